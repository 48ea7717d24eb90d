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
    /// Per-device memory limit for the planner, MiB.
    #[arg(long, default_value_t = 1e6)]
    memory_mib: f64,
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
        plan(&model, &loss, b, args.devices, args.memory_mib * 1024.0 * 1024.0, device)
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
    println!("plan: {} on {mesh}; unigram entropy {entropy:.3} nats", p.chosen().name);
    println!("final loss: {last}");
    Ok(())
}
