//! Side-by-side runs. On the CPU, lazuli (in this process) and the Python side (a child process) alternate
//! repetitions of the same number of steps, so drift of the machine hits both. On a GPU each framework runs in a
//! process of its own, one after the other (each takes most of the device's memory for its allocator).
//! The first steps of every run start from the shared weights, and their losses are compared: each row proves
//! that both sides computed the same thing before it reports how fast.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};

use crate::stats::{median, Spread};
use crate::worker::{self, SetupInfo, Split, StepRun, Worker};
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
}

impl Default for Options {
    fn default() -> Options {
        Options { reps: 7, warmup: 3, steps: None, pipelined: false }
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

fn split_median(splits: &[Split]) -> Option<Split> {
    if splits.is_empty() {
        return None;
    }
    let m = |f: fn(&Split) -> f64| median(&splits.iter().map(f).collect::<Vec<_>>());
    Some(Split {
        record: m(|s| s.record),
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
    let mut jax = Worker::start_with(python, script, "jax", worker::jax_cpu_xla_flags()?.as_deref())?;
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

/// The lazuli side of a GPU row as its own process's work: write the weights, warm up, time `reps` runs.
/// Printed as one JSON line by `lazuli-bench lazuli-side`.
pub fn lazuli_side(w: &Workload, weights: &Path, opts: &Options) -> BenchResult<Value> {
    let steps = opts.steps.unwrap_or_else(|| default_steps(w));
    let t0 = Instant::now();
    let mut lz = LazuliRun::new(w);
    lz.write_weights(weights)?;
    let init_s = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let first = lz.run(1, false)?;
    let first_s = t0.elapsed().as_secs_f64();
    let rest = lz.run(opts.warmup.saturating_sub(1), false)?;
    let mut reps = Vec::new();
    let mut splits = Vec::new();
    let mut peak_bytes = None;
    for _ in 0..opts.reps {
        let r: StepRun = lz.run(steps, opts.pipelined)?;
        reps.push(r.times);
        splits.extend(r.split);
        peak_bytes = r.peak_bytes;
    }
    let s = split_median(&splits).unwrap_or_default();
    let warmup_losses = [first.losses, rest.losses].concat();
    Ok(json!({
        "init_s": init_s, "first_s": first_s, "warmup_losses": warmup_losses,
        "reps": reps, "params": lz.num_params(), "runtime": lazuli::runtime_info()?.to_string(),
        "peak_bytes": peak_bytes,
        "split": {"record": s.record, "execute": s.execute, "programs_per_step": s.programs_per_step,
                  "compiles": s.compiles, "boundary": s.boundary, "upload": s.upload, "finish": s.finish, "wait": s.wait},
    }))
}

/// A GPU row: lazuli (this binary again, as a child, with `LAZULI_DEVICE=device`), then each Python framework.
#[allow(clippy::too_many_arguments)]
pub fn gpu_row(
    w: &Workload,
    python: &Path,
    script: &Path,
    dir: &Path,
    frameworks: &[String],
    opts: &Options,
    side_args: &[&str],
    device: &str,
) -> BenchResult<Row> {
    let steps = opts.steps.unwrap_or_else(|| default_steps(w));
    let weights = dir.join(format!("{}.safetensors", w.name));
    let exe = std::env::current_exe()?;
    eprintln!("lazuli-bench: lazuli on the {device} ({} reps of {steps} steps)", opts.reps);
    let out = Command::new(exe)
        .args(["lazuli-side", "--workload", &w.name, "--weights"])
        .arg(&weights)
        .args(["--reps", &opts.reps.to_string(), "--steps", &steps.to_string()])
        .args(["--warmup", &opts.warmup.to_string()])
        .args(opts.pipelined.then_some("--pipelined"))
        .args(side_args)
        .env("LAZULI_DEVICE", device)
        .stderr(Stdio::inherit())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // A failed side is reported in its row; the other frameworks still run.
    let v: Value = match serde_json::from_str(text.lines().last().unwrap_or("")) {
        Ok(v) if out.status.success() => v,
        _ => json!({"error": format!("the lazuli side failed ({}); its error output is above", out.status)}),
    };
    let floats = |v: &Value| -> Vec<f64> {
        v.as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default()
    };
    let mut lazuli = Side {
        name: "lazuli".into(),
        first_s: v["first_s"].as_f64().unwrap_or(f64::NAN),
        warmup_losses: floats(&v["warmup_losses"]),
        split: Some(Split {
            record: v["split"]["record"].as_f64().unwrap_or(f64::NAN),
            execute: v["split"]["execute"].as_f64().unwrap_or(f64::NAN),
            boundary: v["split"]["boundary"].as_f64().unwrap_or(f64::NAN),
            upload: v["split"]["upload"].as_f64().unwrap_or(f64::NAN),
            finish: v["split"]["finish"].as_f64().unwrap_or(f64::NAN),
            wait: v["split"]["wait"].as_f64().unwrap_or(f64::NAN),
            programs_per_step: v["split"]["programs_per_step"].as_f64().unwrap_or(f64::NAN),
            compiles: v["split"]["compiles"].as_u64().unwrap_or(0),
        }),
        info: SetupInfo { framework: v["runtime"].as_str().unwrap_or("?").into(), ..SetupInfo::default() },
        error: v["error"].as_str().map(String::from),
        peak_bytes: v["peak_bytes"].as_f64(),
        ..Side::default()
    };
    for rep in v["reps"].as_array().into_iter().flatten() {
        lazuli.steps.push(median(&floats(rep)));
    }
    eprintln!("lazuli-bench: lazuli: {} per step, first step {:.1} s", lazuli.steps.show(), lazuli.first_s);
    let mut others = Vec::new();
    for fw in frameworks {
        eprintln!("lazuli-bench: {fw}");
        let name = if fw == "jax" { "JAX jit" } else { "torch.compile" };
        let mut side = Side { name: name.into(), ..Side::default() };
        if let Err(e) = python_side(&mut side, fw, w, python, script, &weights, opts, steps) {
            eprintln!("lazuli-bench: {name} failed: {e}");
            side.error = Some(e.to_string().lines().next().unwrap_or("").to_string());
        } else {
            eprintln!("lazuli-bench: {name}: {} per step, first step {:.1} s", side.steps.show(), side.first_s);
        }
        others.push(side);
    }
    Ok(Row { workload: w.clone(), lazuli, others, steps_per_rep: steps })
}

/// One Python framework's part of a GPU row, in `side`.
#[allow(clippy::too_many_arguments)]
fn python_side(
    side: &mut Side,
    fw: &str,
    w: &Workload,
    python: &Path,
    script: &Path,
    weights: &Path,
    opts: &Options,
    steps: usize,
) -> BenchResult<()> {
    let mut worker = Worker::start(python, script, fw)?;
    let t0 = Instant::now();
    side.info = worker.setup(w, weights)?;
    // torch.compile compiles on the first call: count it in the first step, as lazuli's.
    let first = worker.run(1, false)?;
    side.first_s = if fw == "jax" { side.info.compile_s + first.times[0] } else { t0.elapsed().as_secs_f64() };
    side.warmup_losses = [first.losses, worker.run(opts.warmup.saturating_sub(1), false)?.losses].concat();
    for _ in 0..opts.reps {
        let r = worker.run(steps, opts.pipelined)?;
        side.steps.push(median(&r.times));
        side.peak_bytes = r.peak_bytes;
    }
    Ok(())
}
