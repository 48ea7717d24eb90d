//! The finite check (`LAZULI_CHECK_FINITE`, `Config::check_finite`). When on, a step's program computes one more
//! output: counts of non-finite elements, one small `i32` vector (`hlo::finite::count_groups`, shaped per backend by
//! [`counting`]: on a GPU a guarded check's one total by rows of each tensor, `log`'s counts one reduction per group
//! of up to 32 tensors; on the CPU large tensors alone, their rows summed first, and a guarded check's partial counts
//! joined before its one sum). Where lazuli's counting kernel applies (one NVIDIA GPU), a guarded check's total is
//! instead that kernel's, one launch over every tensor ([`count_by_kernel`]).
//!
//! `skip` and `stop` count only what enters the update (`hlo::finite::update_inputs`: the loss, the gradients, or a
//! product's smaller operands for a gradient that is one, the outputs that are not state), one total, and guard the
//! state (`hlo::finite::guard`): each parameter or optimizer state output becomes `select(tripped, old, new)`, so a
//! tripped step hands back the values it was given, old state is still donated to it, and nothing waits for the host. Their checks are read once two later programs are launched
//! (or at `wait()` once their counts are on the host), when the in-flight bound has waited for that step anyway, or
//! by a read that has waited for a result of that program or a later one of its thread ([`after_read`]: a loop that
//! reads its loss). Under `stop` the guard is
//! the sticky flag of [`flag`]: every program launched after a trip keeps the state too, so when the check of step k is
//! read, the state is still the one step k was given. Each `stop` check keeps step k's IR (one per program structure,
//! [`graph_of`]) and the inputs that are not donated state (the batch, scalars); the donated ones are
//! followed from output to output as later programs take them ([`keep`]), so that on a trip [`locate`] runs step
//! k again on exactly its inputs: the first op that made a non-finite value from finite operands, and each
//! output's count. The trip is an `Error::NonFinite`; the checks of the programs launched after it are dropped
//! with it and the flag is cleared. Under `LAZULI_LOCATE_AHEAD` the locating program of a training step's structure
//! that runs again is compiled ahead on a thread and run once at a finite check ([`locate::warm`]).
//!
//! On a GPU the counts' copy to the host starts when the program is launched ([`start_read`]), so reading a check
//! costs no round trip through the plugin once the step has run. `wait()` reads only the checks whose copy has
//! landed ([`read_landed`]): the last program's lands through one more notice of the plugin after the program
//! itself, and is read by the next launch or read instead. A clean check's kept inputs are let go on the reaper's
//! thread (`in_flight::reaper`), not on the host's path between two steps.
//!
//! A split step (`read::launch_gradients`, under `stop` on GPUs by default) is two checked programs: the gradients'
//! counts the loss and the gradients and hands its trip on in the flag; the update's leaves those values out of its
//! count ([`counted_leaves`]) and guards the state by the flag. A trip is located in the gradients' program, or in
//! the update's, whose kept inputs leave out the gradients: [`chain`] makes them again for its locator.
//!
//! `log` keeps the first program: every output counted per group, nothing guarded or donated, the step's IR and
//! inputs kept, its check read at the next materialization before anything is launched.

pub(crate) mod chain;
pub(crate) mod flag;
mod locate;

pub(crate) use locate::join_aside;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use lazuli_hlo::{Graph, KernelOp, Loc, NodeId, Op, TensorType};
use lazuli_kernels::{Implementation, Target};

use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::diagnostics::{self, EventKind};
use crate::error::{Error, Result};
use crate::graph::element::bytes_to_f64;
use crate::graph::tensor::Data;
use crate::runtime::{launcher, runtime, Backend, CheckFinite};

/// A step whose check has not been read yet.
pub(crate) struct Pending {
    /// The counts' copy to the host, started at the launch where the device is not the host ([`start_read`]).
    /// Declared before `counts`, so that an unread copy is waited for before the counts' buffer is let go.
    read: Option<lazuli_pjrt::HostCopy>,
    /// The counts: one of what entered the update (`skip`, `stop`), or one per group of the floating-point
    /// outputs (`log`, [`groups`]).
    counts: Data,
    /// What a trip is located from (`stop` and `log`).
    replay: Option<Replay>,
    /// The line whose materialization ran the step, and the step's number.
    at: Loc,
    step: u64,
    mode: CheckFinite,
    /// The program guards some state (it updates parameters or optimizer state).
    guarded: bool,
}

/// A step's IR (without the check) and its inputs, in parameter order, with the lines that recorded them.
pub(crate) struct Replay {
    pub graph: Arc<Graph>,
    /// The structure's locating program, built ahead.
    pub ahead: Arc<locate::Ahead>,
    pub inputs: Vec<Data>,
    pub input_locs: Vec<Loc>,
    /// A split step's gradients' program: what makes its outputs again, for the update after it.
    pub source: Option<Arc<chain::Source>>,
    /// A split step's update: its inputs that the gradients' program made, not kept (placeholders in `inputs`).
    pub fed: Option<chain::Fed>,
}

impl Replay {
    /// The IR with this step's inputs' lines: the kept IR is the first of its structure, whose inputs were recorded
    /// elsewhere (the initial weights, where later steps' are the update's line).
    fn own_graph(&self) -> std::borrow::Cow<'_, Graph> {
        let g = &self.graph;
        if g.params.iter().zip(&self.input_locs).all(|(&p, loc)| g.nodes[p].loc == *loc) {
            return std::borrow::Cow::Borrowed(g);
        }
        let mut own = Graph::clone(g);
        for (&p, &loc) in g.params.iter().zip(&self.input_locs) {
            own.nodes[p].loc = loc;
        }
        std::borrow::Cow::Owned(own)
    }

    /// The inputs to run the step again on, the fed ones made again.
    fn run_inputs(&self, rt: &crate::runtime::Runtime) -> Result<std::borrow::Cow<'_, [Data]>> {
        chain::inputs(rt, &self.inputs, self.fed.as_ref())
    }

    /// Every input this replay alone holds: its own, and its source's once no other check shares it.
    fn into_inputs(self) -> Vec<Data> {
        let mut inputs = self.inputs;
        for source in [self.source, self.fed.map(|f| f.source)].into_iter().flatten() {
            if let Ok(source) = Arc::try_unwrap(source) {
                inputs.extend(source.inputs.into_inner().unwrap_or_else(|e| e.into_inner()));
            }
        }
        inputs
    }

    /// The floating-point outputs' types and lines, in output order: what the report names.
    fn outputs(&self) -> Vec<(TensorType, Loc)> {
        let g = &self.graph;
        g.outputs
            .iter()
            .map(|&o| &g.nodes[o])
            .filter(|n| n.ty.dtype.is_float())
            .map(|n| (n.ty.clone(), n.loc))
            .collect()
    }
}

/// Checks not read yet, oldest first: one under `log`, up to three under `skip` and `stop`.
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

/// Whether a checked program keeps its state on a trip (and may donate it), counting only what enters the update,
/// and has its check read two launches later: `skip` and `stop`.
pub(crate) fn guards(mode: CheckFinite) -> bool {
    matches!(mode, CheckFinite::Skip | CheckFinite::Stop)
}

/// Whether the step is located on a trip, from its IR and inputs kept until its check is read.
pub(crate) fn replays(mode: CheckFinite) -> bool {
    matches!(mode, CheckFinite::Stop | CheckFinite::Log)
}

/// Whether a weight's replaced copy is noted for the program that computes its new one ([`chain::note_copy`]): under
/// `stop` with the split step, where the old copy is read only by the gradients' program, which keeps it.
pub(crate) fn notes_copies() -> bool {
    runtime().is_ok_and(|rt| rt.config.check_finite == CheckFinite::Stop && rt.config.splits_update())
}

/// The executable-cache key of a checked program: another program than the unchecked one of the same structure,
/// than one checked under another mode, than one with other guards, and than one that counts other parameters.
pub(crate) fn key(key: u64, mode: CheckFinite, guards: &[(usize, usize)], counted: &[usize]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (key, "nonfinite", mode as u8, guards, counted).hash(&mut h);
    h.finish()
}

/// Under `stop`: the parameters (by leaf) whose values a program of the current flag chain has counted already.
/// That program's trip went into the flag this one reads, and the flag decides this one's guard, so this one's
/// count leaves them out: the update of a split step does not read the gradients again. A value of an upload, of
/// a mesh program or of another flag chain is counted again.
pub(crate) fn counted_leaves(mode: CheckFinite, leaves: &[std::rc::Rc<crate::graph::tensor::Node>]) -> Vec<usize> {
    if mode != CheckFinite::Stop {
        return Vec::new();
    }
    let epoch = flag::epoch();
    let counted =
        |leaf: &crate::graph::tensor::Node| matches!(&leaf.lock().data, Some(Data::Device(v)) if v.counted() == epoch);
    leaves.iter().enumerate().filter(|(_, leaf)| counted(leaf)).map(|(i, _)| i).collect()
}

/// Under `stop`, after a checked program's launch: its outputs that its count read (every floating-point output
/// but the guarded state, see [`with_check`]) are counted in the current flag chain ([`counted_leaves`]).
pub(crate) fn note_counted(mode: CheckFinite, outputs: &[Data], guards: &[(usize, usize)], floating: &[bool]) {
    if mode != CheckFinite::Stop {
        return;
    }
    let epoch = flag::epoch();
    // A step guards hundreds of outputs: marked once, not searched for per output.
    let mut guarded = vec![false; outputs.len()];
    for &(_, j) in guards {
        if let Some(g) = guarded.get_mut(j) {
            *g = true;
        }
    }
    for (j, out) in outputs.iter().enumerate() {
        if let (Data::Device(v), false, true) = (out, guarded[j], floating[j]) {
            v.set_counted(epoch);
        }
    }
}

/// `graph` with the check's output appended (after the step's own outputs) and the `guards` applied, for
/// emitting. Under `stop`, output `flag` is the sticky flag's next value ([`flag`]), which becomes
/// `flag OR tripped` and decides the guards. On a mesh the counts have the layout `counts_sharding`.
///
/// Under `skip` and `stop` the guard is decided by the values entering the update (`hlo::finite::update_inputs`:
/// the loss, the gradients), so that the select fuses into the update, and the one count is theirs: as dynamic
/// loss scaling, they read no state. A non-finite state that an update makes from finite inputs makes the next
/// step's loss non-finite: `stop` then names the step's non-finite input, and under `skip` [`SKIPS_IN_A_ROW`]
/// skipped steps in a row end the run with an error that says so. Under `stop` the parameters `counted` (by
/// [`counted_leaves`]), and what layout ops and widening converts make of them (`hlo::finite::covered`), are left
/// out of the count: the flag carries their trip. Under `log` nothing is guarded and the counts are the outputs'.
pub(crate) fn with_check(
    graph: &Graph,
    guards: &[(usize, usize)],
    counted: &[usize],
    flag: Option<usize>,
    mode: CheckFinite,
    (backend, target, finite_count): (Backend, &Target, Implementation),
    counts_sharding: Option<String>,
) -> Result<Graph> {
    use lazuli_hlo::finite as f;
    let mut g = graph.clone();
    let loc = g.outputs.first().map_or(Loc::caller(), |&o| g.nodes[o].loc);
    let counting = self::counting(backend);
    let counts = if self::guards(mode) {
        let mut entering = f::update_inputs(&g, guards);
        if !counted.is_empty() {
            let covered = f::covered(&g, counted);
            entering.retain(|&x| !covered[x]);
        }
        let total = match count_by_kernel(&mut g, &entering, (target, finite_count), loc)? {
            Some(total) => total,
            None => match counting.total {
                f::Total::ByRows(width) => f::count_total_by_rows(&mut g, &entering, width, loc),
                f::Total::Joined => {
                    // Grouped by dtype, so that a step whose gradients alternate between f32 and bf16 (weights
                    // read through bf16 copies) is a few groups, not one per run of a dtype.
                    entering.sort_by_key(|&x| g.nodes[x].ty.dtype);
                    f::count_total_joined(&mut g, &entering, &counting, loc)
                }
            }
            .map_err(Error::Internal)?,
        };
        let mut tripped = f::tripped(&mut g, total, loc).map_err(Error::Internal)?;
        if let Some(j) = flag {
            let handed_on = g.outputs[j];
            tripped = f::sticky(&mut g, handed_on, tripped, loc).map_err(Error::Internal)?;
            g.outputs[j] = tripped;
        }
        f::guard(&mut g, tripped, guards, counting.guard_rebuilds, loc).map_err(Error::Internal)?;
        total
    } else {
        let outputs = f::floating(&g, g.outputs.clone());
        match f::count_nonfinite_grouped(&mut g, &outputs, &counting, loc).map_err(Error::Internal)? {
            Some(counts) => counts,
            // A step without floating-point outputs still gets an output, so that every checked program has one
            // more.
            None => f::total_of(&mut g, None, loc).map_err(Error::Internal)?,
        }
    };
    g.outputs.push(counts);
    if g.partitions > 0 {
        g.output_shardings.push(counts_sharding);
    }
    Ok(g)
}

/// `i32[1]`: the non-finite elements of `of` counted by lazuli's kernel (`lazuli_kernels::finite_count`), one
/// launch over every tensor where XLA's program counts each in a reduction kernel of its own; `None` where the
/// kernel does not apply (not an NVIDIA GPU, f64 values, nothing to count, `LAZULI_FINITE_COUNT=composite`) or
/// on a mesh, whose partitioner would gather every tensor onto each device for a custom call. A forced `triton`
/// that cannot apply is an error.
fn count_by_kernel(
    g: &mut Graph,
    of: &[NodeId],
    (target, want): (&Target, Implementation),
    loc: Loc,
) -> Result<Option<NodeId>> {
    if want == Implementation::Composite || of.is_empty() {
        return Ok(None);
    }
    if g.partitions > 0 {
        return match want {
            Implementation::Triton => Err(Error::Config(
                "LAZULI_FINITE_COUNT=triton: a sharded program's check counts with XLA's reductions".into(),
            )),
            _ => Ok(None),
        };
    }
    let types: Vec<TensorType> = of.iter().map(|&x| g.nodes[x].ty.clone()).collect();
    let def = match lazuli_kernels::finite_count::count_nonfinite(&types, target, want) {
        Ok(def) if def.device.is_some() => def,
        Ok(_) => return Ok(None),
        Err(why) => return Err(Error::Config(format!("LAZULI_FINITE_COUNT: {why}"))),
    };
    g.push(Op::Kernel(KernelOp::new(def, 0)), of.to_vec(), loc).map(Some).map_err(Error::Internal)
}

/// How the check's counts are grouped and reduced on `backend`
/// (`docs/perf-log/2026-12-02-cpu-check-locator-autotuning.md`).
fn counting(backend: Backend) -> lazuli_hlo::finite::Counting {
    match backend {
        Backend::Cpu => lazuli_hlo::finite::Counting::FOR_CPU,
        _ => lazuli_hlo::finite::Counting::FOR_GPU,
    }
}

/// The IR of each program structure that a trip may be located in, by key, and its locating program, built ahead on a
/// thread of its own: built once, when a program of that key is first kept (usually right after its compile, which
/// built the IR anyway); a cache hit builds none. With `compile` (`LAZULI_LOCATE_AHEAD`) the locating program is also
/// compiled ahead, on another thread, once the structure is kept a second time. A program recorded from other lines
/// shares its key (keys hold no lines) and so the lines of the first.
pub(crate) fn graph_of(
    key: u64,
    compile_after: Option<std::time::Duration>,
    backend: Backend,
    build: impl FnOnce() -> Graph,
) -> (Arc<Graph>, Arc<locate::Ahead>) {
    /// More structures than a training loop has; past it the store starts again.
    const MOST: usize = 64;
    type Kept = (Arc<Graph>, Arc<locate::Ahead>);
    static GRAPHS: Mutex<Option<HashMap<u64, Kept>>> = Mutex::new(None);
    let mut graphs = GRAPHS.lock().unwrap_or_else(|e| e.into_inner());
    let graphs = graphs.get_or_insert_with(HashMap::new);
    if let Some(kept) = graphs.get(&key) {
        if compile_after.is_some_and(|after| kept.1.age() >= after) {
            kept.1.compile();
        }
        return kept.clone();
    }
    if graphs.len() >= MOST {
        graphs.clear();
    }
    let graph = Arc::new(build());
    let ahead = locate::Ahead::start(graph.clone(), compile_after.is_some(), backend);
    graphs.entry(key).or_insert((graph, ahead)).clone()
}

/// Keep a launched step's check until it is read: its counts and, where the mode locates trips, what to run it
/// again from. `donated` pairs each input donated to this program with the output that took its buffer: a kept
/// input of an earlier step that is one of them is that output from now on, the value that equals it while the
/// flag keeps the state (the input's own buffer is gone).
pub(crate) fn keep(
    counts: Data,
    replay: Option<Replay>,
    donated: &[(Data, Data)],
    at: Loc,
    (mode, guarded): (CheckFinite, bool),
    remade: Option<(&Arc<chain::Source>, &[Option<usize>])>,
) {
    let read = start_read(&counts);
    let pending = Pending { read, counts, replay, at, step: diagnostics::current_step(), mode, guarded };
    let mut queue = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    if !donated.is_empty() {
        // Both sides are alive here (held by `donated` and the kept inputs): equal addresses are one value.
        let taken: HashMap<usize, &Data> = donated.iter().map(|(from, to)| (value_id(from), to)).collect();
        let follow = |inputs: &mut [Data]| {
            for input in inputs {
                if let Some(&to) = taken.get(&value_id(input)) {
                    *input = to.clone();
                }
            }
        };
        for r in queue.iter_mut().filter_map(|p| p.replay.as_mut()) {
            follow(&mut r.inputs);
            // A source is shared by a gradients' program's check and its update's: following twice changes
            // nothing more.
            for source in r.source.iter().chain(r.fed.as_ref().map(|f| &f.source)) {
                follow(&mut source.inputs.lock().unwrap_or_else(|e| e.into_inner()));
            }
        }
    }
    let mut pending = pending;
    // A split step's update: what its gradients' program made is made again.
    if let (Some(r), Some((source, made))) = (pending.replay.as_mut(), remade) {
        r.fed = chain::feed(source, made, &mut r.inputs);
    }
    queue.push_back(pending);
    HAS_PENDING.store(true, Relaxed);
}

/// The split step's gradients' program, among the pending checks (the latest first), that made some of `leaves`'
/// values, and for each leaf the output it made: the update after it keeps none of them for its locator ([`chain`]).
pub(crate) fn remade(
    leaves: &[std::rc::Rc<crate::graph::tensor::Node>],
) -> Option<(Arc<chain::Source>, Vec<Option<usize>>)> {
    if !HAS_PENDING.load(Relaxed) {
        return None;
    }
    let sources: Vec<Arc<chain::Source>> = {
        let queue = PENDING.lock().unwrap_or_else(|e| e.into_inner());
        queue.iter().rev().filter_map(|p| p.replay.as_ref()?.source.clone()).collect()
    };
    sources.into_iter().find_map(|source| {
        let made: Vec<Option<usize>> =
            leaves.iter().map(|l| l.lock().data.as_ref().and_then(|d| source.made(d))).collect();
        made.iter().any(Option::is_some).then_some((source, made))
    })
}

/// The address of a value's buffer holder: the same for every clone of one value.
fn value_id(d: &Data) -> usize {
    match d {
        Data::Host(bytes) => Arc::as_ptr(bytes) as usize,
        Data::Device(v) => Arc::as_ptr(v) as usize,
        Data::Sharded { shards, .. } => shards.first().map_or(0, |b| Arc::as_ptr(b) as usize),
    }
}

/// The oldest `n` pending checks (all, when fewer are queued), oldest first.
fn take(n: usize) -> Vec<Pending> {
    if !HAS_PENDING.load(Relaxed) || n == 0 {
        return Vec::new();
    }
    let mut queue = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    let n = n.min(queue.len());
    let taken = queue.drain(..n).collect();
    HAS_PENDING.store(!queue.is_empty(), Relaxed);
    taken
}

/// Before a materialization launches anything: read a `log` check now. Under `skip` and `stop` say how many checks
/// (all but the newest) [`after_launch`] reads once this program is queued: a step's check is read once two later
/// programs were launched, and the in-flight bound has waited for that step by then, so reading it never waits for
/// the device. They stay queued until then, so that this program's donations move their kept inputs on.
pub(crate) fn before_launch() -> Result<usize> {
    if !HAS_PENDING.load(Relaxed) {
        return Ok(0);
    }
    if guards(runtime()?.config.check_finite) {
        let queue = PENDING.lock().unwrap_or_else(|e| e.into_inner());
        return Ok(queue.len().saturating_sub(1));
    }
    read_all(take(usize::MAX))?;
    Ok(0)
}

/// After a read of `read`, which waited for it: under `skip` and `stop`, read the checks of the programs up to the
/// one that made it, which are done (a thread's programs finish in order): a loop that reads its loss every step
/// has the bad step's trip as its read's error, located on a device that has run nothing after the bad step but
/// what keeps its state (the update of a split step, which reads the flag). A read of the latest program's result
/// first waits for the launched programs (done by then, but for the launcher's own note of it). A read of an older
/// program's result (a loop that logs the previous step's loss) reads only older checks, so as not to wait.
pub(crate) fn after_read(read: &Data) -> Result<()> {
    if !HAS_PENDING.load(Relaxed) || !guards(runtime()?.config.check_finite) {
        return Ok(());
    }
    // A mesh program's shards carry no program number: its checks keep to the launches.
    let Some(through) = program_of(read) else { return Ok(()) };
    let done = {
        let queue = PENDING.lock().unwrap_or_else(|e| e.into_inner());
        queue.iter().take_while(|p| program_of(&p.counts).is_some_and(|n| n <= through)).count()
    };
    if done == 0 {
        return Ok(());
    }
    if let Data::Device(v) = read {
        if launcher::of_latest_program(v) {
            crate::exec::in_flight::throttle(0)?;
        }
    }
    read_all(take(done))
}

/// The number of the program on this thread that made `d`; `None` for an upload or a mesh program's shards.
fn program_of(d: &Data) -> Option<u64> {
    match d {
        Data::Device(v) => Some(v.program()).filter(|&n| n != 0),
        Data::Sharded { .. } | Data::Host(_) => None,
    }
}

/// Read the oldest `n` checks, as [`before_launch`] counted them.
pub(crate) fn after_launch(n: usize) -> Result<()> {
    read_all(take(n))
}

/// Read every pending check whose counts are on the host, oldest first, whatever its mode (`wait()`, after the
/// launched programs finished). On a GPU the counts' copy lands a little after its program, through one more
/// completion notice of the plugin: a check whose copy is still on its way is left to the next launch or read,
/// which finds it landed instead of making the host wait for it while the device idles.
pub(crate) fn read_landed() -> Result<()> {
    if !HAS_PENDING.load(Relaxed) {
        return Ok(());
    }
    let landed = {
        let queue = PENDING.lock().unwrap_or_else(|e| e.into_inner());
        queue.iter().take_while(|p| p.read.as_ref().is_none_or(lazuli_pjrt::HostCopy::is_done)).count()
    };
    read_all(take(landed))
}

/// Read checks in order; the first error ends the reading (under `stop`, the checks after a trip are dropped).
fn read_all(pending: Vec<Pending>) -> Result<()> {
    let n = pending.len();
    for (i, p) in pending.into_iter().enumerate() {
        read(p, n - 1 - i)?;
    }
    Ok(())
}

/// Read a check (`after` more were taken with it): an [`Error::NonFinite`] on a trip under `stop`; under `log` and
/// `skip` the first trip's report goes to stderr, and `skip` counts the step in `Metrics::skipped_steps`. Each trip
/// is also an event (`EventKind::NonFinite`).
fn read(mut pending: Pending, after: usize) -> Result<()> {
    let mut counts = counts(&mut pending)?;
    // Under skip and stop the one count is of the values that entered the update.
    let entered = if guards(pending.mode) { counts.pop().unwrap_or(0) } else { 0 };
    if entered == 0 && counts.iter().all(|&c| c == 0) {
        if pending.mode == CheckFinite::Skip && pending.guarded {
            SKIPPED_IN_A_ROW.store(0, Relaxed);
        }
        if let Some(r) = pending.replay.take() {
            let rt = runtime()?;
            locate::warm(rt, &r.ahead, || r.run_inputs(rt));
            // On a GPU the host reads this right after the device finished, before it records the next step.
            if rt.config.backend != Backend::Cpu {
                crate::exec::in_flight::reaper::release_later(r.into_inputs());
            }
        }
        return Ok(());
    }
    let mode = pending.mode;
    if mode == CheckFinite::Skip && pending.guarded {
        Counters::add(&COUNTERS.skipped_steps, 1);
        if SKIPPED_IN_A_ROW.fetch_add(1, Relaxed) + 1 >= SKIPS_IN_A_ROW {
            SKIPPED_IN_A_ROW.store(0, Relaxed);
            let report = report(&pending, &counts, None, entered, 0)
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
        Some(r) if first || mode == CheckFinite::Stop => {
            let rt = runtime()?;
            Some(r.run_inputs(rt).and_then(|inputs| locate::locate(rt, &r.own_graph(), Some(&r.ahead), &inputs)))
        }
        _ => None,
    };
    // The programs launched after a `stop` trip kept the state and their checks say nothing more: dropped, and the
    // next program starts from a clear flag.
    let later = match mode {
        CheckFinite::Stop => {
            flag::reset();
            after + take(usize::MAX).len()
        }
        _ => 0,
    };
    let report = report(&pending, &counts, located.as_ref(), entered, later);
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

/// On a GPU, the copy of a just launched program's counts to the host, started now: the plugin runs it right
/// after the program, so the check is on the host by the time it is read. A read started only then (at `wait()`,
/// where the host has waited for the step already) costs another round trip through the plugin's completion
/// notice. On the CPU a count is read where it lies, once the launcher has run the program.
fn start_read(counts: &Data) -> Option<lazuli_pjrt::HostCopy> {
    if runtime().ok()?.config.backend == Backend::Cpu {
        return None;
    }
    let Data::Device(v) = counts else { return None };
    v.buffer().ok()?.start_to_host().ok()
}

/// The counts of the pending check, read from the device (its step has finished or is about to).
fn counts(p: &mut Pending) -> Result<Vec<u64>> {
    let n = if guards(p.mode) { 1 } else { groups(p).len().max(1) };
    let ty = TensorType::new(lazuli_hlo::DType::I32, [n]);
    let reading = std::time::Instant::now();
    let bytes = match p.read.take() {
        // A copy that failed (the program did) is read again the ordinary way, whose error names the step.
        Some(copy) => copy.finish().map(Arc::new).or_else(|_| p.counts.to_host(&ty))?,
        None => p.counts.to_host(&ty)?,
    };
    Counters::add(&COUNTERS.finite_read_ns, reading.elapsed().as_nanos() as u64);
    Ok(bytes_to_f64(lazuli_hlo::DType::I32, &bytes).into_iter().map(|c| c as u64).collect())
}

/// The floating-point outputs a check names (none under `skip`, which keeps no IR).
fn checked(p: &Pending) -> Vec<(TensorType, Loc)> {
    p.replay.as_ref().map_or_else(Vec::new, Replay::outputs)
}

/// The groups of the checked outputs that `log`'s counts count, in order.
fn groups(p: &Pending) -> Vec<std::ops::Range<usize>> {
    let checked = checked(p);
    // A check is pending only once the runtime is up.
    let counting = runtime().map_or(lazuli_hlo::finite::Counting::FOR_GPU, |rt| counting(rt.config.backend));
    lazuli_hlo::finite::count_groups(&checked.iter().map(|(ty, _)| ty).collect::<Vec<_>>(), &counting)
}

/// The outputs a report lists (a model's weights all go non-finite together; the first few say enough).
const SHOWN: usize = 6;

/// The report of a trip: the step, the outputs with non-finite values, what became of its state, and where the
/// values came from.
fn report(
    p: &Pending,
    counts: &[u64],
    located: Option<&Result<locate::Replayed>>,
    entered: u64,
    later: usize,
) -> String {
    let checked = checked(p);
    let mut out = match located {
        Some(Ok(replayed)) if replayed.outputs.len() == checked.len() => by_output(p, &checked, &replayed.outputs),
        _ => by_group(p, &checked, counts),
    };
    match p.mode {
        CheckFinite::Skip if !p.guarded => out += "  the program updates no state: nothing to skip\n",
        CheckFinite::Skip if entered > 0 => {
            out += &format!(
                "  skipped: {entered} non-finite values entered the update; parameters and optimizer state keep \
                 their values from before the step\n"
            )
        }
        CheckFinite::Stop if p.guarded => {
            out += "  kept: parameters and optimizer state hold their values from before the step";
            if later > 0 {
                out += &format!(", as the {later} program(s) launched after it left them");
            }
            out += "\n";
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
fn by_output(p: &Pending, checked: &[(TensorType, Loc)], counts: &[u64]) -> String {
    let bad: Vec<String> = checked
        .iter()
        .zip(counts)
        .filter(|(_, &c)| c > 0)
        .map(|((ty, loc), c)| format!("    {ty} recorded at {loc}: {c} of {} non-finite", ty.elements()))
        .collect();
    let (n, total) = (bad.len(), checked.len());
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
fn by_group(p: &Pending, checked: &[(TensorType, Loc)], counts: &[u64]) -> String {
    let mut out = format!("  step {}:\n", p.step);
    if counts.iter().any(|&c| c > 0) {
        out += "  non-finite values among its floating-point outputs:\n";
    }
    let mut shown = 0;
    for (group, &c) in groups(p).into_iter().zip(counts).filter(|(_, &c)| c > 0) {
        let members = &checked[group];
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
