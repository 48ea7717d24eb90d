//! Materialization events: what ran, why, where in the user's code, and what it cost. Emitted through `tracing`
//! (target `lazuli`, level DEBUG) and, when `LAZULI_EVENTS` names a file, appended to it as JSON lines. With no
//! subscriber interested and no file, no event is even built.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// What an event describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A program ran (and maybe compiled).
    Program,
    /// A tensor was copied to the host.
    Read,
    /// A step boundary (`lazuli::sync()`) completed.
    StepEnd,
    /// A step's outputs held NaN or infinite values (`LAZULI_CHECK_FINITE`); `explanation` holds the report.
    NonFinite,
}

/// One event. Times are milliseconds; `start_us` counts from the process's first event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// What happened: a program, a read or a step boundary.
    pub kind: EventKind,
    /// `item`, `to_vec`, `display`, `sync`, `gradients`, `checkpoint`, `host_control_flow`, `explicit`, `graph_size`.
    pub cause: String,
    /// Source file of the line that caused it (the materializing call).
    pub file: String,
    /// Line in `file`.
    pub line: u32,
    /// Column in `line`.
    pub col: u32,
    /// The step it happened in, counted from 0 (`sync()` ends a step).
    pub step: u64,
    /// 1-based position of this program among the checked programs of its step.
    pub program_in_step: u32,
    /// Inside `diagnostics::unchecked` (evaluation, sampling): not part of the step's accounting.
    pub unchecked: bool,
    /// The program's structure hash (hex): equal hashes are the same compiled program.
    pub graph_hash: String,
    /// Nodes in the program's graph.
    pub nodes: usize,
    /// The program's inputs (parameters).
    pub inputs: usize,
    /// The program's outputs.
    pub outputs: usize,
    /// The program was already compiled in this process (no compile, no load).
    pub cache_hit: bool,
    /// A cache miss served by the persistent compile cache: `compile_ms` is the time to load it.
    #[serde(default)]
    pub disk_hit: bool,
    /// A compile after the warm-up steps.
    pub recompile: bool,
    /// Time compiling the program (or loading it from the persistent compile cache); 0 on a cache hit.
    pub compile_ms: f64,
    /// Time launching the program (execution is asynchronous on GPUs and TPUs).
    pub execute_ms: f64,
    /// Time copying data: uploads for a program, the copy to the host for a read.
    pub transfer_ms: f64,
    /// Bytes uploaded for the program.
    pub bytes_to_device: u64,
    /// Bytes read back to the host.
    pub bytes_to_host: u64,
    /// When the event began, in microseconds from the process's first event.
    pub start_us: f64,
    /// For a compile: how this graph differs from the closest one compiled before (the text of `differences`).
    pub explanation: Vec<String>,
    /// For a compile: each difference from the closest graph compiled before, with its kind and the line that
    /// recorded it (the cause's site; `file`/`line` above are where the program was materialized).
    #[serde(default)]
    pub differences: Vec<super::explain::Difference>,
    /// For a compile: each custom kernel of the program with the implementation it runs and why
    /// (`attention at src/model.rs:42:9: cudnn (bf16, head dim 64, causal)`).
    #[serde(default)]
    pub kernels: Vec<String>,
    /// For a compile: structure the program repeats (`12 copies of 310 nodes recorded at src/model.rs:40–58 (9
    /// lines)`), the copies that a scanned body would compile once; the most nodes saved first.
    #[serde(default)]
    pub repeats: Vec<String>,
}

impl Event {
    /// An event of `kind` caused by `cause` at `at`, in the current step, starting now; the measurements are zero until
    /// filled in.
    pub fn new(kind: EventKind, cause: &str, at: lazuli_hlo::Loc) -> Event {
        Event {
            kind,
            cause: cause.to_string(),
            file: at.file.to_string(),
            line: at.line,
            col: at.col,
            step: super::steps::current_step(),
            program_in_step: 0,
            unchecked: false,
            graph_hash: String::new(),
            nodes: 0,
            inputs: 0,
            outputs: 0,
            cache_hit: false,
            disk_hit: false,
            recompile: false,
            compile_ms: 0.0,
            execute_ms: 0.0,
            transfer_ms: 0.0,
            bytes_to_device: 0,
            bytes_to_host: 0,
            start_us: now_us(),
            explanation: Vec::new(),
            differences: Vec::new(),
            kernels: Vec::new(),
            repeats: Vec::new(),
        }
    }

    /// Total wall time the event accounts for (ms).
    pub fn total_ms(&self) -> f64 {
        self.compile_ms + self.execute_ms + self.transfer_ms
    }

    /// `file:line`.
    pub fn site(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// Microseconds since the first call in this process.
pub fn now_us() -> f64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e6
}

/// The JSON-lines file named by `LAZULI_EVENTS`, opened for appending on first use.
fn sink() -> &'static Option<Mutex<std::fs::File>> {
    static SINK: OnceLock<Option<Mutex<std::fs::File>>> = OnceLock::new();
    SINK.get_or_init(|| {
        let path = crate::settings::events_file()?;
        match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
            Ok(f) => Some(Mutex::new(f)),
            Err(e) => {
                eprintln!("lazuli: cannot open LAZULI_EVENTS={}: {e}; events are off", path.display());
                None
            }
        }
    })
}

static CAPTURING: AtomicBool = AtomicBool::new(false);
static CAPTURED: Mutex<Vec<Event>> = Mutex::new(Vec::new());

/// Start keeping events in memory (for tests and tools in the same process); `take_captured` returns them.
pub fn start_capture() {
    CAPTURED.lock().unwrap_or_else(|p| p.into_inner()).clear();
    CAPTURING.store(true, Relaxed);
}

/// Stop capturing and return what was captured.
pub fn take_captured() -> Vec<Event> {
    CAPTURING.store(false, Relaxed);
    std::mem::take(&mut *CAPTURED.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Whether anyone listens: an event file, an in-memory capture, or a `tracing` subscriber for target `lazuli`
/// at DEBUG.
pub fn enabled() -> bool {
    CAPTURING.load(Relaxed) || sink().is_some() || tracing::enabled!(target: "lazuli", tracing::Level::DEBUG)
}

/// Send an event to the listeners.
pub fn emit(e: &Event) {
    tracing::debug!(
        target: "lazuli",
        kind = ?e.kind,
        cause = %e.cause,
        site = %e.site(),
        step = e.step,
        program_in_step = e.program_in_step,
        graph_hash = %e.graph_hash,
        nodes = e.nodes,
        cache_hit = e.cache_hit,
        disk_hit = e.disk_hit,
        recompile = e.recompile,
        compile_ms = e.compile_ms,
        execute_ms = e.execute_ms,
        transfer_ms = e.transfer_ms,
        bytes_to_device = e.bytes_to_device,
        bytes_to_host = e.bytes_to_host,
        explanation = ?e.explanation,
        differences = ?e.differences.iter().map(|d| format!("{:?} at {}", d.kind, d.site)).collect::<Vec<_>>(),
        kernels = ?e.kernels,
        "materialization"
    );
    if CAPTURING.load(Relaxed) {
        CAPTURED.lock().unwrap_or_else(|p| p.into_inner()).push(e.clone());
    }
    if let Some(file) = sink() {
        if let Ok(mut line) = serde_json::to_vec(e) {
            line.push(b'\n');
            let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
            // One write per line keeps lines whole when several processes append to one file.
            let _ = f.write_all(&line);
        }
    }
}
