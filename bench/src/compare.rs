//! Side-by-side runs. On the CPU, lazuli (in this process) and the Python side (a child process) alternate
//! repetitions of the same number of steps, so drift of the machine hits both. On a GPU each framework runs in a
//! process of its own, one after the other (each takes most of the device's memory for its allocator): see
//! [`crate::gpu`].
//! The first steps of every run start from the shared weights, and their losses are compared: each row proves
//! that both sides computed the same thing before it reports how fast.

use std::path::Path;
use std::time::Instant;

use crate::stats::{median, Spread};
use crate::worker::{self, SetupInfo, Split, Worker};
use crate::workloads::{LazuliRun, Workload};
use crate::{losses_agree, BenchResult};

#[derive(Clone, Debug)]
pub struct Options {
    pub reps: usize,
    /// Steps before timing; their losses (from the shared initial weights) are compared.
    pub warmup: usize,
    /// Timed steps per repetition; `None` picks a count for the workload's size.
    pub steps: Option<usize>,
    /// Steps back to back, one wait at the end (per-step time = total / steps), instead of waiting every step.
    pub pipelined: bool,
    /// After the timed repetitions, profile one more repetition's kernels (GPU rows; lazuli and JAX).
    pub profile: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options { reps: 7, warmup: 3, steps: None, pipelined: false, profile: false }
    }
}

/// Timed steps per repetition: about 10–40 ms of work per repetition and side on a 2-core CPU.
pub fn default_steps(w: &Workload) -> usize {
    match w.name.as_str() {
        "mlp-tiny" => 300,
        "mlp-mnist" => 20,
        "gpt-tiny" => 10,
        _ => 10,
    }
}

/// Relative tolerance of the loss comparison: f32 everywhere, or bf16 matmul operands.
pub fn loss_tolerance(w: &Workload) -> f64 {
    if w.bf16_matmul {
        5e-3
    } else {
        1e-4
    }
}

/// One framework's result for one workload.
#[derive(Clone, Debug, Default)]
pub struct Side {
    pub name: String,
    pub steps: Spread,
    /// First step (lazuli: record + compile + run) or ahead-of-time compile (JAX), in seconds.
    pub first_s: f64,
    pub warmup_losses: Vec<f64>,
    pub split: Option<Split>,
    pub info: SetupInfo,
    /// lazuli's first step loaded its program from the persistent compile cache instead of compiling it.
    pub first_from_disk: bool,
    /// Why this side has no result (GPU rows report a failed side and go on).
    pub error: Option<String>,
    /// The same calls with an empty program (the step's arguments and donation): dispatch alone (JAX, CPU rows).
    pub empty_program: Spread,
    /// The device allocator's peak after the timed steps, where reported (GPU rows).
    pub peak_bytes: Option<f64>,
    /// The device's kernels over one more repetition (`--profile`).
    pub profile: Option<lazuli::diagnostics::DeviceProfile>,
}

#[derive(Clone, Debug)]
pub struct Row {
    pub workload: Workload,
    pub lazuli: Side,
    pub others: Vec<Side>,
    pub steps_per_rep: usize,
}

impl Row {
    /// lazuli's median over the first comparison side's.
    pub fn ratio(&self) -> f64 {
        self.others.first().map_or(f64::NAN, |o| self.lazuli.steps.median() / o.steps.median())
    }

    /// Whether every side's first losses agree with lazuli's.
    pub fn agreement(&self) -> std::result::Result<(), String> {
        let tol = loss_tolerance(&self.workload);
        for o in &self.others {
            losses_agree(&self.lazuli.warmup_losses, &o.warmup_losses, tol).map_err(|e| format!("{}: {e}", o.name))?;
        }
        Ok(())
    }
}

pub(crate) fn split_median(splits: &[Split]) -> Option<Split> {
    if splits.is_empty() {
        return None;
    }
    let m = |f: fn(&Split) -> f64| median(&splits.iter().map(f).collect::<Vec<_>>());
    Some(Split {
        record: m(|s| s.record),
        record_parts: [m(|s| s.record_parts[0]), m(|s| s.record_parts[1]), m(|s| s.record_parts[2])],
        execute: m(|s| s.execute),
        boundary: m(|s| s.boundary),
        upload: m(|s| s.upload),
        finish: m(|s| s.finish),
        wait: m(|s| s.wait),
        programs_per_step: m(|s| s.programs_per_step),
        compiles: splits.iter().map(|s| s.compiles).sum(),
    })
}

/// Run `w` in lazuli and in JAX on the CPU, alternating repetitions.
pub fn cpu_row(w: &Workload, python: &Path, script: &Path, dir: &Path, opts: &Options) -> BenchResult<Row> {
    let steps = opts.steps.unwrap_or_else(|| default_steps(w));
    let weights = dir.join(format!("{}.safetensors", w.name));
    let mut lz = LazuliRun::new(w);
    lz.write_weights(&weights)?;
    let flags = worker::jax_cpu_xla_flags()?;
    let env: Vec<(&str, &str)> = flags.as_deref().map(|f| ("XLA_FLAGS", f)).into_iter().collect();
    let mut jax = Worker::start_with(python, script, "jax", &env)?;
    let info = jax.setup(w, &weights)?;
    let mut lazuli = Side { name: "lazuli".into(), ..Side::default() };
    let mut other = Side { name: "JAX jit".into(), first_s: info.compile_s, info, ..Side::default() };

    let t0 = Instant::now();
    let m0 = lazuli::metrics();
    let first = lz.run(1, false)?;
    lazuli.first_s = t0.elapsed().as_secs_f64();
    lazuli.first_from_disk = (lazuli::metrics() - m0).disk_cache_hits > 0;
    let rest = lz.run(opts.warmup.saturating_sub(1), false)?;
    lazuli.warmup_losses = [first.losses, rest.losses].concat();
    other.warmup_losses = jax.run(opts.warmup, false)?.losses;

    let mut splits = Vec::new();
    let mut lazuli_rep = |lz: &mut LazuliRun, side: &mut Side| -> BenchResult<()> {
        let r = lz.run(steps, opts.pipelined)?;
        side.steps.push(median(&r.times));
        splits.extend(r.split);
        Ok(())
    };
    for rep in 0..opts.reps {
        // Alternate who goes first, so that a drifting machine favours neither.
        if rep % 2 == 0 {
            lazuli_rep(&mut lz, &mut lazuli)?;
            other.steps.push(median(&jax.run(steps, opts.pipelined)?.times));
        } else {
            other.steps.push(median(&jax.run(steps, opts.pipelined)?.times));
            lazuli_rep(&mut lz, &mut lazuli)?;
        }
        other.empty_program.push(median(&jax.run_empty(steps, opts.pipelined)?.times));
    }
    lazuli.split = split_median(&splits);
    let _ = std::fs::remove_file(&weights);
    Ok(Row { workload: w.clone(), lazuli, others: vec![other], steps_per_rep: steps })
}
