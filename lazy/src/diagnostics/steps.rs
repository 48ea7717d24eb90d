//! Step accounting and strict mode. A step is what runs between two step boundaries (`lazuli::sync()`). A step
//! that runs more than one program has graph breaks; a compile after the warm-up steps is a recompile. Strict
//! mode turns either into an error at the offending call, with the same explanation the report gives.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use lazuli_hlo::{Graph, Loc};

use super::explain::{explain_miss, Compiled, DiffKind, Difference};
use super::Cause;
use crate::error::{Error, Result};

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

/// The values `LAZULI_STRICT` takes, for its errors.
const ACCEPTED: &str =
    "expected 1 (or on, true), 0 (or off, false, empty), or programs=N,warmup=S with N ≥ 1 and S ≥ 0 (either may be left out)";

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

    /// The setting of `LAZULI_STRICT`: unset, empty, `0`, `off` or `false` for off; `1`, `on` or `true` for
    /// [`Budget::training`]; or `programs=N,warmup=S` (either or both; N ≥ 1 programs per step, compiles allowed
    /// in the first S steps; the other as in [`Budget::training`]). Anything else is an error naming the
    /// variable and the accepted values, never a silent on or off.
    pub fn from_env() -> Result<Option<Budget>> {
        Budget::read_env().map_err(Error::Config)
    }

    fn read_env() -> std::result::Result<Option<Budget>, String> {
        let Some(v) = crate::settings::strict() else { return Ok(None) };
        Budget::parse(&v).map_err(|why| format!("LAZULI_STRICT={v:?}: {why}; {ACCEPTED}"))
    }

    /// Parse a `LAZULI_STRICT` value; the error says what is wrong with it.
    fn parse(v: &str) -> std::result::Result<Option<Budget>, String> {
        let v = v.trim();
        match v.to_ascii_lowercase().as_str() {
            "" | "0" | "off" | "false" => return Ok(None),
            "1" | "on" | "true" => return Ok(Some(Budget::training())),
            _ => {}
        }
        let mut b = Budget::training();
        let (mut programs, mut warmup) = (false, false);
        for part in v.split(',').map(str::trim) {
            let Some((key, n)) = part.split_once('=') else {
                return Err(format!("{part:?} is not a known value or key=value"));
            };
            let (key, n) = (key.trim(), n.trim());
            let seen = match key {
                "programs" => &mut programs,
                "warmup" => &mut warmup,
                _ => return Err(format!("unknown key {key:?}")),
            };
            if std::mem::replace(seen, true) {
                return Err(format!("{key} is given twice"));
            }
            let bad = || format!("{key}={n:?} is not a whole number{}", if key == "programs" { " ≥ 1" } else { "" });
            if key == "programs" {
                b.programs_per_step = n.parse().ok().filter(|&p| p >= 1).ok_or_else(bad)?;
            } else {
                b.compile_until_step = n.parse().map_err(|_| bad())?;
            }
        }
        Ok(Some(b))
    }
}

/// `LAZULI_STRICT`, read once; a malformed value stays an error that every checked program reports.
fn env_setting() -> &'static std::result::Result<Option<Budget>, String> {
    static SETTING: std::sync::OnceLock<std::result::Result<Option<Budget>, String>> = std::sync::OnceLock::new();
    SETTING.get_or_init(Budget::read_env)
}

/// The active budget and the step it counts from; `None` when strict mode is off. Initialized from
/// `LAZULI_STRICT` (counting from step 0); off when the setting is malformed (`before_program` reports it).
fn strict() -> &'static Mutex<Option<(Budget, u64)>> {
    static STRICT: std::sync::OnceLock<Mutex<Option<(Budget, u64)>>> = std::sync::OnceLock::new();
    STRICT.get_or_init(|| Mutex::new(env_setting().as_ref().ok().copied().flatten().map(|b| (b, 0))))
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

/// The guard of `strict_scope`: dropping it restores the previous strict setting.
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
fn history() -> &'static Mutex<Vec<Compiled>> {
    static H: Mutex<Vec<Compiled>> = Mutex::new(Vec::new());
    &H
}

/// Kept so that explanations stay cheap and memory bounded.
const HISTORY: usize = 32;

/// What `before_program` decided, for the event.
pub(crate) struct ProgramCheck {
    pub program_in_step: u32,
    pub unchecked: bool,
    pub recompile: bool,
    /// For a compile: the differences' text, one line each.
    pub explanation: Vec<String>,
    /// For a compile: how it differs from the closest graph compiled before, each at the line that caused it.
    pub differences: Vec<Difference>,
}

/// Explain a new graph against the history, then add it to the history.
fn explain_new(graph: &Graph, at: Loc) -> Vec<Difference> {
    let compiled = Compiled::new(graph.clone());
    let mut h = history().lock().unwrap_or_else(|e| e.into_inner());
    let differences = explain_miss(&compiled, at, &h);
    if h.len() == HISTORY {
        h.remove(0);
    }
    h.push(compiled);
    differences
}

/// Why a program about to run is compiled (on a cache miss).
pub(crate) enum Compiling<'g> {
    /// A graph the program cache has not held: its IR, to compare with the graphs compiled before.
    Graph(&'g Graph),
    /// A graph compiled before and evicted by the program cache.
    Evicted,
}

/// Account for a program about to run; in strict mode, refuse a graph break or a recompile.
/// `compiling` says why the program is compiled on a cache miss (`None` on a hit).
pub(crate) fn before_program(
    cause: Cause,
    at: Loc,
    cache_hit: bool,
    compiling: Option<Compiling<'_>>,
) -> Result<ProgramCheck> {
    if let Err(e) = env_setting() {
        return Err(Error::Config(e.clone()));
    }
    let unchecked = UNCHECKED.with(|u| u.get());
    let step = current_step();
    let differences = match compiling {
        None => Vec::new(),
        Some(Compiling::Graph(g)) => explain_new(g, at),
        Some(Compiling::Evicted) => vec![Difference {
            kind: DiffKind::Evicted,
            site: super::compare::site(&at),
            text: vec!["the same graph was compiled before; the program cache evicted it".into()],
        }],
    };
    let explanation: Vec<String> = differences.iter().flat_map(|d| d.text.iter().cloned()).collect();
    if unchecked {
        return Ok(ProgramCheck { program_in_step: 0, unchecked, recompile: false, explanation, differences });
    }
    // The gradients launched before an update are part of the step boundary: they do not count as a program of
    // the step's budget.
    let program_in_step = match cause {
        Cause::Gradients => PROGRAMS_IN_STEP.load(Relaxed) + 1,
        _ => PROGRAMS_IN_STEP.fetch_add(1, Relaxed) + 1,
    };
    let recompile = !cache_hit && step >= 1;
    if let Some((b, since)) = strict_budget() {
        // The step boundary's own program is still to come unless this is it.
        let will_run = program_in_step + u32::from(!matches!(cause, Cause::Sync | Cause::Gradients));
        let uncount = || {
            if cause != Cause::Gradients {
                PROGRAMS_IN_STEP.fetch_sub(1, Relaxed);
            }
        };
        if will_run > b.programs_per_step {
            uncount();
            return Err(Error::Strict(format!(
                "graph break at {at}: {} forces a program in the middle of step {step} (budget: {} program(s) per step)\n  advice: {}",
                cause_name(cause),
                b.programs_per_step,
                advice(cause)
            )));
        }
        if !cache_hit && step >= since + b.compile_until_step {
            uncount();
            return Err(Error::Strict(format!(
                "recompile at {at} in step {step} (compiles allowed until step {}):\n{}",
                since + b.compile_until_step,
                recompile_reasons(&differences)
            )));
        }
    }
    Ok(ProgramCheck { program_in_step, unchecked, recompile, explanation, differences })
}

/// Each difference with its line and its fix, indented for a strict-mode error.
fn recompile_reasons(differences: &[Difference]) -> String {
    if differences.is_empty() {
        return "  no graph compiled before resembles it".into();
    }
    let mut out = Vec::new();
    for d in differences {
        out.push(format!("  cause: {} at {}", d.kind.label(), d.site));
        out.extend(d.text.iter().map(|t| format!("    {t}")));
        out.push(format!("    advice: {}", d.kind.advice()));
    }
    out.join("\n")
}

/// The event name of a cause.
pub fn cause_name(c: Cause) -> &'static str {
    match c {
        Cause::Item => "item",
        Cause::ToVec => "to_vec",
        Cause::Display => "display",
        Cause::Sync => "sync",
        Cause::Gradients => "gradients",
        Cause::Explicit => "explicit",
        Cause::Checkpoint => "checkpoint",
        Cause::HostControlFlow => "host_control_flow",
        Cause::GraphSize => "graph_size",
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
        Cause::Gradients => {
            "the gradients, launched before the optimizer's update (LAZULI_SPLIT_UPDATE): part of the step boundary"
        }
        Cause::GraphSize => {
            "the graph grew too large without a step boundary and was compiled in pieces: call lazuli::sync() inside the loop that records it"
        }
    }
}
