//! `lazuli-bench nan`: the same planted NaN caught by lazuli (`LAZULI_CHECK_FINITE=stop`), PyTorch
//! (`torch.autograd.detect_anomaly`, eager) and JAX (`jax_debug_nans`): each side's step time without and with its
//! checking, the time from the bad step's start to the error, and whether the error names the planted line.
//!
//! The model (here and in `python/nan_compare.py`): a residual MLP, `h += tanh(h @ a) @ b` per layer, loss
//! `mean(h²)`, SGD; layer `planted` takes `log(y * y + poison)`. With `poison = 1` all is finite; at the bad step
//! `poison = -1e30`, and that `log` makes NaN from finite inputs. Each framework draws its own weights.

use std::cell::Cell;
use std::panic::Location;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use lazuli::nn::{HostRng, Param};
use lazuli::{Optimizer, Sgd, Tensor};
use serde_json::{json, Value};

use crate::stats::{duration, machine, today};
use crate::BenchResult;

const SCRIPT: &str = include_str!("../python/nan_compare.py");

/// The model's sizes and the run's length.
#[derive(Clone, Copy, Debug)]
pub struct NanConfig {
    pub batch: usize,
    pub dim: usize,
    pub layers: usize,
    pub planted: usize,
    pub steps: usize,
}

impl NanConfig {
    fn json(&self) -> Value {
        json!({"batch": self.batch, "dim": self.dim, "layers": self.layers, "planted": self.planted, "steps": self.steps})
    }
}

thread_local! {
    /// Where the planted `log` was recorded, noted when it is.
    static PLANTED_AT: Cell<Option<&'static Location<'static>>> = const { Cell::new(None) };
}

/// `log(y * y + poison)`, recorded at the caller's line (the ops take their line from their caller).
#[track_caller]
pub(crate) fn planted_log(y: &Tensor, poison: f64) -> Tensor {
    let at = Location::caller();
    PLANTED_AT.with(|l| l.set(Some(at)));
    (y * y + poison).log()
}

/// The planted `log`'s line, and whether `error` names the op at that line as the first non-finite value.
pub(crate) fn names_planted_log(error: &str) -> (u32, bool) {
    match PLANTED_AT.with(|l| l.get()) {
        Some(at) => (at.line(), error.contains(&format!("first non-finite value: log at {}:{}", at.file(), at.line()))),
        None => (0, false),
    }
}

fn forward(ws: &[(Param, Param)], x: &Tensor, poison: f64, planted: usize) -> Tensor {
    let mut h = x.clone();
    for (i, (a, b)) in ws.iter().enumerate() {
        let mut y = h.matmul(&a.get()).tanh().matmul(&b.get());
        if i == planted {
            y = planted_log(&y, poison);
        }
        h = h + y;
    }
    (&h * &h).mean_all()
}

/// In the child (`nan-side`): the lazuli side under the process's `LAZULI_CHECK_FINITE`, as one JSON line.
pub fn side(cfg: NanConfig) -> BenchResult<Value> {
    let mut rng = HostRng::new(1);
    let d = cfg.dim;
    let init = |rng: &mut HostRng, rows: usize, cols: usize| {
        let scale = 0.5 / (rows as f64).sqrt();
        let v: Vec<f32> = (0..rows * cols).map(|_| (rng.normal() * scale) as f32).collect();
        Param::new(Tensor::from_slice(&v, &[rows, cols]))
    };
    let ws: Vec<(Param, Param)> =
        (0..cfg.layers).map(|_| (init(&mut rng, d, 2 * d), init(&mut rng, 2 * d, d))).collect();
    let x: Vec<f32> = (0..cfg.batch * d).map(|_| rng.normal() as f32).collect();
    let x = Tensor::from_slice(&x, &[cfg.batch, d]);
    let named: Vec<(String, Param)> = ws
        .iter()
        .enumerate()
        .flat_map(|(i, (a, b))| [(format!("{i}.a"), a.clone()), (format!("{i}.b"), b.clone())])
        .collect();
    let mut opt = Sgd::new(named, 1e-3);
    let mut step = |poison: f64| -> lazuli::Result<f32> {
        let loss = forward(&ws, &x, poison, cfg.planted);
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync()?;
        loss.item::<f32>()
    };
    for _ in 0..2 {
        step(1.0)?;
    }
    let t0 = Instant::now();
    for _ in 0..cfg.steps {
        step(1.0)?;
    }
    let step_s = t0.elapsed().as_secs_f64() / cfg.steps as f64;
    let before = lazuli::metrics();
    let t0 = Instant::now();
    // The bad step, and two more should its check not be read by its own loss read (at the latest it is read once
    // two later steps are launched).
    let outcome = step(-1e30).and_then(|_| step(1.0)).and_then(|_| step(1.0));
    let trip_s = t0.elapsed().as_secs_f64();
    let m = lazuli::metrics() - before;
    let (planted_line, names_line) = match &outcome {
        Ok(_) => names_planted_log(""),
        Err(e) => names_planted_log(&e.to_string()),
    };
    let message = match &outcome {
        Ok(v) => format!("no error (loss {v})"),
        Err(e) => e.to_string().lines().next().unwrap_or("").to_string(),
    };
    Ok(json!({"step_s": step_s, "trip_s": trip_s, "message": message, "names_line": names_line,
              "check_read_s": m.finite_read_ms / 1e3, "locate_compiles": m.locate_compiles,
              "locate_compile_s": m.locate_compile_ms / 1e3, "locate_run_s": m.locate_run_ms / 1e3,
              "planted_line": planted_line, "runtime": lazuli::runtime_info()?.to_string()}))
}

fn lazuli_child(cfg: NanConfig, check: &str, device: &str) -> BenchResult<Value> {
    let out = Command::new(std::env::current_exe()?)
        .args(["nan-side", "--batch", &cfg.batch.to_string(), "--dim", &cfg.dim.to_string()])
        .args(["--layers", &cfg.layers.to_string(), "--planted", &cfg.planted.to_string()])
        .args(["--steps", &cfg.steps.to_string()])
        .env("LAZULI_CHECK_FINITE", check)
        .env("LAZULI_DEVICE", device)
        .stderr(Stdio::inherit())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or(""))
        .map_err(|_| format!("nan-side failed ({})", out.status).into())
}

fn python_child(python: &Path, dir: &Path, framework: &str, cfg: NanConfig) -> BenchResult<Value> {
    let script = dir.join("nan_compare.py");
    std::fs::write(&script, SCRIPT)?;
    let out = Command::new(python)
        .arg(&script)
        .arg(framework)
        .arg(cfg.json().to_string())
        .stderr(Stdio::inherit())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or(""))
        .map_err(|_| format!("failed: the {framework} side exited with {}", out.status).into())
}

/// The whole comparison, printed as a table.
pub fn run(cfg: NanConfig, python: &Path, device: &str) -> BenchResult<()> {
    let dir = std::env::temp_dir().join(format!("lazuli-nan-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let plain = lazuli_child(cfg, "off", device);
    let checked = lazuli_child(cfg, "stop", device);
    let skipping = lazuli_child(cfg, "skip", device);
    // The harness's own environment has no PyTorch: PyPI's Linux wheel brings the CUDA libraries (gigabytes).
    let torch = match crate::pyenv::imports(python, "torch") {
        true => python_child(python, &dir, "torch", cfg),
        false => Err(format!(
            "not run: {} has no PyTorch (the harness does not install it; --python a Python that has it)",
            python.display()
        )
        .into()),
    };
    let jax = python_child(python, &dir, "jax", cfg);
    let _ = std::fs::remove_dir_all(&dir);
    println!("## lazuli-bench nan, {}", today());
    println!("- command: `{}`", std::env::args().collect::<Vec<_>>().join(" "));
    println!("- host: {}; lazuli's device: {device}", machine());
    println!(
        "- model: residual MLP, {} layers of {}→{}→{}, batch {}, f32, SGD; layer {} takes log(y·y + poison), \
         poison −1e30 at the bad step; each step reads its loss",
        cfg.layers,
        cfg.dim,
        2 * cfg.dim,
        cfg.dim,
        cfg.batch,
        cfg.planted
    );
    println!("\n| framework, checking | step | step with checking | cost | bad step to error | names the planted line | first line of the error |");
    println!("|---|---|---|---|---|---|---|");
    match (&plain, &checked) {
        (Ok(p), Ok(c)) => {
            let (ps, cs) = (p["step_s"].as_f64().unwrap_or(f64::NAN), c["step_s"].as_f64().unwrap_or(f64::NAN));
            println!(
                "| lazuli, `LAZULI_CHECK_FINITE=stop` | {} | {} | {:+.1}% | {} | {} | {} |",
                duration(ps),
                duration(cs),
                100.0 * (cs / ps - 1.0),
                duration(c["trip_s"].as_f64().unwrap_or(f64::NAN)),
                c["names_line"],
                c["message"].as_str().unwrap_or("")
            );
        }
        (p, c) => println!(
            "| lazuli | failed: {:?} {:?} | | | | | |",
            p.as_ref().err().map(|e| e.to_string()),
            c.as_ref().err().map(|e| e.to_string())
        ),
    }
    if let (Ok(p), Ok(s)) = (&plain, &skipping) {
        let (ps, ss) = (p["step_s"].as_f64().unwrap_or(f64::NAN), s["step_s"].as_f64().unwrap_or(f64::NAN));
        println!(
            "| lazuli, `LAZULI_CHECK_FINITE=skip` | {} | {} | {:+.1}% | (skipped, no error) | no (skip does not locate) | {} |",
            duration(ps),
            duration(ss),
            100.0 * (ss / ps - 1.0),
            s["message"].as_str().unwrap_or("")
        );
    }
    for side in [&torch, &jax] {
        match side {
            Ok(v) => {
                let (ps, cs) = (v["plain_s"].as_f64().unwrap_or(f64::NAN), v["checked_s"].as_f64().unwrap_or(f64::NAN));
                println!(
                    "| {} ({}) | {} | {} | {:+.1}% | {} | {} | {} |",
                    v["framework"].as_str().unwrap_or("?"),
                    v["device"].as_str().unwrap_or("?"),
                    duration(ps),
                    duration(cs),
                    100.0 * (cs / ps - 1.0),
                    duration(v["trip_s"].as_f64().unwrap_or(f64::NAN)),
                    v["names_line"],
                    v["message"].as_str().unwrap_or("")
                );
            }
            Err(e) => println!("| (python side) | {} | | | | | |", e.to_string().lines().next().unwrap_or("")),
        }
    }
    Ok(())
}
