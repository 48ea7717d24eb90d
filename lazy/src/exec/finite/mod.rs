//! The finite check (`LAZULI_CHECK_FINITE`, `Config::check_finite`). When on, a step's program computes one more
//! output: counts of non-finite elements, one small `i32` vector, one count per group of floating-point outputs
//! (`hlo::finite::count_groups`): one reduction per group, not per output, since on a GPU a launch per output cost
//! more than the reading (on the CPU the two measured the same within its noise). Under `skip` the program also guards its state (`hlo::finite::guard`): each
//! parameter or optimizer state output becomes `select(all_finite, new, old)`, so a tripped step hands back the
//! values it was given, old state can still be donated to it, and nothing waits for the host. `stop` and `log`
//! donate nothing and keep the step's IR and inputs for the locator (guarding `stop` too measured slower on the
//! H200). `finish` keeps the counts as the step's pending check and hands them to no tensor.
//!
//! `stop` and `log` read the check at the next materialization, before it launches anything (and at `wait()` and
//! reads), when the host waits for that step anyway; a trip is located by [`locate`]: the step runs again on its
//! kept inputs with every floating-point node's count as output. `skip` reads a step's check once two later programs are
//! launched, so that reading it never waits for the device, and locates nothing.

mod locate;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use lazuli_hlo::finite::GROUP_TENSORS;
use lazuli_hlo::{Graph, Loc, TensorType};

use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::diagnostics::{self, EventKind};
use crate::error::{Error, Result};
use crate::graph::element::bytes_to_f64;
use crate::graph::tensor::Data;
use crate::runtime::{runtime, CheckFinite};

/// A step whose check has not been read yet.
pub(crate) struct Pending {
    /// The counts, one per group of `checked` ([`groups`]).
    counts: Data,
    /// The checked outputs' types and lines, in the order the counts group them (none under `skip`, whose one
    /// count is of what entered the update).
    checked: Vec<(TensorType, Loc)>,
    /// What a trip is located from (`stop` and `log`): the step's IR without the check, and its inputs.
    replay: Option<Replay>,
    /// The line whose materialization ran the step, and the step's number.
    at: Loc,
    step: u64,
    mode: CheckFinite,
    /// The program guards some state (it updates parameters or optimizer state).
    guarded: bool,
}

/// A step's IR (without the check) and its inputs, in parameter order.
pub(crate) struct Replay {
    pub graph: Graph,
    pub inputs: Vec<Data>,
}

/// Checks not read yet, oldest first: one under `stop` and `log`, up to two under `skip`.
static PENDING: Mutex<VecDeque<Pending>> = Mutex::new(VecDeque::new());
/// Whether `PENDING` holds a check: the common case (checking off) costs one load per materialization.
static HAS_PENDING: AtomicBool = AtomicBool::new(false);
/// `log` and `skip` print their first trip's report only; later trips are events.
static REPORTED: AtomicBool = AtomicBool::new(false);

/// Under `skip`: this many skipped steps in a row end the run. A bad batch is skipped once; a run that skips step
/// after step is stuck (its state non-finite, or an input that stays bad), and says so instead of skipping forever.
pub(crate) const SKIPS_IN_A_ROW: u64 = 20;
static SKIPPED_IN_A_ROW: AtomicU64 = AtomicU64::new(0);

/// Whether steps are checked under this configuration.
pub(crate) fn enabled(mode: CheckFinite) -> bool {
    mode != CheckFinite::Off
}

/// Whether a checked program keeps its state on a trip (and may donate it): `skip` only.
pub(crate) fn guards(mode: CheckFinite) -> bool {
    matches!(mode, CheckFinite::Skip)
}

/// Whether the step is located on a trip, from its IR and inputs kept until its check is read.
pub(crate) fn replays(mode: CheckFinite) -> bool {
    matches!(mode, CheckFinite::Stop | CheckFinite::Log)
}

/// The executable-cache key of a checked program: another program than the unchecked one of the same structure,
/// and than one with other guards.
pub(crate) fn key(key: u64, mode: CheckFinite, guards: &[(usize, usize)]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (key, "nonfinite", self::guards(mode), guards).hash(&mut h);
    h.finish()
}

/// `graph` with the check's output appended (after the step's own outputs) and the `guards` applied, for
/// emitting. On a mesh the counts have the layout `counts_sharding`.
///
/// Under `stop` and `log` nothing is guarded and the counts are the outputs'. Under `skip`, which is meant to stay
/// on, the guard is decided by the values entering the update (`hlo::finite::update_inputs`: the loss, the
/// gradients), so that the select fuses into the update, and the one count is theirs: as dynamic loss scaling, skip
/// reads no state. A non-finite state that an update makes from finite inputs makes the next steps' losses
/// non-finite; [`SKIPS_IN_A_ROW`] skipped steps in a row end the run with an error that says so.
pub(crate) fn with_check(
    graph: &Graph,
    guards: &[(usize, usize)],
    mode: CheckFinite,
    counts_sharding: Option<String>,
) -> Result<Graph> {
    let mut g = graph.clone();
    let loc = g.outputs.first().map_or(Loc::caller(), |&o| g.nodes[o].loc);
    let counts = match mode {
        CheckFinite::Skip => {
            let entering = lazuli_hlo::finite::update_inputs(&g, guards);
            let entering = lazuli_hlo::finite::count_nonfinite_grouped(&mut g, &entering, GROUP_TENSORS, loc)
                .map_err(Error::Internal)?;
            if let Some(e) = entering {
                lazuli_hlo::finite::guard(&mut g, e, guards, loc).map_err(Error::Internal)?;
            }
            lazuli_hlo::finite::total_of(&mut g, entering, loc).map_err(Error::Internal)?
        }
        _ => {
            let outputs = lazuli_hlo::finite::floating(&g, g.outputs.clone());
            let counts = lazuli_hlo::finite::count_nonfinite_grouped(&mut g, &outputs, GROUP_TENSORS, loc);
            match counts.map_err(Error::Internal)? {
                Some(c) => {
                    lazuli_hlo::finite::guard(&mut g, c, guards, loc).map_err(Error::Internal)?;
                    c
                }
                // A step without floating-point outputs still gets an output, so that every checked program has
                // one more.
                None => g.push(zero_counts(), Vec::new(), loc).map_err(Error::Internal)?,
            }
        }
    };
    g.outputs.push(counts);
    if g.partitions > 0 {
        g.output_shardings.push(counts_sharding);
    }
    Ok(g)
}

fn zero_counts() -> lazuli_hlo::Op {
    lazuli_hlo::Op::Constant(lazuli_hlo::Constant::new(0.0, TensorType::new(lazuli_hlo::DType::I32, [1])))
}

/// Keep a launched step's check until it is read: its counts, its floating-point outputs' types and lines, and,
/// where the mode locates trips, what to run it again from.
pub(crate) fn keep(
    counts: Data,
    checked: Vec<(TensorType, Loc)>,
    replay: Option<Replay>,
    at: Loc,
    mode: CheckFinite,
    guarded: bool,
) {
    let pending = Pending { counts, checked, replay, at, step: diagnostics::current_step(), mode, guarded };
    PENDING.lock().unwrap_or_else(|e| e.into_inner()).push_back(pending);
    HAS_PENDING.store(true, Relaxed);
}

/// The pending checks, oldest first: all of them, or all but the newest.
fn take(all: bool) -> Vec<Pending> {
    if !HAS_PENDING.load(Relaxed) {
        return Vec::new();
    }
    let mut queue = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    let n = if all { queue.len() } else { queue.len().saturating_sub(1) };
    let taken = queue.drain(..n).collect();
    HAS_PENDING.store(!queue.is_empty(), Relaxed);
    taken
}

/// Before a materialization launches anything: read a `stop` or `log` check now (an `Err` on a `stop` trip).
/// Under `skip` hand back every check but the newest, to be read by [`after_launch`] once this program is
/// queued: a step's check is read once two later programs were launched, and the in-flight bound has waited for
/// that step by then, so reading it never waits for the device.
pub(crate) fn before_launch() -> Result<Vec<Pending>> {
    if !HAS_PENDING.load(Relaxed) {
        return Ok(Vec::new());
    }
    if runtime()?.config.check_finite == CheckFinite::Skip {
        return Ok(take(false));
    }
    take(true).into_iter().try_for_each(read)?;
    Ok(Vec::new())
}

/// Read the checks [`before_launch`] handed back.
pub(crate) fn after_launch(pending: Vec<Pending>) -> Result<()> {
    pending.into_iter().try_for_each(read)
}

/// Read every pending check, whatever its mode (`wait()`).
pub(crate) fn check_pending() -> Result<()> {
    take(true).into_iter().try_for_each(read)
}

/// Read a check: an [`Error::NonFinite`] on a trip under `stop`; under `log` and `skip` the first trip's report
/// goes to stderr, and `skip` counts the step in `Metrics::skipped_steps`. Each trip is also an event
/// (`EventKind::NonFinite`).
fn read(pending: Pending) -> Result<()> {
    let mut counts = counts(&pending)?;
    // Under skip, the last count is of the values that entered the update: non-zero, the state was kept.
    let entered = if pending.mode == CheckFinite::Skip { counts.pop().unwrap_or(0) } else { 0 };
    if entered == 0 && counts.iter().all(|&c| c == 0) {
        if pending.mode == CheckFinite::Skip && pending.guarded {
            SKIPPED_IN_A_ROW.store(0, Relaxed);
        }
        return Ok(());
    }
    let mode = pending.mode;
    if mode == CheckFinite::Skip && pending.guarded {
        Counters::add(&COUNTERS.skipped_steps, 1);
        if SKIPPED_IN_A_ROW.fetch_add(1, Relaxed) + 1 >= SKIPS_IN_A_ROW {
            SKIPPED_IN_A_ROW.store(0, Relaxed);
            let report = report(&pending, &counts, None, entered)
                + &format!(
                    "\n  {SKIPS_IN_A_ROW} steps in a row were skipped: either the state itself is non-finite (an \
                     update can make it so from finite inputs, which skip does not read) or an input stays bad; stop \
                     locates the op"
                );
            emit_event(&pending, report.lines().map(str::to_string).collect());
            return Err(Error::NonFinite { at: pending.at, op_at: None, op: None, report });
        }
    }
    let first = !REPORTED.swap(true, Relaxed);
    let located = match &pending.replay {
        Some(r) if first || mode == CheckFinite::Stop => Some(locate::locate(runtime()?, &r.graph, &r.inputs)),
        _ => None,
    };
    let report = report(&pending, &counts, located.as_ref(), entered);
    emit_event(&pending, report.lines().map(str::to_string).collect());
    match mode {
        CheckFinite::Stop => {
            let (op_at, op) = match &located {
                Some(Ok(locate::Replayed { first: Some(l), .. })) => (Some(l.loc), Some(l.op)),
                _ => (None, None),
            };
            Err(Error::NonFinite { at: pending.at, op_at, op, report })
        }
        _ => {
            if first {
                eprintln!("lazuli: non-finite values in the step materialized at {}:\n{report}", pending.at);
            }
            Ok(())
        }
    }
}

/// The counts of the pending check, read from the device (its step has finished or is about to).
fn counts(p: &Pending) -> Result<Vec<u64>> {
    let n = if p.mode == CheckFinite::Skip { 1 } else { groups(p).len().max(1) };
    let ty = TensorType::new(lazuli_hlo::DType::I32, [n]);
    let reading = std::time::Instant::now();
    let bytes = p.counts.to_host(&ty)?;
    Counters::add(&COUNTERS.finite_read_ns, reading.elapsed().as_nanos() as u64);
    Ok(bytes_to_f64(lazuli_hlo::DType::I32, &bytes).into_iter().map(|c| c as u64).collect())
}

/// The groups of `p.checked` that the counts count, in order.
fn groups(p: &Pending) -> Vec<std::ops::Range<usize>> {
    lazuli_hlo::finite::count_groups(&p.checked.iter().map(|(ty, _)| ty).collect::<Vec<_>>(), GROUP_TENSORS)
}

/// The outputs a report lists (a model's weights all go non-finite together; the first few say enough).
const SHOWN: usize = 6;

/// The report of a trip: the step, the outputs with non-finite values, what became of its state, and where the
/// values came from.
fn report(p: &Pending, counts: &[u64], located: Option<&Result<locate::Replayed>>, entered: u64) -> String {
    let mut out = match located {
        Some(Ok(replayed)) if replayed.outputs.len() == p.checked.len() => by_output(p, &replayed.outputs),
        _ => by_group(p, counts),
    };
    match p.mode {
        CheckFinite::Skip if !p.guarded => out += "  the program updates no state: nothing to skip\n",
        CheckFinite::Skip if entered > 0 => {
            out += &format!(
                "  skipped: {entered} non-finite values entered the update; parameters and optimizer state keep \
                 their values from before the step\n"
            )
        }
        _ => {}
    }
    match located {
        Some(Ok(locate::Replayed { first: Some(l), .. })) => out += &l.describe(),
        Some(Ok(_)) => out += "  no op of the step made a non-finite value when it ran again on the same inputs",
        Some(Err(e)) => out += &format!("  locating the first non-finite value failed: {e}"),
        None if p.mode == CheckFinite::Skip && entered > 0 && p.guarded => {
            out += "  not located under skip (stop locates the first op)"
        }
        None if p.mode == CheckFinite::Skip => {}
        None => out += "  not located: only the first trip is reported under log",
    }
    out
}

/// The outputs with non-finite values, one by one, from the counts of a run of the step again.
fn by_output(p: &Pending, counts: &[u64]) -> String {
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
    out
}

/// The groups of outputs with non-finite values, as the step's check counted them: each group's count and its
/// members (the first few).
fn by_group(p: &Pending, counts: &[u64]) -> String {
    let mut out = format!("  step {}:\n", p.step);
    if counts.iter().any(|&c| c > 0) {
        out += "  non-finite values among its floating-point outputs:\n";
    }
    let mut shown = 0;
    for (group, &c) in groups(p).into_iter().zip(counts).filter(|(_, &c)| c > 0) {
        let members = &p.checked[group];
        let elements: usize = members.iter().map(|(ty, _)| ty.elements()).sum();
        match members {
            [(ty, loc)] => out += &format!("    {ty} recorded at {loc}: {c} of {elements} non-finite\n"),
            _ => out += &format!("    {c} of {elements} non-finite in one count of {} outputs:\n", members.len()),
        }
        for (ty, loc) in members.iter().filter(|_| members.len() > 1).take(SHOWN.saturating_sub(shown)) {
            out += &format!("      {ty} recorded at {loc}\n");
            shown += 1;
        }
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
