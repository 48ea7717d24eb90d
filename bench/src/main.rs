//! `lazuli-bench`: lazuli side by side with JAX (and PyTorch on a GPU).
//!
//!   cargo run --release -p lazuli-bench -- cpu                 # the CPU table: every workload, with ratios
//!   cargo run --release -p lazuli-bench -- trace               # the trace workload alone
//!   cargo run --release -p lazuli-bench -- check-cost          # the finite check's cost on the CPU workloads
//!   lazuli-bench gpu --python python3                          # GPT-2 small on a GPU: lazuli, JAX, torch.compile,
//!                                                              # attention fused and written out
//!
//! The first `cpu` run makes the comparison environment (bench/.venv: jax[cpu], numpy, safetensors from PyPI).
//! Modes: `LAZULI_BENCH_JAX_SYNC=1` (JAX's CPU client dispatches synchronously, as lazuli's does);
//! `LAZULI_BENCH_READ_LOSS=1` (every step reads its loss to the host, as a loop that logs it does);
//! `LAZULI_BENCH_JAX_XLA=lazuli` (JAX's CPU side compiles with lazuli's XLA CPU options, through `XLA_FLAGS`).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use clap::{Parser, Subcommand};
use lazuli_bench::attention::Case;
use lazuli_bench::compare::{self, Options, Row};
use lazuli_bench::gpu::{self, GpuJob, Loop};
use lazuli_bench::nan_gpt::GptNanConfig;
use lazuli_bench::stats::{duration, machine, rustc_version, today};
use lazuli_bench::trace::{self, TraceRow};
use lazuli_bench::workloads::{Attention, Workload};
use lazuli_bench::{pyenv, worker, BenchResult, ALLOCATOR};

/// lazuli sets no allocator; an application picks one. The harness picks what the README recommends (features
/// `mimalloc`, `malloc-override`, on by default), so its tables show lazuli as set up for speed, and says so in
/// every header; `--no-default-features` measures the system allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "lazuli side by side with JAX (and PyTorch on a GPU)")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(clap::Args, Clone)]
struct Common {
    /// Timed repetitions per side (each the median of its steps).
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Timed steps per repetition (default: by workload).
    #[arg(long)]
    steps: Option<usize>,
    /// Untimed steps first; their losses are compared across frameworks.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// A Python that has the comparison's packages, instead of the harness's own environment.
    #[arg(long)]
    python: Option<PathBuf>,
    /// Time each repetition's steps back to back with one wait at the end (as a training loop that does not read
    /// every step's loss runs), instead of waiting for every step's results; on every side.
    #[arg(long)]
    pipelined: bool,
    /// GPU rows: after the timed repetitions, one more under the profiler (lazuli's plugin profiler, JAX's
    /// `jax.profiler`), and a table of where each side's device time goes.
    #[arg(long)]
    profile: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every CPU workload: mlp-tiny, mlp-mnist, gpt-tiny (against JAX jit), trace and compile (lazuli only).
    Cpu {
        #[command(flatten)]
        common: Common,
        /// Only these workloads (comma-separated).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
    /// What the finite check costs the CPU workloads: `LAZULI_CHECK_FINITE=off` against each of `--modes`, one
    /// process per setting a round, and each round's cost by lazuli's medians and by lazuli ÷ JAX in its process.
    CheckCost {
        #[arg(long, default_value_t = 6)]
        rounds: usize,
        #[arg(long, default_value_t = 9)]
        reps: usize,
        /// The settings measured against `off`.
        #[arg(long, value_delimiter = ',', default_values_t = ["stop".to_string()])]
        modes: Vec<String>,
        /// Only these workloads (comma-separated; default: mlp-tiny, mlp-mnist, gpt-tiny).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        #[arg(long)]
        python: Option<PathBuf>,
    },
    /// (internal) One process of `check-cost`, under the process's `LAZULI_CHECK_FINITE`; one JSON line a workload.
    CpuCheckSide {
        #[arg(long)]
        reps: usize,
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        #[arg(long)]
        python: Option<PathBuf>,
    },
    /// Host-side cost of a GPT-2-small-sized step (record, autodiff, walk, hash, lookup) without executing it.
    Trace {
        #[arg(long, value_delimiter = ',', default_values_t = [2usize, 4, 8, 12, 24])]
        layers: Vec<usize>,
        #[arg(long, default_value_t = 15)]
        iters: usize,
        /// Sleep this long before each timed step, as a loop that waits for the device's step does: the step is
        /// then recorded on a cold host (caches, allocator blocks), not right after the one before.
        #[arg(long, default_value_t = 0)]
        pause_ms: u64,
        /// Print JSON lines (used by `cpu`).
        #[arg(long)]
        json: bool,
    },
    /// GPT-2 small (124M, T=1024, B=8, bf16 matmuls, AdamW) on a GPU: lazuli, JAX jit and torch.compile, each
    /// with fused attention (lazuli's scaled_dot_product_attention, JAX's cuDNN, PyTorch's SDPA) and written out.
    Gpu {
        #[command(flatten)]
        common: Common,
        /// Comparison frameworks after lazuli (which always runs), in order: jax, torch (`""` for lazuli alone).
        #[arg(long, value_delimiter = ',', default_values_t = ["jax".to_string(), "torch".to_string()])]
        frameworks: Vec<String>,
        /// Attention variants for every framework, in order: fused (one attention op on bf16 q, k, v), written
        /// (scores, mask, softmax, weighted sum).
        #[arg(long, value_enum, value_delimiter = ',', default_values = ["fused", "written"])]
        attention: Vec<Attention>,
        /// Smaller model for a dry run (2 layers, d=128, T=64): checks the scripts, not the speed.
        #[arg(long)]
        tiny: bool,
        /// lazuli's LAZULI_DEVICE for its side (`cpu` for a dry run without a GPU).
        #[arg(long, default_value = "gpu")]
        device: String,
        /// lazuli's side recomputes each transformer block in the backward pass (`GptConfig::checkpoint_blocks`):
        /// its peak memory and step time against the plain rows'.
        #[arg(long)]
        checkpoint: bool,
        /// lazuli's side stores the blocks stacked and runs them as one scanned body (`GptConfig::scan_blocks`),
        /// and JAX's runs them with `lax.scan`: first step and step time against the unrolled rows'.
        #[arg(long)]
        scan: bool,
        /// The loops to time, one after the other, each with every side (waiting, read-loss, pipelined), and a
        /// table of all of them at the end; without it, the one `--pipelined` (or `LAZULI_BENCH_READ_LOSS=1`)
        /// names.
        #[arg(long, value_delimiter = ',')]
        loops: Vec<Loop>,
    },
    /// Attention alone (bf16; GPT-2 small's shapes, causal, by default), forward and forward+backward: lazuli's
    /// cuDNN, Triton and composite implementations beside JAX's cuDNN call and PyTorch's SDPA.
    Attention {
        /// Calls per timed run.
        #[arg(long, default_value_t = 50)]
        iters: usize,
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Shapes BxTxHxD (q, k and v alike), each a table.
        #[arg(long, value_delimiter = ',', default_values_t = ["8x1024x12x64".to_string()])]
        shapes: Vec<String>,
        /// Masks, each a table per shape: causal, none.
        #[arg(long, value_delimiter = ',', default_values_t = ["causal".to_string()])]
        masks: Vec<String>,
        /// A Python with JAX (and PyTorch), instead of the harness's own environment.
        #[arg(long)]
        python: Option<PathBuf>,
    },
    /// Cold compile against warm start from the persistent compile cache (gpt-tiny's step), lazuli only.
    Compile {
        #[arg(long, default_value_t = 3)]
        reps: usize,
    },
    /// (internal) One process's first gpt-tiny step, for `compile`; prints one JSON line.
    CompileSide,
    /// (internal) The lazuli side of a GPU row, in its own process; prints one JSON line.
    LazuliSide {
        #[arg(long)]
        workload: String,
        #[arg(long, value_enum, default_value = "written")]
        attention: Attention,
        #[arg(long)]
        weights: PathBuf,
        #[arg(long)]
        tiny: bool,
        #[arg(long)]
        checkpoint: bool,
        #[arg(long)]
        scan: bool,
        /// Another depth than GPT-2 small's 12 layers.
        #[arg(long)]
        layers: Option<usize>,
        /// Another batch than 8 sequences.
        #[arg(long)]
        batch: Option<usize>,
        /// Another sequence length than 1,024 tokens.
        #[arg(long)]
        seq: Option<usize>,
        #[command(flatten)]
        common: Common,
    },
    /// Gradient checkpointing's trade on GPT-2 small: peak device memory and step time with and without
    /// recomputed blocks at each batch size, and the largest batch that fits, extrapolated linearly from the
    /// peaks (lazuli only, GPUs).
    Memory {
        #[arg(long, value_delimiter = ',', default_values_t = [8usize, 32])]
        batches: Vec<usize>,
        #[arg(long, default_value = "gpu")]
        device: String,
        #[arg(long, default_value_t = 5)]
        steps: usize,
    },
    /// The same planted NaN caught by lazuli (`LAZULI_CHECK_FINITE=stop`), PyTorch (`detect_anomaly`) and JAX
    /// (`jax_debug_nans`): step time without and with checking, time from the bad step to the error, and whether
    /// the error names the planted line. `--workload gpt2`: the GPU benchmarks' GPT-2 small step, lazuli alone,
    /// with the trip's time split and the goal (trip − one compile) / step ≤ 3.
    Nan {
        /// `mlp` (the residual MLP, beside PyTorch and JAX) or `gpt2`.
        #[arg(long, default_value = "mlp")]
        workload: String,
        /// Default: 1024 (mlp), 8 (gpt2).
        #[arg(long)]
        batch: Option<usize>,
        /// Width. Default: 1024 (mlp), 768 (gpt2, one head per 64).
        #[arg(long)]
        dim: Option<usize>,
        /// Default: 12.
        #[arg(long)]
        layers: Option<usize>,
        /// The layer whose `log` goes NaN. Default: 5 (mlp, gpt2), 1 (gpt2 --tiny).
        #[arg(long)]
        planted: Option<usize>,
        /// Timed steps per measurement. Default: 20 (mlp), 10 (gpt2).
        #[arg(long)]
        steps: Option<usize>,
        /// gpt2: tokens per sequence (default 1024).
        #[arg(long)]
        seq: Option<usize>,
        /// gpt2: vocabulary (default 50304).
        #[arg(long)]
        vocab: Option<usize>,
        /// gpt2: the dry-run size for a CPU (2 layers, d=128, T=64, B=2, vocabulary 512) before the options above.
        #[arg(long)]
        tiny: bool,
        #[arg(long, default_value = "gpu")]
        device: String,
        /// A Python with PyTorch and JAX, instead of the harness's own environment (mlp only).
        #[arg(long)]
        python: Option<PathBuf>,
        /// gpt2: rounds of the three settings, alternated, a process each; a setting's step is its median over
        /// the rounds (the trip is timed in the first round's `stop`).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// (internal) lazuli's side of `nan`, under the process's `LAZULI_CHECK_FINITE`; prints one JSON line.
    NanSide {
        #[arg(long)]
        batch: usize,
        #[arg(long)]
        dim: usize,
        #[arg(long)]
        layers: usize,
        #[arg(long)]
        planted: usize,
        #[arg(long)]
        steps: usize,
    },
    /// (internal) lazuli's side of `nan --workload gpt2`, under the process's `LAZULI_CHECK_FINITE`; prints one
    /// JSON line.
    NanGptSide {
        #[arg(long)]
        batch: usize,
        #[arg(long)]
        seq: usize,
        #[arg(long)]
        layers: usize,
        #[arg(long)]
        dim: usize,
        #[arg(long)]
        vocab: usize,
        #[arg(long)]
        planted: usize,
        #[arg(long)]
        steps: usize,
        /// Time the steps only, not the bad step and its error.
        #[arg(long)]
        no_trip: bool,
    },
    /// Where a waiting step's head goes (the last kernel's end to the next step's first kernel), from a profiled
    /// waiting run: `LAZULI_PROFILE_TRACE=T LAZULI_BENCH_MARKS=M lazuli-bench gpu --profile …`, then `head --trace
    /// T --marks M`.
    Head {
        /// The plugin's whole profile (`LAZULI_PROFILE_TRACE`).
        #[arg(long)]
        trace: PathBuf,
        /// The bench's marks (`LAZULI_BENCH_MARKS`).
        #[arg(long)]
        marks: PathBuf,
        /// Instead: every event from just before the N-th waited step's last kernel ends to its `wait()`
        /// returning (the plugin's notice, event by event).
        #[arg(long)]
        window: Option<usize>,
    },
    /// How the GPT step's compile time, first step and step time grow with depth, its blocks unrolled and
    /// scanned: GPT-2 small's width at each layer count, lazuli only, each in a new process without the
    /// persistent compile cache.
    Depth {
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 12, 24])]
        layers: Vec<usize>,
        /// The dry-run width (d=128, T=64, batch 2), for the CPU.
        #[arg(long)]
        tiny: bool,
        /// lazuli's LAZULI_DEVICE.
        #[arg(long, default_value = "gpu")]
        device: String,
        /// Timed steps after the first.
        #[arg(long, default_value_t = 5)]
        steps: usize,
        /// Another batch than the width's (for GPT-2 small's width on a CPU: e.g. `--batch 1 --seq 128`).
        #[arg(long)]
        batch: Option<usize>,
        /// Another sequence length than the width's.
        #[arg(long)]
        seq: Option<usize>,
    },
}

fn options(c: &Common) -> Options {
    Options { reps: c.reps, warmup: c.warmup, steps: c.steps, pipelined: c.pipelined, profile: c.profile }
}

/// A scratch directory for weights files and the worker script, removed at the end.
fn scratch() -> BenchResult<PathBuf> {
    let dir = std::env::temp_dir().join(format!("lazuli-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn gpu_workload(tiny: bool, checkpoint: bool, scan: bool) -> Workload {
    let mut w = Workload::gpt2_small_gpu();
    if let lazuli_bench::workloads::Model::Gpt { config, .. } = &mut w.model {
        config.checkpoint_blocks = checkpoint;
        config.scan_blocks = scan;
    }
    if tiny {
        if let lazuli_bench::workloads::Model::Gpt { config, seq } = &mut w.model {
            (config.n_layer, config.d_model, config.n_head, config.vocab, *seq) = (2, 128, 4, 512, 64);
        }
        w.batch = 2;
        // Its tables say which model they timed: the dry run, not GPT-2 small.
        w.name = "gpt2-tiny".into();
    }
    w
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Cpu { common, only } => cpu(&common, &only),
        Cmd::CheckCost { rounds, reps, modes, only, python } => {
            lazuli_bench::check_cost::run(&only, &modes, rounds, reps, python)
        }
        Cmd::CpuCheckSide { reps, only, python } => scratch().and_then(|dir| {
            let r = lazuli_bench::check_cost::side(&only, reps, python.as_deref(), &dir);
            let _ = std::fs::remove_dir_all(&dir);
            r.map(|lines| lines.iter().for_each(|l| println!("{l}")))
        }),
        Cmd::Trace { layers, iters, pause_ms, json } => trace_cmd(&layers, iters, pause_ms, json),
        Cmd::Head { trace, marks, window } => lazuli_bench::head::report(&trace, &marks, window),
        Cmd::Compile { reps } => scratch().and_then(|dir| {
            let r = compile_cmd(&dir, reps);
            let _ = std::fs::remove_dir_all(&dir);
            r
        }),
        Cmd::CompileSide => {
            let started = std::time::Instant::now();
            lazuli_bench::compile::side(&Workload::gpt_tiny(), started).map(|v| println!("{v}"))
        }
        Cmd::Attention { iters, reps, shapes, masks, python } => {
            attention_cases(&shapes, &masks).and_then(|c| attention_cmd(&c, iters, reps, python.as_deref()))
        }
        Cmd::Gpu { common, mut frameworks, attention, tiny, device, checkpoint, scan, mut loops } => {
            frameworks.retain(|f| !f.is_empty());
            if loops.is_empty() {
                loops.push(Loop::from_flags(common.pipelined));
            }
            let variants = GpuVariants { tiny, checkpoint, scan };
            gpu(&common, frameworks, attention, &device, variants, &loops)
        }
        Cmd::Depth { layers, tiny, device, steps, batch, seq } => {
            let size = lazuli_bench::depth::Size { tiny, batch, seq };
            lazuli_bench::depth::run(&layers, size, &device, steps)
        }
        Cmd::Memory { batches, device, steps } => lazuli_bench::depth::memory(&batches, &device, steps),
        Cmd::Nan { workload, batch, dim, layers, planted, steps, seq, vocab, tiny, device, python, rounds } => {
            match workload.as_str() {
                "mlp" => {
                    let cfg = lazuli_bench::nan::NanConfig {
                        batch: batch.unwrap_or(1024),
                        dim: dim.unwrap_or(1024),
                        layers: layers.unwrap_or(12),
                        planted: planted.unwrap_or(5),
                        steps: steps.unwrap_or(20),
                    };
                    pyenv::ensure(python.as_deref()).and_then(|py| lazuli_bench::nan::run(cfg, &py, &device))
                }
                "gpt2" => {
                    let base = if tiny { GptNanConfig::tiny() } else { GptNanConfig::gpt2_small() };
                    let cfg = GptNanConfig {
                        batch: batch.unwrap_or(base.batch),
                        seq: seq.unwrap_or(base.seq),
                        layers: layers.unwrap_or(base.layers),
                        dim: dim.unwrap_or(base.dim),
                        vocab: vocab.unwrap_or(base.vocab),
                        planted: planted.unwrap_or(base.planted),
                        steps: steps.unwrap_or(base.steps),
                    };
                    lazuli_bench::nan_gpt::run(cfg, &device, rounds.max(1))
                }
                other => Err(format!("nan: unknown workload {other:?} (expected mlp or gpt2)").into()),
            }
        }
        Cmd::NanGptSide { batch, seq, layers, dim, vocab, planted, steps, no_trip } => {
            let cfg = GptNanConfig { batch, seq, layers, dim, vocab, planted, steps };
            lazuli_bench::nan_gpt::side(cfg, !no_trip)
                .inspect_err(|e| println!("{}", serde_json::json!({"error": e.to_string()})))
                .map(|v| println!("{v}"))
        }
        Cmd::NanSide { batch, dim, layers, planted, steps } => {
            let cfg = lazuli_bench::nan::NanConfig { batch, dim, layers, planted, steps };
            lazuli_bench::nan::side(cfg)
                .inspect_err(|e| println!("{}", serde_json::json!({"error": e.to_string()})))
                .map(|v| println!("{v}"))
        }
        Cmd::LazuliSide { workload, attention, weights, tiny, checkpoint, scan, layers, batch, seq, common } => {
            let mut w = Workload { attention, ..gpu_workload(tiny, checkpoint, scan) };
            w.batch = batch.unwrap_or(w.batch);
            if let lazuli_bench::workloads::Model::Gpt { config, seq: tokens } = &mut w.model {
                config.n_layer = layers.unwrap_or(config.n_layer);
                *tokens = seq.unwrap_or(*tokens);
            }
            if workload != w.name {
                eprintln!("lazuli-bench: lazuli-side knows only {}", w.name);
                std::process::exit(2);
            }
            // The parent reads the last line: the result, or why there is none.
            gpu::lazuli_side(&w, &weights, &options(&common))
                .inspect_err(|e| println!("{}", serde_json::json!({"error": e.to_string()})))
                .map(|v| println!("{v}"))
        }
    };
    if let Err(e) = result {
        eprintln!("lazuli-bench: {e}");
        std::process::exit(1);
    }
}

fn header(command: &str, python_versions: &str) -> BenchResult<()> {
    println!("## lazuli-bench, {}", today());
    println!("- command: `{command}`");
    println!("- machine: {}", machine());
    println!(
        "- lazuli {} ({}), {}; allocator: {ALLOCATOR}",
        env!("CARGO_PKG_VERSION"),
        rustc_version(),
        lazuli::runtime_info()?
    );
    println!("- comparison: {python_versions}");
    let mut knobs: Vec<String> = ["LAZULI_BENCH_JAX_SYNC", "LAZULI_BENCH_READ_LOSS", "LAZULI_BENCH_JAX_XLA"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| format!("{k}={v}")))
        .collect();
    if let Some(flags) = lazuli_bench::worker::jax_cpu_xla_flags()? {
        knobs.push(format!("JAX's XLA_FLAGS `{flags}`"));
    }
    if !knobs.is_empty() {
        println!("- modes: {}", knobs.join(", "));
    }
    Ok(())
}

fn print_rows(rows: &[Row]) {
    let names: Vec<&str> = rows.first().map(|r| r.others.iter().map(|o| o.name.as_str()).collect()).unwrap_or_default();
    let mut head = "| workload | steps × reps | lazuli median (min–max) |".to_string();
    for n in &names {
        head += &format!(" {n} median (min–max) |");
    }
    println!("\n{head} lazuli/{} | goal | losses agree |", names.first().unwrap_or(&"other"));
    println!("|{}", "---|".repeat(6 + names.len()));
    for r in rows {
        let mut line = format!(
            "| {} | {} × {} | {} |",
            r.workload.name,
            r.steps_per_rep,
            r.lazuli.steps.values.len(),
            r.lazuli.steps.show()
        );
        for o in &r.others {
            line += &format!(" {} |", o.steps.show());
        }
        let agree = match r.agreement() {
            Ok(()) => format!("yes ({} steps)", r.lazuli.warmup_losses.len()),
            Err(e) => format!("NO: {e}"),
        };
        println!("{line} {:.2} | {} | {agree} |", r.ratio(), goal(&r.workload.name));
    }
    println!("\nWhere lazuli's step time goes (medians over repetitions):\n");
    let names: Vec<&str> = worker::Split::default().phases().iter().map(|(n, _)| *n).collect();
    println!(
        "| workload | step | {} | other | programs/step | first step (lazuli) | compile (JAX) |",
        names.join(" | ")
    );
    println!("|---|---|{}---|---|---|---|", "---|".repeat(names.len()));
    for r in rows {
        let s = r.lazuli.split.unwrap_or_default();
        let step = r.lazuli.steps.median();
        let phases = s.phases();
        let other = step - phases.iter().map(|(_, t)| t).sum::<f64>();
        let cells: Vec<String> = phases.iter().map(|(_, t)| duration(*t)).collect();
        println!(
            "| {} | {} | {} | {} | {:.0} ({} compiles) | {} | {} |",
            r.workload.name,
            duration(step),
            cells.join(" | "),
            duration(other.max(0.0)),
            s.programs_per_step,
            s.compiles,
            duration(r.lazuli.first_s)
                + if r.lazuli.first_from_disk { " (program from the disk cache)" } else { " (compiled)" },
            r.others.first().map(|o| duration(o.first_s)).unwrap_or_default()
        );
    }
    println!(
        "\nThe comparison's own split: the same calls with an empty program (the step's arguments, donated alike, \
         passed through) time dispatch alone; the rest is the step's program.\n"
    );
    println!("| workload | side | step | empty program (dispatch) | step − empty (the program) |");
    println!("|---|---|---|---|---|");
    for r in rows {
        for o in r.others.iter().filter(|o| !o.empty_program.values.is_empty()) {
            let (step, empty) = (o.steps.median(), o.empty_program.median());
            println!(
                "| {} | {} | {} | {} | {} |",
                r.workload.name,
                o.name,
                duration(step),
                o.empty_program.show(),
                duration((step - empty).max(0.0))
            );
        }
    }
}

fn goal(name: &str) -> &'static str {
    match name {
        "mlp-tiny" => "≤ 0.5",
        "mlp-mnist" | "gpt-tiny" => "≤ 1.0",
        "gpt2-small" => "≤ 1.05",
        _ => "",
    }
}

fn cpu(common: &Common, only: &[String]) -> BenchResult<()> {
    let wanted = |n: &str| only.is_empty() || only.iter().any(|o| o == n);
    let python = pyenv::ensure(common.python.as_deref())?;
    let dir = scratch()?;
    let script = worker::write_script(&dir)?;
    let opts = options(common);
    let mut rows = Vec::new();
    for w in Workload::cpu_workloads() {
        if wanted(&w.name) {
            eprintln!("lazuli-bench: {} ...", w.name);
            rows.push(compare::cpu_row(&w, &python, &script, &dir, &opts)?);
        }
    }
    let versions = rows
        .first()
        .map(|r| {
            r.others
                .iter()
                .map(|o| format!("{} on {}, Python {}", o.info.framework, o.info.device, o.info.python))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    header(&command, &versions)?;
    if !rows.is_empty() {
        print_rows(&rows);
    }
    if wanted("trace") {
        eprintln!("lazuli-bench: trace ...");
        // Its own process: the trace needs donation off, which is fixed per process (see trace.rs).
        let out = Command::new(std::env::current_exe()?)
            .args(["trace", "--json"])
            .env("LAZULI_DONATE", "0")
            .stderr(Stdio::inherit())
            .output()?;
        if !out.status.success() {
            return Err(format!("the trace workload failed ({})", out.status).into());
        }
        let rows: Vec<TraceRow> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .map(|v| TraceRow::from_json(&v))
            .collect();
        print_trace(&rows, 0);
    }
    if wanted("compile") {
        eprintln!("lazuli-bench: compile ...");
        compile_cmd(&dir, 3)?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn print_trace(rows: &[TraceRow], pause_ms: u64) {
    println!("\ntrace: one GPT-2-small-shaped training step (d=768, 12 heads, vocab 50304, AdamW) recorded and looked up, not executed; medians; goal at 12 layers: ≤ 1 ms");
    if pause_ms > 0 {
        println!("each step recorded after the host slept {pause_ms} ms, as after waiting for the device's step");
    }
    println!();
    println!("| layers | nodes | inputs | outputs | record fwd | autodiff | optimizer | collect | walk | key | lookup | total | cache hit |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.layers,
            r.nodes,
            r.inputs,
            r.outputs,
            duration(r.record),
            duration(r.autodiff),
            duration(r.optimizer),
            duration(r.collect),
            duration(r.walk),
            duration(r.hash),
            duration(r.lookup),
            duration(r.total),
            if r.cache_hit { "yes" } else { "no (not primed)" }
        );
    }
}

fn trace_cmd(layers: &[usize], iters: usize, pause_ms: u64, json: bool) -> BenchResult<()> {
    if std::env::var("LAZULI_DONATE").as_deref() != Ok("0") {
        // Run again with donation off (see trace.rs), passing the output through.
        let status =
            Command::new(std::env::current_exe()?).args(std::env::args().skip(1)).env("LAZULI_DONATE", "0").status()?;
        std::process::exit(status.code().unwrap_or(1));
    }
    let mut rows = Vec::new();
    for &l in layers {
        eprintln!("lazuli-bench: trace, {l} layers");
        // Only 12 layers (GPT-2 small) is compiled and run once, so its lookups hit; the others probe the cache
        // the same way and miss (a lookup costs the same either way).
        let pause = std::time::Duration::from_millis(pause_ms);
        let row = trace::measure(l, iters, l == 12, pause)?;
        if json {
            println!("{}", row.to_json());
        }
        rows.push(row);
    }
    if !json {
        print_trace(&rows, pause_ms);
    }
    Ok(())
}

/// The GPU rows' model variants (`--tiny`, `--checkpoint`, `--scan`).
struct GpuVariants {
    tiny: bool,
    checkpoint: bool,
    scan: bool,
}

/// Each loop in turn with every side, its report printed as it ends; then, for more than one, the loops' table.
fn gpu(
    common: &Common,
    frameworks: Vec<String>,
    attentions: Vec<Attention>,
    device: &str,
    v: GpuVariants,
    loops: &[Loop],
) -> BenchResult<()> {
    // lazuli alone (`--frameworks ""`) needs no Python: its side writes the weights the others read.
    let python = match frameworks.is_empty() {
        true => PathBuf::new(),
        false => pyenv::ensure(common.python.as_deref())?,
    };
    let dir = scratch()?;
    let workload = gpu_workload(v.tiny, v.checkpoint, v.scan);
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let runs = (|| -> BenchResult<Vec<gpu::GpuRun>> {
        let script = worker::write_script(&dir)?;
        let mut runs = Vec::new();
        for &lp in loops {
            let job = GpuJob {
                script: script.clone(),
                weights: dir.join(format!("{}.safetensors", workload.name)),
                workload: workload.clone(),
                python: python.clone(),
                frameworks: frameworks.clone(),
                attentions: attentions.clone(),
                opts: Options { steps: common.steps.or(Some(10)), pipelined: lp == Loop::Pipelined, ..options(common) },
                lp,
                device: device.to_string(),
                tiny: v.tiny,
                checkpoint: v.checkpoint,
                scan: v.scan,
            };
            let run = job.run()?;
            run.print(&command);
            runs.push(run);
        }
        Ok(runs)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let runs = runs?;
    if runs.len() > 1 {
        gpu::print_loops(&runs);
    }
    Ok(())
}

/// Every shape with every mask, in order.
fn attention_cases(shapes: &[String], masks: &[String]) -> BenchResult<Vec<Case>> {
    let causal = |m: &String| match m.as_str() {
        "causal" => Ok(true),
        "none" => Ok(false),
        _ => Err(format!("--masks: `{m}` is not a mask (causal, none)")),
    };
    let masks: Vec<bool> = masks.iter().map(causal).collect::<Result<_, _>>()?;
    let mut cases = Vec::new();
    for s in shapes {
        let dims = Case::parse_dims(s)?;
        cases.extend(masks.iter().map(|&causal| Case { dims, causal }));
    }
    Ok(cases)
}

fn attention_cmd(cases: &[Case], iters: usize, reps: usize, python: Option<&std::path::Path>) -> BenchResult<()> {
    let python = pyenv::ensure(python)?;
    let dir = scratch()?;
    let tables: BenchResult<Vec<_>> =
        cases.iter().map(|&c| Ok((c, lazuli_bench::attention::run(&python, &dir, c, iters, reps)?))).collect();
    let _ = std::fs::remove_dir_all(&dir);
    let tables = tables?;
    println!("## lazuli-bench attention, {}", today());
    println!("- command: `{}`", std::env::args().collect::<Vec<_>>().join(" "));
    println!("- host: {}; lazuli on {}; allocator: {ALLOCATOR}", machine(), lazuli::runtime_info()?);
    println!("- backward: gradients of sum(out · w) for q, k, v; q, k and v apart");
    for (case, rows) in &tables {
        println!("\n### {}\n", case.describe());
        let jax = rows.iter().find(|r| r.name.starts_with("JAX")).map(|r| (r.fwd_ms, r.fwd_bwd_ms));
        println!("| implementation | forward ms | forward+backward ms | vs JAX forward | vs JAX forward+backward |");
        println!("|---|---|---|---|---|");
        for r in rows {
            let vs = |ms: f64, j: Option<f64>| j.map(|j| format!("{:.2}", ms / j)).unwrap_or_default();
            println!(
                "| {} | {:.3} | {:.3} | {} | {} |",
                r.name,
                r.fwd_ms,
                r.fwd_bwd_ms,
                vs(r.fwd_ms, jax.map(|j| j.0)),
                vs(r.fwd_bwd_ms, jax.map(|j| j.1))
            );
        }
    }
    Ok(())
}

fn compile_cmd(dir: &std::path::Path, reps: usize) -> BenchResult<()> {
    let r = lazuli_bench::compile::measure(dir, reps)?;
    let ratio = r.cold_compile.median() / r.warm_compile.median();
    println!("\ncompile: gpt-tiny's first step in a new process, cold (empty persistent compile cache) against warm (the cache the cold process wrote); {reps} pairs, medians (min–max); goal: warm ≥ 10× faster\n");
    println!("| | compile or load | first step | process start to end of first step |");
    println!("|---|---|---|---|");
    println!("| cold | {} | {} | {} |", r.cold_compile.show(), r.cold_step.show(), r.cold_process.show());
    println!("| warm | {} | {} | {} |", r.warm_compile.show(), r.warm_step.show(), r.warm_process.show());
    println!(
        "| cold/warm | {ratio:.1}× | {:.1}× | {:.1}× |",
        r.cold_step.median() / r.warm_step.median(),
        r.cold_process.median() / r.warm_process.median()
    );
    println!("\nwarm processes that loaded the program from the cache: {}/{reps}", r.warm_hits);
    Ok(())
}
