//! The character-level GPT of `train_gpt`, trained on a mesh of devices with a sharding plan: data parallel,
//! FSDP, Megatron tensor parallel, their 2-D mix, or the planner's choice. On the CPU plugin, `--devices N` gives
//! N virtual devices in this process.
//!
//! cargo run --release --example sharded_train -- --devices 8 --plan auto

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use lazuli::nn::{Gpt, GptConfig, HostRng};
use lazuli::sharding::{apply_plan, plan, DeviceModel};
use lazuli::{AdamW, Backend, Config, DType, Module, PartitionSpec, Tensor};

/// lazuli sets no allocator; an application picks one. mimalloc, also as C's malloc (its `override` feature),
/// serves recording's many small allocations and the plugin's much faster than glibc's malloc (README, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "GPT training on a mesh with a sharding plan")]
struct Args {
    #[arg(long, default_value_t = 8)]
    devices: usize,
    /// auto | dp | fsdp | tp | 2d
    #[arg(long, default_value = "auto")]
    plan: String,
    #[arg(long, default_value_t = 30)]
    steps: u64,
    /// Per-device memory limit for the planner, MiB (default: what the device's allocator may use, where the
    /// plugin says; otherwise no limit).
    #[arg(long)]
    memory_mib: Option<f64>,
    #[arg(long, default_value_t = 32)]
    batch: usize,
    #[arg(long, default_value_t = 64)]
    block: usize,
    #[arg(long, default_value_t = 2)]
    layers: usize,
    #[arg(long, default_value_t = 4)]
    heads: usize,
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Print every step's loss.
    #[arg(long)]
    print_losses: bool,
    /// Text to train on (default: this repository's sources).
    #[arg(long)]
    data: Option<std::path::PathBuf>,
    /// Vocabulary size (0: the corpus's byte vocabulary).
    #[arg(long, default_value_t = 0)]
    vocab: usize,
    /// The planner's cost model: `auto` (the platform's), `cpu` or `h200`. With `--steps 0`, a CPU run shows
    /// what the planner would choose on GPUs.
    #[arg(long, default_value = "auto")]
    device_model: String,
    /// Peak TFLOP/s of one device for the MFU line (default on GPUs: an H200's dense bf16, 989).
    #[arg(long)]
    peak_tflops: Option<f64>,
}

fn main() -> lazuli::Result<()> {
    let args = Args::parse();
    let mut config = Config::from_env()?;
    if config.backend == Backend::Cpu {
        config.cpu_device_count = config.cpu_device_count.max(args.devices as i64);
    }
    lazuli::init(config)?;
    let info = lazuli::runtime_info()?;
    println!("sharded_train on {info}");
    if info.device_count < args.devices {
        return Err(lazuli::Error::Sharding(format!(
            "{} devices asked for, {} available",
            args.devices, info.device_count
        )));
    }
    let text = match &args.data {
        Some(p) => std::fs::read(p).map_err(|e| lazuli::Error::Config(format!("reading {}: {e}", p.display())))?,
        None => common::default_corpus(),
    };
    if text.len() < args.block + 2 {
        return Err(lazuli::Error::Config(format!("the text has {} bytes; need more than --block", text.len())));
    }
    let (_, index, entropy) = common::vocabulary(&text);
    let ids: Vec<i32> = text.iter().map(|&b| index[b as usize] as i32).collect();
    let vocab = if args.vocab > 0 { args.vocab } else { *ids.iter().max().unwrap_or(&0) as usize + 1 };
    let cfg = GptConfig {
        vocab,
        block_size: args.block,
        n_layer: args.layers,
        n_head: args.heads,
        d_model: args.dim,
        dropout: 0.0,
        dtype: DType::F32,
        scan_blocks: false,
        checkpoint_blocks: false,
    };
    let model = Gpt::new(&mut HostRng::new(1), cfg);
    let (b, t) = (args.batch, args.block);
    let batch = |step: u64| {
        let mut rng = HostRng::new(30_000 + step);
        let (mut x, mut y) = (Vec::with_capacity(b * t), Vec::with_capacity(b * t));
        for _ in 0..b {
            let o = rng.below((ids.len() - t - 1) as u64) as usize;
            x.extend_from_slice(&ids[o..o + t]);
            y.extend_from_slice(&ids[o + 1..o + t + 1]);
        }
        (x, y)
    };

    // Plan from the recorded (not run) first step.
    let device = match (args.device_model.as_str(), info.platform.as_str()) {
        ("cpu", _) | ("auto", "cpu") => DeviceModel::CPU,
        ("h200", _) | ("auto", _) => DeviceModel::H200,
        (other, _) => return Err(lazuli::Error::Config(format!("--device-model {other}: expected auto, cpu or h200"))),
    };
    let mut p = {
        let (x, y) = batch(0);
        let loss = model.loss(&Tensor::from_slice(&x, &[b, t]), &Tensor::from_slice(&y, &[b, t]));
        let limit = match args.memory_mib {
            Some(mib) => mib * 1024.0 * 1024.0,
            None => lazuli::memory_stats()
                .ok()
                .and_then(|s| s.first().and_then(|s| s.bytes_limit))
                .map_or(f64::INFINITY, |b| b as f64),
        };
        plan(&model, &loss, b, args.devices, limit, device)
    };
    if args.plan != "auto" {
        p.choose(&args.plan).map_err(lazuli::Error::Sharding)?;
    }
    print!("{p}");
    let mesh = apply_plan(&p, &model)?;
    let data_split = mesh.axes().iter().any(|(n, _)| n == "data");
    let mut opt = AdamW::new(model.named_params(), 3e-3);

    let mut log = common::StepLog::new(0, args.steps);
    let mut last = f32::NAN;
    for step in 0..args.steps {
        let (x, y) = batch(step);
        let (mut x, mut y) = (Tensor::from_slice(&x, &[b, t]), Tensor::from_slice(&y, &[b, t]));
        if data_split {
            x = x.shard(&mesh, &PartitionSpec::split(2, 0, "data"));
            y = y.shard(&mesh, &PartitionSpec::split(2, 0, "data"));
        }
        let loss = model.loss(&x, &y);
        last = common::finish_step(&mut opt, &loss, true)?.unwrap_or(f32::NAN);
        if args.print_losses {
            println!("step {step}: loss {last}");
        }
        log.step_done(step, Some(last));
    }
    log.finish();
    report_throughput(&args, &model.config, &info.platform, log.median_step_ms(), p.chosen().memory_bytes);
    println!("plan: {} on {mesh}; unigram entropy {entropy:.3} nats", p.chosen().name);
    if args.steps > 0 {
        println!("final loss: {last}");
    }
    Ok(())
}

/// Tokens per second, model FLOPs utilization (on GPUs, or given `--peak-tflops`) and each device's peak memory
/// beside the planner's estimate (where the plugin keeps allocator statistics: GPUs, not the CPU).
fn report_throughput(args: &Args, cfg: &GptConfig, platform: &str, step_ms: f64, estimated_bytes: f64) {
    if !step_ms.is_finite() {
        return;
    }
    let tokens = (args.batch * args.block) as f64;
    let per_s = tokens / (step_ms / 1e3);
    let mut line = format!("throughput: {per_s:.0} tokens/s");
    let peak = args.peak_tflops.or((platform != "cpu").then_some(989.0));
    if let Some(peak) = peak {
        let flops = cfg.train_flops_per_token(args.block) * per_s;
        let mfu = flops / (peak * 1e12 * args.devices as f64);
        line += &format!(", {:.1}% MFU ({:.0} TFLOP/s of {} × {peak} peak)", 100.0 * mfu, flops / 1e12, args.devices);
    }
    println!("{line}");
    let gib = |b: f64| b / (1u64 << 30) as f64;
    match lazuli::memory_stats() {
        Ok(stats) => {
            let peaks: Vec<String> = stats
                .iter()
                .take(args.devices)
                .map(|s| s.peak_bytes_in_use.map_or("?".into(), |p| format!("{:.2}", gib(p as f64))))
                .collect();
            println!(
                "peak memory per device: {} GiB (the planner estimated {:.2} GiB)",
                peaks.join(", "),
                gib(estimated_bytes)
            );
        }
        Err(e) => println!("peak memory per device: not reported by this plugin ({e})"),
    }
}
