//! The finite check (`LAZULI_CHECK_FINITE`, `Config::check_finite`). When on, a single-device step's program
//! computes one more output: each floating-point output's count of non-finite elements, one small `i32` vector
//! that XLA fuses with the outputs' producers. `finish` keeps it as the step's pending check, with the step's IR
//! and its input values (donation is off while checking, so the inputs survive the step), and hands it to no
//! tensor. The next materialization (before it launches anything), `wait()` and reads read it: by then the host
//! waits for that step anyway, so checking never waits for the device just to check. A trip is located by
//! [`locate`]: the step runs again on its kept inputs with every floating-point node's count as output.

mod locate;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

use lazuli_hlo::{Graph, Loc, TensorType};

use crate::diagnostics::{self, EventKind};
use crate::error::{Error, Result};
use crate::graph::element::bytes_to_f64;
use crate::graph::tensor::Data;
use crate::runtime::{runtime, CheckFinite};

/// A step whose check has not been read yet.
pub(crate) struct Pending {
    /// The counts, one per entry of `checked`.
    counts: Data,
    /// The checked outputs' types and lines, in the counts' order.
    checked: Vec<(TensorType, Loc)>,
    /// The step's IR (without the check), for locating a trip.
    graph: Graph,
    /// The step's inputs, in parameter order.
    inputs: Vec<Data>,
    /// The line whose materialization ran the step, and the step's number.
    at: Loc,
    step: u64,
}

static PENDING: Mutex<Option<Pending>> = Mutex::new(None);
/// Whether `PENDING` holds a check: the common case (checking off) costs one load per materialization.
static HAS_PENDING: AtomicBool = AtomicBool::new(false);
/// `log` prints its first trip's report only; later trips are events.
static LOGGED: AtomicBool = AtomicBool::new(false);

/// Whether steps are checked under this configuration.
pub(crate) fn enabled(mode: CheckFinite) -> bool {
    mode != CheckFinite::Off
}

/// The executable-cache key of a checked program: another program than the unchecked one of the same structure.
pub(crate) fn key(key: u64) -> u64 {
    key ^ 0x6e6f_6e66_696e_6974 // "nonfinit"
}

/// `graph` with the check's output appended (after the step's own outputs), for emitting.
pub(crate) fn with_check(graph: &Graph) -> Result<Graph> {
    let mut g = graph.clone();
    let outputs = lazuli_hlo::finite::floating(&g, g.outputs.clone());
    let loc = g.outputs.first().map_or(Loc::caller(), |&o| g.nodes[o].loc);
    let counts = lazuli_hlo::finite::count_nonfinite(&mut g, &outputs, loc).map_err(Error::Internal)?;
    // A step without floating-point outputs still gets an output, so that every checked program has one more.
    let counts = match counts {
        Some(c) => c,
        None => g.push(zero_counts(), Vec::new(), loc).map_err(Error::Internal)?,
    };
    g.outputs.push(counts);
    Ok(g)
}

fn zero_counts() -> lazuli_hlo::Op {
    lazuli_hlo::Op::Constant(lazuli_hlo::Constant::new(0.0, TensorType::new(lazuli_hlo::DType::I32, [1])))
}

/// Keep a launched step's check until it is read. `graph` is the step's IR (its outputs the step's own).
pub(crate) fn keep(counts: Data, graph: Graph, inputs: Vec<Data>, at: Loc) {
    let checked = graph
        .outputs
        .iter()
        .filter(|&&o| graph.nodes[o].ty.dtype.is_float())
        .map(|&o| (graph.nodes[o].ty.clone(), graph.nodes[o].loc))
        .collect();
    let pending = Pending { counts, checked, graph, inputs, at, step: diagnostics::current_step() };
    *PENDING.lock().unwrap_or_else(|e| e.into_inner()) = Some(pending);
    HAS_PENDING.store(true, Relaxed);
}

/// Read the pending check, if any: an [`Error::NonFinite`] on a trip under `stop`; under `log` the first trip's
/// report goes to stderr. Each trip is also an event (`EventKind::NonFinite`).
pub(crate) fn check_pending() -> Result<()> {
    if !HAS_PENDING.load(Relaxed) {
        return Ok(());
    }
    let Some(pending) = PENDING.lock().unwrap_or_else(|e| e.into_inner()).take() else { return Ok(()) };
    HAS_PENDING.store(false, Relaxed);
    let counts = counts(&pending)?;
    if counts.iter().all(|&c| c == 0) {
        return Ok(());
    }
    let rt = runtime()?;
    let mode = rt.config.check_finite;
    if mode == CheckFinite::Log && LOGGED.swap(true, Relaxed) {
        emit_event(&pending, vec!["not located: only the first trip is reported under log".into()]);
        return Ok(());
    }
    let located = locate::locate(rt, &pending.graph, &pending.inputs);
    let report = report(&pending, &counts, &located);
    emit_event(&pending, report.lines().map(str::to_string).collect());
    match mode {
        CheckFinite::Log => {
            eprintln!("lazuli: non-finite values in the step materialized at {}:\n{report}", pending.at);
            Ok(())
        }
        _ => {
            let (op_at, op) = match &located {
                Ok(Some(l)) => (Some(l.loc), Some(l.op)),
                _ => (None, None),
            };
            Err(Error::NonFinite { at: pending.at, op_at, op, report })
        }
    }
}

/// The counts of the pending check, read from the device (its step has finished or is about to).
fn counts(p: &Pending) -> Result<Vec<u64>> {
    let ty = TensorType::new(lazuli_hlo::DType::I32, [p.checked.len().max(1)]);
    let bytes = p.counts.to_host(&ty)?;
    Ok(bytes_to_f64(lazuli_hlo::DType::I32, &bytes).into_iter().map(|c| c as u64).collect())
}

/// The outputs a report lists (a model's weights all go non-finite together; the first few say enough).
const SHOWN: usize = 6;

/// The report of a trip: the step, the outputs with non-finite values, and where they came from.
fn report(p: &Pending, counts: &[u64], located: &Result<Option<locate::Located>>) -> String {
    let bad: Vec<String> = p
        .checked
        .iter()
        .zip(counts)
        .filter(|(_, &c)| c > 0)
        .map(|((ty, loc), c)| format!("    {ty} recorded at {loc}: {c} of {} non-finite", ty.elements()))
        .collect();
    let (n, total) = (bad.len(), p.checked.len());
    let mut out = format!("  step {}: {n} of its {total} floating-point outputs hold non-finite values\n", p.step);
    for line in bad.iter().take(SHOWN) {
        out += line;
        out += "\n";
    }
    if n > SHOWN {
        out += &format!("    … and {} more\n", n - SHOWN);
    }
    match located {
        Ok(Some(l)) => out += &l.describe(),
        Ok(None) => out += "  no op of the step made a non-finite value when it ran again on the same inputs",
        Err(e) => out += &format!("  locating the first non-finite value failed: {e}"),
    }
    out
}

fn emit_event(p: &Pending, lines: Vec<String>) {
    if diagnostics::events::enabled() {
        let mut e = diagnostics::Event::new(EventKind::NonFinite, "check_finite", p.at);
        e.step = p.step;
        e.explanation = lines;
        diagnostics::events::emit(&e);
    }
}
