//! Reverse-mode autodiff over the lazy graph. The gradient of each op is its `vjp` rule in `lazuli-hlo` (beside
//! its shape rule and lowering); this file only walks the graph and records those rules lazily, into the same
//! graph as the forward pass, at the forward op's source line.

use std::cell::Cell;
use std::rc::Rc;

use lazuli_hlo::{Builder, KernelOp, Loc, Op, TensorType};

use crate::graph::backward_replay::{self, Log, Shape, UNORDERED};
use crate::graph::record::{apply, fail};
use crate::graph::tensor::{Node, NodeMap, Tensor};

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops recorded now on this thread keep what `backward()` needs.
pub fn grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Run `f` with gradient tracking off on this thread (optimizer updates, evaluation). Restored on return or panic.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GRAD_ENABLED.with(|g| g.replace(false)));
    f()
}

/// Records gradient ops as lazy tensors at the source location of the forward node at position `at`, noting them
/// in `log` to keep as a template where one is kept (`backward_replay`).
struct Recorder<'l> {
    loc: Loc,
    at: usize,
    log: Option<&'l mut Log>,
}

/// Gradient nodes are handle-less (`Tensor::record_node`): only the leaves' gradients become tensors.
impl Builder for Recorder<'_> {
    type V = Rc<Node>;
    fn ty<'a>(&'a self, v: &'a Rc<Node>) -> &'a TensorType {
        &v.ty
    }
    fn needs_grad(&self, v: &Rc<Node>) -> bool {
        v.grad_path || v.requires_grad()
    }
    fn op(&mut self, op: Op, operands: &[&Rc<Node>]) -> Rc<Node> {
        // Gradient rules' constants (zeros for masks, ones, scales) are structure: share them.
        if let Op::Constant(c) = &op {
            let node = crate::graph::constants::shared_constant(c.value(), c.ty.dtype, &c.ty.dims, self.loc);
            if let Some(log) = self.log.as_deref_mut() {
                log.constant(c.value(), &c.ty, self.at, &node);
            }
            return node;
        }
        let tys: smallvec::SmallVec<[&TensorType; 4]> = operands.iter().map(|n| &n.ty).collect();
        let ty = op.infer(&tys).unwrap_or_else(|msg| fail(self.loc, msg));
        let Some(log) = self.log.as_deref_mut() else {
            return Tensor::record_node(op, operands.iter().map(|n| Rc::clone(n)).collect(), ty, self.loc);
        };
        let kept = op.clone();
        let node = Tensor::record_node(op, operands.iter().map(|n| Rc::clone(n)).collect(), ty, self.loc);
        log.op(&kept, operands, self.at, &node);
        node
    }
    fn refuse(&mut self, why: &str) -> ! {
        fail(self.loc, why)
    }
}

thread_local! {
    /// Each backward pass stamps the nodes it visits with `(pass << 32) | position` (see `Node::grad_visit`).
    static PASSES: Cell<u64> = const { Cell::new(0) };
}

/// Nodes on the gradient path below `root`, operands before users, each stamped with its position under the
/// returned pass; gradient leaves end the walk. Stamps instead of a map of seen nodes: a training step's
/// backward pass visits every node of its forward pass. Also the nodes among them that are results of a kernel
/// with a joint gradient rule (read from the recipes the walk reads anyway).
fn topo_order(root: &Rc<Node>) -> (Vec<Rc<Node>>, u64, Vec<Rc<Node>>) {
    let pass = (PASSES.get() + 1) << 32;
    PASSES.set(pass >> 32);
    let seen = |o: &Node| o.grad_visit.get() & !UNORDERED == pass;
    let on_path = |o: &Node| o.grad_path || o.requires_grad();
    let mut order = Vec::new();
    let mut joint = Vec::new();
    let finish = |node: Rc<Node>, order: &mut Vec<Rc<Node>>| {
        node.grad_visit.set(pass | order.len() as u64);
        order.push(node);
    };
    // (node, operands already pushed?)
    let mut stack: Vec<(Rc<Node>, bool)> = vec![(root.clone(), false)];
    while let Some((node, expanded)) = stack.pop() {
        if expanded {
            finish(node, &mut order);
            continue;
        }
        if seen(&node) {
            continue;
        }
        node.grad_visit.set(pass | UNORDERED);
        let below = stack.len();
        if node.grad_path && !node.requires_grad() {
            if let Some(r) = node.lock().recipe.as_ref() {
                if matches!(&r.op, Op::Kernel(k) if k.has_joint_gradient()) {
                    joint.push(node.clone());
                }
                let unseen = |o: &&Rc<Node>| on_path(o) && !seen(o);
                stack.extend(r.operands.iter().rev().filter(unseen).map(|o| (o.clone(), false)));
            }
        }
        if stack.len() == below {
            // Nothing new below: done at once, without a second visit.
            finish(node, &mut order);
        } else {
            stack.insert(below, (node, true));
        }
    }
    (order, pass, joint)
}

/// Cotangents of every gradient leaf under `root`, seeded with `seed` (the cotangent of `root`).
fn backprop(root: &Tensor, seed: Tensor) -> Vec<(Rc<Node>, Tensor)> {
    no_grad(|| {
        let (order, pass, joint) = topo_order(&root.node);
        let mut log = None;
        if backward_replay::enabled() {
            let shape = Shape::of(&order, pass);
            if let Some(leaves) = backward_replay::replay(&shape, &order, &seed.node) {
                return leaves;
            }
            if shape.seen_before() {
                log = Some((shape, Log::new(&order, pass, &seed.node)));
            }
        }
        let leaves = run_rules(&order, pass, &joint, seed, log.as_mut().map(|(_, l)| l));
        if let Some((shape, log)) = log {
            log.keep(shape, &order, &leaves);
        }
        leaves
    })
}

/// The gradient rules of every node of `order` (a backward walk under stamp `pass`, the root last), from the
/// root's cotangent `seed` back to the gradient leaves; their cotangents, noted in `log` where given.
fn run_rules(
    order: &[Rc<Node>],
    pass: u64,
    joint: &[Rc<Node>],
    seed: Tensor,
    mut log: Option<&mut Log>,
) -> Vec<(Rc<Node>, Tensor)> {
    let joint = joint_places(joint, order.len());
    // The cotangent of each node, by its position in `order` (the root is last).
    let mut cot: Vec<Option<Rc<Node>>> = vec![None; order.len()];
    if let Some(last) = cot.last_mut() {
        *last = Some(seed.node.clone());
    }
    let mut leaves = Vec::new();
    for (position, node) in order.iter().enumerate().rev() {
        // Like PyTorch without retain_graph: a node gradients went through no longer keeps its recipe once
        // computed, which frees the forward graph and lets the step donate its inputs.
        node.backward_done.set(true);
        let mut b = Recorder { loc: node.loc, at: position, log: log.as_deref_mut() };
        let place = joint[position].as_ref();
        if let Some(Joint::Later) = place {
            continue; // the call's first result takes this cotangent
        }
        let own = cot[position].take();
        if node.requires_grad() {
            leaves.extend(own.map(|g| (node.clone(), Tensor::from_node(g))));
            continue;
        }
        // The rule runs under the node's lock (it records new nodes and never locks this one), so neither
        // the op nor its operands are copied.
        let mut state = node.lock();
        let Some(recipe) = state.recipe.as_mut() else { continue };
        if let (None, Some(g)) = (place, &own) {
            if record_scaled_alternative(&mut recipe.op, g) {
                if let Some(log) = b.log.as_deref_mut() {
                    log.alternative(position, &recipe.op);
                }
            }
        }
        let grads = match (&recipe.op, place) {
            (Op::Kernel(k), Some(Joint::First(results))) => {
                let mut take = |p: usize| if p == position { own.clone() } else { cot[p].take() };
                let cotangents: Vec<_> = results.iter().filter_map(|&(r, p)| Some((r, take(p)?))).collect();
                match k.joint_vjp(&mut b, &recipe.operands, cotangents) {
                    Some(grads) => grads,
                    None => continue,
                }
            }
            _ => {
                let Some(g) = own else { continue };
                recipe.op.vjp(&mut b, &recipe.operands, node, &g)
            }
        };
        for (operand, dx) in recipe.operands.iter().zip(grads) {
            let Some(dx) = dx else { continue };
            if !(operand.grad_path || operand.requires_grad()) {
                continue;
            }
            // Every operand on the gradient path was ordered by this pass, before its user.
            let Some(at) = backward_replay::numbered(operand, pass) else { continue };
            let slot = &mut cot[at as usize];
            *slot = Some(match slot.take() {
                Some(prev) => b.add(&prev, &dx),
                None => dx,
            });
        }
    }
    leaves
}

/// A kernel result whose gradient was computed ahead for a unit cotangent (`KernelDef::scaled_alternative`) is
/// recorded as its alternative's when its cotangent `g` is anything but a constant one, before its rule runs.
/// Whether it was.
fn record_scaled_alternative(op: &mut Op, g: &Rc<Node>) -> bool {
    let Op::Kernel(k) = op else { return false };
    let Some(alternative) = &k.def.scaled_alternative else { return false };
    let one = g.lock().recipe.as_ref().is_some_and(|r| matches!(&r.op, Op::Constant(c) if c.value() == 1.0));
    if !one {
        *op = Op::Kernel(KernelOp::new(alternative.clone(), k.result));
    }
    !one
}

/// Where a result of a kernel call with a joint gradient rule (`Gradient::Joint`) stands in a backward walk.
enum Joint {
    /// The call's rule runs here, at its first result in the order (the last the walk reaches), with the
    /// cotangents of every result of the call in the walk, `(result index, position)`, this one included.
    First(Vec<(usize, usize)>),
    /// A later result of the call: the first takes its cotangent.
    Later,
}

/// The places of the joint-rule kernel results `nodes` (on the walk's path) among their calls, by position in a
/// walk of `len` nodes (a list, not a map: the walk asks for every position).
fn joint_places(nodes: &[Rc<Node>], len: usize) -> Vec<Option<Joint>> {
    let mut places: Vec<Option<Joint>> = std::iter::repeat_with(|| None).take(len).collect();
    if nodes.is_empty() {
        return places;
    }
    let position = |n: &Rc<Node>| (n.grad_visit.get() & UNORDERED) as usize;
    let mut results: Vec<(usize, KernelOp, Vec<*const Node>)> = nodes
        .iter()
        .filter_map(|n| {
            let state = n.lock();
            let recipe = state.recipe.as_ref()?;
            let Op::Kernel(k) = &recipe.op else { return None };
            Some((position(n), k.clone(), recipe.operands.iter().map(Rc::as_ptr).collect()))
        })
        .collect();
    results.sort_by_key(|r| r.0);
    let keyed: Vec<(&KernelOp, &Vec<*const Node>)> = results.iter().map(|(_, k, ops)| (k, ops)).collect();
    for group in lazuli_hlo::ops::kernel::joint_calls(&keyed) {
        let members = group.iter().map(|&i| (results[i].1.result, results[i].0)).collect();
        group[1..].iter().for_each(|&i| places[results[i].0] = Some(Joint::Later));
        places[results[group[0]].0] = Some(Joint::First(members));
    }
    places
}

impl Tensor {
    /// Mark this tensor as a gradient leaf: `backward()` accumulates into its `grad()`. Floating-point only.
    #[track_caller]
    pub fn requires_grad(self) -> Tensor {
        self.set_requires_grad(true);
        self
    }

    /// Mark (`true`) or unmark this tensor as a gradient leaf in place; marking panics for a non-float tensor, naming
    /// the caller's line.
    #[track_caller]
    pub fn set_requires_grad(&self, on: bool) {
        if on && !self.dtype().is_float() {
            fail(
                Loc::caller(),
                format!("requires_grad: only floating-point tensors have gradients, not {}", self.tensor_type()),
            );
        }
        self.node.requires_grad.set(on);
    }

    /// Whether this tensor is a gradient leaf (`requires_grad`).
    pub fn is_requires_grad(&self) -> bool {
        self.node.requires_grad()
    }

    /// The accumulated gradient (a lazy tensor), if `backward()` has reached this leaf.
    pub fn grad(&self) -> Option<Tensor> {
        self.node.grad.borrow().clone()
    }

    /// Remove and return the accumulated gradient.
    pub(crate) fn take_grad(&self) -> Option<Tensor> {
        self.node.grad.borrow_mut().take()
    }

    /// Set the accumulated gradient (moving it between values of one parameter).
    pub(crate) fn put_grad(&self, g: Tensor) {
        *self.node.grad.borrow_mut() = Some(g);
    }

    /// Forget the accumulated gradient.
    pub fn zero_grad(&self) {
        *self.node.grad.borrow_mut() = None;
    }

    /// Record the gradient of this scalar with respect to every gradient leaf it depends on, accumulating into
    /// their `grad()`. Recorded lazily into the same graph: nothing runs until the step boundary.
    #[track_caller]
    pub fn backward(&self) {
        let loc = Loc::caller();
        if self.elements() != 1 || !self.dtype().is_float() {
            fail(loc, format!("backward: needs a floating-point scalar loss, got {}", self.tensor_type()));
        }
        // The seed is structure (a shared constant node), not a candidate output of the step.
        let seed = Tensor::structural(crate::graph::constants::shared_constant(1.0, self.dtype(), self.dims(), loc));
        for (leaf, g) in backprop(self, seed) {
            let mut slot = leaf.grad.borrow_mut();
            *slot = Some(match slot.take() {
                Some(prev) => no_grad(|| prev.binary_at(&g, lazuli_hlo::BinaryKind::Add, loc)),
                None => g,
            });
        }
    }
}

/// Gradients of the scalar `loss` with respect to `wrt` (gradient leaves), without touching their `grad()`.
/// A leaf `loss` does not depend on gets zeros.
#[track_caller]
pub fn grad(loss: &Tensor, wrt: &[&Tensor]) -> Vec<Tensor> {
    let loc = Loc::caller();
    if loss.elements() != 1 || !loss.dtype().is_float() {
        fail(loc, format!("grad: needs a floating-point scalar loss, got {}", loss.tensor_type()));
    }
    for w in wrt {
        if !w.is_requires_grad() {
            fail(
                loc,
                format!(
                    "grad: a tensor recorded at {} is not a gradient leaf; call .requires_grad() on it",
                    w.location()
                ),
            );
        }
    }
    let seed = no_grad(|| apply(Op::Constant(lazuli_hlo::Constant::new(1.0, loss.tensor_type().clone())), &[], loc));
    let found: NodeMap<Tensor> = backprop(loss, seed).into_iter().map(|(n, g)| (Rc::as_ptr(&n), g)).collect();
    wrt.iter()
        .map(|w| match found.get(&Rc::as_ptr(&w.node)) {
            Some(g) => g.clone(),
            None => no_grad(|| Tensor::zeros(w.dims(), w.dtype())),
        })
        .collect()
}

/// `f(params)` and its gradients with respect to `params`.
#[track_caller]
pub fn value_and_grad(f: impl FnOnce(&[Tensor]) -> Tensor, params: &[Tensor]) -> (Tensor, Vec<Tensor>) {
    let loss = f(params);
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = grad(&loss, &refs);
    (loss, grads)
}

#[cfg(test)]
mod tests {
    use lazuli_hlo::{KernelOp, Loc, Op};

    use crate::graph::record::try_apply;
    use crate::graph::tensor::Tensor;

    /// The joint rule runs once per call with every result's cotangent, wherever the results sit in the walk,
    /// and with zeros for a result the loss does not reach.
    #[test]
    fn a_joint_rule_sees_every_results_cotangent_once() {
        let def = lazuli_hlo::ops::kernel::joint_rule_probe(3);
        let (xv, av, w1, w2) = ([1.0, -2.0, 0.5], [0.25, 1.0, -1.5], [0.5, -1.0, 2.0], [1.5, 0.25, -0.5]);
        // Each case twice: a later pass over a forward of one shape replays an earlier one's gradient ops.
        let cases = [(true, true, true), (true, true, false), (true, false, true), (false, true, true)];
        for (use_s, use_y, s_first) in cases.into_iter().chain(cases) {
            let x = Tensor::from_slice(&xv, &[3]).requires_grad();
            let a = Tensor::from_slice(&av, &[3]).requires_grad();
            let result = |r: usize| try_apply(Op::Kernel(KernelOp::new(def.clone(), r)), &[&x, &a], Loc::caller());
            let (s, y) = if s_first {
                let s = result(0).expect("s");
                (s, result(1).expect("y"))
            } else {
                let y = result(1).expect("y");
                (result(0).expect("s"), y)
            };
            let (c1, c2) = (Tensor::from_slice(&w1, &[3]), Tensor::from_slice(&w2, &[3]));
            let loss = match (use_s, use_y) {
                (true, true) => (&s * &c1).sum_all() + (&y * &c2).sum_all(),
                (true, false) => (&s * &c1).sum_all(),
                _ => (&y * &c2).sum_all(),
            };
            let grads = crate::graph::autodiff::grad(&loss, &[&x, &a]);
            for g in &grads {
                let got = g.to_vec::<f64>().expect("gradient");
                for i in 0..3 {
                    let s = xv[i] + av[i];
                    let (ds, dy) = (if use_s { w1[i] } else { 0.0 }, if use_y { w2[i] } else { 0.0 });
                    let want = ds + 2.0 * s * dy + ds * dy;
                    let case = (use_s, use_y, s_first);
                    assert!((got[i] - want).abs() < 1e-12, "{case:?} [{i}]: {} against {want}", got[i]);
                }
            }
        }
        // The first two cases walk alike: the second keeps a template, which both second passes replay; the other
        // two keep theirs at their second pass.
        assert_eq!(crate::graph::backward_replay::replays_on_this_thread(), 2);
    }

    /// A kernel whose rule assumes a unit cotangent keeps it under `backward()`'s seed and gives way to its scaled
    /// alternative under any other cotangent. The two rules differ on purpose (2 and 5 for `d(2·Σx)/dx`), so the
    /// gradient says which ran; the loss's value is the same either way.
    #[test]
    fn a_scaled_cotangent_records_the_scaled_alternative() {
        use lazuli_hlo::{Builder, Choice, DType, Gradient, KernelDef, Program, TensorType};
        use std::sync::Arc;
        let kernel = |name: &'static str, claimed: f64, alternative: Option<Arc<KernelDef>>| {
            let (x, y) = (TensorType::new(DType::F64, [3]), TensorType::scalar(DType::F64));
            let composite = Program::record(std::slice::from_ref(&x), |b, v| {
                let s = b.sum(&v[0], &[0]);
                vec![Some(b.scale(&s, 2.0))]
            });
            let rule = Program::record(&[x.clone(), y.clone(), y.clone()], |b, v| {
                let g = b.broadcast(&v[2], &[3], &[]);
                vec![Some(b.scale(&g, claimed))]
            });
            let choice = Choice { implementation: "composite", reason: String::new() };
            let rules = vec![Gradient::Program(rule.expect("rule"))];
            let def = KernelDef::new(name, vec![x], vec![y], None, composite.expect("composite"), rules, choice);
            match alternative {
                Some(a) => KernelDef::with_scaled_alternative(def.expect("def"), a).expect("alternative"),
                None => def.expect("def"),
            }
        };
        let ahead = kernel("ahead", 2.0, Some(kernel("alternative", 5.0, None)));
        // Each scale three times: the third pass replays the second's gradient ops, the alternative included.
        for (scale, want) in [(1.0, 2.0), (3.0, 15.0), (3.0, 15.0), (1.0, 2.0), (1.0, 2.0), (3.0, 15.0)] {
            let x = Tensor::from_slice(&[1.0f64, 2.0, 3.0], &[3]).requires_grad();
            let y = try_apply(Op::Kernel(KernelOp::new(ahead.clone(), 0)), &[&x], Loc::caller()).expect("y");
            let loss = if scale == 1.0 { y.clone() } else { &y * scale };
            let grads = crate::graph::autodiff::grad(&loss, &[&x]);
            assert_eq!(grads[0].to_vec::<f64>().expect("gradient"), vec![want; 3], "loss scaled by {scale}");
            assert_eq!(y.to_vec::<f64>().expect("y"), vec![12.0], "loss scaled by {scale}");
        }
        assert_eq!(crate::graph::backward_replay::replays_on_this_thread(), 2);
    }
}
