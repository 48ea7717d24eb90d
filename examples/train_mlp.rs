//! Train an MLP classifier on two interleaved spirals generated here, with AdamW, one compiled program per step.
//!
//! cargo run --release --example train_mlp -- --steps 1500 [--save ckpt.safetensors] [--resume ckpt.safetensors]

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Parser;
use lazuli::nn::{Activation, HostRng, Mlp};
use lazuli::{checkpoint, AdamW, DType, Module, Optimizer, Schedule, Tensor};

/// lazuli sets no allocator; an application picks one. mimalloc, also as C's malloc (its `override` feature),
/// serves recording's many small allocations and the plugin's much faster than glibc's malloc (README, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Two-spirals classifier trained with lazuli")]
struct Args {
    /// Total training steps.
    #[arg(long, default_value_t = 1500)]
    steps: u64,
    /// Write a checkpoint here at the end.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Continue from a checkpoint written by --save.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Stop (and save, with --save) after this many steps, as if interrupted; --resume continues the same run.
    #[arg(long)]
    stop_at: Option<u64>,
    /// Points per spiral.
    #[arg(long, default_value_t = 512)]
    points: usize,
    /// Mini-batch size.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Print the loss every N steps (read after the step boundary: no extra program).
    #[arg(long, default_value_t = 250)]
    log_every: u64,
}

/// Two spirals, 1.5 turns each, with a little noise. Returns (points [n, 2], labels).
fn spirals(points: usize, seed: u64) -> (Vec<f32>, Vec<u8>) {
    let mut rng = HostRng::new(seed);
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for i in 0..points {
        let t = i as f64 / points as f64;
        let angle = 3.0 * std::f64::consts::PI * t;
        let r = 0.1 + 0.9 * t;
        for (class, sign) in [(0u8, 1.0), (1u8, -1.0)] {
            xs.push((sign * r * angle.cos() + 0.02 * rng.normal()) as f32);
            xs.push((sign * r * angle.sin() + 0.02 * rng.normal()) as f32);
            ys.push(class);
        }
    }
    (xs, ys)
}

/// Mean softmax cross-entropy of `logits [n, 2]` against one-hot `targets [n, 2]`.
fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Tensor {
    let m = logits.max_keepdim(&[1]);
    let lse = (logits - &m).exp().sum(&[1]).log() + m.reshape(&[-1]);
    (lse - (logits * targets).sum(&[1])).mean_all()
}

fn one_hot(labels: &[u8]) -> Vec<f32> {
    labels.iter().flat_map(|&c| [(c == 0) as u8 as f32, (c == 1) as u8 as f32]).collect()
}

fn main() -> lazuli::Result<()> {
    let args = Args::parse();
    println!("train_mlp on {}", lazuli::runtime_info()?);
    let (xs, ys) = spirals(args.points, 7);
    let n = ys.len();

    let model = Mlp::new(&mut HostRng::new(1), &[2, 128, 128, 2], Activation::Tanh, DType::F32);
    let mut opt = AdamW::new(model.named_params(), 1e-2).weight_decay(1e-4);
    let schedule = Schedule::WarmupCosine { peak: 1e-2, min: 1e-4, warmup: 50, total: args.steps };
    let mut start = 0;
    if let Some(path) = &args.resume {
        let (_, meta) = checkpoint::load(path, &model, Some(&mut opt))?;
        start = meta.optimizer_steps;
        println!("resumed from {} at step {start}", path.display());
    }
    println!("model: {} parameters; {n} points; batch {}", model.num_params(), args.batch);

    let mut log =
        common::StepLog::new(start, args.steps).throughput(args.batch as u64, "samples").every(args.log_every);
    let mut last_loss = f32::NAN;
    let end = args.stop_at.unwrap_or(args.steps).min(args.steps);
    for step in start..end {
        // The batch depends only on the step number, so a resumed run sees the same data.
        let mut rng = HostRng::new(10_000 + step);
        let idx: Vec<usize> = (0..args.batch).map(|_| rng.below(n as u64) as usize).collect();
        let bx: Vec<f32> = idx.iter().flat_map(|&i| [xs[2 * i], xs[2 * i + 1]]).collect();
        let by: Vec<u8> = idx.iter().map(|&i| ys[i]).collect();
        let x = Tensor::from_slice(&bx, &[args.batch, 2]);
        let t = Tensor::from_slice(&one_hot(&by), &[args.batch, 2]);

        opt.set_lr(schedule.at(step));
        let loss = cross_entropy(&model.forward(&x), &t);
        let logged = common::finish_step(&mut opt, &loss, step % args.log_every == 0 || step + 1 == end)?;
        if let Some(l) = logged {
            last_loss = l;
        }
        log.step_done(step, logged);
    }
    let regular = log.finish();

    // Accuracy on every point, in evaluation mode and without gradients.
    // Evaluation is not a training step: `unchecked` keeps it out of the step accounting (and strict mode).
    let logits = lazuli::diagnostics::unchecked(|| {
        lazuli::no_grad(|| model.forward(&Tensor::from_slice(&xs, &[n, 2]))).to_vec::<f32>()
    })?;
    let correct = (0..n).filter(|&i| ((logits[2 * i + 1] > logits[2 * i]) as u8) == ys[i]).count();
    println!("accuracy: {:.2}% ({correct}/{n})", 100.0 * correct as f64 / n as f64);

    if let Some(path) = &args.save {
        let mut meta = BTreeMap::new();
        meta.insert("example".into(), "train_mlp".into());
        checkpoint::save(path, &model, Some(&opt), &[], &meta)?;
        println!("saved {}", path.display());
    }
    if !regular {
        println!("warning: some steps compiled or ran more than one program");
    }
    println!("final loss: {last_loss}");
    Ok(())
}
