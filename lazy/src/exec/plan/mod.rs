//! Plan: what a step boundary will run, decided before anything touches the device. The walk of the pending
//! graph under the targets (cut into pieces when it is too large), the mesh it runs on and its layouts, the
//! buffers donated to outputs, the structure key and the executable cache's answer. One immutable `Plan` that the
//! later stages read, and that `bench_hooks` times without running.

use std::rc::Rc;
use std::sync::Arc;

use lazuli_hlo::Loc;
use lazuli_pjrt::LoadedExecutable;
use lazuli_sharding::{Mesh, Sharding};

use crate::diagnostics::Cause;
use crate::error::Result;
use crate::graph::tensor::Node;
use crate::graph::walk::{walk, Walk};
use crate::runtime::{CheckFinite, Runtime};

/// The most nodes one program is compiled from. XLA's compile memory grows faster than the graph (an
/// elementwise chain with a host scalar per op, on the 2-core machine of BENCHMARKS.md: 10k nodes 0.3 GB, 25k
/// 0.5 GB, 50k 1.2 GB of peak memory); a graph recorded without a step boundary (a loop of 100k ops) is
/// compiled in pieces of at most this many nodes instead. A GPT-2-small training step is about 2,300 nodes.
pub const MAX_GRAPH_NODES: usize = 32_768;

/// A planned program: the walk (its IR built when needed), its mesh and layouts, its donations, its key, and the
/// compiled program if the cache has it.
pub(crate) struct Plan {
    pub walk: Walk,
    /// Where a sharded program runs, and how its parameters and outputs are laid out.
    pub mesh: Option<Placement>,
    /// Parameters whose buffers become outputs' (in parameter order).
    pub donated: Vec<usize>,
    pub key: u64,
    pub cached: Option<Arc<LoadedExecutable>>,
    /// Not cached, but compiled before and evicted by the program cache (`LAZULI_PROGRAM_CACHE_LIMIT`).
    pub evicted: bool,
    /// The program also counts its floating-point outputs' non-finite values (`exec/finite/`), in one extra
    /// output after the targets'.
    pub checked: bool,
    /// `(parameter, output)`: state outputs that a checked program replaces by the parameter's value (the value
    /// they succeed) when what enters its update holds non-finite values (`Skip`), or from a trip on (`Stop`).
    pub guards: Vec<(usize, usize)>,
    /// Under `Stop`: the output that is the sticky trip flag's next value (`exec/finite/flag.rs`).
    pub flag: Option<usize>,
    /// Under `Stop`: parameters that an earlier program of the flag's chain counted, left out of this one's count
    /// (`finite::counted_leaves`).
    pub counted: Vec<usize>,
    /// Under `Stop`: the split step's gradients' program that made some of the leaves, and per leaf the output it
    /// made (`finite::chain`): the check keeps none of those, and they may be donated to any output.
    pub remade: Option<(Arc<crate::exec::finite::chain::Source>, Vec<Option<usize>>)>,
}

/// A sharded program's mesh, with each parameter's and each output's layout.
pub(crate) struct Placement {
    pub mesh: Mesh,
    pub params: Vec<Arc<Sharding>>,
    pub outputs: Vec<Arc<Sharding>>,
}

impl Plan {
    /// The number of devices the program runs on.
    pub fn devices(&self) -> usize {
        self.mesh.as_ref().map_or(1, |p| p.mesh.size())
    }
}

/// Plan the program that computes `targets`, or `None` when nothing under them is pending. A graph larger than
/// [`MAX_GRAPH_NODES`] has pieces of it computed first (each a program of its own, cause `GraphSize`).
/// `flag`, one of the targets, is the finite check's sticky flag under `stop`. Under `stop` a split step's
/// gradients' program (`cause`) donates nothing: its kept inputs make its outputs again for its update's locator
/// (`exec/finite/chain.rs`), and it updates no state but the random generator's, a few bytes.
pub(crate) fn plan(
    rt: &Runtime,
    targets: &[Rc<Node>],
    flag: Option<&Rc<Node>>,
    (cause, at): (Cause, Loc),
) -> Result<Option<Plan>> {
    let walk = bounded_walk(targets, at)?;
    if walk.targets.is_empty() {
        return Ok(None);
    }
    Ok(Some(plan_walk(rt, walk, flag, cause == Cause::Gradients)?))
}

/// Layouts, donations, key and cache lookup of a walked graph (of a split step's gradients' program where
/// `gradients`).
pub(crate) fn plan_walk(rt: &Runtime, walk: Walk, flag: Option<&Rc<Node>>, gradients: bool) -> Result<Plan> {
    let mut plan = prepare(walk, (rt.config.donate, gradients), rt.config.check_finite, flag)?;
    lookup(rt, &mut plan);
    Ok(plan)
}

/// Everything but the cache lookup: the mesh and its layouts (parameters keep their placement, outputs get the
/// shardings the ops' rules propagate), the donations, and the key they all enter. With the finite check on, the
/// program counts non-finite values; under `Skip` and `Stop` it guards its state (see `CheckFinite`), so it still
/// donates: all it can under `Skip`, under `Stop` only old state to its successor, so that every input that is not
/// guarded state stays whole for the locator to run the step again (`exec/finite/`), but for what a split step's
/// gradients' program made, which the locator makes again (`finite/chain.rs`), and which that program (`gradients`)
/// does not donate. `Log` donates nothing. A checked program has a key of its own.
pub(crate) fn prepare(
    mut walk: Walk,
    (donate, gradients): (bool, bool),
    check: CheckFinite,
    flag: Option<&Rc<Node>>,
) -> Result<Plan> {
    let donate = donate && !(gradients && check == CheckFinite::Stop);
    let mesh = crate::exec::spmd::mesh_of(&walk.leaves, walk.constraint_at.as_ref())?;
    let checked = crate::exec::finite::enabled(check);
    let mesh = mesh.map(|m| {
        let leaves = walk.leaves.clone();
        let (params, mut outputs) = crate::exec::spmd::annotate(walk.graph(), &leaves, &m);
        if checked {
            outputs.push(Arc::new(Sharding::replicated(&m, 1))); // the counts, read whole
        }
        Placement { mesh: m, params, outputs }
    });
    let guards = if crate::exec::finite::guards(check) { successor_pairs(&walk) } else { Vec::new() };
    let donation = match check {
        CheckFinite::Off | CheckFinite::Skip if donate => Donation::Any,
        CheckFinite::Stop if donate => Donation::Successors,
        _ => Donation::None,
    };
    // Under `stop` a split step's update keeps no gradients for its locator (`finite::chain` makes them again),
    // so a dying one may take any output, as without the check (a new bf16 copy of a weight).
    let remade = match check {
        CheckFinite::Stop if !gradients => crate::exec::finite::remade(&walk.leaves),
        _ => None,
    };
    let to_any = remade.as_ref().map_or(&[][..], |(_, made)| &made[..]);
    let donated = plan_donation(&mut walk, donation, to_any);
    let counted = crate::exec::finite::counted_leaves(check, &walk.leaves);
    let key = if checked { crate::exec::finite::key(walk.key(), check, &guards, &counted) } else { walk.key() };
    let flag = flag.filter(|_| checked).and_then(|f| walk.targets.iter().position(|t| Rc::ptr_eq(t, f)));
    Ok(Plan { walk, mesh, donated, key, cached: None, evicted: false, checked, guards, flag, counted, remade })
}

/// Which buffers a program may donate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Donation {
    None,
    /// A dying leaf only to its successor (old state to its new value), or to any output where `plan_donation`'s
    /// `to_any` has a value for it.
    Successors,
    /// Any dying leaf to an output of its type and layout.
    Any,
}

/// `(parameter, output)` for each leaf whose successor (the value that replaces it) is an output of its type.
fn successor_pairs(w: &Walk) -> Vec<(usize, usize)> {
    let mut output_of = vec![None; w.len()];
    for (j, &o) in w.outputs.iter().enumerate() {
        output_of[o] = Some(j);
    }
    let mut taken = vec![false; w.outputs.len()];
    let mut pairs = Vec::new();
    for (i, leaf) in w.leaves.iter().enumerate() {
        let next = leaf.successor.get().and_then(|s| s.upgrade());
        let j = next.and_then(|s| w.id_of(&s)).and_then(|id| output_of[id]);
        if let Some(j) = j.filter(|&j| !taken[j] && w.targets[j].ty == leaf.ty) {
            taken[j] = true;
            pairs.push((i, j));
        }
    }
    pairs
}

/// The executable cache's answer for the plan's key.
pub(crate) fn lookup(rt: &Runtime, plan: &mut Plan) {
    let mut cache = rt.cache.lock().unwrap_or_else(|e| e.into_inner());
    plan.cached = cache.get(plan.key);
    plan.evicted = plan.cached.is_none() && cache.was_evicted(plan.key);
}

/// The walk under `targets`, after computing first pieces of a graph larger than [`MAX_GRAPH_NODES`].
fn bounded_walk(targets: &[Rc<Node>], at: Loc) -> Result<Walk> {
    let mut traced = walk(targets);
    while traced.len() > MAX_GRAPH_NODES {
        let (before, first) = (traced.len(), first_piece(&traced));
        drop(traced);
        if !first.is_empty() {
            crate::exec::materialize(&first, Cause::GraphSize, at)?;
        }
        traced = walk(targets);
        if first.is_empty() || traced.len() >= before {
            break; // nothing to cut off (a graph of leaves): compile it whole
        }
    }
    Ok(traced)
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

/// Donate the buffers of leaves that die with this step to outputs of the same type, so new weights and
/// optimizer state are written in place. A node dies with the step when the user holds no handle to it and every
/// reference to it comes from a recipe dropped after the step: a target's (unless it keeps its recipe for a later
/// `backward()`), or a dying node's. Users come after their operands in the graph, so one backward sweep decides.
/// `Config::donate` (`LAZULI_DONATE=0`) turns donation off. Returns the donated parameter indices.
fn plan_donation(w: &mut Walk, donation: Donation, to_any: &[Option<usize>]) -> Vec<usize> {
    if donation == Donation::None {
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
    let mut dying = vec![false; w.leaves.len()];
    dying_leaves.iter().for_each(|&i| dying[i] = true);
    for (i, j) in successor_pairs(w) {
        if dying[i] && fits(i, j, &used) {
            used[j] = true;
            donated[i] = true;
            aliases.push((i, j));
        }
    }
    let any = |i: usize| donation == Donation::Any || to_any.get(i).is_some_and(Option::is_some);
    for &i in dying_leaves.iter().filter(|&&i| any(i)) {
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
