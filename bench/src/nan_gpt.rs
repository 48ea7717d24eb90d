//! `lazuli-bench nan --workload gpt2`: the planted NaN of [`crate::nan`] in the GPT-2 step of the GPU benchmarks
//! (`gpt_bf16`: bf16 matmuls, fused attention; AdamW as `Workload::gpt2_small_gpu`), lazuli alone. Block
//! `planted` adds `log(m·m + poison)` of its MLP branch `m` to the residual stream instead of `m`; `poison` is 1
//! until the bad step and −1e30 at it, where that `log` makes NaN from finite inputs.
//!
//! Measured, each setting in a process of its own, in rounds of the three alternated (`--rounds`, the machine's
//! noise is larger than the check's cost): the step (each reading its loss) without the check, with `stop` and
//! with `skip`; and under the first round's `stop` the time from the start of the bad step to its error (the bad
//! step's own loss read, which has waited for it, reads its check), split by the runtime's metrics into waiting
//! for the check, building the locator's program (its graph and IR), its compile, its run (uploads, execution,
//! reading back) and the rest (the bad step, the report); whether the error names the planted op and line; and the
//! issue's goal, (trip − one compile) / step ≤ 3. With the locator ahead (`LAZULI_LOCATE_AHEAD`, on by default on
//! NVIDIA GPUs) each process first steps until the locating program compiled ahead has run once, and a trip
//! compiles nothing.

use std::process::{Command, Stdio};
use std::time::Instant;

use lazuli::nn::{Gpt, GptConfig, HostRng};
use lazuli::{AdamW, Optimizer, Tensor};
use serde_json::{json, Value};

use crate::gpt_bf16;
use crate::nan::{names_planted_log, planted_log};
use crate::stats::{duration, machine, median, today, Spread};
use crate::workloads::{Attention, Opt, Workload};
use crate::BenchResult;

/// The goal for the time from a trip to the named op, in steps (one compile allowed on top).
const GOAL_STEPS: f64 = 3.0;

/// The model's sizes and the run's length.
#[derive(Clone, Copy, Debug)]
pub struct GptNanConfig {
    pub batch: usize,
    pub seq: usize,
    pub layers: usize,
    /// Width of the residual stream; one head per 64.
    pub dim: usize,
    pub vocab: usize,
    /// The block whose MLP branch takes the planted `log`.
    pub planted: usize,
    /// Timed steps before the bad one.
    pub steps: usize,
}

impl GptNanConfig {
    /// GPT-2 small as the GPU benchmarks run it: B = 8, T = 1024, 12 layers of d = 768, vocabulary 50304.
    pub fn gpt2_small() -> GptNanConfig {
        GptNanConfig { batch: 8, seq: 1024, layers: 12, dim: 768, vocab: 50304, planted: 5, steps: 10 }
    }

    /// The dry-run size (as `gpu --tiny`): B = 2, T = 64, 2 layers of d = 128, vocabulary 512.
    pub fn tiny() -> GptNanConfig {
        GptNanConfig { batch: 2, seq: 64, layers: 2, dim: 128, vocab: 512, planted: 1, steps: 10 }
    }

    fn args(&self) -> Vec<String> {
        let pairs = [
            ("--batch", self.batch),
            ("--seq", self.seq),
            ("--layers", self.layers),
            ("--dim", self.dim),
            ("--vocab", self.vocab),
            ("--planted", self.planted),
            ("--steps", self.steps),
        ];
        pairs.iter().flat_map(|(k, v)| [k.to_string(), v.to_string()]).collect()
    }

    fn gpt(&self) -> GptConfig {
        GptConfig {
            n_layer: self.layers,
            d_model: self.dim,
            n_head: (self.dim / 64).max(1),
            block_size: self.seq,
            dropout: 0.0,
            ..GptConfig::gpt2_small(self.vocab)
        }
    }
}

/// The model and the GPU benchmarks' AdamW.
fn model(cfg: &GptNanConfig) -> BenchResult<(Gpt, AdamW)> {
    let gpt = Gpt::new(&mut HostRng::new(1), cfg.gpt());
    let Opt::AdamW { lr, beta1, beta2, eps, weight_decay } = Workload::gpt2_small_gpu().opt else {
        return Err("the GPU workload's optimizer is not AdamW".into());
    };
    let opt =
        AdamW::new(lazuli::Module::named_params(&gpt), lr).betas(beta1, beta2).eps(eps).weight_decay(weight_decay);
    Ok((gpt, opt))
}

/// In the child (`nan-gpt-side`): the step and, with `trip`, the bad step and its error, under the process's
/// `LAZULI_CHECK_FINITE`, as one JSON line.
pub fn side(cfg: GptNanConfig, trip: bool) -> BenchResult<Value> {
    let (gpt, mut opt) = model(&cfg)?;
    let mut data = HostRng::new(1001);
    let vocab = cfg.vocab as u64;
    let ids: Vec<i32> = (0..cfg.batch * cfg.seq).map(|_| data.below(vocab) as i32).collect();
    // Each target a fixed function of its token, as in the GPU workload: the loss falls from the first step.
    let targets: Vec<i32> = ids.iter().map(|&t| ((t as u64 * 7 + 3) % vocab) as i32).collect();
    let mut step = |poison: f64| -> BenchResult<f32> {
        let x = Tensor::from_slice(&ids, &[cfg.batch, cfg.seq]);
        let y = Tensor::from_slice(&targets, &[cfg.batch, cfg.seq]);
        let plant = |m: &Tensor| planted_log(m, poison);
        let loss = gpt_bf16::loss_planted(&gpt, &x, &y, Attention::Fused, Some((cfg.planted, &plant)))?;
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync()?;
        Ok(loss.item::<f32>()?)
    };
    let (t0, before) = (Instant::now(), lazuli::metrics());
    let first_loss = step(1.0)?;
    let first_s = t0.elapsed().as_secs_f64();
    let first = lazuli::metrics() - before;
    step(1.0)?;
    let mut times = Vec::with_capacity(cfg.steps);
    for _ in 0..cfg.steps {
        let t0 = Instant::now();
        step(1.0)?;
        times.push(t0.elapsed().as_secs_f64());
    }
    let runtime = lazuli::runtime_info()?.to_string();
    let params = lazuli::Module::num_params(&gpt);
    if !trip {
        return Ok(json!({ "step_s": median(&times), "first_s": first_s, "first_loss": first_loss,
            "first_compile_s": first.compile_ms / 1e3, "first_from_disk": first.disk_cache_hits > 0,
            "params": params, "runtime": runtime }));
    }
    // The locator ahead (`LAZULI_LOCATE_AHEAD`, on by default on NVIDIA GPUs once a step has trained for
    // `lazuli::LOCATE_AHEAD_AFTER`): more steps until the locating programs compiled on threads are done, and three
    // more (the next check read runs the step's once), so that the trip is timed as a long run has it.
    let config = lazuli::Config::from_env()?;
    let locates = matches!(config.check_finite, lazuli::CheckFinite::Stop | lazuli::CheckFinite::Log);
    let ahead = locates && config.locate_ahead_after().is_some();
    let (waiting, mut ahead_steps) = (Instant::now(), 0);
    let compiling = || {
        let m = lazuli::metrics();
        m.locate_ahead == 0 || m.locate_compiles < m.locate_ahead
    };
    while ahead && compiling() && waiting.elapsed().as_secs() < 300 {
        step(1.0)?;
        ahead_steps += 1;
    }
    for _ in 0..if ahead { 3 } else { 0 } {
        step(1.0)?;
    }
    let ahead_s = waiting.elapsed().as_secs_f64();
    let before = lazuli::metrics();
    let t0 = Instant::now();
    // The bad step, and two more should its check not be read by its own loss read (it is read once two later
    // steps are launched at the latest; they keep the state from before the bad one).
    let mut trip = || step(-1e30).and_then(|_| step(1.0)).and_then(|_| step(1.0));
    // `LAZULI_BENCH_PROFILE_TRIP=1`: the device's kernels over the trip (the locating program's among them), on
    // stderr; the trip's time then includes the profiler's.
    let outcome = match std::env::var_os("LAZULI_BENCH_PROFILE_TRIP") {
        Some(_) => {
            let (outcome, profile) = lazuli::profile(1, trip)?;
            eprintln!("the trip's device time:\n{profile}");
            outcome
        }
        None => trip(),
    };
    let trip_s = t0.elapsed().as_secs_f64();
    let m = lazuli::metrics() - before;
    let text = outcome.as_ref().err().map(|e| e.to_string()).unwrap_or_default();
    let (planted_line, names_line) = names_planted_log(&text);
    let message = match &outcome {
        Ok(v) => format!("no error (loss {v})"),
        Err(_) => text.lines().next().unwrap_or("").to_string(),
    };
    let located = text.lines().find(|l| l.contains("first non-finite value")).unwrap_or("").trim().to_string();
    Ok(json!({
        "step_s": median(&times), "first_s": first_s, "first_loss": first_loss, "trip_s": trip_s,
        "first_compile_s": first.compile_ms / 1e3, "first_from_disk": first.disk_cache_hits > 0,
        "check_read_s": m.finite_read_ms / 1e3, "locate_compiles": m.locate_compiles,
        "locate_compile_s": m.locate_compile_ms / 1e3,
        "locate_run_s": m.locate_run_ms / 1e3, "locate_build_s": m.locate_build_ms / 1e3,
        "ahead": ahead, "ahead_steps": ahead_steps, "ahead_s": ahead_s, "ahead_programs": before.locate_ahead,
        "warm_runs": before.locate_warm_runs,
        "ahead_compile_s": before.locate_compile_ms / 1e3, "locate_warm_s": before.locate_warm_ms / 1e3,
        "message": message, "located": located, "names_line": names_line, "planted_line": planted_line,
        "params": params, "runtime": runtime,
    }))
}

fn child(cfg: GptNanConfig, check: &str, device: &str, trip: bool) -> BenchResult<Value> {
    eprintln!("lazuli-bench: nan, gpt2, LAZULI_CHECK_FINITE={check} on the {device}");
    let out = Command::new(std::env::current_exe()?)
        .arg("nan-gpt-side")
        .args(cfg.args())
        .args((!trip).then_some("--no-trip"))
        .env("LAZULI_CHECK_FINITE", check)
        .env("LAZULI_DEVICE", device)
        // The first step compiles, to set beside the locator's compile.
        .env("LAZULI_COMPILE_CACHE", "off")
        .stderr(Stdio::inherit())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    match serde_json::from_str::<Value>(text.lines().last().unwrap_or("")) {
        Ok(v) if v["error"].is_string() => Err(format!("nan-gpt-side: {}", v["error"]).into()),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("nan-gpt-side failed ({})", out.status).into()),
    }
}

fn seconds(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

/// The GPT-2 case, printed as two tables: the step under each setting (its median over `rounds` rounds of the
/// three, alternated, a process each), and the trip under `stop` (timed in the first round).
pub fn run(cfg: GptNanConfig, device: &str, rounds: usize) -> BenchResult<()> {
    const SETTINGS: [&str; 3] = ["off", "stop", "skip"];
    let mut sides: Vec<Vec<Value>> = vec![Vec::new(); SETTINGS.len()];
    let mut failed: Vec<Option<String>> = vec![None; SETTINGS.len()];
    let mut trip = None;
    for round in 0..rounds {
        for (i, check) in SETTINGS.iter().enumerate() {
            let timed_trip = round == 0 && *check == "stop";
            match child(cfg, check, device, timed_trip) {
                Ok(v) if timed_trip => {
                    trip = Some(v.clone());
                    sides[i].push(v);
                }
                Ok(v) => sides[i].push(v),
                // `off` and `stop` are what the table is about; `skip` may fail alone.
                Err(e) if *check == "skip" => failed[i] = Some(e.to_string()),
                Err(e) => return Err(e),
            }
        }
    }
    let trip = trip.ok_or("nan: the first round's `stop` did not run")?;
    println!("## lazuli-bench nan, gpt2, {}", today());
    println!("- command: `{}`", std::env::args().collect::<Vec<_>>().join(" "));
    println!("- host: {}; lazuli's device: {device} ({})", machine(), trip["runtime"].as_str().unwrap_or("?"));
    println!(
        "- model: GPT ({} parameters), {} layers of d = {}, B = {}, T = {}, vocabulary {}, bf16 matmuls, fused \
         attention, AdamW; block {} adds log(m·m + poison) of its MLP branch, poison −1e30 at the bad step; each \
         step reads its loss; {} timed steps (median) per process, {rounds} rounds of the three settings \
         alternated",
        trip["params"], cfg.layers, cfg.dim, cfg.batch, cfg.seq, cfg.vocab, cfg.planted, cfg.steps
    );
    let steps = |i: usize| {
        let mut s = Spread::default();
        sides[i].iter().for_each(|v| s.push(seconds(v, "step_s")));
        s
    };
    let step_off = steps(0).median();
    println!("\n| `LAZULI_CHECK_FINITE` | step, median of the rounds (min–max) | cost against off | first step | its compile |");
    println!("|---|---|---|---|---|");
    for (i, name) in SETTINGS.iter().enumerate() {
        let (Some(first), None) = (sides[i].first(), &failed[i]) else {
            println!("| {name} | failed: {} | | | |", failed[i].as_deref().unwrap_or("no result"));
            continue;
        };
        let s = steps(i);
        let from = if first["first_from_disk"].as_bool() == Some(true) { " (from the disk cache)" } else { "" };
        println!(
            "| {name} | {} | {:+.1}% | {} | {}{from} |",
            s.show(),
            100.0 * (s.median() / step_off - 1.0),
            duration(seconds(first, "first_s")),
            duration(seconds(first, "first_compile_s"))
        );
    }
    print_trip(&trip);
    Ok(())
}

/// The trip under `stop`: where its time went and the goal's ratio.
fn print_trip(stop: &Value) {
    let (trip, step) = (seconds(stop, "trip_s"), seconds(stop, "step_s"));
    let (read, compile, runs) =
        (seconds(stop, "check_read_s"), seconds(stop, "locate_compile_s"), seconds(stop, "locate_run_s"));
    let built = seconds(stop, "locate_build_s");
    let compiles = stop["locate_compiles"].as_u64().unwrap_or(0);
    let rest = trip - read - built - compile - runs;
    // The goal allows one compile on top of the steps; a locator that compiled more pays for the others.
    let one_compile = if compiles > 0 { compile / compiles as f64 } else { 0.0 };
    let ratio = (trip - one_compile) / step;
    println!(
        "\n| bad step to error | waiting for the check | locator built (graph, IR) | locator compiles | locator runs \
         | rest (the bad step and any after it, the report) | (trip − one compile) / step | goal |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} ({compiles}) | {} | {} | {ratio:.1} | ≤ {GOAL_STEPS} ({}) |",
        duration(trip),
        duration(read),
        duration(built),
        duration(compile),
        duration(runs),
        duration(rest),
        if ratio <= GOAL_STEPS { "met" } else { "not met" }
    );
    println!(
        "\nNames the planted line and op: {} (planted at line {}). The error: `{}`; `{}`",
        stop["names_line"],
        stop["planted_line"],
        stop["message"].as_str().unwrap_or(""),
        stop["located"].as_str().unwrap_or("")
    );
}
