//! Data-parallel training across processes started by `lazuli-run`: each process computes the gradient of its
//! share of every batch, the processes average their gradients through the group's key-value store, and every
//! replica applies the same update (the CPU plugins have no collectives across processes). Process 0 checkpoints;
//! after a restart (`--max-restarts`) the group resumes from the checkpoint.
//!
//! cargo build --release --example data_parallel -p lazuli -p lazuli-distributed
//! target/release/lazuli-run --nproc 2 --max-restarts 1 -- target/release/examples/data_parallel --steps 300

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use lazuli::nn::{Activation, HostRng, Mlp};
use lazuli::{checkpoint, DType, Module, Tensor};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "An MLP trained data-parallel over the processes of a lazuli-run group")]
struct Args {
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// The global batch, split evenly over the processes.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    #[arg(long, default_value_t = 0.1)]
    lr: f32,
    /// Process 0 writes a checkpoint here every `--checkpoint-every` steps; every process resumes from it.
    #[arg(long, default_value = "data_parallel.ckpt.safetensors")]
    checkpoint: PathBuf,
    #[arg(long, default_value_t = 50)]
    checkpoint_every: u64,
}

/// Rows `[first, first + n)` of step `step`'s global batch: points in the unit square and a smooth target.
fn rows(step: u64, first: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
    let mut x = Vec::with_capacity(2 * n);
    for i in first..first + n {
        let mut rng = HostRng::new(step * 1_000_003 + i as u64);
        x.extend([rng.normal() as f32, rng.normal() as f32]);
    }
    let y = x.chunks(2).map(|p| (2.0 * p[0]).sin() * p[1].cos()).collect();
    (x, y)
}

fn main() -> lazuli::Result<()> {
    let args = Args::parse();
    lazuli::platform()?; // joins the group that lazuli-run's variables describe
    let group = lazuli::distributed::group().expect("run me with lazuli-run (LAZULI_COORDINATOR and friends)");
    let (me, n) = (group.process_id(), group.num_processes() as usize);
    assert!(args.batch % n == 0, "--batch {} does not split over {n} processes", args.batch);
    let share = args.batch / n;

    let model = Mlp::new(&mut HostRng::new(1), &[2, 64, 64, 1], Activation::Tanh, DType::F32);
    let mut start = 0;
    if args.checkpoint.exists() {
        let (_, meta) = checkpoint::load(&args.checkpoint, &model, None)?;
        start = meta.user.get("step").and_then(|s| s.parse().ok()).unwrap_or(0);
        println!("process {me}: resumed at step {start}");
    }
    let params = model.named_params();
    let mut last_loss = f32::NAN;
    for step in start..args.steps {
        let (x, y) = rows(step, me as usize * share, share);
        let pred = model.forward(&Tensor::from_slice(&x, &[share, 2]));
        let loss = (pred - Tensor::from_slice(&y, &[share, 1])).pow(2.0).mean_all();
        let values: Vec<Tensor> = params.iter().map(|(_, p)| p.get()).collect();
        let grads = lazuli::grad(&loss, &values.iter().collect::<Vec<_>>());
        lazuli::sync()?; // the loss and gradients in one program; the reads below run nothing
                         // This process's loss and gradients as one message; the mean of all processes' is the global batch's.
        let mut mine = vec![loss.item::<f32>()?];
        for g in &grads {
            mine.extend(g.to_vec::<f32>()?);
        }
        let mean = average(group, step, &mine, n);
        last_loss = mean[0];
        let mut offset = 1;
        for ((_, p), g) in params.iter().zip(&grads) {
            let update = Tensor::from_slice(&mean[offset..offset + g.elements()], g.dims());
            p.set(lazuli::no_grad(|| p.get() - update * f64::from(args.lr)));
            offset += g.elements();
        }
        lazuli::sync()?;
        if me == 0 && (step + 1) % args.checkpoint_every == 0 {
            let meta = [("step".to_string(), (step + 1).to_string())].into();
            checkpoint::save(&args.checkpoint, &model, None, &[], &meta)?;
        }
        if me == 0 && step % 50 == 0 {
            println!("step {step}: loss {last_loss:.5}");
        }
    }
    if me == 0 {
        println!("final loss: {last_loss:.5}");
    }
    Ok(())
}

/// The element-wise mean of every process's `values` for `step`, in process order (so every process computes
/// the same bits).
fn average(group: &lazuli::distributed::Member, step: u64, values: &[f32], n: usize) -> Vec<f32> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    group.put(&format!("step/{step}/{}", group.process_id()), &bytes).expect("the group failed");
    let mut sum = vec![0f32; values.len()];
    for p in 0..n {
        let theirs = group.get(&format!("step/{step}/{p}"), Duration::from_secs(60)).expect("the group failed");
        for (s, c) in sum.iter_mut().zip(theirs.chunks(4)) {
            *s += f32::from_le_bytes(c.try_into().expect("4 bytes"));
        }
    }
    // Every process has put its values for this step, so each finished reading the last step's: this process's
    // can go (the store would otherwise grow by a model's gradients every step).
    if step > 0 {
        group.delete(&format!("step/{}/{}", step - 1, group.process_id())).expect("the group failed");
    }
    sum.iter().map(|s| s / n as f32).collect()
}
