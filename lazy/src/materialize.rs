//! Materialization: collect the pending graph under some target tensors, look its structure up in the executable
//! cache (compiling on a miss), run it, and store the results on their nodes.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use lazuli_hlo::{emit, EmitOptions, Loc};
use lazuli_pjrt::{Buffer, CompileOptions, ElementType};

use crate::compile_cache;
use crate::diagnostics::{self, cause_name, EventKind};
use crate::error::{Error, Result};
use crate::launcher::{self, Arg, DeviceValue, Job, Ticket};
use crate::metrics::{Counters, COUNTERS};
use crate::runtime::{runtime, Runtime};
use crate::tensor::{Data, Node};
use crate::walk::{one_at_a_time, walk, Walk};

/// Why a materialization happened (diagnostics build on this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// `item()`.
    Item,
    /// `to_vec()`, `to_ndarray()` and the other typed reads.
    ToVec,
    /// Printing a tensor (`Display`).
    Display,
    /// `sync()`, the step boundary.
    Sync,
    /// `Tensor::materialize()`.
    Explicit,
    /// Saving a checkpoint.
    Checkpoint,
    /// A tensor's value decided a host-side branch (`if loss > 1.0`).
    HostControlFlow,
    /// The pending graph outgrew [`MAX_GRAPH_NODES`]; a piece of it was computed first.
    GraphSize,
}

/// The most nodes one program is compiled from. XLA's compile memory grows faster than the graph (an
/// elementwise chain with a host scalar per op, on the 2-core machine of BENCHMARKS.md: 10k nodes 0.3 GB, 25k
/// 0.5 GB, 50k 1.2 GB of peak memory); a graph recorded without a step boundary (a loop of 100k ops) is
/// compiled in pieces of at most this many nodes instead. A GPT-2-small training step is about 2,300 nodes.
pub const MAX_GRAPH_NODES: usize = 32_768;

pub(crate) fn element_type(dt: lazuli_hlo::DType) -> ElementType {
    use lazuli_hlo::DType::*;
    match dt {
        F32 => ElementType::F32,
        F64 => ElementType::F64,
        F16 => ElementType::F16,
        BF16 => ElementType::BF16,
        I32 => ElementType::S32,
        I64 => ElementType::S64,
        U8 => ElementType::U8,
        U32 => ElementType::U32,
        U64 => ElementType::U64,
        Bool => ElementType::Pred,
    }
}

/// Where a leaf's host data goes: uploaded right away (`reuse`: a CPU device with no program running may
/// overwrite an earlier, dropped upload), or by the launcher right before the program runs.
#[derive(Clone, Copy)]
enum Upload {
    Now { reuse: bool },
    OnLauncher,
}

/// A leaf's device value. A host leaf is copied to the device once; later materializations reuse the copy. Host
/// scalars (learning rates, Adam's betas, recorded anew every step) share one device copy per dtype and value;
/// they are never donated (`plan_donation`), so sharing is safe.
///
/// An array of a batch's size may overwrite the buffer of an earlier upload of its type and shape that is no
/// longer used (`Client::buffer_from_host_reusing`): on the launcher always (nothing else runs there), here
/// with `Upload::Now { reuse: true }`.
fn device_value(rt: &Runtime, node: &Node, upload: Upload) -> Result<(Arg, u64)> {
    type ScalarKey = (lazuli_hlo::DType, Vec<u8>);
    static SCALARS: std::sync::Mutex<Option<std::collections::HashMap<ScalarKey, Arc<DeviceValue>>>> =
        std::sync::Mutex::new(None);
    let mut state = node.lock();
    let bytes = match &state.data {
        Some(Data::Device(v)) => return Ok((Arg::Value(v.clone()), 0)),
        Some(Data::Host(bytes)) => bytes.clone(),
        // A sharded value used by a single-device program: gathered once, then kept on the device.
        Some(d @ Data::Sharded { .. }) => d.to_host(&node.ty)?,
        None => return Err(Error::Internal("a pending node was bound to a parameter".into())),
    };
    // Only scalars are looked up (and their key copied): a batch or a weight is uploaded as it is.
    let key = (node.ty.rank() == 0).then(|| (node.ty.dtype, bytes.to_vec()));
    if let Some(key) = &key {
        let cached = SCALARS.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|m| m.get(key).cloned());
        // A copy whose upload failed (with the program it was queued with) is made again, not shared on.
        if let Some(value) = cached.filter(|v| !v.failed()) {
            state.data = Some(Data::Device(value.clone()));
            return Ok((Arg::Value(value), 0));
        }
    }
    let dims: Vec<i64> = node.ty.dims.iter().map(|&d| d as i64).collect();
    let ty = element_type(node.ty.dtype);
    let n = bytes.len() as u64;
    let (arg, value) = match upload {
        Upload::Now { reuse } => {
            let buf = if reuse && key.is_none() {
                rt.client.buffer_from_host_reusing(&bytes, ty, &dims, &rt.device)?
            } else {
                rt.client.buffer_from_host(&bytes, ty, &dims, &rt.device)?
            };
            let value = DeviceValue::ready(buf, 0);
            (Arg::Value(value.clone()), value)
        }
        Upload::OnLauncher => {
            let into = DeviceValue::pending(0);
            (Arg::Upload { bytes, ty, dims, reuse: key.is_none(), into: into.clone() }, into)
        }
    };
    Counters::add(&COUNTERS.bytes_to_device, n);
    state.data = Some(Data::Device(value.clone()));
    if let Some(key) = key {
        let mut cache = SCALARS.lock().unwrap_or_else(|e| e.into_inner());
        let map = cache.get_or_insert_with(Default::default);
        // Values that change every step (bias corrections) would grow it without bound.
        if map.len() >= 256 {
            map.clear();
        }
        map.insert(key, value);
    }
    Ok((arg, n))
}

/// Donate the buffers of leaves that die with this step to outputs of the same type, so new weights and
/// optimizer state are written in place. A node dies with the step when the user holds no handle to it and every
/// reference to it comes from a recipe dropped after the step: a target's (unless it keeps its recipe for a later
/// `backward()`), or a dying node's. Users come after their operands in the graph, so one backward sweep decides.
/// `LAZULI_DONATE=0` turns donation off. Returns the donated parameter indices.
fn plan_donation(w: &mut Walk) -> Vec<usize> {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // `check_settings` refused anything but 0, 1, true and false when the runtime was made.
    if !*ENABLED.get_or_init(|| !matches!(std::env::var("LAZULI_DONATE").as_deref(), Ok("0" | "false"))) {
        return Vec::new();
    }
    let n = w.len();
    let mut is_target = vec![false; n];
    for &o in &w.outputs {
        is_target[o] = true;
    }
    let mut param_of = vec![None; n];
    for (i, &id) in w.params.iter().enumerate() {
        param_of[id] = Some(i);
    }
    // References from recipes that are dropped after the step, per node.
    let mut dropped_refs = vec![0usize; n];
    let mut dying_leaves = Vec::new();
    for id in (0..n).rev() {
        let node = &w.nodes[id];
        // Handles held by this planning: `nodes` (+1), and `leaves` for parameters (+1).
        let ours = 1 + param_of[id].is_some() as usize;
        let dies = node.user_handles() == 0 && Rc::strong_count(node) == dropped_refs[id] + ours;
        if let Some(i) = param_of[id] {
            // Scalars share cached device copies (`device_buffer`), and donating one would save nothing.
            if dies && node.ty.rank() > 0 {
                dying_leaves.push(i);
            }
            continue;
        }
        let recipe_dropped = if is_target[id] { !node.keeps_recipe() } else { dies };
        if recipe_dropped {
            for &o in w.operands(id) {
                dropped_refs[o as usize] += 1;
            }
        }
    }
    dying_leaves.sort_unstable();
    let mut output_of = vec![None; n];
    for (j, &o) in w.outputs.iter().enumerate() {
        output_of[o] = Some(j);
    }
    let mut used = vec![false; w.outputs.len()];
    let mut donated = vec![false; w.leaves.len()];
    let shardings = w.graph.as_ref().map(|g| (&g.param_shardings, &g.output_shardings));
    // Same type and, on a mesh, the same layout: a shard can only become the same shard.
    let fits = |i: usize, j: usize, used: &[bool]| {
        !used[j] && w.targets[j].ty == w.leaves[i].ty && shardings.is_none_or(|(p, o)| p.get(i) == o.get(j))
    };
    let mut aliases = Vec::new();
    // First each leaf to its own successor (an old weight to its new value): XLA then updates it in place. Any
    // other pairing of equal types is valid but makes XLA copy buffers around the fusions that read them.
    for &i in &dying_leaves {
        let next = w.leaves[i].successor.get().and_then(|s| s.upgrade());
        let j = next.and_then(|s| w.id_of(&s)).and_then(|id| output_of[id]);
        if let Some(j) = j.filter(|&j| fits(i, j, &used)) {
            used[j] = true;
            donated[i] = true;
            aliases.push((i, j));
        }
    }
    for &i in &dying_leaves {
        if donated[i] {
            continue;
        }
        if let Some(j) = (0..used.len()).find(|&j| fits(i, j, &used)) {
            used[j] = true;
            donated[i] = true;
            aliases.push((i, j));
        }
    }
    aliases.sort_unstable();
    w.aliases = aliases;
    dying_leaves.into_iter().filter(|&i| donated[i]).collect()
}

/// Compute `targets` (those still pending) in one program, or in several when their graph is larger than
/// [`MAX_GRAPH_NODES`].
pub(crate) fn materialize(targets: &[Rc<Node>], cause: Cause, at: Loc) -> Result<()> {
    // One materialization at a time (see `one_at_a_time`).
    let _one = one_at_a_time();
    materialize_unlocked(targets, cause, at)
}

/// The pending nodes of the first [`MAX_GRAPH_NODES`] / 2 nodes of `traced` (in topological order) that later
/// nodes read: computing them first leaves a graph that much smaller.
fn first_piece(traced: &Walk) -> Vec<Rc<Node>> {
    let cut = MAX_GRAPH_NODES / 2;
    let mut needed = vec![false; cut];
    for id in cut..traced.len() {
        for &o in traced.operands(id) {
            if (o as usize) < cut {
                needed[o as usize] = true;
            }
        }
    }
    (0..cut).filter(|&i| needed[i] && traced.nodes[i].is_pending()).map(|i| traced.nodes[i].clone()).collect()
}

fn materialize_unlocked(targets: &[Rc<Node>], cause: Cause, at: Loc) -> Result<()> {
    let started = Instant::now();
    if !targets.iter().any(|t| t.is_pending()) {
        return Ok(());
    }
    let rt = runtime()?;
    let mut traced = walk(targets);
    while traced.len() > MAX_GRAPH_NODES {
        let (before, first) = (traced.len(), first_piece(&traced));
        drop(traced);
        if !first.is_empty() {
            materialize_unlocked(&first, Cause::GraphSize, at)?;
        }
        traced = walk(targets);
        if first.is_empty() || traced.len() >= before {
            break; // nothing to cut off (a graph of leaves): compile it whole
        }
    }
    if traced.targets.is_empty() {
        return Ok(());
    }
    // On a mesh: parameters keep their placement, outputs get the shardings the ops' rules propagate.
    let mesh = crate::spmd::mesh_of(&traced.leaves, traced.has_constraint)?;
    let placement = mesh.as_ref().map(|m| {
        let leaves = traced.leaves.clone();
        crate::spmd::annotate(traced.graph(), &leaves, m)
    });
    let donated = plan_donation(&mut traced);
    let key = traced.key();
    let cached = rt.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
    // Strict mode may refuse here, before anything is uploaded, compiled or donated.
    let hit = cached.is_some();
    // Diagnostics compare a new program's IR with earlier ones; a cache hit needs no IR at all.
    let check = diagnostics::before_program(cause, at, hit, if hit { None } else { Some(traced.graph()) })?;
    if !hit && mesh.is_none() {
        fits_in_memory(rt, &traced)?;
    }
    let mut event =
        diagnostics::events::enabled().then(|| diagnostics::Event::new(EventKind::Program, cause_name(cause), at));

    let t0 = Instant::now();
    Counters::add(&COUNTERS.boundary_ns, (t0 - started).as_nanos() as u64);
    let mut uploaded = 0u64;
    // Single-device CPU programs run on the launcher thread; the others from here.
    let on_launcher = mesh.is_none() && rt.uses_launcher(launcher::take_demand());
    let upload = if on_launcher {
        Upload::OnLauncher
    } else {
        Upload::Now { reuse: rt.config.backend == crate::runtime::Backend::Cpu && nothing_running() }
    };
    // Per device (one for an ordinary program), the arguments in parameter order.
    let devices = mesh.as_ref().map_or(1, |m| m.size());
    let mut args: Vec<Vec<Arg>> = vec![Vec::with_capacity(traced.leaves.len()); devices];
    for (i, leaf) in traced.leaves.iter().enumerate() {
        match &placement {
            Some((params, _)) => {
                let (bufs, bytes) = crate::spmd::leaf_shards(rt, leaf, &params[i])?;
                uploaded += bytes;
                for (k, b) in bufs.into_iter().enumerate() {
                    args[k].push(Arg::Shard(b));
                }
            }
            None => {
                let (arg, bytes) = device_value(rt, leaf, upload)?;
                uploaded += bytes;
                args[0].push(arg);
            }
        }
    }
    // One clock read ends a phase and starts the next (each read is a few dozen ns; a small step has several).
    let t1 = Instant::now();
    let transfer = t1 - t0;
    Counters::add(&COUNTERS.upload_ns, transfer.as_nanos() as u64);
    let t0 = t1;
    let exe = match cached {
        Some(exe) => {
            Counters::add(&COUNTERS.cache_hits, 1);
            exe
        }
        None => {
            let options = || match &mesh {
                Some(m) => CompileOptions {
                    device_assignment: Some(vec![m.devices().iter().map(|&d| d as i64).collect()]),
                    xla_options: rt.xla_options(),
                    ..CompileOptions::spmd(m.size() as u32)
                },
                None => CompileOptions { xla_options: rt.xla_options(), ..CompileOptions::default() },
            };
            let text = emit(traced.graph(), &EmitOptions::default());
            dump_program(key, &text);
            let exe = loop {
                match compile_cache::compile(rt, &text, &options(), key) {
                    Err(source) if rt.drop_unknown_default(&source) => continue,
                    done => break done.map_err(|source| compile_error(traced.graph(), at, source))?,
                }
            };
            Counters::add(&COUNTERS.compile_ns, t0.elapsed().as_nanos() as u64);
            Counters::add(&COUNTERS.compiles, 1);
            let exe = Arc::new(exe);
            rt.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, exe.clone());
            exe
        }
    };
    let compile = t0.elapsed();
    let n_out = exe.num_outputs().map_err(|source| Error::Execute { at, source })?;
    if n_out != traced.targets.len() {
        let expected = traced.targets.len();
        return Err(Error::Internal(format!("the program has {n_out} outputs, {expected} expected")));
    }
    // Keep at most a few programs queued: older ones are waited for (and their errors reported) first.
    throttle(MAX_IN_FLIGHT - 1)?;
    let t0 = Instant::now();
    let program = launcher::next_program();
    // Output j: its value (one buffer, or one per device).
    let outputs: Vec<Data> = if on_launcher {
        let outputs: Vec<Arc<DeviceValue>> = (0..n_out).map(|_| DeviceValue::pending(program)).collect();
        let ticket = Ticket::new(at);
        let args = args.pop().unwrap_or_default();
        let from_core = launcher::cores::current();
        let job = Job { exe: exe.clone(), args, outputs: outputs.clone(), ticket: ticket.clone(), from_core };
        launcher::submit(rt, job);
        in_flight().push_back(Launched::Queued(ticket));
        Counters::add(&COUNTERS.executions, 1);
        Counters::add(&COUNTERS.queued, 1);
        outputs.into_iter().map(Data::Device).collect()
    } else {
        let mut inputs: Vec<Vec<&Buffer>> = Vec::with_capacity(devices);
        for list in &args {
            inputs.push(list.iter().map(Arg::buffer).collect::<Result<_>>()?);
        }
        let (mut per_device, done) = exe.launch_sharded(&inputs).map_err(|source| Error::Execute { at, source })?;
        // Output j's buffer on each device.
        let mut outs: Vec<Vec<Buffer>> = (0..n_out).map(|_| Vec::with_capacity(devices)).collect();
        for list in per_device.iter_mut() {
            for (j, b) in list.drain(..).enumerate() {
                outs[j].push(b);
            }
        }
        if outs.iter().any(|bufs| bufs.len() != devices) {
            return Err(Error::Internal("the program returned fewer outputs than it has".into()));
        }
        // Buffers dropped while the program runs are freed by the plugin once it no longer uses them (PJRT's
        // contract for destroying a buffer), so only the completion is kept.
        in_flight().push_back(Launched::Here { done, at });
        Counters::add(&COUNTERS.executions, 1);
        outs.into_iter()
            .enumerate()
            .map(|(j, mut bufs)| match &placement {
                Some((_, shardings)) => {
                    Data::Sharded { shards: bufs.into_iter().map(Arc::new).collect(), sharding: shardings[j].clone() }
                }
                None => Data::Device(DeviceValue::ready(bufs.remove(0), program)),
            })
            .collect()
    };
    let finishing = Instant::now();
    let execute = finishing - t0;
    if !on_launcher {
        Counters::add(&COUNTERS.execute_ns, execute.as_nanos() as u64);
    }
    for &i in &donated {
        // The buffer now belongs to an output; nothing may read this node again.
        let leaf = &traced.leaves[i];
        Counters::add(&COUNTERS.bytes_donated, leaf.ty.byte_size() as u64);
        leaf.take_data();
    }
    // Dropping the op and operands here releases the graph above computed values.
    for (node, data) in traced.targets.iter().zip(outputs) {
        node.set_data(data);
    }
    // The first run of a new program is waited for: the plugin sets up runtime state on it whose teardown is
    // registered then, and the exit hook below must be registered after that to run before it.
    if !hit {
        throttle(0)?;
    }
    // A process that ends right after `sync()` must not tear the plugin down under a running program.
    static EXIT_WAIT: std::sync::Once = std::sync::Once::new();
    EXIT_WAIT.call_once(|| {
        lazuli_pjrt::on_exit(wait_at_exit);
    });
    if let Some(e) = &mut event {
        e.program_in_step = check.program_in_step;
        e.unchecked = check.unchecked;
        e.recompile = check.recompile;
        e.explanation = check.explanation;
        e.differences = check.differences;
        if !hit {
            e.kernels = kernel_choices(traced.graph());
        }
        e.graph_hash = format!("{key:016x}");
        (e.nodes, e.inputs, e.outputs) = (traced.len(), traced.params.len(), traced.outputs.len());
        e.cache_hit = hit;
        e.disk_hit = !hit && compile_cache::loaded_from_disk(key);
        e.compile_ms = if e.cache_hit { 0.0 } else { compile.as_secs_f64() * 1e3 };
        e.execute_ms = execute.as_secs_f64() * 1e3;
        e.transfer_ms = transfer.as_secs_f64() * 1e3;
        e.bytes_to_device = uploaded;
        diagnostics::events::emit(e);
    }
    // Releasing the graph above the outputs is part of finishing.
    drop((traced, args));
    Counters::add(&COUNTERS.finish_ns, finishing.elapsed().as_nanos() as u64);
    Ok(())
}

/// Programs launched but perhaps still running, oldest first, with the line that caused each. Execution is
/// asynchronous: `sync()` returns once the step's program is enqueued, so the host records the next step while
/// the device runs this one. Reads wait for the data they need; `wait()` waits for everything.
static IN_FLIGHT: std::sync::Mutex<std::collections::VecDeque<Launched>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());

/// Programs allowed in flight at once (bounds device memory held by queued steps, and how late an error shows).
const MAX_IN_FLIGHT: usize = 2;

/// A launched program: its completion and the line that launched it.
enum Launched {
    /// Launched from the materializing thread.
    Here { done: lazuli_pjrt::Completion, at: Loc },
    /// Queued on the launcher (`launcher.rs`); the ticket knows the line.
    Queued(Arc<Ticket>),
}

impl Launched {
    fn is_done(&self) -> bool {
        match self {
            Launched::Here { done, .. } => done.is_done(),
            Launched::Queued(ticket) => ticket.is_done(),
        }
    }

    fn wait(self) -> Result<()> {
        match self {
            Launched::Here { done, at } => done.wait().map_err(|source| Error::Execute { at, source }),
            Launched::Queued(ticket) => ticket.wait(),
        }
    }
}

fn in_flight() -> std::sync::MutexGuard<'static, std::collections::VecDeque<Launched>> {
    IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner())
}

/// No launched program is still running (their completions stay queued, with any error, for `wait()`).
fn nothing_running() -> bool {
    in_flight().iter().all(Launched::is_done)
}

/// Wait for the oldest launched programs until at most `keep` remain; an error names the line that launched it.
fn throttle(keep: usize) -> Result<()> {
    if in_flight().len() <= keep {
        return Ok(());
    }
    let t0 = Instant::now();
    let mut status = Ok(());
    loop {
        let Some(launched) = ({
            let mut q = in_flight();
            if q.len() > keep {
                q.pop_front()
            } else {
                None
            }
        }) else {
            break;
        };
        if let (Err(e), true) = (launched.wait(), status.is_ok()) {
            status = Err(e);
        }
    }
    Counters::add(&COUNTERS.wait_ns, t0.elapsed().as_nanos() as u64);
    status
}

/// At process exit: wait for launched programs, unless another thread holds the queue (it is then mid-launch);
/// then keep the launcher out of the plugin, which is torn down next.
fn wait_at_exit() {
    let pending: Vec<_> = match IN_FLIGHT.try_lock() {
        Ok(mut q) => q.drain(..).collect(),
        Err(_) => Vec::new(),
    };
    for launched in pending {
        let _ = launched.wait();
    }
    launcher::shutdown();
}

/// Wait until every launched program has finished on its devices. `sync()` only enqueues the step; reads
/// (`item`, `to_vec`, checkpoints) wait for what they read. Use this to time steps or to surface a runtime error
/// at a known point. An error names the line whose materialization launched the failing program.
pub fn wait() -> Result<()> {
    launcher::note_wait();
    launcher::flush_graves();
    throttle(0)
}

/// A new program whose outputs and uploads together need more memory than the device has free (the host's
/// available memory for the CPU plugin) is refused before anything is uploaded or compiled, naming the largest of
/// those values with the line that recorded it and both sizes: XLA would otherwise grow until the operating
/// system's OOM killer ends the process. Intermediate values are not counted (XLA may fuse them away), and where
/// the plugin reports no memory nothing is checked.
fn fits_in_memory(rt: &Runtime, traced: &Walk) -> Result<()> {
    let Some(free) = rt.free_memory() else { return Ok(()) };
    let uploads = traced.leaves.iter().filter(|n| matches!(n.lock().data, Some(Data::Host(_))));
    let needed: Vec<&Rc<Node>> = traced.targets.iter().chain(uploads).collect();
    let total = needed.iter().map(|n| n.ty.byte_size()).fold(0, usize::saturating_add);
    let Some(largest) = needed.iter().max_by_key(|n| n.ty.byte_size()) else { return Ok(()) };
    if total <= free {
        return Ok(());
    }
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    Err(Error::OutOfMemory(format!(
        "the program's outputs and uploads need {:.2} GiB; the device has {:.2} GiB free (the largest: {}, {:.2} \
         GiB, recorded at {})",
        gib(total),
        gib(free),
        largest.ty,
        gib(largest.ty.byte_size()),
        largest.loc
    )))
}

/// Each custom kernel of `graph` once, with where it was recorded, the implementation it runs and why.
fn kernel_choices(graph: &lazuli_hlo::Graph) -> Vec<String> {
    let mut seen = Vec::new();
    for node in &graph.nodes {
        let lazuli_hlo::Op::Kernel(k) = &node.op else { continue };
        let c = &k.def.choice;
        let line = format!("{} at {}: {} ({})", k.def.name, node.loc, c.implementation, c.reason);
        if !seen.contains(&line) {
            seen.push(line);
        }
    }
    seen
}

/// A compile error; where the program holds custom kernels with device code (Triton IR, cuDNN calls), it
/// names them with their lines, since XLA's message names the kernel's IR, not the user's code.
fn compile_error(graph: &lazuli_hlo::Graph, at: Loc, source: lazuli_pjrt::Error) -> Error {
    let kernels: Vec<String> = kernel_choices(graph).into_iter().filter(|k| !k.contains(": composite (")).collect();
    if kernels.is_empty() {
        Error::Compile { at, source }
    } else {
        Error::KernelCompile { at, kernels: kernels.join("\n  "), source }
    }
}

/// With `LAZULI_DUMP_DIR` set, write every compiled program there as `<hash>.mlir` (for bug reports and for
/// reading what XLA was given). Best effort: a failed write never fails the computation.
fn dump_program(key: u64, text: &str) {
    if let Some(dir) = std::env::var_os("LAZULI_DUMP_DIR") {
        let dir = std::path::PathBuf::from(dir);
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(dir.join(format!("{key:016x}.mlir")), text);
    }
}
