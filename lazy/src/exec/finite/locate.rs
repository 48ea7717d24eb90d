//! Locating a trip: the first node, in program order, whose result holds non-finite values while its
//! floating-point operands are all finite (an op before any input or constant, which may be a `-inf` mask). The
//! step's IR runs again on its kept inputs as one program that reduces (`FiniteStats`; nodes of one dtype and size
//! stacked into one reduction by rows) every floating-point node that can make a non-finite value (not those that
//! only move values), every output and every floating-point operand of those nodes to its count of non-finite
//! elements and its range, so that the found node's operand ranges, which the report shows, come from the same
//! run. It is compiled here and not cached: a trip is rare. On the CPU, 16-bit values are widened to f32 before
//! they are reduced ([`probe`]), and the program is compiled at an LLVM level chosen by how much it reads
//! ([`options`]).
//! A step partitioned over a mesh runs again whole on one device, its kept shards gathered: the same ops in the
//! same order, without a partitioned compile per trip (the model must then fit on one device).

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use lazuli_hlo::{emit, Checkpoint, EmitOptions, FiniteStats, Graph, Loc, NodeId, Op, Reshape, TensorType};
use lazuli_pjrt::{Buffer, CompileOptions, LoadedExecutable, XlaOption};

use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::error::{Error, Result};
use crate::exec::upload::element_type;
use crate::graph::element::bytes_to_f64;
use crate::graph::tensor::Data;
use crate::runtime::{Backend, Runtime};

/// The op a trip started at.
pub(crate) struct Located {
    pub op: &'static str,
    pub loc: Loc,
    pub ty: TensorType,
    /// Its non-finite elements.
    pub nonfinite: u64,
    /// Each operand's type and, for a floating-point one, its statistics.
    pub operands: Vec<(TensorType, Option<Stats>)>,
}

/// A floating-point value's range and its non-finite elements.
pub(crate) struct Stats {
    pub min: f64,
    pub max: f64,
    pub nan: usize,
    pub inf: usize,
}

impl Located {
    pub fn describe(&self) -> String {
        if self.op == "parameter" {
            // Not made by the step: a bad batch, or state that an earlier update made non-finite from finite
            // values, which `stop` (as `skip`) does not count at that update.
            return format!(
                "  first non-finite value: an input of the step, {} recorded at {} ({} of {} non-finite): it was \
                 non-finite before the step ran (a bad input, or state that the update recorded there made \
                 non-finite from finite values in an earlier step)",
                self.ty,
                self.loc,
                self.nonfinite,
                self.ty.elements()
            );
        }
        let mut out = format!(
            "  first non-finite value: {} at {} -> {} ({} of {} non-finite), from finite operands:",
            self.op,
            self.loc,
            self.ty,
            self.nonfinite,
            self.ty.elements()
        );
        for (i, (ty, stats)) in self.operands.iter().enumerate() {
            out += &format!("\n    operand {i}: {ty}");
            if let Some(s) = stats {
                out += &format!(": min {:e}, max {:e}, {} NaN, {} inf", s.min, s.max, s.nan, s.inf);
            }
        }
        out
    }
}

/// What running a step again found.
pub(crate) struct Replayed {
    /// The first node that made a non-finite value from finite operands; `None` when the run made none.
    pub first: Option<Located>,
    /// Each floating-point output's non-finite elements in that run, in output order: the step check counts
    /// groups of outputs, this names them one by one.
    pub outputs: Vec<u64>,
}

/// Watched nodes of one dtype and size reduced together, at most: one reduction by rows instead of one each, so
/// that GPT-2's step, which watches about 2,500 nodes, has under a hundred reductions (fewer kernels to compile,
/// to load on the first run, and to launch).
const STACK: usize = lazuli_hlo::finite::GROUP_TENSORS;

/// When the locating program is compiled ahead and run once before any trip (`LAZULI_LOCATE_AHEAD`), only nodes of
/// up to this many elements are stacked: a new program's first run, which loads its kernels, no longer falls on a
/// trip, and a large node reduced alone reads its values once where a stacked one is gathered first. On an H200,
/// GPT-2's locating run took 23 ms so, against 42 ms with every size stacked
/// (`docs/perf-log/2026-12-03-locator-ahead.md`).
const STACK_UP_TO_AHEAD: usize = 1 << 16;

/// The locating program of one step structure: the step's IR on one device with every watched node's
/// statistics as its outputs, and its StableHLO text. Built on a thread of its own when a structure is first kept
/// ([`Ahead`]), so that a trip does not build it (at GPT-2's size some 30–60 ms of the trip's time).
pub(crate) struct Probe {
    graph: Graph,
    /// Each statistics output's node and the nodes it holds three values of.
    stats: Vec<(NodeId, Vec<NodeId>)>,
    /// The counted nodes of the step's IR, in program order.
    counted: Vec<NodeId>,
    /// The step's nodes: a probe node at or past this stands for its operand (a barrier before a reduction).
    nodes: usize,
    /// The elements of the watched nodes: what one run reads at least.
    watched: usize,
    text: String,
}

/// A structure's [`Probe`], built ahead on a thread of its own; empty until that thread is done, and `None` in it
/// when there was nothing to watch or the build failed (a trip then builds it, and reports what failed). Under
/// `LAZULI_LOCATE_AHEAD` another thread compiles it once the structure runs again ([`Ahead::compile`]), and the
/// first finite check of the structure read after that runs it once ([`warm`]), so that a trip neither compiles
/// nor pays a new program's first run.
pub(crate) struct Ahead {
    /// When the structure was first kept: `Auto` compiles ahead only once it has trained a while.
    born: Instant,
    probe: OnceLock<Option<Probe>>,
    /// The compiled probe; `None` in it when the compile failed (a trip then compiles again, and reports why).
    program: OnceLock<Option<LoadedExecutable>>,
    /// A thread was started to compile the probe: `program` will be set.
    compiling: AtomicBool,
    /// The compiled probe ran once, or that run failed and it is not tried again.
    warmed: AtomicBool,
}

/// The threads compiling probes ahead: joined at exit ([`join_aside`]), before the plugin is torn down.
static ASIDE: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// Joins the compiles started ahead (and an unload started aside) when the thread that started them ends, and so,
/// on the main thread, when the process exits: the C library runs a thread's thread-local destructors before any
/// exit-time callback. The exit hook ([`join_aside`]) runs too late for a compile still under way: the plugin
/// registers exit-time destructors for statics that a compile creates, so those of a compile that started after
/// the hook was registered are destroyed before the hook runs, under the compile that uses them (a process ending
/// within an ahead compile crashed so).
struct JoinBeforeExit;

impl Drop for JoinBeforeExit {
    fn drop(&mut self) {
        join_aside();
    }
}

thread_local! {
    static JOIN_BEFORE_EXIT: JoinBeforeExit = const { JoinBeforeExit };
}

impl Default for Ahead {
    /// Nothing built yet, its structure first kept now.
    fn default() -> Ahead {
        Ahead {
            born: Instant::now(),
            probe: OnceLock::new(),
            program: OnceLock::new(),
            compiling: AtomicBool::new(false),
            warmed: AtomicBool::new(false),
        }
    }
}

impl Ahead {
    /// Starts building `graph`'s probe on a thread of its own (stacking only nodes of up to
    /// [`STACK_UP_TO_AHEAD`] elements when it will be compiled ahead); without a thread the trip builds it.
    pub fn start(graph: Arc<Graph>, to_compile: bool, backend: Backend) -> Arc<Ahead> {
        let ahead = Arc::new(Ahead::default());
        let filled = ahead.clone();
        let stack_up_to = if to_compile { STACK_UP_TO_AHEAD } else { usize::MAX };
        // Pure Rust over the IR, no plugin call: nothing to join at exit.
        let spawned = std::thread::Builder::new().name("lazuli-locator".into()).spawn(move || {
            let _ = filled.probe.set(probe(&graph, stack_up_to, backend).ok().flatten());
        });
        if spawned.is_err() {
            let _ = ahead.probe.set(None);
        }
        ahead
    }

    /// Starts compiling the probe on a thread of its own, once: called when its step structure runs again (under
    /// `Auto`, once it has trained for `LOCATE_AHEAD_AFTER`), so that a structure that runs once (a first step)
    /// costs no compile. Without a thread the trip compiles it.
    pub fn compile(self: &Arc<Ahead>) {
        if self.compiling.load(Relaxed) {
            return;
        }
        let filled = self.clone();
        let spawned = std::thread::Builder::new().name("lazuli-locator-compile".into()).spawn(move || {
            // Set whatever happens: a trip waits for it.
            let compiled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let p = filled.built()?;
                crate::runtime::runtime().and_then(|rt| compile_probe(rt, p)).ok()
            }));
            let _ = filled.program.set(compiled.ok().flatten());
        });
        if let Ok(handle) = spawned {
            Counters::add(&COUNTERS.locate_ahead, 1);
            self.compiling.store(true, Relaxed);
            ASIDE.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
            JOIN_BEFORE_EXIT.with(|_| ());
        }
    }

    /// How long ago its structure was first kept.
    pub fn age(&self) -> std::time::Duration {
        self.born.elapsed()
    }

    /// The probe once its thread is done: `None` when there is nothing to watch or the build failed.
    fn built(&self) -> Option<&Probe> {
        once_set(&self.probe).as_ref()
    }

    fn ready(&self) -> Option<&Probe> {
        self.probe.get().and_then(Option::as_ref)
    }

    fn compiled(&self) -> Option<&LoadedExecutable> {
        self.program.get().and_then(Option::as_ref)
    }

    /// The probe and its program once compiled ahead, waiting for a compile still under way (no longer than a
    /// compile at the trip would take); `None` when none was started or it failed.
    fn wait_compiled(&self) -> Option<(&Probe, &LoadedExecutable)> {
        if !self.compiling.load(Relaxed) {
            return None;
        }
        // A compiling thread sets `program` whatever happens.
        let exe = once_set(&self.program).as_ref()?;
        Some((self.ready()?, exe))
    }
}

/// `cell`'s value once another thread, which sets it whatever happens, has set it.
fn once_set<T>(cell: &OnceLock<T>) -> &T {
    loop {
        match cell.get() {
            Some(value) => return value,
            None => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
    }
}

/// Runs a structure's probe once if it was compiled ahead and has not run yet, on `inputs` (a finite step's kept
/// inputs), its results dropped: a new program's first run loads its kernels (on an H200 some 15–50 ms for GPT-2's
/// locating program), which then does not fall on a trip. A failed run is not tried again; a trip then runs the
/// program as it is.
pub(crate) fn warm<'a>(rt: &Runtime, ahead: &Ahead, inputs: impl FnOnce() -> Result<Cow<'a, [Data]>>) {
    let (Some(p), Some(exe)) = (ahead.ready(), ahead.compiled()) else { return };
    if ahead.warmed.swap(true, Relaxed) {
        return;
    }
    // Before the lock: a split step's update has its gradients made again, a program run of its own.
    let Ok(inputs) = inputs() else { return };
    let _one = crate::exec::one_at_a_time();
    let running = Instant::now();
    if execute(rt, &p.graph, exe, &inputs).is_ok() {
        Counters::add(&COUNTERS.locate_warm_runs, 1);
        Counters::add(&COUNTERS.locate_warm_ns, running.elapsed().as_nanos() as u64);
    }
}

/// `graph`'s locating program: `None` when it has no floating-point node to watch. Watched nodes of up to
/// `stack_up_to` elements are stacked. On the CPU, 16-bit values are converted to f32 (behind a barrier) before
/// they are reduced: XLA's CPU compiler reduces a 16-bit value in a loop that converts element by element, which
/// took three quarters of the run of a bf16 GPT's locating program, and four times as long as converting first
/// (`docs/perf-log/2026-12-05-locating-run-on-the-cpu.md`).
fn probe(graph: &Graph, stack_up_to: usize, backend: Backend) -> Result<Option<Probe>> {
    let graph = &on_one_device(graph);
    let floats = lazuli_hlo::finite::floating(graph, 0..graph.nodes.len());
    let counted = counted(graph, &floats);
    // Whichever node is found, its floating-point operands are among these: their ranges come from the same run.
    let watched = watched(graph, &counted);
    if watched.is_empty() {
        return Ok(None);
    }
    let mut probe = graph.clone();
    let loc = graph.nodes.first().map_or(Loc::caller(), |n| n.loc);
    let measured = unfoldable(&mut probe, &watched)?;
    let widen = backend == Backend::Cpu;
    let stats = lazuli_hlo::finite::stats(&mut probe, &measured, STACK, stack_up_to, widen, loc);
    let stats = stats.map_err(Error::Internal)?;
    probe.outputs = stats.iter().map(|&(v, _)| v).collect();
    // No aliases: the kept inputs stay the caller's.
    probe.aliases.clear();
    let text = emit(&probe, &EmitOptions::default());
    let watched = watched.iter().map(|&id| graph.nodes[id].ty.elements()).sum();
    Ok(Some(Probe { graph: probe, stats, counted, nodes: graph.nodes.len(), watched, text }))
}

/// Run `graph` again on `inputs`: its first node that made a non-finite value from finite operands, and its
/// outputs' counts. `ahead` is its structure's probe if already built (and compiled, under
/// `LAZULI_LOCATE_AHEAD`: a compile still under way is waited for); else it is built and compiled here.
pub(crate) fn locate(rt: &Runtime, graph: &Graph, ahead: Option<&Ahead>, inputs: &[Data]) -> Result<Replayed> {
    let _one = crate::exec::one_at_a_time();
    if let Some((p, exe)) = ahead.and_then(Ahead::wait_compiled) {
        let running = Instant::now();
        let host = execute(rt, &p.graph, exe, inputs)?;
        Counters::add(&COUNTERS.locate_run_ns, running.elapsed().as_nanos() as u64);
        return found(graph, p, &host);
    }
    let building = Instant::now();
    let built;
    let probe = match ahead.and_then(Ahead::ready) {
        Some(p) => p,
        None => match probe(graph, usize::MAX, rt.config.backend)? {
            Some(p) => {
                built = p;
                &built
            }
            None => return Ok(Replayed { first: None, outputs: Vec::new() }),
        },
    };
    Counters::add(&COUNTERS.locate_build_ns, building.elapsed().as_nanos() as u64);
    let exe = compile_probe(rt, probe)?;
    let running = Instant::now();
    let host = execute(rt, &probe.graph, &exe, inputs)?;
    unload_aside(move || drop(exe));
    Counters::add(&COUNTERS.locate_run_ns, running.elapsed().as_nanos() as u64);
    found(graph, probe, &host)
}

/// What a run of `probe` (its outputs' bytes, `host`) found in `graph`.
fn found(graph: &Graph, probe: &Probe, host: &[Vec<u8>]) -> Result<Replayed> {
    let Probe { graph: probed, stats, counted, nodes: n, .. } = probe;
    // Back from a barrier to the node it stands for.
    let stands_for = |m: NodeId| if m < *n { m } else { probed.nodes[m].operands[0] };
    let mut nonfinite = vec![0u64; graph.nodes.len()];
    let mut range = vec![None; graph.nodes.len()];
    for ((all, of), bytes) in stats.iter().zip(host) {
        let dtype = probed.nodes[*all].ty.dtype;
        for (&m, three) in of.iter().zip(bytes_to_f64(dtype, bytes).chunks(3)) {
            let id = stands_for(m);
            let (count, min, max) = FiniteStats::read(dtype, three);
            nonfinite[id] = count;
            range[id] = Some((min, max));
        }
    }
    let float_outputs = graph.outputs.iter().filter(|&&o| graph.nodes[o].ty.dtype.is_float());
    let outputs = float_outputs.map(|&o| nonfinite[o]).collect();
    // The first counted node with non-finite values made them: an uncounted operand (0 here) only moved values
    // made before it, by a counted node that would come first.
    let made = |id: NodeId| nonfinite[id] > 0 && graph.nodes[id].operands.iter().all(|&o| nonfinite[o] == 0);
    let enters = |id: NodeId| matches!(graph.nodes[id].op, Op::Parameter(_) | Op::Constant(_));
    // An op that made non-finite values from finite ones comes before any non-finite input or constant: a `-inf`
    // mask enters as one of those and is meant to be there. One of them is named when no op made non-finite
    // values of its own.
    let first = counted.iter().copied().find(|&id| !enters(id) && made(id));
    let Some(first) = first.or_else(|| counted.iter().copied().find(|&id| made(id))) else {
        return Ok(Replayed { first: None, outputs });
    };
    let node = &graph.nodes[first];
    let mut operands = Vec::with_capacity(node.operands.len());
    for &o in &node.operands {
        let ty = graph.nodes[o].ty.clone();
        // The operands are finite: no NaN, no infinity.
        let stats = match range[o] {
            Some((min, max)) => Some(Stats { min, max, nan: 0, inf: 0 }),
            None if ty.dtype.is_float() => return Err(Error::Internal("an operand's range was not computed".into())),
            None => None,
        };
        operands.push((ty, stats));
    }
    let located =
        Located { op: node.op.name(), loc: node.loc, ty: node.ty.clone(), nonfinite: nonfinite[first], operands };
    Ok(Replayed { first: Some(located), outputs })
}

/// The floating-point nodes whose non-finite elements the locating run counts: those that can make a non-finite
/// value from finite operands (not those that only move values: a reshape, a slice, a select, …), which are what
/// the search looks for, and the outputs, which the report names. Counting fewer nodes is a smaller program to
/// compile, and the compile is most of a trip (`docs/perf-log/2026-12-01-gelu-flags-grouped-check.md`).
fn counted(graph: &Graph, floats: &[NodeId]) -> Vec<NodeId> {
    let mut is_output = vec![false; graph.nodes.len()];
    graph.outputs.iter().for_each(|&o| is_output[o] = true);
    floats.iter().copied().filter(|&id| is_output[id] || !graph.nodes[id].op.only_moves_values()).collect()
}

/// The nodes the locating run reduces, each once, in program order: the counted ones and the floating-point
/// operands of those (whose ranges the report shows; an uncounted one reports 0 non-finite, as it only moves
/// values).
fn watched(graph: &Graph, counted: &[NodeId]) -> Vec<NodeId> {
    let mut wanted = vec![false; graph.nodes.len()];
    for &id in counted {
        wanted[id] = true;
        for &o in &graph.nodes[id].operands {
            wanted[o] |= graph.nodes[o].ty.dtype.is_float();
        }
    }
    (0..graph.nodes.len()).filter(|&id| wanted[id]).collect()
}

/// The nodes to reduce for `watched`, in order: each node itself, or, for a value computed from constants alone
/// (a mask, a zero state, their broadcasts), that value through an optimization barrier. XLA folds a reduction of
/// a constant at compile time, and a variadic one over a large broadcast it evaluates element by element: minutes
/// for one of GPT-2's embedding-sized values.
fn unfoldable(probe: &mut Graph, watched: &[NodeId]) -> Result<Vec<NodeId>> {
    let constant = constant_only(probe);
    let barrier = Op::Checkpoint(Checkpoint::Barrier { index: 0 });
    let mut measured = Vec::with_capacity(watched.len());
    for &id in watched {
        measured.push(match constant[id] {
            true => probe.push(barrier.clone(), vec![id], probe.nodes[id].loc).map_err(Error::Internal)?,
            false => id,
        });
    }
    Ok(measured)
}

/// Whether each node's value depends on no input of the program.
fn constant_only(graph: &Graph) -> Vec<bool> {
    let mut constant = vec![false; graph.nodes.len()];
    for (id, node) in graph.nodes.iter().enumerate() {
        constant[id] = !matches!(node.op, Op::Parameter(_)) && node.operands.iter().all(|&o| constant[o]);
    }
    constant
}

/// `graph` as one device runs it: no partitions, no layouts, and its sharding constraints (identities with a
/// layout) as reshapes to their own shape.
fn on_one_device(graph: &Graph) -> Graph {
    let mut g = graph.clone();
    if g.partitions == 0 {
        return g;
    }
    g.partitions = 0;
    g.param_shardings.clear();
    g.output_shardings.clear();
    for node in &mut g.nodes {
        if let Op::ShardingConstraint(_) = node.op {
            node.op = Op::Reshape(Reshape { dims: node.ty.dims.to_vec() });
        }
    }
    g
}

/// The line a locating program's compile or run error names: its first output's.
fn line_of(graph: &Graph) -> Loc {
    graph.outputs.first().map_or(Loc::caller(), |&o| graph.nodes[o].loc)
}

/// Compile a probe's program (no aliases: the inputs are kept).
fn compile_probe(rt: &Runtime, probe: &Probe) -> Result<LoadedExecutable> {
    let options = options(rt, probe.watched);
    let at = line_of(&probe.graph);
    let compiling = Instant::now();
    let exe = loop {
        match rt.client.compile(&probe.text, &options) {
            Err(source) if rt.drop_unknown_default(&source) => continue,
            done => break done.map_err(|source| Error::Compile { at, source })?,
        }
    };
    Counters::add(&COUNTERS.locate_compiles, 1);
    Counters::add(&COUNTERS.locate_compile_ns, compiling.elapsed().as_nanos() as u64);
    Ok(exe)
}

/// Run `exe`, `graph`'s program, on `inputs`; each output's bytes.
fn execute(rt: &Runtime, graph: &Graph, exe: &LoadedExecutable, inputs: &[Data]) -> Result<Vec<Vec<u8>>> {
    let outs = run(rt, graph, exe, inputs)?;
    outs.iter().map(Buffer::to_host).collect::<lazuli_pjrt::Result<_>>().map_err(Error::from)
}

/// Run `exe`, `graph`'s program, on `inputs` (uploading those not on the device); its outputs.
pub(super) fn run(rt: &Runtime, graph: &Graph, exe: &LoadedExecutable, inputs: &[Data]) -> Result<Vec<Buffer>> {
    let at = line_of(graph);
    let uploaded = upload(rt, graph, inputs)?;
    let mut args: Vec<&Buffer> = Vec::with_capacity(inputs.len());
    for (data, up) in inputs.iter().zip(&uploaded) {
        args.push(match (data, up) {
            (_, Some(b)) => b,
            (Data::Device(v), None) => v.buffer()?,
            _ => return Err(Error::Internal("a kept input has no buffer".into())),
        });
    }
    exe.execute(&args).map_err(|source| Error::Execute { at, source })
}

/// The thread unloading the last locating program, if one was started.
static UNLOADING: std::sync::Mutex<Option<std::thread::JoinHandle<()>>> = std::sync::Mutex::new(None);

/// Unloads the locating program off the error's path: on an H200 unloading GPT-2's took about 90 ms, five steps'
/// time. Joined before the next one and at exit, so that no unload races the plugin's teardown.
fn unload_aside(unload: impl FnOnce() + Send + 'static) {
    join_unloading();
    let handle = std::thread::Builder::new().name("lazuli-unload".into()).spawn(unload);
    // Without a thread, `unload` was dropped unrun by the failed spawn: the program is unloaded here, as before.
    *UNLOADING.lock().unwrap_or_else(|e| e.into_inner()) = handle.ok();
    JOIN_BEFORE_EXIT.with(|_| ());
}

/// At exit, before the plugin is torn down: waits for the compiles started ahead (a run that ends within one waits
/// for its end) and for an unload started by [`unload_aside`].
pub(crate) fn join_aside() {
    let compiles = std::mem::take(&mut *ASIDE.lock().unwrap_or_else(|e| e.into_inner()));
    if compiles.iter().any(|h| !h.is_finished()) {
        // A wait as long as a compile, which would otherwise look like a hang.
        eprintln!(
            "lazuli: waiting for the NaN locator's compile ahead to finish before exit \
             (LAZULI_LOCATE_AHEAD=0 compiles it only at a trip)"
        );
    }
    for handle in compiles {
        let _ = handle.join();
    }
    join_unloading();
}

/// Waits for an unload started by [`unload_aside`].
fn join_unloading() {
    let handle = UNLOADING.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(h) = handle {
        let _ = h.join();
    }
}

/// The locator's compile options. The program runs once, so on the CPU LLVM's optimizations pay only where they
/// save more of the run than they add to the compile: a program that reads fewer than
/// [`OPTIMIZED_FROM_ELEMENTS`] is compiled without them (`xla_backend_optimization_level=0`,
/// `docs/perf-log/2026-12-01-nan-gpt.md`), a larger one at level 1. That option goes first, so that
/// `LAZULI_XLA_OPTIONS` can still set it. On NVIDIA GPUs it keeps XLA's autotuning: without it the compile was no
/// shorter and, with the step's program from the persistent cache, the run took about 460 ms instead of 70–90 ms
/// (`docs/perf-log/2026-12-02-cpu-check-locator-autotuning.md`).
fn options(rt: &Runtime, watched: usize) -> CompileOptions {
    let mut options = rt.single_device_options();
    if rt.config.backend == Backend::Cpu {
        let level = if watched < OPTIMIZED_FROM_ELEMENTS { 0 } else { 1 };
        options.xla_options.insert(0, ("xla_backend_optimization_level".into(), XlaOption::Int(level)));
    }
    options
}

/// On the CPU, a locating program that reads at least this many elements is compiled with LLVM's optimizations:
/// they made each element's reduction about 4 ns faster and the compile about half a second longer, whatever the
/// model's size (`docs/perf-log/2026-12-05-locating-run-on-the-cpu.md`).
const OPTIMIZED_FROM_ELEMENTS: usize = 1 << 26;

/// Device copies of the inputs that are not single device buffers (host data, shards).
fn upload(rt: &Runtime, graph: &Graph, inputs: &[Data]) -> Result<Vec<Option<Buffer>>> {
    let mut out = Vec::with_capacity(inputs.len());
    for (data, &p) in inputs.iter().zip(&graph.params) {
        if let Data::Device(_) = data {
            out.push(None);
            continue;
        }
        let ty = &graph.nodes[p].ty;
        let bytes = data.to_host(ty)?;
        let dims: Vec<i64> = ty.dims.iter().map(|&d| d as i64).collect();
        out.push(Some(rt.client.buffer_from_host(&bytes, element_type(ty.dtype), &dims, &rt.device)?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lazuli_hlo::ops::elementwise::{Binary, BinaryKind, Unary, UnaryKind};
    use lazuli_hlo::{DType, Graph, Loc, Op, TensorType};

    use super::{locate, probe, Ahead, Replayed};
    use crate::graph::tensor::Data;

    /// A probe built ahead (as a trip finds it once its thread is done) and one built by the trip give the same
    /// answer: `log` of 0 and of −1 named first, its two non-finite elements, and the output's count.
    #[test]
    fn a_probe_built_ahead_locates_as_one_built_by_the_trip() {
        let at = |line| Loc { file: "step.rs", line, col: 1 };
        let mut g = Graph::new();
        let x = g.parameter(TensorType::new(DType::F32, [4]), at(1));
        let log = g.push(Op::Unary(Unary { kind: UnaryKind::Log }), vec![x], at(2)).unwrap();
        let y = g.push(Op::Binary(Binary { kind: BinaryKind::Add }), vec![log, x], at(3)).unwrap();
        g.outputs = vec![y];
        let bytes: Vec<u8> = [1.0f32, 0.0, -1.0, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let inputs = [Data::Host(Arc::new(bytes))];
        let rt = crate::runtime::runtime().expect("the CPU runtime");
        let backend = rt.config.backend;
        let ahead = Ahead { probe: probe(&g, usize::MAX, backend).expect("a probe").into(), ..Ahead::default() };
        assert!(ahead.ready().is_some(), "the probe was built");
        let summary = |r: Replayed| {
            let first = r.first.expect("a first non-finite value");
            (first.op, first.loc.line, first.nonfinite, r.outputs)
        };
        let by_the_trip = summary(locate(rt, &g, None, &inputs).expect("located by the trip"));
        let built_ahead = summary(locate(rt, &g, Some(&ahead), &inputs).expect("located ahead"));
        assert_eq!(by_the_trip, ("log", 2, 2, vec![2]));
        assert_eq!(built_ahead, by_the_trip);
    }
}
