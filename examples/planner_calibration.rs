//! Measures the constants of the sharding planner's CPU cost model (`DeviceModel::CPU`, AdamW's update traffic)
//! on this machine's virtual CPU devices: every measurement runs on all devices at once, as a sharded training
//! step does, so the numbers include the devices sharing the host's cores.
//!
//! cargo run --release --example planner_calibration -- --devices 8

use std::time::Instant;

use clap::Parser;
use lazuli::sharding::recorded_work;
use lazuli::{AdamW, Config, Mesh, Optimizer, Param, PartitionSpec, Tensor};

#[derive(Parser)]
#[command(about = "measure the sharding planner's CPU cost-model constants")]
struct Args {
    #[arg(long, default_value_t = 8)]
    devices: usize,
    /// Timed repetitions per measurement (the median is used).
    #[arg(long, default_value_t = 15)]
    reps: usize,
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
    lazuli::init(Config { cpu_device_count: n as i64, ..Config::default() })?;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let mesh = lazuli::mesh(&[("data", n)])?;
    let split = |rank| PartitionSpec::split(rank, 0, "data");
    let rep = PartitionSpec::replicated;
    println!("{} virtual devices on {cores} core(s); every number is all devices working at once", n);

    // Matmuls: the shapes of the sharded GPT's MLP on 256 tokens per device, chained; nothing else in the program.
    let rows = 256 * n;
    let x = host(values(rows * 128), &[rows, 128], &mesh, split(2));
    let w1 = host(vec![1.0 / 128.0; 128 * 512], &[128, 512], &mesh, rep(2));
    let w2 = host(vec![1.0 / 512.0; 512 * 128], &[512, 128], &mesh, rep(2));
    let chain = || (0..8).fold(x.clone(), |h, _| h.matmul(&w1).matmul(&w2));
    let flops = recorded_work(&chain()).matmul_flops;
    let t = time(args.reps, || chain().materialize().unwrap());
    let flops_per_core = flops / t / cores.min(n) as f64;
    println!("matmul: {:.2} GFLOP in {:.2} ms: flops_per_s = {flops_per_core:.3e} per core", flops / 1e9, t * 1e3);

    // Elementwise: layer norm, GELU, softmax and residual adds on [256, 512] rows per device, forward and backward,
    // counted as the planner counts a step (3x the forward's recorded result bytes).
    let a = host(values(rows * 512), &[rows, 512], &mesh, split(2));
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
    let bytes_per_core = bytes / t / cores.min(n) as f64;
    println!(
        "elementwise: {:.1} MiB in {:.2} ms: bytes_per_s = {bytes_per_core:.3e} per core",
        bytes / 1048576.0,
        t * 1e3
    );

    // AdamW on a replicated 4 MiB parameter (data parallel): the step with the update minus the step without.
    let elems = 1024 * 1024;
    let p = Param::new(host(values(elems), &[1024, 1024], &mesh, rep(2)));
    let c = host(values(elems), &[1024, 1024], &mesh, rep(2));
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
    let traffic = (with - without).max(0.0) * cores.min(n) as f64 * bytes_per_core / (n as f64 * per_device);
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
    let (t_large, b_large) = allreduce(256 * 1024);
    let link = (b_large - b_small) / (t_large - t_small).max(1e-9);
    let latency = (t_small - b_small / link).max(0.0);
    println!(
        "all-reduce: {:.1} us at 4 KiB, {:.1} us at 1 MiB: link_bytes_per_s = {link:.3e}, collective_latency_s = {latency:.2e}",
        t_small * 1e6,
        t_large * 1e6
    );
    println!(
        "DeviceModel {{ flops_per_s: {flops_per_core:.2e}, bytes_per_s: {bytes_per_core:.2e}, link_bytes_per_s: {link:.2e}, \
         collective_latency_s: {latency:.1e}, shared_cores: Some({}) }}; update_traffic {traffic:.1}",
        cores.min(n)
    );
    Ok(())
}
