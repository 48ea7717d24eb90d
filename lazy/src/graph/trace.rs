//! Tracing: a Rust closure over lazy tensors, run once on placeholder inputs and read back as a [`Program`] (the
//! sub-graph a custom kernel's composite or a loop's body carries as data). The closure records as usual, with
//! gradients off; the program is what it recorded between the placeholders and what it returned.
//!
//! Tensors from outside the closure are handled by [`Captures`]: a custom kernel refuses them (its inputs are
//! its signature), a loop body lifts them into extra operands of the loop, computed once before it.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use lazuli_hlo::{Builder, Constant, Loc, Op, Parameter, Program, Recorder, TensorType, Value};

use crate::graph::tensor::{Data, Node, NodeMap, Tensor};

thread_local! {
    /// Whether a closure is being traced on this thread: [`made`] notes nodes only then.
    static TRACING: Cell<bool> = const { Cell::new(false) };
    /// The nodes made by each closure being traced, innermost last.
    static MADE: RefCell<Vec<NodeMap<()>>> = const { RefCell::new(Vec::new()) };
}

/// A node was made: while a closure is traced, it is one of that closure's own (see [`lifted`]).
pub(crate) fn made(node: &Rc<Node>) {
    if TRACING.get() {
        MADE.with_borrow_mut(|m| {
            if let Some(top) = m.last_mut() {
                top.insert(Rc::as_ptr(node), ());
            }
        });
    }
}

/// Run `f` noting the nodes it makes; returns its result and those nodes.
fn noting_made<R>(f: impl FnOnce() -> R) -> (R, NodeMap<()>) {
    struct Pop(bool);
    impl Drop for Pop {
        fn drop(&mut self) {
            MADE.with_borrow_mut(|m| m.pop());
            TRACING.set(self.0);
        }
    }
    MADE.with_borrow_mut(|m| m.push(NodeMap::default()));
    let pop = Pop(TRACING.replace(true));
    let r = f();
    let made = MADE.with_borrow_mut(|m| std::mem::take(m.last_mut().expect("pushed above")));
    drop(pop);
    (r, made)
}

/// What tracing does with a tensor the closure uses but did not compute from its inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Captures {
    /// An error naming where the tensor was recorded; a host scalar becomes a constant of the program.
    Refuse,
    /// Each such tensor becomes an extra input of the program, after the declared ones (loop-invariant).
    Lift,
}

/// A traced closure: its program (inputs: the declared types, then one per captured tensor) and the captured
/// tensors, in the order of those extra inputs.
pub(crate) struct Traced {
    pub program: Program,
    pub captured: Vec<Tensor>,
}

/// Record `f` on placeholder inputs of `types` and read what it recorded back as a program.
pub(crate) fn trace(
    types: &[TensorType],
    loc: Loc,
    captures: Captures,
    f: impl FnOnce(&[Tensor]) -> Vec<Option<Tensor>>,
) -> Result<Traced, String> {
    let placeholders: Vec<Tensor> = types
        .iter()
        .enumerate()
        .map(|(index, ty)| {
            let node = Tensor::record_node(Op::Parameter(Parameter { index }), Default::default(), ty.clone(), loc);
            Tensor::structural(node)
        })
        .collect();
    let (outputs, made) = noting_made(|| crate::graph::autodiff::no_grad(|| f(&placeholders)));
    let returned: Vec<Rc<Node>> = outputs.iter().flatten().map(|t| t.node.clone()).collect();
    let captured = match captures {
        Captures::Refuse => Vec::new(),
        Captures::Lift => lifted(&placeholders, &returned, &made),
    };
    let mut inputs = types.to_vec();
    inputs.extend(captured.iter().map(|n| n.ty.clone()));
    let mut error = None;
    let program = Program::record(&inputs, |b, x| {
        let mut seen: NodeMap<Value> = NodeMap::default();
        for (node, v) in placeholders.iter().map(|p| &p.node).chain(&captured).zip(x) {
            seen.insert(Rc::as_ptr(node), v.clone());
        }
        let mut outs = Vec::new();
        for o in &outputs {
            match o {
                None => outs.push(None),
                Some(t) => match replay(b, &t.node, &mut seen) {
                    Ok(v) => outs.push(Some(v)),
                    Err(e) => {
                        error.get_or_insert(e);
                        outs.push(None);
                    }
                },
            }
        }
        outs
    })?;
    match error {
        Some(e) => Err(e),
        None => Ok(Traced { program, captured: captured.into_iter().map(Tensor::structural).collect() }),
    }
}

/// The tensors a closure used without computing them from its inputs: every node that is neither the closure's
/// own op (one it recorded, in `made`) nor depends on a placeholder, and is returned or read by one that is. In a
/// deterministic order (operands before users, first use first), so the same closure makes the same program.
///
/// An op the closure recorded on outer tensors alone (a weight's transpose, say) belongs to the program, not to
/// the outer graph: the closure ran with gradients off, so as an outer node it would cut the outer tensors'
/// gradient; in the program the loop's rule differentiates it (and XLA hoists it out of the loop).
fn lifted(placeholders: &[Tensor], returned: &[Rc<Node>], made: &NodeMap<()>) -> Vec<Rc<Node>> {
    // Per node: whether it depends on a placeholder. An explicit stack: a captured tensor's pending history may
    // be long.
    let mut inside: NodeMap<bool> = placeholders.iter().map(|p| (Rc::as_ptr(&p.node), true)).collect();
    let mut captured: Vec<Rc<Node>> = Vec::new();
    let mut taken: NodeMap<()> = NodeMap::default();
    let mut take = |n: &Rc<Node>, captured: &mut Vec<Rc<Node>>| {
        if taken.insert(Rc::as_ptr(n), ()).is_none() {
            captured.push(n.clone());
        }
    };
    let mut stack: Vec<(Rc<Node>, bool)> = returned.iter().rev().map(|n| (n.clone(), false)).collect();
    while let Some((node, expanded)) = stack.pop() {
        if inside.contains_key(&Rc::as_ptr(&node)) {
            continue;
        }
        let operands: Vec<Rc<Node>> = node.lock().recipe.as_ref().map_or(Vec::new(), |r| r.operands.to_vec());
        if !expanded {
            stack.push((node, true));
            stack.extend(operands.into_iter().rev().map(|o| (o, false)));
            continue;
        }
        let own_op = made.contains_key(&Rc::as_ptr(&node)) && node.lock().recipe.is_some();
        let depends = own_op || operands.iter().any(|o| inside[&Rc::as_ptr(o)]);
        if depends {
            for o in operands.iter().filter(|o| !inside[&Rc::as_ptr(o)]) {
                take(o, &mut captured);
            }
        }
        inside.insert(Rc::as_ptr(&node), depends);
    }
    for n in returned.iter().filter(|n| !inside[&Rc::as_ptr(n)]) {
        take(n, &mut captured);
    }
    captured
}

/// The program value of `node`, recording its recipe's ops (operands first) on `b`.
fn replay(b: &mut Recorder, node: &Rc<Node>, seen: &mut NodeMap<Value>) -> Result<Value, String> {
    if let Some(v) = seen.get(&Rc::as_ptr(node)) {
        return Ok(v.clone());
    }
    let (op, operands) = {
        let state = node.lock();
        match (&state.recipe, &state.data) {
            (Some(r), _) => (r.op.clone(), r.operands.to_vec()),
            (None, Some(Data::Host(bytes))) if node.ty.rank() == 0 => {
                let value = crate::graph::element::bytes_to_f64(node.ty.dtype, bytes)[0];
                (Op::Constant(Constant::new(value, node.ty.clone())), Vec::new())
            }
            _ => {
                return Err(format!(
                    "it uses a tensor recorded at {} that is not one of the kernel's inputs: pass it as an input",
                    node.loc
                ))
            }
        }
    };
    let mut args = Vec::with_capacity(operands.len());
    for o in &operands {
        args.push(replay(b, o, seen)?);
    }
    let refs: Vec<&Value> = args.iter().collect();
    let v = b.op(op, &refs);
    seen.insert(Rc::as_ptr(node), v.clone());
    Ok(v)
}
