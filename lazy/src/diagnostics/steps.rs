//! Step accounting and strict mode. A step is what runs between two step boundaries (`lazuli::sync()`). A step
//! that runs more than one program has graph breaks; a compile after the warm-up steps is a recompile. Strict
//! mode turns either into an error at the offending call, with the same explanation the report gives.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use lazuli_hlo::{Graph, Loc};

use super::explain::{closest, explain};
use crate::error::{Error, Result};
use crate::materialize::Cause;

static STEP: AtomicU64 = AtomicU64::new(0);
static PROGRAMS_IN_STEP: AtomicU32 = AtomicU32::new(0);

/// Steps completed so far (the current step's number, counting from 0).
pub fn current_step() -> u64 {
    STEP.load(Relaxed)
}

/// Called by `sync()` after its program: the next step begins.
pub(crate) fn end_step() {
    STEP.fetch_add(1, Relaxed);
    PROGRAMS_IN_STEP.store(0, Relaxed);
}

/// Limits strict mode enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Programs a step may run, the step boundary's own included (1: no graph breaks).
    pub programs_per_step: u32,
    /// Compiles are allowed only in steps before this one (2: steps 0 and 1 warm up).
    pub compile_until_step: u64,
}

impl Budget {
    /// One program per step, no compiles after step 2.
    pub const fn training() -> Budget {
        Budget { programs_per_step: 1, compile_until_step: 2 }
    }

    /// `LAZULI_STRICT`: `1`/`on` for [`Budget::training`], or `programs=N,warmup=S`.
    fn from_env() -> Option<Budget> {
        let v = std::env::var("LAZULI_STRICT").ok()?;
        let v = v.trim();
        if v.is_empty() || v == "0" || v.eq_ignore_ascii_case("off") {
            return None;
        }
        let mut b = Budget::training();
        for part in v.split(',') {
            match part.split_once('=') {
                Some(("programs", n)) => b.programs_per_step = n.parse().unwrap_or(b.programs_per_step),
                Some(("warmup", n)) => b.compile_until_step = n.parse().unwrap_or(b.compile_until_step),
                _ => {}
            }
        }
        Some(b)
    }
}

/// The active budget and the step it counts from; `None` when strict mode is off. Initialized from
/// `LAZULI_STRICT` (counting from step 0).
fn strict() -> &'static Mutex<Option<(Budget, u64)>> {
    static STRICT: std::sync::OnceLock<Mutex<Option<(Budget, u64)>>> = std::sync::OnceLock::new();
    STRICT.get_or_init(|| Mutex::new(Budget::from_env().map(|b| (b, 0))))
}

fn set(v: Option<(Budget, u64)>) {
    *strict().lock().unwrap_or_else(|e| e.into_inner()) = v;
}

/// Turn strict mode on (with a budget whose warm-up counts from the current step) or off, for the whole process.
pub fn set_strict(budget: Option<Budget>) {
    set(budget.map(|b| (b, current_step())));
}

/// The budget strict mode enforces now, and the step its warm-up counts from.
pub fn strict_budget() -> Option<(Budget, u64)> {
    *strict().lock().unwrap_or_else(|e| e.into_inner())
}

/// Strict mode with `budget` from the current step until the guard is dropped (then the previous setting
/// returns): "at most 1 program per step, no compiles after 2 steps of this scope".
pub fn strict_scope(budget: Budget) -> StrictScope {
    let previous = strict_budget();
    set_strict(Some(budget));
    StrictScope { previous }
}

pub struct StrictScope {
    previous: Option<(Budget, u64)>,
}

impl Drop for StrictScope {
    fn drop(&mut self) {
        set(self.previous);
    }
}

thread_local! {
    static UNCHECKED: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` outside the step accounting (evaluation, sampling, logging tools): its programs are neither graph
/// breaks nor recompiles, and strict mode lets them through. They still appear in events, marked `unchecked`.
pub fn unchecked<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            UNCHECKED.with(|u| u.set(self.0));
        }
    }
    let _restore = Restore(UNCHECKED.with(|u| u.replace(true)));
    f()
}

/// Graphs compiled so far (most recent last), for explaining the next miss.
fn history() -> &'static Mutex<Vec<Arc<Graph>>> {
    static H: std::sync::OnceLock<Mutex<Vec<Arc<Graph>>>> = std::sync::OnceLock::new();
    H.get_or_init(|| Mutex::new(Vec::new()))
}

/// Kept so that explanations stay cheap and memory bounded.
const HISTORY: usize = 32;

/// What `before_program` decided, for the event.
pub(crate) struct ProgramCheck {
    pub program_in_step: u32,
    pub unchecked: bool,
    pub recompile: bool,
    pub explanation: Vec<String>,
}

/// Account for a program about to run; in strict mode, refuse a graph break or a recompile.
/// `graph` is the new program's IR on a cache miss (`None` on a hit).
pub(crate) fn before_program(cause: Cause, at: Loc, cache_hit: bool, graph: Option<&Graph>) -> Result<ProgramCheck> {
    let unchecked = UNCHECKED.with(|u| u.get());
    let step = current_step();
    let explanation = if let Some(graph) = graph {
        let h = history().lock().unwrap_or_else(|e| e.into_inner());
        match closest(graph, h.iter().map(|g| g.as_ref())) {
            Some((_, before)) => explain(graph, before),
            None => Vec::new(),
        }
    } else {
        Vec::new()
    };
    if let Some(graph) = graph {
        let mut h = history().lock().unwrap_or_else(|e| e.into_inner());
        if h.len() == HISTORY {
            h.remove(0);
        }
        h.push(Arc::new(graph.clone()));
    }
    if unchecked {
        return Ok(ProgramCheck { program_in_step: 0, unchecked, recompile: false, explanation });
    }
    let program_in_step = PROGRAMS_IN_STEP.fetch_add(1, Relaxed) + 1;
    let recompile = !cache_hit && step >= 1;
    if let Some((b, since)) = strict_budget() {
        // The step boundary's own program is still to come unless this is it.
        let will_run = program_in_step + u32::from(cause != Cause::Sync);
        if will_run > b.programs_per_step {
            PROGRAMS_IN_STEP.fetch_sub(1, Relaxed);
            return Err(Error::Strict(format!(
                "graph break at {at}: {} forces a program in the middle of step {step} (budget: {} program(s) per step)\n  advice: {}",
                cause_name(cause),
                b.programs_per_step,
                advice(cause)
            )));
        }
        if !cache_hit && step >= since + b.compile_until_step {
            PROGRAMS_IN_STEP.fetch_sub(1, Relaxed);
            let why =
                if explanation.is_empty() { vec!["no graph compiled before resembles it".into()] } else { explanation };
            return Err(Error::Strict(format!(
                "recompile at {at} in step {step} (compiles allowed until step {}):\n  {}",
                since + b.compile_until_step,
                why.join("\n  ")
            )));
        }
    }
    Ok(ProgramCheck { program_in_step, unchecked, recompile, explanation })
}

/// The event name of a cause.
pub fn cause_name(c: Cause) -> &'static str {
    match c {
        Cause::Item => "item",
        Cause::ToVec => "to_vec",
        Cause::Display => "display",
        Cause::Sync => "sync",
        Cause::Explicit => "explicit",
        Cause::Checkpoint => "checkpoint",
        Cause::HostControlFlow => "host_control_flow",
    }
}

/// What to do about a break with this cause.
pub fn advice(c: Cause) -> &'static str {
    match c {
        Cause::Item | Cause::ToVec | Cause::Display => {
            "read the value after the step boundary (lazuli::sync()): it is computed by the step's program and reading it then runs nothing"
        }
        Cause::HostControlFlow => {
            "decide on the device instead (cond.select(a, b)), or branch on a value read after the step boundary"
        }
        Cause::Checkpoint => "save checkpoints right after lazuli::sync(), not in the middle of a step",
        Cause::Explicit => "materialize() forces a program; let the step boundary compute the tensor instead",
        Cause::Sync => "a step ran more programs than its budget",
    }
}
