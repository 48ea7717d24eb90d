//! Materialization: collect the pending graph under some target tensors, look its structure up in the executable
//! cache (compiling on a miss), run it, and store the results on their nodes.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

use lazuli_hlo::{emit, EmitOptions, Graph, Loc, NodeId};
use lazuli_pjrt::{Buffer, CompileOptions, ElementType};

use crate::compile_cache;
use crate::diagnostics::{self, cause_name, EventKind};
use crate::error::{Error, Result};
use crate::metrics::{Counters, COUNTERS};
use crate::runtime::{runtime, Runtime};
use crate::tensor::{Data, Node, NodeMap};

/// Why a materialization happened (diagnostics build on this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    Item,
    ToVec,
    Display,
    Sync,
    Explicit,
    Checkpoint,
    /// A tensor's value decided a host-side branch (`if loss > 1.0`).
    HostControlFlow,
}

/// The graph under the targets.
pub(crate) struct Traced {
    pub graph: Graph,
    /// The lazy node of every graph node, by node id.
    pub nodes: Vec<Arc<Node>>,
    /// Ready nodes (host or device data) bound to the parameters, in parameter order.
    pub leaves: Vec<Arc<Node>>,
    /// Pending nodes to receive the outputs, in output order.
    pub targets: Vec<Arc<Node>>,
}

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

/// Copy a host leaf to the device once; later materializations reuse the buffer.
fn device_buffer(rt: &Runtime, node: &Node) -> Result<(Arc<Buffer>, u64)> {
    let mut state = node.lock();
    let bytes = match &state.data {
        Some(Data::Device(b)) => return Ok((b.clone(), 0)),
        Some(Data::Host(bytes)) => bytes.clone(),
        // A sharded value used by a single-device program: gathered once, then kept on the device.
        Some(d @ Data::Sharded { .. }) => d.to_host(&node.ty)?,
        None => return Err(Error::Internal("a pending node was bound to a parameter".into())),
    };
    let dims: Vec<i64> = node.ty.dims.iter().map(|&d| d as i64).collect();
    let buf = Arc::new(rt.client.buffer_from_host(&bytes, element_type(node.ty.dtype), &dims, &rt.device)?);
    Counters::add(&COUNTERS.bytes_to_device, bytes.len() as u64);
    state.data = Some(Data::Device(buf.clone()));
    Ok((buf, bytes.len() as u64))
}

/// Walk the pending graph below `targets` (iteratively: graphs can be deep) and build the IR in topological order.
pub(crate) fn trace(targets: &[Arc<Node>]) -> Traced {
    let mut graph = Graph::new();
    let mut leaves = Vec::new();
    let mut nodes: Vec<Arc<Node>> = Vec::new();
    let mut ids: NodeMap<NodeId> = NodeMap::default();
    let mut outputs = Vec::new();
    for target in targets {
        if ids.contains_key(&Arc::as_ptr(target)) && outputs.iter().any(|n: &Arc<Node>| Arc::ptr_eq(n, target)) {
            continue;
        }
        // Post-order DFS: (node, operands already pushed?)
        let mut stack: Vec<(Arc<Node>, bool)> = vec![(target.clone(), false)];
        while let Some((node, expanded)) = stack.pop() {
            let key = Arc::as_ptr(&node);
            if ids.contains_key(&key) {
                continue;
            }
            let state = node.lock();
            match (&state.data, &state.recipe) {
                (None, Some(recipe)) => {
                    if expanded {
                        let operand_ids = recipe.operands.iter().map(|o| ids[&Arc::as_ptr(o)]).collect();
                        let id = graph.push_typed(recipe.op.clone(), operand_ids, node.ty.clone(), node.loc);
                        drop(state);
                        ids.insert(key, id);
                        nodes.push(node);
                    } else {
                        let operands = recipe.operands.clone();
                        drop(state);
                        stack.push((node, true));
                        for o in operands.into_iter().rev() {
                            if !ids.contains_key(&Arc::as_ptr(&o)) {
                                stack.push((o, false));
                            }
                        }
                    }
                }
                _ => {
                    drop(state);
                    let id = graph.parameter(node.ty.clone(), node.loc);
                    ids.insert(key, id);
                    nodes.push(node.clone());
                    leaves.push(node);
                }
            }
        }
        if target.is_pending() {
            graph.outputs.push(ids[&Arc::as_ptr(target)]);
            outputs.push(target.clone());
        }
    }
    Traced { graph, nodes, leaves, targets: outputs }
}

/// Hash of the graph's structure: ops, operand wiring, types, outputs. Never values, never source lines, so the
/// same computation with new data (or recorded from another line) reuses the compiled program.
pub(crate) fn structure_hash(graph: &Graph) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    graph.nodes.len().hash(&mut h);
    for n in &graph.nodes {
        n.op.hash(&mut h);
        n.operands.hash(&mut h);
        n.ty.hash(&mut h);
    }
    graph.outputs.hash(&mut h);
    graph.aliases.hash(&mut h);
    graph.partitions.hash(&mut h);
    graph.param_shardings.hash(&mut h);
    graph.output_shardings.hash(&mut h);
    h.finish()
}

/// Donate the buffers of leaves that die with this step to outputs of the same type, so new weights and
/// optimizer state are written in place. A node dies with the step when the user holds no handle to it and every
/// reference to it comes from a recipe dropped after the step: a target's (unless it keeps its recipe for a later
/// `backward()`), or a dying node's. Users come after their operands in the graph, so one backward sweep decides.
/// `LAZULI_DONATE=0` turns donation off. Returns the donated parameter indices.
fn plan_donation(traced: &mut Traced) -> Vec<usize> {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*ENABLED.get_or_init(|| std::env::var("LAZULI_DONATE").map(|v| v != "0").unwrap_or(true)) {
        return Vec::new();
    }
    let g = &traced.graph;
    let mut is_target = vec![false; g.nodes.len()];
    for &o in &g.outputs {
        is_target[o] = true;
    }
    let mut param_of = vec![None; g.nodes.len()];
    for (i, &id) in g.params.iter().enumerate() {
        param_of[id] = Some(i);
    }
    // References from recipes that are dropped after the step, per node.
    let mut dropped_refs = vec![0usize; g.nodes.len()];
    let mut dying_leaves = Vec::new();
    for id in (0..g.nodes.len()).rev() {
        let node = &traced.nodes[id];
        // Handles held by this planning: `nodes` (+1), and `leaves` for parameters (+1).
        let ours = 1 + param_of[id].is_some() as usize;
        let dies = node.user_handles() == 0 && Arc::strong_count(node) == dropped_refs[id] + ours;
        if let Some(i) = param_of[id] {
            if dies {
                dying_leaves.push(i);
            }
            continue;
        }
        let recipe_dropped = if is_target[id] { !node.keeps_recipe() } else { dies };
        if recipe_dropped {
            for &o in &g.nodes[id].operands {
                dropped_refs[o] += 1;
            }
        }
    }
    dying_leaves.sort_unstable();
    let mut used = vec![false; g.outputs.len()];
    let mut donated = Vec::new();
    for i in dying_leaves {
        let leaf = &traced.leaves[i];
        // Same type and, on a mesh, the same layout: a shard can only become the same shard.
        let g = &traced.graph;
        let fits = |j: usize| {
            !used[j] && traced.targets[j].ty == leaf.ty && g.param_shardings.get(i) == g.output_shardings.get(j)
        };
        if let Some(j) = (0..used.len()).find(|&j| fits(j)) {
            used[j] = true;
            traced.graph.aliases.push((i, j));
            donated.push(i);
        }
    }
    donated
}

/// Compute `targets` (those still pending) in one program.
pub(crate) fn materialize(targets: &[Arc<Node>], cause: Cause, at: Loc) -> Result<()> {
    // One materialization at a time: another thread tracing the same pending graph while this one donates its
    // inputs would bind buffers that are about to be consumed.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !targets.iter().any(|t| t.is_pending()) {
        return Ok(());
    }
    let rt = runtime()?;
    let mut traced = trace(targets);
    if traced.targets.is_empty() {
        return Ok(());
    }
    // On a mesh: parameters keep their placement, outputs get the shardings the ops' rules propagate.
    let mesh = crate::spmd::mesh_of(&traced.leaves, &traced.graph)?;
    let placement = mesh.as_ref().map(|m| crate::spmd::annotate(&mut traced.graph, &traced.leaves, m));
    let donated = plan_donation(&mut traced);
    let key = structure_hash(&traced.graph);
    let cached = rt.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
    // Strict mode may refuse here, before anything is uploaded, compiled or donated.
    let hit = cached.is_some();
    let check = diagnostics::before_program(cause, at, hit, &traced.graph)?;
    let mut event =
        diagnostics::events::enabled().then(|| diagnostics::Event::new(EventKind::Program, cause_name(cause), at));

    let t0 = Instant::now();
    let mut uploaded = 0u64;
    // Per device (one for an ordinary program), the argument buffers in parameter order.
    let devices = mesh.as_ref().map_or(1, |m| m.size());
    let mut args: Vec<Vec<Arc<Buffer>>> = vec![Vec::with_capacity(traced.leaves.len()); devices];
    for (i, leaf) in traced.leaves.iter().enumerate() {
        let (bufs, bytes) = match &placement {
            Some((params, _)) => crate::spmd::leaf_shards(rt, leaf, &params[i])?,
            None => device_buffer(rt, leaf).map(|(b, n)| (vec![b], n))?,
        };
        uploaded += bytes;
        for (k, b) in bufs.into_iter().enumerate() {
            args[k].push(b);
        }
    }
    let transfer = t0.elapsed();
    let options = match &mesh {
        Some(m) => CompileOptions {
            device_assignment: Some(vec![m.devices().iter().map(|&d| d as i64).collect()]),
            ..CompileOptions::spmd(m.size() as u32)
        },
        None => CompileOptions::default(),
    };
    let t0 = Instant::now();
    let exe = match cached {
        Some(exe) => {
            Counters::add(&COUNTERS.cache_hits, 1);
            exe
        }
        None => {
            let text = emit(&traced.graph, &EmitOptions::default());
            dump_program(key, &text);
            let exe =
                compile_cache::compile(rt, &text, &options, key).map_err(|source| Error::Compile { at, source })?;
            Counters::add(&COUNTERS.compile_ns, t0.elapsed().as_nanos() as u64);
            Counters::add(&COUNTERS.compiles, 1);
            let exe = Arc::new(exe);
            rt.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, exe.clone());
            exe
        }
    };
    let compile = t0.elapsed();
    let t0 = Instant::now();
    let arg_refs: Vec<Vec<&Buffer>> = args.iter().map(|list| list.iter().map(|b| b.as_ref()).collect()).collect();
    let mut per_device = exe.execute_sharded(&arg_refs).map_err(|source| Error::Execute { at, source })?;
    let execute = t0.elapsed();
    // Output j: its buffer on each device.
    let n_out = per_device.first().map_or(0, Vec::len);
    let mut outs: Vec<Vec<Buffer>> = (0..n_out).map(|_| Vec::with_capacity(devices)).collect();
    for list in per_device.iter_mut() {
        for (j, b) in list.drain(..).enumerate() {
            outs[j].push(b);
        }
    }
    Counters::add(&COUNTERS.execute_ns, execute.as_nanos() as u64);
    Counters::add(&COUNTERS.executions, 1);
    if outs.len() != traced.targets.len() {
        return Err(Error::Internal(format!(
            "the program returned {} outputs, {} expected",
            outs.len(),
            traced.targets.len()
        )));
    }
    for &i in &donated {
        // The buffer now belongs to an output; nothing may read this node again.
        let leaf = &traced.leaves[i];
        Counters::add(&COUNTERS.bytes_donated, leaf.ty.byte_size() as u64);
        leaf.lock().data = None;
    }
    for (j, (node, mut bufs)) in traced.targets.iter().zip(outs).enumerate() {
        // Dropping the op and operands here releases the graph above computed values.
        let data = match &placement {
            Some((_, outputs)) => {
                Data::Sharded { shards: bufs.into_iter().map(Arc::new).collect(), sharding: outputs[j].clone() }
            }
            None => Data::Device(Arc::new(bufs.remove(0))),
        };
        node.set_data(data);
    }
    if let Some(e) = &mut event {
        let g = &traced.graph;
        e.program_in_step = check.program_in_step;
        e.unchecked = check.unchecked;
        e.recompile = check.recompile;
        e.explanation = check.explanation;
        e.graph_hash = format!("{key:016x}");
        (e.nodes, e.inputs, e.outputs) = (g.nodes.len(), g.params.len(), g.outputs.len());
        e.cache_hit = hit;
        e.disk_hit = !hit && compile_cache::loaded_from_disk(key);
        e.compile_ms = if e.cache_hit { 0.0 } else { compile.as_secs_f64() * 1e3 };
        e.execute_ms = execute.as_secs_f64() * 1e3;
        e.transfer_ms = transfer.as_secs_f64() * 1e3;
        e.bytes_to_device = uploaded;
        diagnostics::events::emit(e);
    }
    Ok(())
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
