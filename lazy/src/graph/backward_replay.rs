//! A training loop records the same forward pass every step, and `backward()` then records the same gradient ops
//! on it: the same rules run, the same shapes are inferred, the same composites are expanded on a tape, the same
//! constants are looked up. Only the nodes they read differ.
//!
//! So the second backward pass over a forward of some shape runs the rules and keeps what they recorded as a
//! template: each op with its type, its hashes, the forward node it differentiates (its source line) and where its
//! operands come from (a node of the forward pass, an operand of one that is off the gradient path, the seed, an
//! earlier op of the template). The first pass only notes the shape: noting what the rules record costs about as
//! much again as recording it, wasted on shapes that never come back. A later pass over a forward whose shape
//! (`Shape`, compared whole, not by hash) is the same makes the same nodes from the template, without running a
//! rule. The graph is the same either way, node for node, so the step's program is the same.
//!
//! `LAZULI_BACKWARD_REPLAY=0` turns this off.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use lazuli_hlo::{DType, Dims, Op, TensorType};

use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::graph::constants::shared_constant;
use crate::graph::tensor::{structure_hasher, Node, NodeMap, Operands, Tensor};

/// The stamp a backward pass puts on a node it reached, before the node has a position (see `autodiff.rs`).
pub(crate) const UNORDERED: u64 = 0xffff_ffff;

/// The number the backward pass `pass` stamped on `node` (a position in its order, or past it an operand off the
/// gradient path, `Shape::of`), if that pass numbered it.
pub(crate) fn numbered(node: &Node, pass: u64) -> Option<u64> {
    let stamp = node.grad_visit.get();
    (stamp & !UNORDERED == pass && stamp & UNORDERED != UNORDERED).then_some(stamp & UNORDERED)
}

/// How many forward structures a thread keeps templates for (a training step, an evaluation with gradients, a
/// second model).
const KEPT: usize = 4;

/// How many shapes seen once a thread remembers.
const SEEN: usize = 8;

thread_local! {
    static TEMPLATES: RefCell<Vec<Rc<Template>>> = const { RefCell::new(Vec::new()) };
    /// Hashes of shapes seen once and not yet kept.
    static SEEN_ONCE: RefCell<VecDeque<u64>> = const { RefCell::new(VecDeque::new()) };
    /// This thread's override of the setting (tests compare the two ways in one process).
    static FORCED: Cell<Option<bool>> = const { Cell::new(None) };
    /// This thread's replayed passes (`Metrics::backward_replays` counts every thread's).
    static REPLAYS: Cell<u64> = const { Cell::new(0) };
}

/// Whether backward passes on this thread replay templates.
pub(crate) fn enabled() -> bool {
    FORCED.get().unwrap_or_else(crate::settings::backward_replay)
}

/// Force replaying on or off on this thread (`None`: the setting's).
#[cfg(test)]
pub(crate) fn force(on: Option<bool>) {
    FORCED.set(on);
}

/// Backward passes this thread replayed.
#[cfg(test)]
pub(crate) fn replays_on_this_thread() -> u64 {
    REPLAYS.get()
}

/// Where a template op's operand comes from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Src {
    /// The node at this position of the backward walk's order (on the gradient path).
    Order(u32),
    /// The n-th distinct operand off the gradient path, in the order the shape met them.
    Off(u32),
    /// The cotangent the pass was seeded with.
    Seed,
    /// The n-th node the template made.
    Made(u32),
}

/// A node the rules recorded.
enum Made {
    /// A shared structural constant (`graph::constants`), looked up again on replay.
    Constant { value: f64, dtype: DType, dims: Dims, at: u32 },
    /// An op on earlier values, at the line of the forward node at position `at`.
    Op { op: Op, operands: smallvec::SmallVec<[Src; 3]>, ty: TensorType, op_hash: u64, ty_hash: u64, at: u32 },
}

/// What the rules of one backward pass recorded.
struct Template {
    shape: Vec<u64>,
    hash: u64,
    made: Vec<Made>,
    /// Forward ops replaced by their scaled alternative (`autodiff::record_scaled_alternative`), by position.
    alternatives: Vec<(u32, Op)>,
    /// Each gradient leaf's gradient, in the order the pass found them.
    leaves: Vec<(u32, Src)>,
}

/// The shape of the part of a forward graph a backward pass walks: every node of its order with its op's and
/// type's hashes, its flags and its operands (a position in the order, or the n-th distinct node off the gradient
/// path with its type). Two forwards of one shape get the same gradient ops from the rules, wired alike.
pub(crate) struct Shape {
    words: Vec<u64>,
    hash: u64,
    /// The distinct operands off the gradient path, in the order met.
    off: Vec<Rc<Node>>,
}

impl Shape {
    /// The shape of `order` (a backward walk under stamp `pass`). Stamps each operand off the gradient path with
    /// `pass | (order.len() + n)`, which the rules' bookkeeping never reads (it skips such operands).
    pub(crate) fn of(order: &[Rc<Node>], pass: u64) -> Shape {
        let n = order.len() as u64;
        let mut words = Vec::with_capacity(order.len() * 6);
        let mut off = Vec::new();
        for node in order {
            let state = node.lock();
            // As `autodiff::topo_order` decides it: only such a node's operands were walked.
            let descended = node.grad_path && !node.requires_grad() && state.recipe.is_some();
            let flags = node.grad_path as u64 | (node.requires_grad() as u64) << 1 | (descended as u64) << 2;
            words.extend([node.op_hash, node.ty_hash, flags]);
            let Some(recipe) = state.recipe.as_ref().filter(|_| descended) else { continue };
            words.push(recipe.operands.len() as u64);
            for o in &recipe.operands {
                if let Some(id) = numbered(o, pass) {
                    words.push(id);
                } else {
                    let id = n + off.len() as u64;
                    o.grad_visit.set(pass | id);
                    off.push(o.clone());
                    words.extend([id, o.ty_hash]);
                }
            }
        }
        let mut h = structure_hasher();
        words.hash(&mut h);
        Shape { hash: h.finish(), words, off }
    }

    /// Whether a pass over this shape came before (without a template kept): only then is a template worth
    /// noting. The first sight is remembered.
    pub(crate) fn seen_before(&self) -> bool {
        SEEN_ONCE.with_borrow_mut(|seen| {
            if let Some(i) = seen.iter().position(|&h| h == self.hash) {
                seen.remove(i);
                return true;
            }
            if seen.len() == SEEN {
                seen.pop_front();
            }
            seen.push_back(self.hash);
            false
        })
    }
}

/// The gradient leaves' gradients made from a kept template of this shape, if there is one.
pub(crate) fn replay(shape: &Shape, order: &[Rc<Node>], seed: &Rc<Node>) -> Option<Vec<(Rc<Node>, Tensor)>> {
    let template = TEMPLATES.with_borrow_mut(|kept| {
        let i = kept.iter().position(|t| t.hash == shape.hash && t.shape == shape.words)?;
        let t = kept.remove(i);
        kept.insert(0, t.clone());
        Some(t)
    })?;
    let mut made: Vec<Rc<Node>> = Vec::with_capacity(template.made.len());
    let value = |src: Src, made: &[Rc<Node>]| match src {
        Src::Order(p) => order[p as usize].clone(),
        Src::Off(i) => shape.off[i as usize].clone(),
        Src::Seed => seed.clone(),
        Src::Made(i) => made[i as usize].clone(),
    };
    for m in &template.made {
        let node = match m {
            Made::Constant { value, dtype, dims, at } => shared_constant(*value, *dtype, dims, order[*at as usize].loc),
            Made::Op { op, operands, ty, op_hash, ty_hash, at } => {
                let operands: Operands = operands.iter().map(|&s| value(s, &made)).collect();
                Tensor::remake_node(op.clone(), operands, ty.clone(), order[*at as usize].loc, *op_hash, *ty_hash)
            }
        };
        made.push(node);
    }
    for (p, op) in &template.alternatives {
        if let Some(recipe) = order[*p as usize].lock().recipe.as_mut() {
            recipe.op = op.clone();
        }
    }
    // As the rules' pass does: the forward's recipes may go once computed.
    order.iter().for_each(|node| node.backward_done.set(true));
    Counters::add(&COUNTERS.backward_replays, 1);
    REPLAYS.set(REPLAYS.get() + 1);
    Some(
        template.leaves.iter().map(|&(p, g)| (order[p as usize].clone(), Tensor::from_node(value(g, &made)))).collect(),
    )
}

/// Notes what the rules record during one backward pass, to keep it as a template.
pub(crate) struct Log {
    pass: u64,
    order_len: u64,
    seed: *const Node,
    made: Vec<Made>,
    /// The nodes made so far, by address (kept alive by `nodes`, so no address is reused meanwhile).
    index: NodeMap<u32>,
    nodes: Vec<Rc<Node>>,
    alternatives: Vec<(u32, Op)>,
    /// Some operand came from none of the known places: no template is kept.
    unknown: bool,
}

impl Log {
    pub(crate) fn new(order: &[Rc<Node>], pass: u64, seed: &Rc<Node>) -> Log {
        Log {
            pass,
            order_len: order.len() as u64,
            seed: Rc::as_ptr(seed),
            made: Vec::new(),
            index: NodeMap::default(),
            nodes: Vec::new(),
            alternatives: Vec::new(),
            unknown: false,
        }
    }

    fn src(&mut self, n: &Rc<Node>) -> Src {
        if let Some(&i) = self.index.get(&Rc::as_ptr(n)) {
            return Src::Made(i);
        }
        if let Some(id) = numbered(n, self.pass) {
            return if id < self.order_len { Src::Order(id as u32) } else { Src::Off((id - self.order_len) as u32) };
        }
        if Rc::as_ptr(n) == self.seed {
            return Src::Seed;
        }
        self.unknown = true;
        Src::Seed
    }

    fn push(&mut self, made: Made, node: &Rc<Node>) {
        self.index.insert(Rc::as_ptr(node), self.made.len() as u32);
        self.made.push(made);
        self.nodes.push(node.clone());
    }

    /// The rules looked up the shared constant `node` while differentiating the node at position `at`.
    pub(crate) fn constant(&mut self, value: f64, ty: &TensorType, at: usize, node: &Rc<Node>) {
        // A second lookup of one constant returns the node already noted.
        if self.index.contains_key(&Rc::as_ptr(node)) {
            return;
        }
        let made = Made::Constant { value, dtype: ty.dtype, dims: ty.dims.clone(), at: at as u32 };
        self.push(made, node);
    }

    /// The rules recorded `op` on `operands` as `node`.
    pub(crate) fn op(&mut self, op: &Op, operands: &[&Rc<Node>], at: usize, node: &Rc<Node>) {
        let operands = operands.iter().map(|o| self.src(o)).collect();
        let made = Made::Op {
            op: op.clone(),
            operands,
            ty: node.ty.clone(),
            op_hash: node.op_hash,
            ty_hash: node.ty_hash,
            at: at as u32,
        };
        self.push(made, node);
    }

    /// The forward op at position `at` became `op` (its scaled alternative).
    pub(crate) fn alternative(&mut self, at: usize, op: &Op) {
        self.alternatives.push((at as u32, op.clone()));
    }

    /// Keep what was logged as the template for `shape`, with the pass's result `leaves`.
    pub(crate) fn keep(mut self, shape: Shape, order: &[Rc<Node>], leaves: &[(Rc<Node>, Tensor)]) {
        let leaves: Vec<(u32, Src)> = leaves
            .iter()
            .map(|(leaf, g)| {
                let p = leaf.grad_visit.get() & UNORDERED;
                debug_assert!(Rc::ptr_eq(&order[p as usize], leaf), "a leaf's stamp is its position");
                (p as u32, self.src(&g.node))
            })
            .collect();
        if self.unknown {
            return;
        }
        let template =
            Template { hash: shape.hash, shape: shape.words, made: self.made, alternatives: self.alternatives, leaves };
        TEMPLATES.with_borrow_mut(|kept| {
            kept.insert(0, Rc::new(template));
            kept.truncate(KEPT);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{force, TEMPLATES};
    use crate::graph::tensor::Tensor;
    use crate::graph::walk::walk;

    fn templates() -> usize {
        TEMPLATES.with_borrow(|t| t.len())
    }

    /// A small model with composites (layer norm, GELU, softmax cross-entropy), a product, a shared constant and
    /// a parameter read twice; its parameters' gradients, and the walk key of their graph.
    fn gradients(seed: u64, replay: bool) -> (Vec<Vec<f64>>, u64) {
        force(Some(replay));
        let values = |n: usize, k: u64| -> Vec<f64> {
            (0..n).map(|i| ((i as u64 * 7 + k * 13) % 11) as f64 / 5.0 - 1.0).collect()
        };
        let x = Tensor::from_slice(&values(12, seed), &[4, 3]);
        let w1 = Tensor::from_slice(&values(15, 1), &[3, 5]).requires_grad();
        let b1 = Tensor::from_slice(&values(5, 2), &[5]).requires_grad();
        let w2 = Tensor::from_slice(&values(15, 3), &[5, 3]).requires_grad();
        let targets = Tensor::from_slice(&[0i32, 2, 1, 2], &[4]);
        let h = (x.matmul(&w1) + &b1).layer_norm(&[-1], 1e-5).gelu();
        let logits = h.matmul(&w2) * 0.5 + h.matmul(&w2).tanh();
        let loss = logits.cross_entropy(&targets) + (&b1 * &b1).sum_all();
        loss.backward();
        let params = [&w1, &b1, &w2];
        let grads: Vec<Tensor> = params.iter().map(|p| p.grad().expect("a gradient")).collect();
        let key = walk(&grads.iter().map(|g| g.node.clone()).collect::<Vec<_>>()).key();
        let values = grads.iter().map(|g| g.to_vec::<f64>().expect("gradient")).collect();
        force(None);
        (values, key)
    }

    /// The second pass over a forward of the same shape replays the first's template: the same graph (the walk's
    /// key, hence the same program) and the same gradients, bit for bit, as the rules make with replay off.
    #[test]
    fn a_replayed_backward_is_the_rules_graph() {
        let replays = super::replays_on_this_thread;
        let (rules, rules_key) = gradients(1, false);
        assert_eq!(templates(), 0, "replay off keeps no template");
        let (first, first_key) = gradients(1, true);
        assert_eq!((templates(), replays()), (0, 0), "the first pass runs the rules and notes the shape");
        let (second, second_key) = gradients(1, true);
        assert_eq!((templates(), replays()), (1, 0), "the second pass runs the rules and keeps a template");
        let (again, again_key) = gradients(1, true);
        assert_eq!(replays(), 1, "the third pass replays it");
        assert_eq!([first_key, second_key, again_key], [rules_key; 3], "one graph structure four ways");
        assert_eq!(first, rules);
        assert_eq!(second, rules);
        assert_eq!(again, rules);
        // New data, same shape: replayed, and the gradients are those of the new data.
        let (other, _) = gradients(2, false);
        let (replayed, _) = gradients(2, true);
        assert_eq!(replays(), 2);
        assert_eq!(replayed, other);
        assert_ne!(replayed, rules, "the data changed the gradients");
    }

    /// Operands off the gradient path are told apart by identity: `x·w1 + x·w2` and `x·w1 + y·w2` have one shape
    /// of ops and types but not one template; each pass gets its own data's gradients.
    #[test]
    fn operands_off_the_path_keep_their_identity() {
        force(Some(true));
        let run = |shared: bool, k: f64| {
            let x = Tensor::from_slice(&[1.0 * k, 2.0, 3.0], &[3]);
            let y = Tensor::from_slice(&[-4.0, 5.0 * k, -6.0], &[3]);
            let w1 = Tensor::from_slice(&[0.5, 0.25, 2.0], &[3]).requires_grad();
            let w2 = Tensor::from_slice(&[1.5, -1.0, 0.75], &[3]).requires_grad();
            let second = if shared { &x } else { &y };
            ((&x * &w1).sum_all() + (second * &w2).sum_all()).backward();
            let g = |w: &Tensor| w.grad().expect("gradient").to_vec::<f64>().expect("values");
            let want2 = if shared { vec![1.0 * k, 2.0, 3.0] } else { vec![-4.0, 5.0 * k, -6.0] };
            assert_eq!(g(&w1), vec![1.0 * k, 2.0, 3.0], "shared {shared}, k {k}");
            assert_eq!(g(&w2), want2, "shared {shared}, k {k}");
        };
        // The shared form is kept first: replayed for `x·w1 + y·w2`, it would read `y` for both.
        for (shared, k) in [(true, 1.0), (true, 2.0), (false, 1.0), (false, 3.0), (true, 4.0), (false, 5.0)] {
            run(shared, k);
        }
        assert_eq!(super::replays_on_this_thread(), 2, "the last two passes replay, each its own shape's template");
        assert_eq!(templates(), 2);
        force(None);
    }
}
