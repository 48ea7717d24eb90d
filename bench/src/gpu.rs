//! The GPU rows: GPT-2 small in lazuli, JAX jit and torch.compile, each with attention written out and fused.
//! Every framework and variant runs in a process of its own, one after the other (each allocator takes most of
//! the device). All start from the same safetensors weights (the lazuli process writes them), and each row's first
//! losses are compared with lazuli's before its speed is reported.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};

use crate::compare::{default_steps, loss_tolerance, split_median, Options, Side};
use crate::stats::{duration, machine, median, today};
use crate::worker::{SetupInfo, Split, Worker};
use crate::workloads::{Attention, LazuliRun, Model, Workload};
use crate::{losses_agree, BenchResult};

/// The comparison frameworks `--frameworks` accepts; lazuli always runs.
pub const PYTHON_FRAMEWORKS: [&str; 2] = ["jax", "torch"];

/// The dense bf16 peak of an H100 or H200 (SXM: the same tensor cores), FLOP/s: what MFU divides by.
const PEAK_FLOPS: f64 = 989e12;

/// The goal of the fused rows: lazuli (fused attention) ≤ this × torch.compile (SDPA).
const GOAL_VS_TORCH_SDPA: f64 = 0.8;

/// A row's name: the framework and how it computes attention.
pub fn side_name(framework: &str, attention: Attention) -> String {
    let fw = match framework {
        "lazuli" => "lazuli",
        "jax" => "JAX jit",
        _ => "torch.compile",
    };
    let attn = match (framework, attention) {
        (_, Attention::Written) => "written-out attention",
        ("torch", Attention::Fused) => "SDPA",
        ("lazuli", Attention::Fused) => "fused attention",
        (_, Attention::Fused) => "cuDNN attention",
    };
    format!("{fw} ({attn})")
}

/// Which kernels lazuli's fused rows run: `LAZULI_ATTENTION`'s choice for bf16 q, k, v that are slots of the
/// projection `[B, T, 3, H, hd]` on an NVIDIA GPU (`on_gpu`), the composite elsewhere.
fn fused_attention_kernels(on_gpu: bool) -> &'static str {
    if !on_gpu {
        return "lazuli::scaled_dot_product_attention as lazuli's ops (the composite: no NVIDIA GPU here)";
    }
    let setting = std::env::var("LAZULI_ATTENTION").unwrap_or_default();
    match lazuli::Implementation::parse(&setting) {
        Some(lazuli::Implementation::Cudnn) => "lazuli::scaled_dot_product_attention by cuDNN's flash attention, bf16 q, k, v sliced from the projection",
        Some(lazuli::Implementation::Composite) => {
            "lazuli::scaled_dot_product_attention as lazuli's ops (LAZULI_ATTENTION=composite)"
        }
        _ => "lazuli::scaled_dot_product_attention by lazuli's Triton flash kernels, reading bf16 q, k, v in place from the projection [B, T, 3, H, hd]",
    }
}

/// How a timed loop meets its steps (`lazuli-bench gpu --loops`); every side runs the same loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Loop {
    /// Each step waits for everything it launched (`lazuli::wait()`, `block_until_ready()`,
    /// `torch.cuda.synchronize()`).
    Waiting,
    /// Each step reads its loss to the host (`item()`, `float(loss)`), as a loop that logs it does.
    ReadLoss,
    /// A repetition's steps back to back, one wait at the end.
    Pipelined,
}

impl Loop {
    /// The loop a run without `--loops` times: `--pipelined`, else `LAZULI_BENCH_READ_LOSS=1`, else waiting.
    pub fn from_flags(pipelined: bool) -> Loop {
        match (pipelined, std::env::var("LAZULI_BENCH_READ_LOSS").is_ok_and(|v| v == "1")) {
            (true, _) => Loop::Pipelined,
            (false, true) => Loop::ReadLoss,
            (false, false) => Loop::Waiting,
        }
    }

    /// The column heading of the loops' summary.
    fn heading(self) -> &'static str {
        match self {
            Loop::Waiting => "waiting",
            Loop::ReadLoss => "reading the loss",
            Loop::Pipelined => "pipelined",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Loop::Waiting => "waiting for every step's results",
            Loop::ReadLoss => {
                "every step reads its loss to the host (`item()`, `float(loss)`), as a loop that logs it does \
                 (`LAZULI_BENCH_READ_LOSS=1`)"
            }
            Loop::Pipelined => "pipelined (each repetition's steps back to back, one wait at the end)",
        }
    }

    /// `LAZULI_BENCH_READ_LOSS` for every side's process (lazuli's harness and the Python worker read it).
    fn read_loss_env(self) -> (&'static str, &'static str) {
        ("LAZULI_BENCH_READ_LOSS", if self == Loop::ReadLoss { "1" } else { "0" })
    }
}

/// What a GPU run measures and with what.
pub struct GpuJob {
    /// The model; each side sets its own attention variant.
    pub workload: Workload,
    pub python: PathBuf,
    pub script: PathBuf,
    /// Written by each lazuli process (the same values every time), read by the Python ones.
    pub weights: PathBuf,
    /// Python frameworks after lazuli, in order ("jax", "torch").
    pub frameworks: Vec<String>,
    /// Attention variants per framework, in order.
    pub attentions: Vec<Attention>,
    /// The timed repetitions; `opts.pipelined` follows `lp`.
    pub opts: Options,
    /// How every side's loop meets its steps.
    pub lp: Loop,
    /// lazuli's `LAZULI_DEVICE` (`cpu` for a dry run).
    pub device: String,
    /// The dry-run model (`--tiny`), passed on to the lazuli processes.
    pub tiny: bool,
    /// lazuli's side with checkpointed transformer blocks (`--checkpoint`).
    pub checkpoint: bool,
    /// lazuli's side with its blocks as one scanned body, JAX's with `lax.scan` (`--scan`).
    pub scan: bool,
}

/// One row: a framework with one attention variant.
pub struct GpuSide {
    /// "lazuli", "jax" or "torch".
    pub framework: String,
    pub attention: Attention,
    pub side: Side,
}

pub struct GpuRun {
    pub workload: Workload,
    pub steps_per_rep: usize,
    pub lp: Loop,
    pub sides: Vec<GpuSide>,
}

impl GpuJob {
    /// Every lazuli variant, then every Python framework's variants; a failed side is reported in its row.
    pub fn run(&self) -> BenchResult<GpuRun> {
        for fw in &self.frameworks {
            if !PYTHON_FRAMEWORKS.contains(&fw.as_str()) {
                return Err(format!("unknown framework {fw:?} (expected {})", PYTHON_FRAMEWORKS.join(", ")).into());
            }
        }
        let steps = self.opts.steps.unwrap_or_else(|| default_steps(&self.workload));
        let mut sides = Vec::new();
        for &attention in &self.attentions {
            let side = self.lazuli_process(attention, steps);
            sides.push(GpuSide { framework: "lazuli".into(), attention, side });
        }
        for fw in &self.frameworks {
            for &attention in &self.attentions {
                let side = self.python_process(fw, attention, steps);
                sides.push(GpuSide { framework: fw.clone(), attention, side });
            }
        }
        Ok(GpuRun { workload: self.workload.clone(), steps_per_rep: steps, lp: self.lp, sides })
    }

    /// lazuli's side: this binary again (`lazuli-side`), with `LAZULI_DEVICE` set; one JSON line back.
    fn lazuli_process(&self, attention: Attention, steps: usize) -> Side {
        let mut name = side_name("lazuli", attention);
        if self.checkpoint {
            name.push_str(", checkpointed blocks");
        }
        if self.scan {
            name.push_str(", scanned blocks");
        }
        eprintln!("lazuli-bench: {name} on the {} ({} reps of {steps} steps)", self.device, self.opts.reps);
        let v = self.lazuli_command(attention, steps).unwrap_or_else(|e| json!({"error": e.to_string()}));
        let side = lazuli_side_from_json(name, &v);
        report(&side);
        side
    }

    fn lazuli_command(&self, attention: Attention, steps: usize) -> BenchResult<Value> {
        let out = Command::new(std::env::current_exe()?)
            .args(["lazuli-side", "--workload", &self.workload.name, "--attention", attention.name(), "--weights"])
            .arg(&self.weights)
            .args(["--reps", &self.opts.reps.to_string(), "--steps", &steps.to_string()])
            .args(["--warmup", &self.opts.warmup.to_string()])
            .args(self.opts.pipelined.then_some("--pipelined"))
            .args(self.opts.profile.then_some("--profile"))
            .args(self.tiny.then_some("--tiny"))
            .args(self.checkpoint.then_some("--checkpoint"))
            .args(self.scan.then_some("--scan"))
            .env("LAZULI_DEVICE", &self.device)
            .envs([self.lp.read_loss_env()])
            .stderr(Stdio::inherit())
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        // A failing side prints {"error": ...} as its last line where it can.
        match serde_json::from_str::<Value>(text.lines().last().unwrap_or("")) {
            Ok(v) if out.status.success() || v["error"].is_string() => Ok(v),
            _ => Err(format!("the lazuli side failed ({}); its error output is above", out.status).into()),
        }
    }

    /// One Python framework with one attention variant, in a worker process of its own.
    fn python_process(&self, fw: &str, attention: Attention, steps: usize) -> Side {
        let mut name = side_name(fw, attention);
        if self.scan && fw == "jax" {
            name.push_str(", lax.scan");
        }
        eprintln!("lazuli-bench: {name}");
        let mut side = Side { name, ..Side::default() };
        let mut w = self.workload.clone();
        w.attention = attention;
        let started = Worker::start_with(&self.python, &self.script, fw, &[self.lp.read_loss_env()]);
        let run = started.and_then(|worker| python_side(&mut side, worker, fw, &w, &self.weights, &self.opts, steps));
        if let Err(e) = run {
            side.error = Some(e.to_string().lines().next().unwrap_or("").to_string());
        }
        report(&side);
        side
    }
}

fn report(side: &Side) {
    match &side.error {
        Some(e) => eprintln!("lazuli-bench: {} failed: {e}", side.name),
        None => {
            eprintln!("lazuli-bench: {}: {} per step, first step {:.1} s", side.name, side.steps.show(), side.first_s)
        }
    }
}

/// The lazuli side as its own process's work: write the weights, warm up, time `reps` runs. Printed as one JSON
/// line by `lazuli-bench lazuli-side`.
pub fn lazuli_side(w: &Workload, weights: &Path, opts: &Options) -> BenchResult<Value> {
    let steps = opts.steps.unwrap_or_else(|| default_steps(w));
    let t0 = Instant::now();
    let mut lz = LazuliRun::new(w);
    lz.write_weights(weights)?;
    let init_s = t0.elapsed().as_secs_f64();
    let compiled_before = lazuli::metrics().compile_ms;
    let t0 = Instant::now();
    let first = lz.run(1, false)?;
    let first_s = t0.elapsed().as_secs_f64();
    // The first step's own compiles (setting up the weights compiled small programs before).
    let first_compile_ms = lazuli::metrics().compile_ms - compiled_before;
    let rest = lz.run(opts.warmup.saturating_sub(1), false)?;
    let mut reps = Vec::new();
    let mut splits = Vec::new();
    let mut peak_bytes = None;
    for _ in 0..opts.reps {
        let r = lz.run(steps, opts.pipelined)?;
        reps.push(r.times);
        splits.extend(r.split);
        peak_bytes = r.peak_bytes;
    }
    let profile = if opts.profile { crate::profile::lazuli(&mut lz, steps, opts.pipelined) } else { None };
    report_locator_ahead();
    let s = split_median(&splits).unwrap_or_default();
    let warmup_losses = [first.losses, rest.losses].concat();
    Ok(json!({
        "init_s": init_s, "first_s": first_s, "compile_ms": first_compile_ms, "warmup_losses": warmup_losses,
        "reps": reps, "params": lz.num_params(), "runtime": lazuli::runtime_info()?.to_string(),
        "peak_bytes": peak_bytes, "profile": profile,
        "bytes_limit": lazuli::memory_stats().ok().and_then(|s| s.first().and_then(|m| m.bytes_limit)),
        "split": {"record": s.record, "record_parts": s.record_parts, "execute": s.execute, "programs_per_step": s.programs_per_step,
                  "compiles": s.compiles, "boundary": s.boundary, "upload": s.upload, "finish": s.finish, "wait": s.wait},
    }))
}

/// With the locator ahead (`LAZULI_LOCATE_AHEAD`), whether the locating program's compile and its warm run fell
/// within this side's steps (the peak memory then holds the warm run), and how long each took.
fn report_locator_ahead() {
    let m = lazuli::metrics();
    if m.locate_ahead > 0 {
        eprintln!(
            "lazuli-bench: locator ahead: {} started, {} compiled ({:.1} s), {} warm runs ({:.1} ms, {} with the \
             gradients made again)",
            m.locate_ahead,
            m.locate_compiles,
            m.locate_compile_ms / 1e3,
            m.locate_warm_runs,
            m.locate_warm_ms,
            m.gradients_remade
        );
    }
}

fn lazuli_side_from_json(name: String, v: &Value) -> Side {
    let floats = |v: &Value| -> Vec<f64> {
        v.as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default()
    };
    let f = |key: &str| v["split"][key].as_f64().unwrap_or(f64::NAN);
    let mut side = Side {
        name,
        first_s: v["first_s"].as_f64().unwrap_or(f64::NAN),
        warmup_losses: floats(&v["warmup_losses"]),
        split: Some(Split {
            record: f("record"),
            record_parts: [0, 1, 2].map(|i| v["split"]["record_parts"][i].as_f64().unwrap_or(f64::NAN)),
            execute: f("execute"),
            boundary: f("boundary"),
            upload: f("upload"),
            finish: f("finish"),
            wait: f("wait"),
            programs_per_step: f("programs_per_step"),
            compiles: v["split"]["compiles"].as_u64().unwrap_or(0),
        }),
        info: SetupInfo { framework: v["runtime"].as_str().unwrap_or("?").into(), ..SetupInfo::default() },
        error: v["error"].as_str().map(String::from),
        peak_bytes: v["peak_bytes"].as_f64(),
        profile: crate::profile::from_json(&v["profile"]),
        ..Side::default()
    };
    for rep in v["reps"].as_array().into_iter().flatten() {
        side.steps.push(median(&floats(rep)));
    }
    side
}

/// One Python framework's part of a GPU run, in `side`.
fn python_side(
    side: &mut Side,
    mut worker: Worker,
    fw: &str,
    w: &Workload,
    weights: &Path,
    opts: &Options,
    steps: usize,
) -> BenchResult<()> {
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
    if opts.profile && fw == "jax" {
        side.profile = crate::profile::jax(&mut worker, steps, &weights.with_extension("jax-profile"));
    }
    Ok(())
}

impl GpuRun {
    /// A side that produced step times.
    fn find(&self, framework: &str, attention: Attention) -> Option<&Side> {
        self.sides
            .iter()
            .find(|s| s.framework == framework && s.attention == attention && s.side.error.is_none())
            .map(|s| &s.side)
    }

    /// The side every row's first losses are compared with: lazuli with written-out attention, else fused.
    fn loss_reference(&self) -> Option<&Side> {
        [Attention::Written, Attention::Fused]
            .into_iter()
            .filter_map(|a| self.find("lazuli", a))
            .find(|s| !s.warmup_losses.is_empty())
    }

    /// The whole report: header, table, goal, lazuli's step split, first losses.
    pub fn print(&self, command: &str) {
        self.print_header(command);
        self.print_table();
        self.print_goal();
        let profiles: Vec<(&str, &lazuli::diagnostics::DeviceProfile)> =
            self.sides.iter().filter_map(|s| Some((s.side.name.as_str(), s.side.profile.as_ref()?))).collect();
        crate::profile::print(&profiles);
        for s in self.sides.iter().filter(|s| s.framework == "lazuli") {
            if let (Some(split), None) = (s.side.split, &s.side.error) {
                let phases: Vec<String> = split.phases().iter().map(|(n, t)| format!("{n} {}", duration(*t))).collect();
                println!(
                    "\n{} per step: {}, {:.0} program(s), {} compile(s) while timed",
                    s.side.name,
                    phases.join(", "),
                    split.programs_per_step,
                    split.compiles
                );
                let [forward, backward, update] = split.record_parts.map(duration);
                // A split step (two programs) launches the gradients inside the optimizer's `step()`.
                let launch = if split.programs_per_step >= 2.0 { ", with the gradients' launch" } else { "" };
                println!("(recording: forward {forward}, backward {backward}, optimizer update {update}{launch})");
            }
        }
        println!();
        for s in &self.sides {
            println!("losses (first steps): {} {:?}", s.side.name, s.side.warmup_losses);
        }
    }

    fn print_header(&self, command: &str) {
        println!("## lazuli-bench gpu, {}", today());
        println!("- command: `{command}`");
        println!("- host: {}; allocator: {}", machine(), crate::ALLOCATOR);
        println!("- mode: {}", self.lp.describe());
        for s in self.sides.iter().filter(|s| s.side.error.is_none()) {
            let i = &s.side.info;
            if s.framework == "lazuli" {
                let attn = match s.attention {
                    Attention::Written => "written out (bf16 matmuls, f32 mask and softmax)",
                    Attention::Fused => fused_attention_kernels(i.framework.starts_with("cuda")),
                };
                println!("- {}: {}; attention: {attn}", s.side.name, i.framework);
            } else {
                println!(
                    "- {}: {} on {}, Python {}; attention: {}",
                    s.side.name, i.framework, i.device, i.python, i.attention
                );
            }
        }
        let Model::Gpt { config, seq } = &self.workload.model else { return };
        let (l, d, t) = (config.n_layer as f64, config.d_model as f64, *seq as f64);
        let per_token = config.train_flops_per_token(*seq);
        let n = (per_token - 12.0 * l * d * t) / 6.0;
        let per_step = per_token * self.workload.items_per_step() as f64;
        println!(
            "- model: {}, {} tokens per step; FLOPs per token 6N + 12·L·d·T = 6·{:.1}M + 12·{l}·{d}·{t} = {:.0} MFLOP \
             (N: parameters without the position table; attention counted in full, fused or not), {:.2} TFLOP \
             per step",
            self.workload.name,
            self.workload.items_per_step(),
            n / 1e6,
            per_token / 1e6,
            per_step / 1e12
        );
        println!("- MFU: FLOPs per step ÷ step time ÷ 989 TFLOP/s (the dense bf16 peak of an H100 or H200 SXM)");
    }

    fn print_table(&self) {
        let tokens = self.workload.items_per_step() as f64;
        let flops = match &self.workload.model {
            Model::Gpt { config, seq } => config.train_flops_per_token(*seq) * tokens,
            Model::Mlp { .. } => f64::NAN,
        };
        let reference = self.loss_reference();
        let sdpa = self.find("torch", Attention::Fused).map(|s| s.steps.median());
        println!(
            "\n| framework | ms/step median (min–max) | tokens/s | MFU | vs JAX jit, same attention | vs torch.compile \
             (SDPA) | first step incl. compile | peak memory | losses agree with {} |",
            reference.map_or("lazuli", |r| r.name.as_str())
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for s in &self.sides {
            let side = &s.side;
            if let Some(e) = &side.error {
                println!("| {} | failed: {e} | | | | | | | |", side.name);
                continue;
            }
            let m = side.steps.median();
            let jax = self.find("jax", s.attention).map(|j| j.steps.median());
            let ratio = |r: Option<f64>| r.map_or("–".to_string(), |r| format!("{:.2}", m / r));
            let agree = match reference {
                Some(r) if std::ptr::eq(r, side) => "(reference)".to_string(),
                Some(r) => match losses_agree(&r.warmup_losses, &side.warmup_losses, loss_tolerance(&self.workload)) {
                    Ok(()) => "yes".into(),
                    Err(e) => format!("NO: {e}"),
                },
                None => "– (no lazuli losses)".into(),
            };
            println!(
                "| {} | {} | {:.0} | {:.1}% | {} | {} | {} | {} | {agree} |",
                side.name,
                side.steps.show(),
                tokens / m,
                100.0 * flops / m / PEAK_FLOPS,
                ratio(jax),
                ratio(sdpa),
                duration(side.first_s),
                side.peak_bytes.map_or("–".to_string(), |b| format!("{:.2} GiB", b / (1u64 << 30) as f64))
            );
        }
    }

    fn print_goal(&self) {
        let lazuli = self.find("lazuli", Attention::Fused);
        let sdpa = self.find("torch", Attention::Fused);
        if let (Some(l), Some(t)) = (lazuli, sdpa) {
            println!("\n{}", goal_line(l, t));
        }
    }
}

/// The loops of one command side by side: each row's ms/step per loop (median of its repetitions, min–max), and
/// each lazuli row's ratio to every other row, loop by loop.
pub fn print_loops(runs: &[GpuRun]) {
    print!("{}", loops_table(runs));
}

fn loops_table(runs: &[GpuRun]) -> String {
    use std::fmt::Write;
    let Some(first) = runs.first() else { return String::new() };
    let mut out = String::from("\n## The loops side by side\n\n");
    let headings: Vec<String> = runs.iter().map(|r| format!("{} ms/step", r.lp.heading())).collect();
    let _ = writeln!(out, "| framework | {} | peak memory ({}) |", headings.join(" | "), first.lp.heading());
    let _ = writeln!(out, "|---|{}---|", "---|".repeat(runs.len()));
    for s in &first.sides {
        let cells: Vec<String> = runs.iter().map(|r| step(r, &s.side.name).map_or("–".into(), |t| t.show())).collect();
        let peak = s.side.peak_bytes.map_or("–".to_string(), |b| format!("{:.2} GiB", b / (1u64 << 30) as f64));
        let _ = writeln!(out, "| {} | {} | {peak} |", s.side.name, cells.join(" | "));
    }
    out.push('\n');
    for l in first.sides.iter().filter(|s| s.framework == "lazuli") {
        for o in first.sides.iter().filter(|s| s.framework != "lazuli") {
            let ratios: Vec<String> = runs
                .iter()
                .filter_map(|r| {
                    let (a, b) = (step(r, &l.side.name)?, step(r, &o.side.name)?);
                    Some(format!("{} {:.2}", r.lp.heading(), a.median() / b.median()))
                })
                .collect();
            let _ = writeln!(out, "{} / {}: {}", l.side.name, o.side.name, ratios.join(", "));
        }
    }
    out
}

/// The step times of `run`'s row `name`, if it ran and timed steps.
fn step<'a>(run: &'a GpuRun, name: &str) -> Option<&'a crate::stats::Spread> {
    let ran = |s: &&GpuSide| s.side.name == name && s.side.error.is_none() && !s.side.steps.values.is_empty();
    run.sides.iter().find(ran).map(|s| &s.side.steps)
}

/// A row whose repetitions spread more than this (max − min over the median) makes the goal's verdict uncertain.
const NOISY_SPREAD: f64 = 0.10;

/// `goal: lazuli (…) ≤ 0.8× torch.compile (…): 0.82×, not met`; a ratio from a row whose repetitions disagree by
/// more than [`NOISY_SPREAD`] is called uncertain, with the spread, instead of met or not.
fn goal_line(lazuli: &Side, torch: &Side) -> String {
    let r = lazuli.steps.median() / torch.steps.median();
    let noisy: Vec<String> = [lazuli, torch]
        .iter()
        .filter(|s| s.steps.relative_spread() > NOISY_SPREAD)
        .map(|s| {
            format!("{}'s repetitions spread {:.0}% ({})", s.name, 100.0 * s.steps.relative_spread(), s.steps.show())
        })
        .collect();
    let verdict = match (r <= GOAL_VS_TORCH_SDPA, noisy.is_empty()) {
        (true, true) => "met".to_string(),
        (false, true) => "not met".to_string(),
        (met, false) => {
            let word = if met { "met in this run" } else { "not met in this run" };
            format!("{word}, uncertain: {}; run it again before counting it", noisy.join("; "))
        }
    };
    format!("goal: {} ≤ {GOAL_VS_TORCH_SDPA}× {}: {r:.2}×, {verdict}", lazuli.name, torch.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Spread;

    fn side(name: &str, ms: &[f64]) -> Side {
        Side { name: name.into(), steps: Spread { values: ms.iter().map(|m| m / 1e3).collect() }, ..Side::default() }
    }

    fn run(lp: Loop, lazuli_ms: &[f64], torch_ms: &[f64]) -> GpuRun {
        let row = |framework: &str, ms: &[f64]| GpuSide {
            framework: framework.into(),
            attention: Attention::Fused,
            side: side(&side_name(framework, Attention::Fused), ms),
        };
        GpuRun {
            workload: Workload::gpt2_small_gpu(),
            steps_per_rep: 10,
            lp,
            sides: vec![row("lazuli", lazuli_ms), row("torch", torch_ms)],
        }
    }

    /// Report of perf log #52's call 2, loop by loop.
    #[test]
    fn the_loops_table_has_a_column_and_a_ratio_per_loop() {
        let runs = [
            run(Loop::Waiting, &[16.8, 16.8, 16.8], &[20.9, 20.9, 22.0]),
            run(Loop::ReadLoss, &[16.1, 16.3, 16.3], &[20.8, 21.1, 22.2]),
            run(Loop::Pipelined, &[15.6, 15.8, 16.1], &[]),
        ];
        let table = loops_table(&runs);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines.contains(
            &"| framework | waiting ms/step | reading the loss ms/step | pipelined ms/step | peak memory (waiting) |"
        ));
        assert!(lines.contains(&"|---|---|---|---|---|"), "{table}");
        assert!(
            lines.contains(&"| lazuli (fused attention) | 16.8 ms (16.8 ms–16.8 ms) | 16.3 ms (16.1 ms–16.3 ms) | 15.8 ms (15.6 ms–16.1 ms) | – |"),
            "{table}"
        );
        // A loop whose row has no steps (here torch's pipelined one) shows a dash and has no ratio.
        assert!(lines.iter().any(|l| l.starts_with("| torch.compile (SDPA) |") && l.contains("| – | – |")), "{table}");
        assert!(
            lines.contains(&"lazuli (fused attention) / torch.compile (SDPA): waiting 0.80, reading the loss 0.77"),
            "{table}"
        );
        assert_eq!(loops_table(&[]), "");
    }

    /// Call 4 of the packed-attention log: torch.compile's pipelined repetitions spread 15%.
    #[test]
    fn a_goal_against_a_noisy_row_is_uncertain() {
        let lazuli = side("lazuli (fused attention)", &[16.7, 16.8, 16.8]);
        let noisy = side("torch.compile (SDPA)", &[23.8, 26.5, 27.7]);
        let line = goal_line(&lazuli, &noisy);
        assert!(
            line.contains("0.63×, met in this run, uncertain: torch.compile (SDPA)'s repetitions spread 15%"),
            "{line}"
        );
        let steady = side("torch.compile (SDPA)", &[22.6, 22.8, 24.1]);
        assert!(goal_line(&lazuli, &steady).ends_with("0.74×, met"), "{}", goal_line(&lazuli, &steady));
        let slow = side("lazuli (fused attention)", &[18.6, 18.6, 18.6]);
        assert!(goal_line(&slow, &steady).ends_with("0.82×, not met"), "{}", goal_line(&slow, &steady));
    }
}
