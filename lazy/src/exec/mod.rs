//! The step boundary. [`materialize`] computes pending tensors in one program through its stages, each in its
//! own folder: the walk of the pending graph (`graph::walk`, cut into pieces when too large) and the rest of the
//! [`plan`] (mesh and layouts, donations, key, cache lookup), the [`program`] (cache hit, or emit and compile),
//! the [`upload`] of its arguments, its [`launch`] (from this thread or on the CPU launcher), and the programs
//! [`in_flight`] (bounded, waited for by reads, `wait()` and at exit). Beside them: [`read`] (what triggers a
//! materialization: `item`, `to_vec`, printing, `sync`), `spmd` (layouts over a mesh), `reference` (the host
//! interpreter instead of a device), [`setup`] (values computed together before the next program),
//! [`bench_hooks`] (the host-side stages timed without running) and
//! [`profile()`] (the device's kernels while a closure runs, from the plugin's profiler).

pub mod bench_hooks;
pub(crate) mod finite;
pub(crate) mod in_flight;
pub(crate) mod index_check;
pub(crate) mod launch;
pub(crate) mod plan;
mod profile;
pub(crate) mod program;
pub mod read;
pub(crate) mod reference;
pub(crate) mod setup;
pub(crate) mod spmd;
pub(crate) mod upload;

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lazuli_hlo::Loc;
use lazuli_pjrt::LoadedExecutable;

pub use plan::MAX_GRAPH_NODES;
pub use profile::profile;

use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::diagnostics::{self, cause_name, Cause, EventKind, ProgramCheck};
use crate::error::Result;
use crate::graph::tensor::{Data, Node};
use crate::runtime::compile_cache;
use crate::runtime::runtime;
use launch::Launch;
use plan::Plan;

/// Compute `targets` (those still pending) in one program, or in several when their graph is larger than
/// [`MAX_GRAPH_NODES`]. `cause` and `at` say why and where, for diagnostics and errors.
pub(crate) fn materialize(targets: &[Rc<Node>], cause: Cause, at: Loc) -> Result<()> {
    if let Some(e) = DEFERRED.take() {
        return Err(e);
    }
    // Set-up waiting to be computed together (parameters' copies) goes first, in its own program, so that the
    // program below reads it as inputs.
    setup::compute_waiting()?;
    let started = Instant::now();
    // A `log` check, before anything new is launched (reads come here too); `skip`'s and `stop`'s older checks
    // are read once this materialization's program is queued, but for the gradients' program of a split step:
    // its step's update is launched next and reads them, so that a trip stops the run after the update of a
    // later step has kept the state, never between a step's two programs.
    let previous = if cause == Cause::Gradients { 0 } else { finite::before_launch()? };
    index_check::read_computed()?;
    if !targets.iter().any(|t| t.is_pending()) {
        return finite::after_launch(previous);
    }
    // Checked indexing's reports still to compute are computed by this step too.
    let with_reports = index_check::with_reports(targets);
    let targets = with_reports.as_deref().unwrap_or(targets);
    let rt = runtime()?;
    // Under `stop` the program also hands on the finite check's sticky flag.
    let flag = finite::flag::next(rt.config.check_finite, at);
    let with_flag: Vec<Rc<Node>>;
    let targets = match &flag {
        Some(f) => {
            with_flag = targets.iter().cloned().chain([f.next.node.clone()]).collect();
            &with_flag[..]
        }
        None => targets,
    };
    let flag_node = flag.as_ref().map(|f| &f.next.node);
    let Some(mut plan) = plan::plan(rt, targets, flag_node, (cause, at))? else {
        return finite::after_launch(previous);
    };
    let hit = plan.cached.is_some();
    // Strict mode may refuse here, before anything is uploaded, compiled or donated. Diagnostics compare a new
    // program's IR with earlier ones; a cache hit needs no IR at all.
    let new_graph = match (hit, plan.evicted) {
        (true, _) => None,
        (false, true) => Some(diagnostics::Compiling::Evicted),
        (false, false) => Some(diagnostics::Compiling::Graph(plan.walk.graph())),
    };
    let check = diagnostics::before_program(cause, at, hit, new_graph)?;
    if !hit && plan.mesh.is_none() {
        program::fits_in_memory(rt, &plan.walk)?;
    }
    // Planning reads only this thread's graph; the device stages run one materialization at a time.
    let one = one_at_a_time();
    let t0 = Instant::now();
    Counters::add(&COUNTERS.boundary_ns, (t0 - started).as_nanos() as u64);
    let launch = Launch::choose(rt, &plan);
    let (args, uploaded) = upload::arguments(rt, &plan, launch.upload(rt))?;
    let t1 = Instant::now();
    Counters::add(&COUNTERS.upload_ns, (t1 - t0).as_nanos() as u64);
    let exe = program::executable(rt, &mut plan, at)?;
    crate::runtime::note_launched(&exe);
    let t2 = Instant::now();
    let outputs = launch.run(rt, &plan, &exe, args, at)?;
    let t3 = Instant::now();
    if launch == Launch::Here {
        Counters::add(&COUNTERS.execute_ns, (t3 - t2).as_nanos() as u64);
    }
    let times = Times { transfer: t1 - t0, compile: t2 - t1, execute: t3 - t2 };
    finish(plan, outputs, (&exe, check), cause, at, times, uploaded)?;
    if let Some(f) = flag {
        finite::flag::launched(f);
    }
    Counters::add(&COUNTERS.finish_ns, t3.elapsed().as_nanos() as u64);
    drop(one);
    finite::after_launch(previous)
}

thread_local! {
    /// An error of a materialization whose caller could not return it (`read::launch_gradients`, inside an
    /// optimizer's `step()`): the thread's next materialization returns it.
    static DEFERRED: std::cell::Cell<Option<crate::error::Error>> = const { std::cell::Cell::new(None) };
}

/// Keep `e` for this thread's next materialization (the first error kept wins).
pub(crate) fn defer_error(e: crate::error::Error) {
    let first = DEFERRED.take().unwrap_or(e);
    DEFERRED.set(Some(first));
}

/// The device stages (upload, compile, launch, finish) of one materialization at a time in the process. Walks and
/// plans of threads' own graphs run in parallel; `pjrt` itself keeps reused upload buffers away from running
/// programs, so this only keeps programs of different threads from interleaving their launches, as the in-flight
/// queue and the CPU launcher's demand tracking expect.
pub(crate) fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a materialization's time went, for its event.
struct Times {
    transfer: Duration,
    compile: Duration,
    execute: Duration,
}

/// After the launch: donated inputs give up their buffers, targets take their values (dropping their recipes,
/// which frees the graph above them), a new program's first run is waited for, and the event is sent.
fn finish(
    mut plan: Plan,
    mut outputs: Vec<Data>,
    (exe, check): (&Arc<LoadedExecutable>, ProgramCheck),
    cause: Cause,
    at: Loc,
    times: Times,
    uploaded: u64,
) -> Result<()> {
    if plan.checked {
        keep_check(&mut plan, exe, &mut outputs, cause, at)?;
    }
    for &i in &plan.donated {
        // The buffer now belongs to an output; nothing may read this node again.
        let leaf = &plan.walk.leaves[i];
        Counters::add(&COUNTERS.bytes_donated, leaf.ty.byte_size() as u64);
        leaf.take_data();
    }
    for (node, data) in plan.walk.targets.iter().zip(outputs) {
        node.set_data(data);
    }
    let hit = plan.cached.is_some();
    // The first run of a new program is waited for: the plugin sets up runtime state on it whose teardown is
    // registered then, and the exit hook below must be registered after that to run before it.
    if !hit {
        in_flight::throttle(0)?;
    }
    // A process that ends right after `sync()` must not tear the plugin down under a running program.
    static EXIT_WAIT: std::sync::Once = std::sync::Once::new();
    EXIT_WAIT.call_once(|| {
        lazuli_pjrt::on_exit(at_exit);
    });
    if diagnostics::events::enabled() {
        emit_event(plan, check, cause, at, times, uploaded);
    }
    Ok(())
}

/// At exit: wait for the programs still running (unless this process's group failed on an accelerator, where a
/// collective may never finish), and leave the group.
fn at_exit() {
    crate::runtime::distributed::begin_exit();
    if !crate::runtime::distributed::exit_without_waiting() {
        in_flight::wait_at_exit();
    }
    finite::join_aside();
    crate::runtime::distributed::leave_at_exit();
}

/// A checked program's last output is its counts of non-finite values: kept as the pending check (`finite`),
/// never given to a tensor. Where trips are located, the step's IR (built before the targets drop their recipes,
/// once per program structure) and inputs are kept too: a donated input's value is its guarded output's, which on a
/// trip is the input's own; the pairs of donated inputs and outputs let earlier steps' kept inputs follow theirs.
/// The gradients' program of a split step updates no state itself, but its trip keeps the state: the update after
/// it reads the flag it hands on.
fn keep_check(
    plan: &mut Plan,
    exe: &Arc<LoadedExecutable>,
    outputs: &mut Vec<Data>,
    cause: Cause,
    at: Loc,
) -> Result<()> {
    let internal = |m: &str| crate::error::Error::Internal(m.into());
    let counts = outputs.pop().ok_or_else(|| internal("a checked program without its check"))?;
    let mode = runtime()?.config.check_finite;
    let of_step = !plan.guards.is_empty() || cause == Cause::Gradients;
    let floating: Vec<bool> = plan.walk.targets.iter().map(|t| t.ty.dtype.is_float()).collect();
    finite::note_counted(mode, outputs, &plan.guards, &floating);
    let mut donated = Vec::with_capacity(plan.walk.aliases.len());
    let replay = if finite::replays(mode) {
        let mut inputs = Vec::with_capacity(plan.walk.leaves.len());
        let mut donated_to = vec![None; plan.walk.leaves.len()];
        plan.walk.aliases.iter().for_each(|&(p, j)| donated_to[p] = Some(j));
        let input_locs = plan.walk.leaves.iter().map(|leaf| leaf.loc).collect();
        let remade = plan.remade.as_ref();
        for (i, (leaf, to)) in plan.walk.leaves.iter().zip(donated_to).enumerate() {
            let data = leaf.lock().data.clone().ok_or_else(|| internal("a checked step's input has no value"))?;
            match to {
                Some(j) => {
                    // A gradient of a split step's update is kept as itself, to be fed from its program again
                    // instead (`finite::chain::feed`); other donated state as the guarded output that took it.
                    let fed = remade.is_some_and(|(_, made)| made[i].is_some());
                    inputs.push(if fed { data.clone() } else { outputs[j].clone() });
                    donated.push((data, outputs[j].clone()));
                }
                None => inputs.push(data),
            }
        }
        // Weights' copies this program writes anew: earlier checks' kept old copies follow them (`finite::chain`).
        if finite::guards(mode) {
            for (old, j) in finite::chain::copies_replaced(&plan.walk.targets, &plan.guards) {
                donated.push((old, outputs[j].clone()));
            }
        }
        // Ahead only for a training step's programs, not a model's initialization.
        let rt = runtime()?;
        let ahead_after = rt.config.locate_ahead_after().filter(|_| of_step);
        let build = || plan.walk.graph().clone();
        let (graph, ahead) = finite::graph_of(plan.key, ahead_after, rt.config.backend, build);
        // What the update after it is fed from, in place of the gradients themselves (`finite::chain`).
        let remakes = cause == Cause::Gradients && plan.mesh.is_none() && plan.donated.is_empty();
        let source = remakes.then(|| finite::chain::Source::new(exe.clone(), graph.clone(), inputs.clone(), outputs));
        Some(finite::Replay { graph, ahead, inputs, input_locs, source, fed: None })
    } else {
        None
    };
    finite::keep(
        counts,
        replay,
        &donated,
        at,
        (mode, of_step),
        plan.remade.as_ref().map(|(source, made)| (source, &made[..])),
    );
    Ok(())
}

/// Wait until every launched program has finished on its devices, then read the finite checks (with
/// `LAZULI_CHECK_FINITE`) whose counts are on the host, and the checked indices' reports. On a GPU a program's
/// counts reach the host a little after the program: a check still on its way is read by the next launch or read
/// (its step's state is guarded meanwhile), not waited for here. `sync()` only enqueues the step; reads (`item`,
/// `to_vec`, checkpoints) wait for what they read, and for the checks of the programs up to it. Use this to time
/// steps or to surface a runtime error at a known point. An error names the line whose materialization launched
/// the failing program.
pub fn wait() -> Result<()> {
    in_flight::wait()?;
    finite::read_landed()?;
    index_check::read_computed()
}

/// What the program repeats, for a compile's event: each run of identical copies, with what a scanned body saves.
fn repeats(graph: &lazuli_hlo::Graph) -> Vec<String> {
    let nodes = graph.nodes.len();
    lazuli_hlo::find_repeats(graph)
        .iter()
        .map(|r| {
            let saved = r.nodes_saved();
            format!(
                "{}: as one scanned body, {saved} of the program's {nodes} nodes fewer ({:.0}%)",
                r.describe(),
                100.0 * saved as f64 / nodes as f64
            )
        })
        .collect()
}

/// The program's event: what ran, why, where, what it cost, and for a compile what changed and which kernels.
fn emit_event(mut plan: Plan, check: ProgramCheck, cause: Cause, at: Loc, times: Times, uploaded: u64) {
    let hit = plan.cached.is_some();
    let key = plan.key;
    let mut e = diagnostics::Event::new(EventKind::Program, cause_name(cause), at);
    e.program_in_step = check.program_in_step;
    e.unchecked = check.unchecked;
    e.recompile = check.recompile;
    e.explanation = check.explanation;
    e.differences = check.differences;
    // The fused ops recorded as formulas for this program: named once, with its compile.
    let fallbacks = crate::ops::fused_layers::take_fallbacks();
    if !hit {
        let mut kernels = program::kernel_choices(plan.walk.graph());
        for f in fallbacks {
            if !kernels.contains(&f) {
                kernels.push(f);
            }
        }
        e.kernels = kernels;
        e.repeats = repeats(plan.walk.graph());
    }
    e.graph_hash = format!("{key:016x}");
    let w = &plan.walk;
    // A checked program has one more output than it has targets: its counts of non-finite values.
    (e.nodes, e.inputs, e.outputs) = (w.len(), w.params.len(), w.outputs.len() + plan.checked as usize);
    e.cache_hit = hit;
    e.disk_hit = !hit && compile_cache::loaded_from_disk(key);
    e.compile_ms = if hit { 0.0 } else { times.compile.as_secs_f64() * 1e3 };
    e.execute_ms = times.execute.as_secs_f64() * 1e3;
    e.transfer_ms = times.transfer.as_secs_f64() * 1e3;
    e.bytes_to_device = uploaded;
    diagnostics::events::emit(&e);
}
