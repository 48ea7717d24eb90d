//! Measures the constants of the sharding planner's cost model (`DeviceModel`, AdamW's update traffic): every
//! measurement runs on all devices at once, as a sharded training step does. On virtual CPU devices the numbers
//! include the devices sharing the host's cores (per core); on GPUs (`LAZULI_DEVICE=gpu`) they are per device,
//! and the shapes should be a real step's (`--rows 8192 --dim 768 --param-mib 64`).
//!
//! cargo run --release --example planner_calibration -- --devices 8

use std::time::Instant;

use clap::Parser;
use lazuli::sharding::recorded_work;
use lazuli::{AdamW, Backend, Config, Mesh, Optimizer, Param, PartitionSpec, Tensor};

/// lazuli sets no allocator; an application picks one. mimalloc, also as C's malloc (its `override` feature),
/// serves recording's many small allocations and the plugin's much faster than glibc's malloc (README, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "measure the sharding planner's CPU cost-model constants")]
struct Args {
    #[arg(long, default_value_t = 8)]
    devices: usize,
    /// Timed repetitions per measurement (the median is used).
    #[arg(long, default_value_t = 15)]
    reps: usize,
    /// Rows (tokens) per device of the matmul and elementwise measurements.
    #[arg(long, default_value_t = 256)]
    rows: usize,
    /// Model width of those measurements (the MLP's hidden width is 4x).
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Size of the parameter of the AdamW measurement, MiB.
    #[arg(long, default_value_t = 4)]
    param_mib: usize,
}

/// Median wall time of `f` (seconds) after two warm-up runs (the first compiles).
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[t.len() / 2]
}

fn host(data: Vec<f32>, dims: &[usize], mesh: &Mesh, spec: PartitionSpec) -> Tensor {
    Tensor::from_slice(&data, dims).shard(mesh, &spec)
}

/// Values in [0.1, 1.1): nothing overflows or goes denormal in the chains below.
fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.1 + ((i * 7919) % 1000) as f32 / 1000.0).collect()
}

fn main() -> lazuli::Result<()> {
    let args = Args::parse();
    let n = args.devices;
    let config = Config::from_env()?;
    let cpu = config.backend == Backend::Cpu;
    lazuli::init(if cpu { Config { cpu_device_count: n as i64, ..config } } else { config })?;
    // Virtual CPU devices share the host's cores: rates are per core. GPUs are independent: rates per device.
    let parallel = if cpu { std::thread::available_parallelism().map_or(1, |c| c.get()).min(n) } else { n };
    let unit = if cpu { "core" } else { "device" };
    let mesh = lazuli::mesh(&[("data", n)])?;
    let split = |rank| PartitionSpec::split(rank, 0, "data");
    let rep = PartitionSpec::replicated;
    println!(
        "{n} devices ({}), {parallel} working at once; every number is all devices working at once",
        lazuli::platform()?
    );

    // Matmuls: the shapes of the sharded GPT's MLP on `rows` tokens per device, chained; nothing else in the
    // program.
    let (rows, d, h) = (args.rows * n, args.dim, 4 * args.dim);
    let x = host(values(rows * d), &[rows, d], &mesh, split(2));
    let w1 = host(vec![1.0 / d as f32; d * h], &[d, h], &mesh, rep(2));
    let w2 = host(vec![1.0 / h as f32; h * d], &[h, d], &mesh, rep(2));
    let chain = || (0..8).fold(x.clone(), |h, _| h.matmul(&w1).matmul(&w2));
    let flops = recorded_work(&chain()).matmul_flops;
    let t = time(args.reps, || chain().materialize().unwrap());
    let flops_per_core = flops / t / parallel as f64;
    println!("matmul: {:.2} GFLOP in {:.2} ms: flops_per_s = {flops_per_core:.3e} per {unit}", flops / 1e9, t * 1e3);

    // Elementwise: layer norm, GELU, softmax and residual adds on [rows, 4·dim] per device, forward and backward,
    // counted as the planner counts a step (3x the forward's recorded result bytes).
    let a = host(values(rows * h), &[rows, h], &mesh, split(2));
    a.set_requires_grad(true);
    let block = || {
        let h = a.layer_norm(&[-1], 1e-5);
        let h = &h + &h.gelu();
        let h = &h + &h.softmax(-1);
        h.layer_norm(&[-1], 1e-5)
    };
    let bytes = 3.0 * recorded_work(&block()).elementwise_bytes;
    let t = time(args.reps, || {
        let g = lazuli::grad(&block().pow(2.0).sum_all(), &[&a]);
        g[0].materialize().unwrap()
    });
    let bytes_per_core = bytes / t / parallel as f64;
    println!(
        "elementwise: {:.1} MiB in {:.2} ms: bytes_per_s = {bytes_per_core:.3e} per {unit}",
        bytes / 1048576.0,
        t * 1e3
    );

    // AdamW on a replicated parameter (data parallel): the step with the update minus the step without.
    let elems = args.param_mib * 1024 * 256;
    let p = Param::new(host(values(elems), &[elems / 1024, 1024], &mesh, rep(2)));
    let c = host(values(elems), &[elems / 1024, 1024], &mesh, rep(2));
    let loss = |p: &Param| (&p.get() * &c).sum_all();
    let without = time(args.reps, || {
        let g = lazuli::grad(&loss(&p), &[&p.get()]);
        g[0].materialize().unwrap()
    });
    let mut opt = AdamW::new(vec![("p".into(), p.clone())], 1e-6);
    let with = time(args.reps, || {
        loss(&p).backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
    });
    let per_device = (elems * 4) as f64;
    let traffic = (with - without).max(0.0) * parallel as f64 * bytes_per_core / (n as f64 * per_device);
    println!(
        "AdamW update: {:.2} ms with, {:.2} ms without: update_traffic = {traffic:.1} bytes per parameter byte",
        with * 1e3,
        without * 1e3
    );

    // All-reduce: a chain of 8 sums over the split dimension, minus the same chain with a local op instead.
    let allreduce = |len: usize| {
        let x = host(values(n * len), &[n, len], &mesh, split(2));
        let k = 8;
        let reduced = time(args.reps, || {
            (0..k).fold(x.clone(), |h, _| &(&h * 0.5) + &(&h.sum(&[0]) * 1e-3)).materialize().unwrap()
        });
        let local =
            time(args.reps, || (0..k).fold(x.clone(), |h, _| &(&h * 0.5) + &(&h * 1e-3)).materialize().unwrap());
        ((reduced - local).max(0.0) / k as f64, 2.0 * (n - 1) as f64 / n as f64 * (len * 4) as f64)
    };
    let (t_small, b_small) = allreduce(1024);
    // 1 MiB per device on the CPU; on GPUs large enough for the links' bandwidth to show.
    let large = if cpu { 256 * 1024 } else { args.param_mib * 256 * 1024 };
    let (t_large, b_large) = allreduce(large);
    let link = (b_large - b_small) / (t_large - t_small).max(1e-9);
    let latency = (t_small - b_small / link).max(0.0);
    println!(
        "all-reduce: {:.1} us at 4 KiB, {:.1} us at {} MiB: link_bytes_per_s = {link:.3e}, collective_latency_s = {latency:.2e}",
        t_small * 1e6,
        t_large * 1e6,
        large * 4 / 1048576
    );
    let shared = if cpu { format!("Some({parallel})") } else { "None".to_string() };
    println!(
        "DeviceModel {{ flops_per_s: {flops_per_core:.2e}, bytes_per_s: {bytes_per_core:.2e}, link_bytes_per_s: {link:.2e}, \
         collective_latency_s: {latency:.1e}, shared_cores: {shared} }}; update_traffic {traffic:.1}"
    );
    Ok(())
}
