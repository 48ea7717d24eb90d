//! The guard that keeps a step's state from a non-finite step ([`guard`]), and what decides it
//! ([`update_inputs`]).

use std::collections::HashMap;

use crate::dtype::DType;
use crate::graph::{Graph, Loc, NodeId};
use crate::op::Op;
use crate::ops::elementwise::Select;
use crate::ops::layout::BroadcastInDim;

/// Guard `g`'s state: while `tripped` (`bool[]`, from [`tripped`](super::tripped) or [`sticky`](super::sticky)) is
/// false, each output `j` of `pairs` keeps its value; otherwise it becomes parameter `i`'s, the value it replaces. A
/// pair whose types differ is an error. An output that converts a guarded output's new value (a weight's bf16 copy)
/// converts the guarded value instead, so that it stays the copy of the state that is kept: paired with its old
/// value, that old value is then not read at all (a pass over every copy saved), and unpaired (the old copy no input
/// of this program, as in a split step's update) it is kept all the same. With `rebuild`, what the update computes
/// from guarded new values is made again from the guarded values (see
/// [`Counting::guard_rebuilds`](super::Counting)).
pub fn guard(g: &mut Graph, tripped: NodeId, pairs: &[(usize, usize)], rebuild: bool, loc: Loc) -> Result<(), String> {
    let copies = copies_of_state(g, pairs);
    let direct: Vec<(usize, usize)> =
        pairs.iter().copied().filter(|&(_, j)| !copies.iter().any(|&(c, _)| c == j)).collect();
    for &(i, j) in pairs.iter().filter(|p| !direct.contains(p)) {
        same_types(g, i, j)?;
    }
    guard_pairs(g, tripped, &direct, rebuild, loc)?;
    for (j, k) in copies {
        let node = &g.nodes[g.outputs[j]];
        let (op, ty) = (node.op.clone(), node.ty.clone());
        let kept = g.outputs[pairs[k].1];
        g.outputs[j] = g.push(op, vec![kept], loc)?;
        debug_assert_eq!(g.nodes[g.outputs[j]].ty, ty);
    }
    Ok(())
}

/// The outputs that convert the new value of a guarded output of `pairs` (a weight's low-precision copy), paired
/// or not, as `(output, index in pairs of the value converted)`; a convert of such a copy is not one.
fn copies_of_state(g: &Graph, pairs: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let guarded_new: Vec<NodeId> = pairs.iter().map(|&(_, j)| g.outputs[j]).collect();
    let source = |j: usize| match (&g.nodes[g.outputs[j]].op, g.nodes[g.outputs[j]].operands.as_slice()) {
        (Op::Convert(_), [x]) => guarded_new.iter().position(|n| n == x),
        _ => None,
    };
    (0..g.outputs.len())
        .filter_map(|j| source(j).map(|k| (j, k)))
        .filter(|&(_, k)| source(pairs[k].1).is_none())
        .collect()
}

/// Parameter `i` and output `j` have one type (a guarded pair), or the error that says they do not.
fn same_types(g: &Graph, i: usize, j: usize) -> Result<(), String> {
    let (old, new) = (&g.nodes[g.params[i]].ty, &g.nodes[g.outputs[j]].ty);
    match old == new {
        true => Ok(()),
        false => Err(format!("guarding output {j} ({new}) with parameter {i} ({old})")),
    }
}

/// Each pair's output becomes `select(tripped, old, new)`, in the order the new values were made. With `rebuild`,
/// what the update computes from a guarded new value (an optimizer's step reading its new moments) is made again
/// from the guarded value. That changes no result (on a trip the step's own select keeps its old value), but each
/// old value is then read by one kernel only: where a second kernel recomputed a new moment from its old value,
/// XLA's CPU backend, which keeps the moment's update and the weight's step in kernels of their own, copied every
/// moment to keep the old one for it. What decides `tripped` is not made again.
fn guard_pairs(
    g: &mut Graph,
    tripped: NodeId,
    pairs: &[(usize, usize)],
    rebuild: bool,
    loc: Loc,
) -> Result<(), String> {
    let mut guarded: HashMap<NodeId, Vec<usize>> = HashMap::new();
    for &(i, j) in pairs {
        same_types(g, i, j)?;
        guarded.entry(g.outputs[j]).or_default().push(i);
    }
    let Some(&first) = guarded.keys().min() else { return Ok(()) };
    let decides = g.ancestors(&[tripped]);
    let feeds = g.ancestors(&guarded.keys().copied().collect::<Vec<_>>());
    let mut kept: HashMap<NodeId, NodeId> = HashMap::new();
    let mut selects: HashMap<(usize, NodeId), NodeId> = HashMap::new();
    for x in first..decides.len() {
        if (decides[x] || !feeds[x]) && !guarded.contains_key(&x) {
            continue;
        }
        let node = &g.nodes[x];
        let mut value = x;
        if rebuild && !decides[x] && node.operands.iter().any(|o| kept.contains_key(o)) {
            let operands = node.operands.iter().map(|o| *kept.get(o).unwrap_or(o)).collect();
            let (op, ty, at) = (node.op.clone(), node.ty.clone(), node.loc);
            value = g.push_typed(op, operands, ty, at);
        }
        if let Some(olds) = guarded.get(&x).cloned() {
            for &i in &olds {
                selects.insert((i, x), keep_old(g, tripped, g.params[i], value, loc)?);
            }
            value = selects[&(olds[0], x)];
        }
        if value != x {
            kept.insert(x, value);
        }
    }
    for &(i, j) in pairs {
        g.outputs[j] = selects[&(i, g.outputs[j])];
    }
    Ok(())
}

/// `select(tripped, old, new)`, `tripped` broadcast to the values' shape.
fn keep_old(g: &mut Graph, tripped: NodeId, old: NodeId, new: NodeId, loc: Loc) -> Result<NodeId, String> {
    let dims = g.nodes[new].ty.dims.to_vec();
    let keep_old = match dims.is_empty() {
        true => tripped,
        false => g.push(Op::BroadcastInDim(BroadcastInDim { dims, map: Vec::new() }), vec![tripped], loc)?,
    };
    g.push(Op::Select(Select), vec![keep_old, old, new], loc)
}

/// What decides a cheap guard of `pairs` (`(parameter, output)`): the floating-point values entering the
/// update, that is the operands of the guarded outputs other than the old state and other guarded outputs (an
/// optimizer's gradients and hyperparameters), and the floating-point outputs that are neither guarded nor a copy
/// of guarded state (the loss). The guard's select then depends on nothing the update computes, so XLA can fuse it
/// into the update's kernels; a non-finite value that the update itself makes from these is not caught by it (a
/// copy that overflows its narrower type, for one: the next step's loss says so). Counting an unpaired copy would
/// compute the update a second time inside the count's kernel. A gradient that is a matrix product larger than its
/// operands is counted by its operands ([`through_smaller_products`]).
pub fn update_inputs(g: &Graph, pairs: &[(usize, usize)]) -> Vec<NodeId> {
    let guarded: Vec<NodeId> = pairs.iter().map(|&(_, j)| g.outputs[j]).collect();
    let copies: Vec<usize> = copies_of_state(g, pairs).into_iter().map(|(j, _)| j).collect();
    let old: Vec<NodeId> = pairs.iter().map(|&(i, _)| g.params[i]).collect();
    let neither = |x: &NodeId| !guarded.contains(x) && !old.contains(x);
    let entering = guarded.iter().flat_map(|&o| g.nodes[o].operands.iter().copied()).filter(neither).collect();
    let unguarded = (0..g.outputs.len()).filter(|j| !copies.contains(j)).map(|j| g.outputs[j]).filter(neither);
    let mut seen = vec![false; g.nodes.len()];
    let mut out = Vec::new();
    for x in through_smaller_products(g, entering).into_iter().chain(unguarded) {
        if !std::mem::replace(&mut seen[x], true) && g.nodes[x].ty.dtype.is_float() {
            out.push(x);
        }
    }
    out
}

/// `of`, with each matrix product among them (seen through ops that keep all its values) replaced by its
/// operands where those hold fewer elements, and so on for their own products: a product of finite values is
/// finite unless it overflows its type, which with f32's exponent range (f32, bf16, f64) a training step's values
/// do not reach (such an overflow would show in the next step's loss, as one in the update's own arithmetic does).
/// f16's range is narrow enough to overflow in practice: its products are counted themselves. A weight's gradient
/// from a small batch is a product much larger than its operands (the batch's activations and their gradients),
/// which are also ready before it: the count then reads fewer values, and the guard's updates wait for it less.
fn through_smaller_products(g: &Graph, of: Vec<NodeId>) -> Vec<NodeId> {
    let mut seen = vec![false; g.nodes.len()];
    let mut out = Vec::with_capacity(of.len());
    let mut todo: Vec<NodeId> = of.into_iter().rev().collect();
    while let Some(x) = todo.pop() {
        if std::mem::replace(&mut seen[x], true) {
            continue;
        }
        match smaller_product_operands(g, x) {
            Some(operands) => todo.extend(operands.into_iter().rev()),
            None => out.push(x),
        }
    }
    out
}

/// The floating-point operands of the product whose values `x` holds all of (or is), where they hold fewer
/// elements than `x` and the product has f32's exponent range. Every operand value enters some value of a product,
/// so a non-finite operand makes the product non-finite: the operands trip exactly when the product does (but for
/// an overflow). A slice of a product is counted itself: a non-finite operand value may enter only values the slice
/// leaves out.
fn smaller_product_operands(g: &Graph, x: NodeId) -> Option<Vec<NodeId>> {
    let keeps_every_value = |op: &Op| {
        matches!(
            op,
            Op::Reshape(_) | Op::Transpose(_) | Op::BroadcastInDim(_) | Op::Reverse(_) | Op::ShardingConstraint(_)
        )
    };
    let mut at = x;
    while g.nodes[at].operands.len() == 1 && keeps_every_value(&g.nodes[at].op) {
        at = g.nodes[at].operands[0];
    }
    let product = &g.nodes[at];
    let wide = matches!(product.ty.dtype, DType::F32 | DType::BF16 | DType::F64);
    if !matches!(product.op, Op::DotGeneral(_)) || !wide {
        return None;
    }
    let operands: Vec<NodeId> = product.operands.iter().copied().filter(|&o| g.nodes[o].ty.dtype.is_float()).collect();
    let elements: usize = operands.iter().map(|&o| g.nodes[o].ty.elements()).sum();
    (elements < g.nodes[x].ty.elements()).then_some(operands)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::TensorType;
    use crate::ops::dot::DotGeneral;
    use crate::ops::elementwise::{Binary, BinaryKind};
    use crate::ops::layout::Transpose;
    use crate::ops::slicing::Slice;

    /// A weight `f32[4,3]` updated by the gradient `xᵀ · dy` of a batch of `batch` (through a transpose, as
    /// autodiff may record it), in `dtype`; returns the graph and its nodes `x`, `dy`, the gradient and the loss.
    fn step(batch: usize, dtype: DType) -> (Graph, [NodeId; 4]) {
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        let mut g = Graph::new();
        let w = g.parameter(TensorType::new(dtype, [4, 3]), loc);
        let x = g.parameter(TensorType::new(dtype, [batch, 4]), loc);
        let dy = g.parameter(TensorType::new(dtype, [batch, 3]), loc);
        let loss = g.parameter(TensorType::new(DType::F32, []), loc);
        let product = g.push(Op::DotGeneral(DotGeneral::new(&[], &[], &[0], &[0])), vec![dy, x], loc).unwrap();
        let grad = g.push(Op::Transpose(Transpose { perm: vec![1, 0] }), vec![product], loc).unwrap();
        let new_w = g.push(Op::Binary(Binary { kind: BinaryKind::Sub }), vec![w, grad], loc).unwrap();
        g.outputs = vec![new_w, loss];
        (g, [x, dy, grad, loss])
    }

    /// A gradient that is a product larger than its operands is counted by them; a product no larger than its
    /// operands, or in f16 (whose range a product of finite values overflows in practice), by itself.
    #[test]
    fn a_gradient_larger_than_its_product_operands_is_counted_by_them() {
        let (g, [x, dy, _, loss]) = step(1, DType::F32);
        assert_eq!(update_inputs(&g, &[(0, 0)]), vec![dy, x, loss]);
        let (g, [x, dy, _, loss]) = step(1, DType::BF16);
        assert_eq!(update_inputs(&g, &[(0, 0)]), vec![dy, x, loss]);
        let (g, [_, _, grad, loss]) = step(2, DType::F32);
        assert_eq!(update_inputs(&g, &[(0, 0)]), vec![grad, loss], "14 operand values against 12");
        let (g, [_, _, grad, loss]) = step(1, DType::F16);
        assert_eq!(update_inputs(&g, &[(0, 0)]), vec![grad, loss]);
        // A slice of a larger product: its operands' values may enter only the rows it leaves out.
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        let (mut g, [_, dy, _, _]) = step(1, DType::F32);
        let wide = g.parameter(TensorType::new(DType::F32, [1, 8]), loc);
        let product = g.push(Op::DotGeneral(DotGeneral::new(&[], &[], &[0], &[0])), vec![wide, dy], loc).unwrap();
        let part = Slice { start: vec![0, 0], limit: vec![4, 3], stride: vec![1, 1] };
        let part = g.push(Op::Slice(part), vec![product], loc).unwrap();
        let w = g.params[0];
        let new_w = g.push(Op::Binary(Binary { kind: BinaryKind::Sub }), vec![w, part], loc).unwrap();
        g.outputs = vec![new_w];
        assert_eq!(update_inputs(&g, &[(0, 0)]), vec![part], "11 operand values against the slice's 12");
    }

    /// The guard decided by the operands' count keeps the weight when an operand of its gradient is not finite, and
    /// updates it otherwise (the reference interpreter).
    #[test]
    fn a_guard_by_the_operands_count_keeps_the_weight_on_their_trip() {
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        let (mut g, _) = step(1, DType::F32);
        let entering = update_inputs(&g, &[(0, 0)]);
        let total = super::super::count_total_by_rows(&mut g, &entering, 4, loc).unwrap();
        let trip = super::super::tripped(&mut g, total, loc).unwrap();
        guard(&mut g, trip, &[(0, 0)], false, loc).unwrap();
        let run = |dy0: f64| {
            let w = ndarray::ArrayD::from_elem(ndarray::IxDyn(&[4, 3]), 1.0);
            let x = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[1, 4]), vec![1.0, 0.0, 2.0, 0.0]).unwrap();
            let dy = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[1, 3]), vec![dy0, 1.0, 0.0]).unwrap();
            let out = g.evaluate(&[w, x, dy, ndarray::ArrayD::from_elem(ndarray::IxDyn(&[]), 0.5)]).unwrap();
            out[0].iter().copied().collect::<Vec<f64>>()
        };
        assert_eq!(run(1.0), vec![0.0, 0.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0]);
        assert_eq!(run(f64::INFINITY), vec![1.0; 12]);
        assert_eq!(run(f64::NAN), vec![1.0; 12]);
    }
}
