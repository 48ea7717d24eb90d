//! A training loop with five problems that hit in the same steps, to check that lazuli's diagnostics name each
//! one at its own line with its own fix:
//!   1. `loss.item()` in the middle of the step (a graph break every step),
//!   2. a short last batch (a recompile for the new input shape, steps 4 and 9),
//!   3. a loop whose count changes (two refinement passes in the first epoch, three in the second: step 5),
//!   4. a value compiled in as a constant that changes every step (a decaying loss weight),
//!   5. a host `if` on a tensor value (another graph break every step).
//!
//! cargo run --release --example graph_breaks_combined    # writes graph_breaks_combined.events.jsonl, prints the report
//! cargo run --release --bin lazuli-report -- graph_breaks_combined.events.jsonl --json report.json
//!
//! `report/tests/report_tool.rs` runs `train` and checks that the report names every problem at its line, and nothing
//! else (it finds the lines by their text here).

use std::path::PathBuf;

use clap::Parser;
use lazuli::diagnostics::report;
use lazuli::nn::{Activation, HostRng, Mlp};
use lazuli::{DType, Module, Optimizer, Sgd, Tensor};

/// lazuli sets no allocator; an application picks one. mimalloc, also as C's malloc (its `override` feature),
/// serves recording's many small allocations and the plugin's much faster than glibc's malloc (README, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    /// Where to write the events (JSON lines).
    #[arg(long, default_value = "graph_breaks_combined.events.jsonl")]
    events: PathBuf,
}

/// Two epochs of five batches (ten steps), with the five problems; prints each step's loss when `verbose`.
pub fn train(verbose: bool) -> lazuli::Result<()> {
    // 150 samples, batches of 32: the last batch of each epoch has 22.
    let mut rng = HostRng::new(7);
    let (n, batch) = (150usize, 32usize);
    let xs: Vec<f32> = (0..n * 4).map(|_| rng.normal() as f32).collect();
    let ys: Vec<f32> = xs.chunks(4).map(|r| r[0] - 2.0 * r[1] + 0.5 * r[2] * r[3]).collect();
    let model = Mlp::new(&mut rng, &[4, 16, 1], Activation::Tanh, DType::F32);
    let mut opt = Sgd::new(model.named_params(), 0.05);

    let mut step = 0;
    for epoch in 0..2 {
        let passes = 2 + epoch;
        for start in (0..n).step_by(batch) {
            let end = (start + batch).min(n);
            // Problem 2: the last batch is shorter.
            let x = Tensor::from_slice(&xs[start * 4..end * 4], &[end - start, 4]);
            let y = Tensor::from_slice(&ys[start..end], &[end - start, 1]);
            let mut h = model.forward(&x);
            // Problem 3: the number of passes changes between epochs, so the step records more ops.
            for _ in 0..passes {
                h = &h + h.tanh() * 0.1;
            }
            // Problem 4: a constant is compiled into the program; a new value is a new program.
            let weight = Tensor::constant(0.9f64.powi(step), DType::F32);
            let loss = (h - &y).pow(2.0).mean_all() * weight;
            // Problem 1: reading the loss before the step boundary runs the forward pass on its own.
            let value = loss.item::<f32>()?;
            loss.backward();
            let norm2 = model
                .params()
                .iter()
                .filter_map(|p| p.grad())
                .map(|g| (&g * &g).sum_all())
                .fold(Tensor::scalar(0.0f32), |a, b| a + b);
            // Problem 5: deciding on the host runs forward and backward once more, to compute the norm.
            if norm2 > 1.0 {
                opt.set_lr(0.05 / norm2.item::<f32>()?.sqrt() as f64);
            } else {
                opt.set_lr(0.05);
            }
            opt.step();
            opt.zero_grad();
            lazuli::sync()?;
            if verbose {
                println!("epoch {epoch} samples {start:3}..{end:3} ({passes} passes): loss {value:.4}");
            }
            step += 1;
        }
    }
    Ok(())
}

fn main() -> lazuli::Result<()> {
    let args = Args::parse();
    // Events go to the file named by LAZULI_EVENTS; set it before lazuli starts.
    let _ = std::fs::remove_file(&args.events);
    std::env::set_var("LAZULI_EVENTS", &args.events);
    train(true)?;
    println!("\n--- lazuli-report {} ---", args.events.display());
    let text = std::fs::read_to_string(&args.events).map_err(|e| lazuli::Error::Config(e.to_string()))?;
    let events = report::parse(&text).map_err(lazuli::Error::Config)?;
    print!("{}", report::render(&report::analyse(&events)));
    Ok(())
}
