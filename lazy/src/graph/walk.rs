//! Walking the pending graph under some targets at a step boundary. The walk hashes the structure as it goes and
//! collects only what running a compiled program needs (the nodes in topological order, their wiring, the leaves
//! to bind and the targets to fill); the IR (`hlo::Graph`, with a clone of every op and type) is built only when a
//! program must be compiled, explained or partitioned. A step whose structure repeats therefore costs one pass
//! over its nodes: no map lookups (a per-node visit stamp says where a node was put) and no IR allocation.

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::sync::Arc;

use lazuli_hlo::{Graph, Loc, Op};
use lazuli_sharding::Sharding;

use crate::graph::tensor::{structure_hasher, Node};

/// One walk of the pending graph below a set of targets.
pub(crate) struct Walk {
    /// The lazy node of every graph node, by node id (topological: operands first).
    pub nodes: Vec<Rc<Node>>,
    /// Operand ids of node `i`: `operands[starts[i]..starts[i + 1]]`. Leaves have none.
    operands: Vec<u32>,
    starts: Vec<u32>,
    /// Node id of parameter `i`.
    pub params: Vec<usize>,
    /// Ready nodes (host or device data) bound to the parameters, in parameter order.
    pub leaves: Vec<Rc<Node>>,
    /// Node id of output `j`.
    pub outputs: Vec<usize>,
    /// Pending nodes to receive the outputs, in output order.
    pub targets: Vec<Rc<Node>>,
    /// The line of the first sharding constraint, if there is one (the graph then runs on a mesh), and its layout
    /// (whose mesh the program runs on when no input is placed on one).
    pub constraint_at: Option<(Loc, Option<Arc<Sharding>>)>,
    /// Hash of ops, wiring, types and outputs.
    structure: u64,
    /// `(parameter, output)` buffer donations decided for this program.
    pub aliases: Vec<(usize, usize)>,
    /// The IR, once built.
    pub graph: Option<Graph>,
    /// This walk's stamp (see `WALKS`).
    epoch: u64,
}

/// The sizes of a walk's lists (see `LAST_SIZES`).
#[derive(Clone, Copy)]
struct Sizes {
    nodes: usize,
    operands: usize,
    params: usize,
    outputs: usize,
    stack: usize,
}

thread_local! {
    /// The sizes of this thread's last walk: the next one allocates its lists at that size.
    static LAST_SIZES: Cell<Sizes> =
        const { Cell::new(Sizes { nodes: 0, operands: 0, params: 0, outputs: 0, stack: 0 }) };
    /// Each walk stamps the nodes it numbers with `(walk << 32) | id`; a stamp from an older walk means "not
    /// yet". Per thread, like the graphs walked.
    static WALKS: Cell<u64> = const { Cell::new(0) };
}

/// The number the walk `epoch` gave `node`, if it numbered it.
fn stamped(node: &Node, epoch: u64) -> Option<u32> {
    let s = node.visit.get();
    (s & !0xffff_ffff == epoch).then_some(s as u32)
}

impl Walk {
    pub fn operands(&self, id: usize) -> &[u32] {
        &self.operands[self.starts[id] as usize..self.starts[id + 1] as usize]
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The number this walk gave `node`, if it reached it.
    pub fn id_of(&self, node: &Node) -> Option<usize> {
        stamped(node, self.epoch).map(|id| id as usize)
    }

    /// The IR of this walk: built on first use (compiling, diagnostics, SPMD annotation), then kept. The
    /// donations are copied in on every call (planning may add them after the IR was built).
    pub fn graph(&mut self) -> &mut Graph {
        if self.graph.is_none() {
            let mut g = Graph::new();
            let mut param = vec![false; self.nodes.len()];
            self.params.iter().for_each(|&p| param[p] = true);
            for (id, node) in self.nodes.iter().enumerate() {
                if param[id] {
                    g.parameter(node.ty.clone(), node.loc);
                    continue;
                }
                let state = node.lock();
                let op = match &state.recipe {
                    Some(r) => r.op.clone(),
                    // Unreachable while the walk's nodes are pinned by the materialization lock.
                    None => panic!("lazuli: internal error: node {id} lost its recipe between walk and lowering"),
                };
                drop(state);
                let operands = self.operands(id).iter().map(|&o| o as usize).collect();
                g.push_typed(op, operands, node.ty.clone(), node.loc);
            }
            g.outputs = self.outputs.clone();
            self.graph = Some(g);
        }
        let g = self.graph.as_mut().expect("built above");
        g.aliases = self.aliases.clone();
        g
    }

    /// The executable-cache key: the structure, donations and (on a mesh) the partitioning. Never values, never
    /// source lines, so the same computation with new data, or recorded from another line, reuses the program.
    pub fn key(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.structure.hash(&mut h);
        self.aliases.hash(&mut h);
        // Only an SPMD-annotated IR adds to the key, never the mere fact that the IR was built.
        if let Some(g) = self.graph.as_ref().filter(|g| g.partitions > 0) {
            g.partitions.hash(&mut h);
            g.param_shardings.hash(&mut h);
            g.output_shardings.hash(&mut h);
        }
        h.finish()
    }
}

/// Walk the pending graph below `targets` (iteratively: graphs can be deep) in post-order. Callers hold the
/// materialization lock, so no recipe is dropped and no stamp is rewritten while this runs.
pub(crate) fn walk(targets: &[Rc<Node>]) -> Walk {
    let walk_no = WALKS.get() + 1;
    WALKS.set(walk_no);
    let epoch = walk_no << 32;
    let id_of = |n: &Node| stamped(n, epoch);
    // A training loop walks the same graph every step: sized like the last walk, the lists grow without
    // reallocating (a small step's walk spent a fifth of its time growing them from empty).
    let last = LAST_SIZES.get();
    let mut starts = Vec::with_capacity(last.nodes + 1);
    starts.push(0);
    let mut w = Walk {
        nodes: Vec::with_capacity(last.nodes),
        operands: Vec::with_capacity(last.operands),
        starts,
        params: Vec::with_capacity(last.params),
        leaves: Vec::with_capacity(last.params),
        outputs: Vec::with_capacity(last.outputs),
        targets: Vec::with_capacity(last.outputs),
        constraint_at: None,
        structure: 0,
        aliases: Vec::new(),
        graph: None,
        epoch,
    };
    let mut h = structure_hasher();
    let mut is_output = Vec::with_capacity(last.nodes);
    // (node, operands already pushed?)
    let mut stack: Vec<(Rc<Node>, bool)> = Vec::with_capacity(last.stack);
    for target in targets {
        if let Some(id) = id_of(target) {
            if is_output[id as usize] {
                continue;
            }
        }
        stack.push((target.clone(), false));
        while let Some((node, expanded)) = stack.pop() {
            if id_of(&node).is_some() {
                continue;
            }
            let state = node.lock();
            let id = w.nodes.len() as u32;
            match (&state.data, &state.recipe) {
                (None, Some(recipe)) => {
                    if !expanded {
                        // Operands not yet numbered go above this node on the stack; a node whose operands are
                        // all numbered (most, in a chain) is numbered at once, without a second visit.
                        let below = stack.len();
                        stack.extend(
                            recipe.operands.iter().rev().filter(|o| id_of(o).is_none()).map(|o| (o.clone(), false)),
                        );
                        if stack.len() > below {
                            drop(state);
                            stack.insert(below, (node, true));
                            continue;
                        }
                    }
                    let first = w.operands.len();
                    for o in &recipe.operands {
                        // Operands were numbered before their user (post-order).
                        w.operands.push(id_of(o).unwrap_or(u32::MAX));
                    }
                    h.write_u64(node.op_hash);
                    w.operands[first..].hash(&mut h);
                    if w.constraint_at.is_none() && matches!(recipe.op, Op::ShardingConstraint(_)) {
                        w.constraint_at = Some((node.loc, node.placement.get().cloned()));
                    }
                }
                _ => {
                    h.write_u64(u64::MAX);
                    h.write_usize(w.params.len());
                    w.params.push(id as usize);
                    w.leaves.push(node.clone());
                }
            }
            drop(state);
            h.write_u64(node.ty_hash);
            node.visit.set(epoch | id as u64);
            w.starts.push(w.operands.len() as u32);
            w.nodes.push(node);
            is_output.push(false);
        }
        if target.is_pending() {
            let id = id_of(target).expect("numbered by the walk") as usize;
            is_output[id] = true;
            w.outputs.push(id);
            w.targets.push(target.clone());
        }
    }
    w.nodes.len().hash(&mut h);
    w.outputs.hash(&mut h);
    w.structure = h.finish();
    let sizes = Sizes {
        nodes: w.nodes.len(),
        operands: w.operands.len(),
        params: w.params.len(),
        outputs: w.outputs.len(),
        stack: stack.capacity(),
    };
    LAST_SIZES.set(sizes);
    w
}

/// The graph under some targets as IR, for the host reference interpreter and the planner.
pub(crate) struct Traced {
    pub graph: Graph,
    /// Ready nodes bound to the parameters, in parameter order.
    pub leaves: Vec<Rc<Node>>,
}

/// Walk below `targets` and build the IR (outside a materialization).
pub(crate) fn trace(targets: &[Rc<Node>]) -> Traced {
    let mut w = walk(targets);
    w.graph();
    Traced { graph: w.graph.take().unwrap_or_default(), leaves: w.leaves }
}
