//! `lazuli-report`: read an event file written with `LAZULI_EVENTS=events.jsonl` and say where the time went:
//! steps, programs per step, compile vs execute vs transfer, the graph breaks per call site ranked by time lost,
//! and the recompiles per cause (an input's shape, a loop count, a constant, other ops) at the line that caused
//! them, with the lines that materialized them, their steps, explanations and fixes.
//!
//! lazuli-report events.jsonl [--json report.json] [--chrome trace.json]
//!
//! From the repository: `cargo run --release --bin lazuli-report -- events.jsonl`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use lazuli::diagnostics::report;

/// The tool parses and groups every event of a run: many small allocations, which mimalloc serves faster than
/// glibc's malloc. lazuli itself installs no allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "lazuli-report", about = "Graph breaks, recompiles and where the time went, from a lazuli event file")]
struct Args {
    /// The JSON-lines event file (`LAZULI_EVENTS=...` when the program ran).
    events: PathBuf,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write a Chrome/Perfetto trace of uploads, compiles, executions and reads here.
    #[arg(long)]
    chrome: Option<PathBuf>,
}

fn run(args: &Args) -> Result<(), String> {
    let text = std::fs::read_to_string(&args.events).map_err(|e| format!("reading {}: {e}", args.events.display()))?;
    let events = report::parse(&text).map_err(|e| format!("{}: {e}", args.events.display()))?;
    let r = report::analyse(&events);
    print!("{}", report::render(&r));
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.chrome {
        let json = serde_json::to_string(&report::chrome_trace(&events)).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lazuli-report: {e}");
            ExitCode::FAILURE
        }
    }
}
