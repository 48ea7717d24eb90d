//! Program: the compiled executable of a plan. A cache hit is used as it is; a miss is checked against the
//! device's memory, emitted as StableHLO (dumped with `LAZULI_DUMP_DIR`), compiled (through the persistent compile
//! cache, retrying without a backend default the plugin refuses) and inserted into the in-memory cache.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use lazuli_hlo::{emit, EmitOptions, Loc};
use lazuli_pjrt::{CompileOptions, LoadedExecutable};

use super::plan::Plan;
use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::error::{Error, Result};
use crate::graph::tensor::{Data, Node};
use crate::graph::walk::Walk;
use crate::runtime::compile_cache;
use crate::runtime::Runtime;

/// The plan's executable: the cached one, or a new compile.
pub(crate) fn executable(rt: &Runtime, plan: &mut Plan, at: Loc) -> Result<Arc<LoadedExecutable>> {
    if let Some(exe) = &plan.cached {
        Counters::add(&COUNTERS.cache_hits, 1);
        return Ok(exe.clone());
    }
    let t0 = Instant::now();
    let options = match &plan.mesh {
        Some(super::plan::Placement { mesh: m, .. }) => CompileOptions {
            device_assignment: Some(vec![m.devices().iter().map(|&d| d as i64).collect()]),
            xla_options: rt.xla_options(),
            ..CompileOptions::spmd(m.size() as u32)
        },
        None => rt.single_device_options(),
    };
    let key = plan.key;
    let checked = plan.checked;
    let counts_sharding = plan.mesh.as_ref().and_then(|p| p.outputs.last()).map(|s| s.hlo());
    let graph = plan.walk.graph();
    let text = if checked {
        let mode = rt.config.check_finite;
        let checked = super::finite::with_check(
            graph,
            &plan.guards,
            &plan.counted,
            plan.flag,
            mode,
            (rt.config.backend, &rt.target, rt.config.finite_count),
            counts_sharding,
        )?;
        emit(&checked, &EmitOptions::default())
    } else {
        emit(graph, &EmitOptions::default())
    };
    dump_program(rt, key, &text);
    let _span = tracing::info_span!(target: "lazuli", "compile", graph_hash = %format_args!("{key:016x}"), site = %at)
        .entered();
    let exe = loop {
        match compile_cache::compile(rt, &text, &options, key) {
            Err(source) if rt.drop_unknown_default(&source) => continue,
            done => break done.map_err(|source| compile_error(graph, at, source))?,
        }
    };
    Counters::add(&COUNTERS.compile_ns, t0.elapsed().as_nanos() as u64);
    Counters::add(&COUNTERS.compiles, 1);
    let exe = Arc::new(exe);
    let evicted = rt.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, exe.clone());
    Counters::add(&COUNTERS.programs_evicted, evicted as u64);
    Ok(exe)
}

/// A new program whose outputs and uploads together need more memory than the device has free (the host's
/// available memory for the CPU plugin) is refused before anything is uploaded or compiled, naming the largest of
/// those values with the line that recorded it and both sizes: XLA would otherwise grow until the operating
/// system's OOM killer ends the process. Intermediate values are not counted (XLA may fuse them away), and where
/// the plugin reports no memory nothing is checked.
pub(crate) fn fits_in_memory(rt: &Runtime, traced: &Walk) -> Result<()> {
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
pub(crate) fn kernel_choices(graph: &lazuli_hlo::Graph) -> Vec<String> {
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

/// With `Config::dump_dir` (`LAZULI_DUMP_DIR`) set, write every compiled program there as `<hash>.mlir` (for bug
/// reports and for reading what XLA was given). Best effort: a failed write never fails the computation.
fn dump_program(rt: &Runtime, key: u64, text: &str) {
    if let Some(dir) = &rt.config.dump_dir {
        let _ = std::fs::write(dir.join(format!("{key:016x}.mlir")), text);
    }
}
