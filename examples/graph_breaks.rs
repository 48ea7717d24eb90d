//! A training loop with three deliberate problems, to show what lazuli's diagnostics find:
//!   1. `loss.item()` in the middle of the step (a graph break: an extra program every step),
//!   2. a short last batch (a recompile for the new shape),
//!   3. a host `if` on a tensor value (gradient clipping decided on the host: another graph break).
//!
//! cargo run --release --example graph_breaks              # writes graph_breaks.events.jsonl, prints the report
//! cargo run --release --example graph_breaks -- --strict  # strict mode stops at the first problem
//! cargo run --release --bin lazuli-report -- graph_breaks.events.jsonl --chrome trace.json

use std::path::PathBuf;

use clap::Parser;
use lazuli::diagnostics::{report, strict_scope, Budget};
use lazuli::nn::{Activation, HostRng, Mlp};
use lazuli::{DType, Module, Optimizer, Sgd, Tensor};

/// lazuli sets no allocator; an application picks one. mimalloc, also as C's malloc (its `override` feature),
/// serves recording's many small allocations and the plugin's much faster than glibc's malloc (README, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    /// Turn strict mode on: the first graph break or recompile after warm-up becomes an error.
    #[arg(long)]
    strict: bool,
    /// Where to write the events (JSON lines).
    #[arg(long, default_value = "graph_breaks.events.jsonl")]
    events: PathBuf,
}

fn main() -> lazuli::Result<()> {
    let args = Args::parse();
    // Events go to the file named by LAZULI_EVENTS; set it before lazuli starts.
    let _ = std::fs::remove_file(&args.events);
    std::env::set_var("LAZULI_EVENTS", &args.events);

    // 150 samples, batches of 32: the last batch of each epoch has 22.
    let mut rng = HostRng::new(3);
    let (n, batch) = (150usize, 32usize);
    let xs: Vec<f32> = (0..n * 4).map(|_| rng.normal() as f32).collect();
    let ys: Vec<f32> = xs.chunks(4).map(|r| r[0] - 2.0 * r[1] + 0.5 * r[2] * r[3]).collect();
    let model = Mlp::new(&mut rng, &[4, 16, 1], Activation::Tanh, DType::F32);
    let mut opt = Sgd::new(model.named_params(), 0.05);

    let _strict = args.strict.then(|| strict_scope(Budget::training()));
    let result = (|| -> lazuli::Result<()> {
        for epoch in 0..2 {
            for start in (0..n).step_by(batch) {
                let end = (start + batch).min(n);
                let x = Tensor::from_slice(&xs[start * 4..end * 4], &[end - start, 4]);
                let y = Tensor::from_slice(&ys[start..end], &[end - start, 1]);
                let loss = (model.forward(&x) - &y).pow(2.0).mean_all();
                // Problem 1: reading the loss before the step boundary runs the forward pass on its own.
                let value = loss.item::<f32>()?;
                loss.backward();
                // Problem 3: deciding on the host whether to clip (by scaling the learning rate) runs forward and backward
                // once more, just to compute the gradient norm.
                let norm2 = model
                    .params()
                    .iter()
                    .map(|p| (p.grad().unwrap() * p.grad().unwrap()).sum_all())
                    .fold(Tensor::scalar(0.0f32), |a, b| a + b);
                if norm2 > 1.0 {
                    opt.set_lr(0.05 / norm2.item::<f32>()?.sqrt() as f64);
                } else {
                    opt.set_lr(0.05);
                }
                opt.step();
                opt.zero_grad();
                lazuli::sync()?;
                println!("epoch {epoch} samples {start:3}..{end:3}: loss {value:.4}");
            }
        }
        Ok(())
    })();
    match result {
        Err(e @ lazuli::Error::Strict(_)) => {
            println!("\nstrict mode stopped the run:\n{e}");
            return Ok(());
        }
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    println!("\n--- lazuli-report {} ---", args.events.display());
    let text = std::fs::read_to_string(&args.events).map_err(|e| lazuli::Error::Config(e.to_string()))?;
    let events = report::parse(&text).map_err(lazuli::Error::Config)?;
    print!("{}", report::render(&report::analyse(&events)));
    Ok(())
}
