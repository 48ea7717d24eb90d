//! `lazuli-bench gpu --profile`: where each side's device time goes, kernel by kernel. lazuli reads its own
//! plugin's profiler (`lazuli::profile`); JAX writes `jax.profiler`'s `*.xplane.pb`, which is read here with the
//! same decoder, so both sides are grouped by the same rules. PyTorch's profiler speaks another format and is
//! not read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lazuli::diagnostics::{DeviceProfile, KernelKind, KernelTime, Launch};
use serde_json::{json, Value};

use crate::worker::Worker;
use crate::workloads::LazuliRun;
use crate::BenchResult;

/// `steps` more lazuli steps under `lazuli::profile`, as JSON; `None` (and why, on stderr) where it cannot.
pub fn lazuli(lz: &mut LazuliRun, steps: usize, pipelined: bool) -> Option<Value> {
    match lazuli::profile(steps, || lz.run(steps, pipelined)) {
        Ok((Ok(_), profile)) => Some(to_json(&profile)),
        Ok((Err(e), _)) => {
            eprintln!("lazuli-bench: the profiled steps failed: {e}");
            None
        }
        Err(e) => {
            eprintln!("lazuli-bench: no profile: {e}");
            None
        }
    }
}

/// `steps` more JAX steps under `jax.profiler`, its trace written under `dir` and read back; `None` (and why, on
/// stderr) where it cannot.
pub fn jax(worker: &mut Worker, steps: usize, dir: &Path) -> Option<DeviceProfile> {
    let profile = worker.profile(steps, dir).and_then(|()| read_xplane_dir(dir, steps));
    let _ = std::fs::remove_dir_all(dir);
    profile.inspect_err(|e| eprintln!("lazuli-bench: no JAX profile: {e}")).ok()
}

/// A profile as one JSON value (it crosses from the lazuli side's process to the report).
pub fn to_json(p: &DeviceProfile) -> Value {
    let kernels: Vec<Value> = p
        .kernels
        .iter()
        .map(|k| json!({"family": k.family, "kind": k.kind.to_string(), "launches": k.launches, "ns": k.time.as_nanos() as u64, "idle_ns": k.idle_before.as_nanos() as u64, "ops": k.ops}))
        .collect();
    let last_step: Vec<Value> = p
        .last_step
        .iter()
        .map(|l| {
            let ns = |d: Duration| d.as_nanos() as u64;
            json!({"name": l.name, "op": l.op, "start_ns": ns(l.start), "ns": ns(l.duration), "idle_ns": ns(l.idle_before)})
        })
        .collect();
    json!({"kernels": kernels, "busy_ns": p.busy.as_nanos() as u64, "span_ns": p.span.as_nanos() as u64, "steps": p.steps, "last_step": last_step})
}

fn launch_from_json(v: &Value) -> Launch {
    let ns = |k: &str| Duration::from_nanos(v[k].as_u64().unwrap_or(0));
    let text = |k: &str| v[k].as_str().unwrap_or("").to_string();
    Launch { name: text("name"), op: text("op"), start: ns("start_ns"), duration: ns("ns"), idle_before: ns("idle_ns") }
}

pub fn from_json(v: &Value) -> Option<DeviceProfile> {
    let ns = |v: &Value| Duration::from_nanos(v.as_u64().unwrap_or(0));
    let kernels = v["kernels"]
        .as_array()?
        .iter()
        .map(|k| {
            let family = k["family"].as_str().unwrap_or("?").to_string();
            KernelTime {
                kind: KernelKind::of(&family),
                family,
                launches: k["launches"].as_u64().unwrap_or(0) as usize,
                time: ns(&k["ns"]),
                idle_before: ns(&k["idle_ns"]),
                ops: serde_json::from_value(k["ops"].clone()).unwrap_or_default(),
            }
        })
        .collect();
    Some(DeviceProfile {
        kernels,
        busy: ns(&v["busy_ns"]),
        span: ns(&v["span_ns"]),
        steps: v["steps"].as_u64().unwrap_or(1) as usize,
        last_step: v["last_step"]
            .as_array()
            .map(|launches| launches.iter().map(launch_from_json).collect())
            .unwrap_or_default(),
    })
}

/// The `*.xplane.pb` that `jax.profiler` wrote under `dir`, as a profile of `steps` steps.
pub fn read_xplane_dir(dir: &Path, steps: usize) -> BenchResult<DeviceProfile> {
    let file = find_xplane(dir)?.ok_or_else(|| format!("no *.xplane.pb under {}", dir.display()))?;
    Ok(DeviceProfile::from_xspace(&std::fs::read(&file)?, steps)?)
}

fn find_xplane(dir: &Path) -> BenchResult<Option<PathBuf>> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            if let Some(found) = find_xplane(&path)? {
                return Ok(Some(found));
            }
        } else if path.to_string_lossy().ends_with(".xplane.pb") {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// Per kind, every profiled side's ms per step side by side; then each side's longest kernel families.
pub fn print(sides: &[(&str, &DeviceProfile)]) {
    if sides.is_empty() {
        return;
    }
    println!("\n### Where the device time goes (one profiled repetition per side, ms per step)\n");
    let names: Vec<&str> = sides.iter().map(|(n, _)| *n).collect();
    println!("| kind | {} |", names.join(" | "));
    println!("|---|{}", "---|".repeat(sides.len()));
    let mut kinds: Vec<KernelKind> = sides.iter().flat_map(|(_, p)| p.by_kind().into_iter().map(|k| k.0)).collect();
    kinds.sort();
    kinds.dedup();
    let ms = |p: &DeviceProfile, d: Duration| d.as_secs_f64() * 1e3 / p.steps as f64;
    for kind in kinds {
        let cells: Vec<String> = sides
            .iter()
            .map(|(_, p)| {
                let (t, n) = p.by_kind().into_iter().find(|k| k.0 == kind).map_or((Duration::ZERO, 0), |k| (k.1, k.2));
                format!("{:.3} ({:.0} launches)", ms(p, t), n as f64 / p.steps as f64)
            })
            .collect();
        println!("| {kind} | {} |", cells.join(" | "));
    }
    let busy: Vec<String> = sides.iter().map(|(_, p)| format!("{:.3}", ms(p, p.busy))).collect();
    let span: Vec<String> = sides.iter().map(|(_, p)| format!("{:.3}", ms(p, p.span))).collect();
    println!("| **busy** | {} |", busy.join(" | "));
    println!("| first start to last end | {} |", span.join(" | "));
    for (name, p) in sides {
        println!("\n{name}:\n```\n{p}```");
        if std::env::var_os("LAZULI_BENCH_ALL_FAMILIES").is_some() {
            println!("\n{name}, every family:\n```\n{p:#}```");
            println!("\n{name}, the last step's launches in order (start µs, duration µs, idle before µs):\n```");
            for l in &p.last_step {
                let us = |d: Duration| d.as_secs_f64() * 1e6;
                println!(
                    "{:>9.1} {:>8.1} {:>6.1}  {}  [{}]",
                    us(l.start),
                    us(l.duration),
                    us(l.idle_before),
                    l.name,
                    l.op
                );
            }
            println!("```");
        }
    }
}
