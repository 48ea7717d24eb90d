//! The `compile` workload: the gpt-tiny training step's first step in a new process, cold (an empty persistent
//! compile cache: XLA compiles) against warm (the cache that the cold process filled: the executable is loaded).
//! Each process is this binary again (`compile-side`), pointed at its cache with `LAZULI_COMPILE_CACHE`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};

use crate::stats::Spread;
use crate::workloads::{LazuliRun, Workload};
use crate::BenchResult;

/// One process's first step.
#[derive(Clone, Copy, Debug, Default)]
pub struct FirstStep {
    /// Compile (or load) time of the step's program, from `lazuli::metrics()`.
    pub compile_s: f64,
    /// The whole first step: record, compile or load, upload, run.
    pub step_s: f64,
    /// Process start to the end of the first step (runtime set-up included).
    pub process_s: f64,
    pub disk_hits: u64,
}

/// In the child: run the workload's first step and report it as one JSON line.
pub fn side(w: &Workload, started: Instant) -> BenchResult<Value> {
    let mut run = LazuliRun::new(w);
    lazuli::runtime_info()?;
    let before = lazuli::metrics();
    let t0 = Instant::now();
    run.step()?;
    let step_s = t0.elapsed().as_secs_f64();
    let m = lazuli::metrics() - before;
    Ok(json!({"compile_s": m.compile_ms / 1e3, "step_s": step_s, "process_s": started.elapsed().as_secs_f64(),
              "compiles": m.compiles, "disk_hits": m.disk_cache_hits, "disk_misses": m.disk_cache_misses}))
}

fn child(cache: &Path) -> BenchResult<FirstStep> {
    let out = Command::new(std::env::current_exe()?)
        .arg("compile-side")
        .env("LAZULI_COMPILE_CACHE", cache)
        .stderr(Stdio::inherit())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("compile-side failed ({}): {text}", out.status).into());
    }
    let v: Value = serde_json::from_str(text.lines().last().unwrap_or(""))?;
    Ok(FirstStep {
        compile_s: v["compile_s"].as_f64().unwrap_or(f64::NAN),
        step_s: v["step_s"].as_f64().unwrap_or(f64::NAN),
        process_s: v["process_s"].as_f64().unwrap_or(f64::NAN),
        disk_hits: v["disk_hits"].as_u64().unwrap_or(0),
    })
}

/// Cold and warm first steps, `reps` pairs, each pair on a new empty cache directory under `scratch`.
pub struct CompileResult {
    pub cold_compile: Spread,
    pub warm_compile: Spread,
    pub cold_step: Spread,
    pub warm_step: Spread,
    pub cold_process: Spread,
    pub warm_process: Spread,
    /// Warm processes that loaded from the cache, of all warm processes.
    pub warm_hits: usize,
}

pub fn measure(scratch: &Path, reps: usize) -> BenchResult<CompileResult> {
    let mut r = CompileResult {
        cold_compile: Spread::default(),
        warm_compile: Spread::default(),
        cold_step: Spread::default(),
        warm_step: Spread::default(),
        cold_process: Spread::default(),
        warm_process: Spread::default(),
        warm_hits: 0,
    };
    for rep in 0..reps {
        let dir = scratch.join(format!("compile-cache-{rep}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let cold = child(&dir)?;
        let warm = child(&dir)?;
        r.cold_compile.push(cold.compile_s);
        r.warm_compile.push(warm.compile_s);
        r.cold_step.push(cold.step_s);
        r.warm_step.push(warm.step_s);
        r.cold_process.push(cold.process_s);
        r.warm_process.push(warm.process_s);
        r.warm_hits += (warm.disk_hits > 0 && cold.disk_hits == 0) as usize;
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(r)
}
