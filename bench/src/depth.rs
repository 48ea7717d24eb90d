//! `lazuli-bench depth`: the GPT-2-small step at several depths, its blocks unrolled and scanned (one body run
//! once per layer), lazuli only. Each point is a new process (`lazuli-side --layers N`) without the persistent
//! compile cache, so its first step compiles: the table shows how compile time, the first step (record, compile,
//! run) and the step time grow with depth. Goal: 24 layers compile in at most twice 1 layer's time.

use std::process::{Command, Stdio};

use serde_json::Value;

use crate::stats::{duration, machine, median, today};
use crate::BenchResult;

/// One process's result.
struct Point {
    compile_s: f64,
    first_s: f64,
    step_s: f64,
    peak_bytes: Option<f64>,
}

pub fn run(layers: &[usize], tiny: bool, device: &str, steps: usize) -> BenchResult<()> {
    let dir = std::env::temp_dir().join(format!("lazuli-depth-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut rows = Vec::new();
    for &n in layers {
        let unrolled = point(n, false, tiny, device, steps, &dir);
        let scanned = point(n, true, tiny, device, steps, &dir);
        rows.push((n, unrolled, scanned));
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("## lazuli-bench depth, {}", today());
    println!("- command: `{}`", std::env::args().collect::<Vec<_>>().join(" "));
    println!("- host: {}; device: {device}; allocator: {}", machine(), crate::ALLOCATOR);
    println!(
        "- model: GPT-2 small's {} at each depth, bf16 matmuls, fused attention, AdamW; `LAZULI_COMPILE_CACHE=off`; \
         step: median of {steps} after the first",
        if tiny { "dry-run width (d=128, T=64, batch 2)" } else { "width (d=768, T=1024, batch 8)" }
    );
    println!("\n| layers | unrolled: compile | first step | step | scanned: compile | first step | step | scanned / unrolled step |");
    println!("|---|---|---|---|---|---|---|---|");
    let show = |p: &BenchResult<Point>| match p {
        Ok(p) => format!("{} | {} | {}", duration(p.compile_s), duration(p.first_s), duration(p.step_s)),
        Err(e) => format!("failed: {} | | ", e.to_string().lines().next().unwrap_or("")),
    };
    for (n, u, s) in &rows {
        let ratio = match (u, s) {
            (Ok(u), Ok(s)) => format!("{:.2}", s.step_s / u.step_s),
            _ => "–".into(),
        };
        println!("| {n} | {} | {} | {ratio} |", show(u), show(s));
    }
    if let (Some((_, Ok(u1), Ok(s1))), Some((nl, Ok(ul), Ok(sl)))) = (rows.first(), rows.last()) {
        println!(
            "\ncompile time, {nl} layers ÷ {} layer(s): unrolled {:.2}×, scanned {:.2}× (goal ≤ 2×)",
            rows[0].0,
            ul.compile_s / u1.compile_s,
            sl.compile_s / s1.compile_s
        );
    }
    for (n, u, s) in &rows {
        let gib = |p: &BenchResult<Point>| {
            p.as_ref()
                .ok()
                .and_then(|p| p.peak_bytes)
                .map_or("–".into(), |b| format!("{:.2} GiB", b / (1u64 << 30) as f64))
        };
        println!("peak memory, {n} layers: unrolled {}, scanned {}", gib(u), gib(s));
    }
    Ok(())
}

fn point(
    layers: usize,
    scan: bool,
    tiny: bool,
    device: &str,
    steps: usize,
    dir: &std::path::Path,
) -> BenchResult<Point> {
    eprintln!("lazuli-bench: {layers} layer(s), {}", if scan { "scanned" } else { "unrolled" });
    let out = Command::new(std::env::current_exe()?)
        .args(["lazuli-side", "--workload", "gpt2-small", "--attention", "fused", "--weights"])
        .arg(dir.join("weights.safetensors"))
        .args(["--reps", "1", "--warmup", "1", "--steps", &steps.to_string(), "--layers", &layers.to_string()])
        .args(scan.then_some("--scan"))
        .args(tiny.then_some("--tiny"))
        .env("LAZULI_DEVICE", device)
        .env("LAZULI_COMPILE_CACHE", "off")
        .stderr(Stdio::inherit())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.lines().last().unwrap_or(""))
        .map_err(|_| format!("lazuli-side failed ({})", out.status))?;
    if let Some(e) = v["error"].as_str() {
        return Err(e.into());
    }
    let times: Vec<f64> =
        v["reps"][0].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default();
    Ok(Point {
        compile_s: v["compile_ms"].as_f64().unwrap_or(f64::NAN) / 1e3,
        first_s: v["first_s"].as_f64().unwrap_or(f64::NAN),
        step_s: median(&times),
        peak_bytes: v["peak_bytes"].as_f64(),
    })
}
