//! `lazuli-bench depth`: the GPT-2-small step at several depths, its blocks unrolled and scanned (one body run
//! once per layer), lazuli only. Each point is a new process (`lazuli-side --layers N`) without the persistent
//! compile cache, so its first step compiles: the table shows how compile time, the first step (record, compile,
//! run) and the step time grow with depth. Goal: 24 layers compile in at most twice 1 layer's time.

use std::process::{Command, Stdio};

use serde_json::Value;

use crate::stats::{duration, machine, median, today};
use crate::BenchResult;

/// One `lazuli-side` process's result.
pub struct Point {
    pub compile_s: f64,
    pub first_s: f64,
    pub step_s: f64,
    pub peak_bytes: Option<f64>,
    /// What the device's allocator may use in all, where the plugin says.
    pub bytes_limit: Option<f64>,
}

/// The model's width and tokens: GPT-2 small's (d=768, T=1024, batch 8), the dry run's (`tiny`: d=128, T=64,
/// batch 2), either with another batch or sequence length.
#[derive(Clone, Copy)]
pub struct Size {
    pub tiny: bool,
    pub batch: Option<usize>,
    pub seq: Option<usize>,
}

impl Size {
    fn args(self) -> Vec<String> {
        let mut args: Vec<String> = self.tiny.then(|| "--tiny".to_string()).into_iter().collect();
        for (flag, v) in [("--batch", self.batch), ("--seq", self.seq)] {
            if let Some(v) = v {
                args.extend([flag.to_string(), v.to_string()]);
            }
        }
        args
    }

    fn describe(self) -> String {
        let (d, t, b) = if self.tiny { (128, 64, 2) } else { (768, 1024, 8) };
        let width = if self.tiny { "dry-run width" } else { "width" };
        format!("{width} (d={d}, T={}, batch {})", self.seq.unwrap_or(t), self.batch.unwrap_or(b))
    }
}

pub fn run(layers: &[usize], size: Size, device: &str, steps: usize) -> BenchResult<()> {
    let dir = std::env::temp_dir().join(format!("lazuli-depth-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut rows = Vec::new();
    for &n in layers {
        let unrolled = point(n, false, size, device, steps, &dir);
        let scanned = point(n, true, size, device, steps, &dir);
        rows.push((n, unrolled, scanned));
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("## lazuli-bench depth, {}", today());
    println!("- command: `{}`", std::env::args().collect::<Vec<_>>().join(" "));
    println!("- host: {}; device: {device}; allocator: {}", machine(), crate::ALLOCATOR);
    let form = std::env::var("LAZULI_SCANNED_BLOCKS").unwrap_or_else(|_| "auto".into());
    println!("- scanned blocks: `LAZULI_SCANNED_BLOCKS={form}`");
    println!(
        "- model: GPT-2 small's {} at each depth, bf16 matmuls, fused attention, AdamW; `LAZULI_COMPILE_CACHE=off`; \
         step: median of {steps} after the first",
        size.describe()
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
    size: Size,
    device: &str,
    steps: usize,
    dir: &std::path::Path,
) -> BenchResult<Point> {
    eprintln!("lazuli-bench: {layers} layer(s), {}", if scan { "scanned" } else { "unrolled" });
    let mut args = vec!["--layers".to_string(), layers.to_string()];
    args.extend(scan.then(|| "--scan".to_string()));
    args.extend(size.args());
    lazuli_side(&args, device, steps, dir)
}

/// The fused-attention GPT's `lazuli-side` in a new process with `args` added, one repetition of `steps` steps
/// after one warm-up step, without the persistent compile cache.
pub fn lazuli_side(args: &[String], device: &str, steps: usize, dir: &std::path::Path) -> BenchResult<Point> {
    let workload = if args.iter().any(|a| a == "--tiny") { "gpt2-tiny" } else { "gpt2-small" };
    let out = Command::new(std::env::current_exe()?)
        .args(["lazuli-side", "--workload", workload, "--attention", "fused", "--weights"])
        .arg(dir.join("weights.safetensors"))
        .args(["--reps", "1", "--warmup", "1", "--steps", &steps.to_string()])
        .args(args)
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
        bytes_limit: v["bytes_limit"].as_f64(),
    })
}

/// `lazuli-bench memory`: peak memory and step time with and without checkpointed blocks at each batch size; the
/// largest batch that fits in the allocator's limit, on a line through the first and last batch's peaks.
pub fn memory(batches: &[usize], device: &str, steps: usize) -> BenchResult<()> {
    let dir = std::env::temp_dir().join(format!("lazuli-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut rows = Vec::new();
    for &b in batches {
        for checkpoint in [false, true] {
            eprintln!("lazuli-bench: batch {b}, {}", if checkpoint { "checkpointed blocks" } else { "plain" });
            let mut args = vec!["--batch".to_string(), b.to_string()];
            args.extend(checkpoint.then(|| "--checkpoint".to_string()));
            rows.push((b, checkpoint, lazuli_side(&args, device, steps, &dir)));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("## lazuli-bench memory, {}", today());
    println!("- command: `{}`", std::env::args().collect::<Vec<_>>().join(" "));
    println!("- host: {}; device: {device}", machine());
    println!(
        "- model: GPT-2 small (T=1024, bf16 matmuls, fused attention, AdamW); peak: the allocator's after the steps"
    );
    println!("\n| batch | plain: peak | step | checkpointed: peak | step | peak saved | step time added |");
    println!("|---|---|---|---|---|---|---|");
    let gib = |b: f64| format!("{:.2} GiB", b / (1u64 << 30) as f64);
    let find = |b: usize, c: bool| rows.iter().find(|r| r.0 == b && r.1 == c).and_then(|r| r.2.as_ref().ok());
    for &b in batches {
        let (Some(p), Some(c)) = (find(b, false), find(b, true)) else {
            let why = rows.iter().filter(|r| r.0 == b).find_map(|r| r.2.as_ref().err()).map(|e| e.to_string());
            println!("| {b} | failed: {} | | | | | |", why.unwrap_or_default().lines().next().unwrap_or(""));
            continue;
        };
        let (pp, cp) = (p.peak_bytes.unwrap_or(f64::NAN), c.peak_bytes.unwrap_or(f64::NAN));
        println!(
            "| {b} | {} | {} | {} | {} | {:.0}% | {:+.0}% |",
            gib(pp),
            duration(p.step_s),
            gib(cp),
            duration(c.step_s),
            100.0 * (1.0 - cp / pp),
            100.0 * (c.step_s / p.step_s - 1.0)
        );
    }
    let limit = rows.iter().find_map(|r| r.2.as_ref().ok().and_then(|p| p.bytes_limit));
    if let (Some(limit), [lo, .., hi]) = (limit, batches) {
        for checkpoint in [false, true] {
            let peak = |b: usize| find(b, checkpoint).and_then(|p| p.peak_bytes);
            if let (Some(a), Some(z)) = (peak(*lo), peak(*hi)) {
                let per_sequence = (z - a) / (*hi - *lo) as f64;
                let fits = *lo as f64 + (limit - a) / per_sequence;
                println!(
                    "largest batch that fits, {}: about {:.0} (extrapolated to the allocator's {} limit; {} per sequence)",
                    if checkpoint { "checkpointed blocks" } else { "plain" },
                    fits.floor(),
                    gib(limit),
                    gib(per_sequence)
                );
            }
        }
    }
    Ok(())
}
