//! Counting non-finite values inside a program: the nodes `LAZULI_CHECK_FINITE` adds to a step's graph (one
//! count per group of floating-point outputs, [`count_nonfinite_grouped`]) and to the graph that locates a trip
//! (each watched node's count and range in one reduction, [`stats`]).
//! The step's counts test `|x| < inf` (false for NaN and ±inf) with ops that every backend and the reference
//! interpreter already have, and XLA fuses it into the reduction that counts; the locator's `FiniteStats` op lowers
//! its test to `stablehlo.is_finite` inside its one reduction.
//!
//! [`guard`] keeps a step's state from a non-finite step, as dynamic loss scaling does: every state output
//! becomes `select(tripped, old, new)`, so a tripped step returns its inputs' values and the old buffers may
//! still be donated (the program itself hands them back). `tripped` is the step's own trip ([`tripped`]) or a
//! [`sticky`] flag that the programs after a trip read and hand on, so that they keep the state too.

use std::ops::Range;

mod guard;
pub use guard::{guard, update_inputs};

use crate::dtype::{DType, TensorType};
use crate::graph::{Graph, Loc, NodeId};
use crate::op::Op;
use crate::ops::checkpoint::Checkpoint;
use crate::ops::elementwise::{BinaryKind, Compare, CompareDir, Convert, Select, Unary, UnaryKind};
use crate::ops::layout::Reshape;
use crate::ops::leaf::Constant;
use crate::ops::reduce::{FiniteStats, Reduce, ReduceKind};
use crate::ops::slicing::{Concatenate, Pad};

/// How [`count_nonfinite_grouped`] groups tensors into counts and shapes each count's reduction: the caller
/// picks the one that suits the compiler of its backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counting {
    /// At most this many tensors share a count…
    pub tensors: usize,
    /// …and at most this many elements (a larger tensor is counted alone).
    pub elements: usize,
    /// A count of more than `elements` elements (a tensor alone) first views its flattened tensor (padded with
    /// zeros) as this many rows and sums them into one row, then that row; `None`, and smaller counts: one
    /// reduction over all of them.
    pub rows: Option<usize>,
    /// How a program that needs one total (a guarded check) counts it.
    pub total: Total,
    /// Whether [`guard`] makes again from the guarded values what the update computes from new ones (a weight's
    /// step reading its new moments). XLA's CPU backend copied every optimizer moment otherwise, about a gigabyte
    /// a step for GPT-2 small (`docs/perf-log/2026-12-05-check-cost-on-the-cpu-again.md`); XLA's GPU backend
    /// updates a tensor's moments and weight in one kernel.
    pub guard_rebuilds: bool,
}

/// How a guarded check's one total is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Total {
    /// [`count_total_by_rows`] in rows of this width: each tensor's row counts, joined and summed.
    ByRows(usize),
    /// [`count_total_joined`]: each group's partial counts (a large tensor's rows summed into one, a small group's
    /// flags), joined and summed once.
    Joined,
}

impl Counting {
    /// XLA's GPU compiler: up to [`GROUP_TENSORS`] tensors, flattened and concatenated, counted by one reduction,
    /// whose concatenation it fuses into the kernel that counts (a launch per tensor cost more than the reading).
    /// A total is counted by rows ([`count_total_by_rows`]).
    pub const FOR_GPU: Counting = Counting {
        tensors: GROUP_TENSORS,
        elements: 1 << 30,
        rows: None,
        total: Total::ByRows(TOTAL_ROW_WIDTH),
        guard_rebuilds: false,
    };
    /// XLA's CPU compiler: only small tensors share a count, and a large tensor's count first sums its 32 rows
    /// into one. Its loop over a concatenation picks each element's source tensor in turn and is not vectorized,
    /// and it rewrites a reduction over more than 32 elements into a tree whose first level it does not fuse with
    /// the test of each element, so that the test's flags were written out in full and read again. Summing rows
    /// (the leading axis) reads each row contiguously and vectorizes; summing within rows of 32 (the last axis)
    /// loaded element by element and took about 1.5 times as long (`docs/perf-log/2026-12-03-locator-ahead.md`).
    /// Small counts stay one reduction: fewer kernels. A total joins the groups' partial counts before it sums
    /// them: XLA's CPU compiler makes each reduction to one count a tree of a few small kernels.
    pub const FOR_CPU: Counting = Counting {
        tensors: GROUP_TENSORS,
        elements: 1 << 14,
        rows: Some(32),
        total: Total::Joined,
        guard_rebuilds: true,
    };
}

/// The rows of [`Counting::FOR_GPU`]'s total: long enough for wide loads, and each of GPT-2's matrices a whole
/// number of them.
pub const TOTAL_ROW_WIDTH: usize = 2048;

/// At most this many tensors share one count of [`Counting::FOR_GPU`]: few enough operands for XLA to fuse their
/// concatenation into the counting reduction.
pub const GROUP_TENSORS: usize = 32;

/// How [`count_nonfinite_grouped`] splits tensors of these types, in order, into counted groups: runs of one dtype
/// of at most `counting.tensors` tensors and `counting.elements` elements (a larger tensor is a group alone).
pub fn count_groups(types: &[&TensorType], counting: &Counting) -> Vec<Range<usize>> {
    let mut groups: Vec<Range<usize>> = Vec::new();
    let mut elements = 0;
    for (i, ty) in types.iter().enumerate() {
        let joins = groups.last().is_some_and(|r| {
            r.len() < counting.tensors
                && types[r.start].dtype == ty.dtype
                && elements + ty.elements() <= counting.elements
        });
        match groups.last_mut() {
            Some(r) if joins => {
                r.end = i + 1;
                elements += ty.elements();
            }
            _ => {
                groups.push(i..i + 1);
                elements = ty.elements();
            }
        }
    }
    groups
}

/// As [`count_nonfinite`], with one count per group of [`count_groups`] instead of one per node: each group's
/// tensors are flattened and concatenated into one counting reduction. A step checks hundreds of outputs, and a
/// reduction per output is a kernel launch per output (two, and a zeroing, for large ones); a group is one.
pub fn count_nonfinite_grouped(
    g: &mut Graph,
    of: &[NodeId],
    counting: &Counting,
    loc: Loc,
) -> Result<Option<NodeId>, String> {
    let types: Vec<&TensorType> = of.iter().map(|&x| &g.nodes[x].ty).collect();
    let groups = count_groups(&types, counting);
    let mut counts = Vec::with_capacity(groups.len());
    for group in groups {
        let partial = group_partial(g, &of[group], counting, loc)?;
        counts.push(reduce_to_one(g, partial, ReduceKind::Sum, loc)?);
    }
    join(g, counts, loc)
}

/// `i32[1]`: how many elements of the floating-point nodes `of` are NaN or infinite in all, shaped for XLA's GPU
/// compiler: each tensor's flags flattened into rows of at most `width` (the last padded with zeros) and counted
/// by rows, the row counts of every tensor joined and summed. Each tensor's row counts are a kernel that reads it
/// with wide loads; a reduction over a join of the tensors themselves decides each element's tensor in turn, and
/// read at a quarter of the memory's speed (`docs/perf-log/2026-12-04-check-by-rows.md`).
pub fn count_total_by_rows(g: &mut Graph, of: &[NodeId], width: usize, loc: Loc) -> Result<NodeId, String> {
    let mut row_counts = Vec::with_capacity(of.len());
    for &x in of {
        let n = g.nodes[x].ty.elements();
        if n == 0 {
            continue;
        }
        let flags = nonfinite_flags(g, x, loc)?;
        let width = width.clamp(1, n);
        let table = flags_table(g, flags, n.div_ceil(width), width, loc)?;
        let by_row = Reduce { kind: ReduceKind::Sum, axes: vec![1], keep: false };
        row_counts.push(g.push(Op::Reduce(by_row), vec![table], loc)?);
    }
    total_of_joined(g, row_counts, loc)
}

/// `i32[1]`: how many elements of the floating-point nodes `of` are NaN or infinite in all, shaped for XLA's CPU
/// compiler: each group of [`count_groups`] becomes a partial count (a tensor counted alone in `counting.rows` rows
/// summed into one; a small group's flags, joined), and the partials are joined and summed once. Counted group by
/// group ([`count_nonfinite_grouped`]), each group's sum is a tree of a few small kernels of XLA's CPU runtime:
/// mlp-mnist's guarded step has 11 kernels more than without the check this way, 21 group by group
/// (`docs/perf-log/2026-12-04-check-cost-on-a-quiet-cpu.md`).
pub fn count_total_joined(g: &mut Graph, of: &[NodeId], counting: &Counting, loc: Loc) -> Result<NodeId, String> {
    let types: Vec<&TensorType> = of.iter().map(|&x| &g.nodes[x].ty).collect();
    let groups = count_groups(&types, counting);
    let mut partials = Vec::with_capacity(groups.len());
    for group in groups {
        let partial = group_partial(g, &of[group], counting, loc)?;
        if g.nodes[partial].ty.elements() > 0 {
            partials.push(partial);
        }
    }
    total_of_joined(g, partials, loc)
}

/// A group's partial count, an `i32` vector: the flags of its tensors flattened and joined (joined before they are
/// tested, so that XLA's simplifier does not split a later sum over the join into one per tensor), then, when there
/// are more than `counting.elements` of them (a tensor counted alone), summed from `counting.rows` rows into one
/// behind an optimization barrier.
fn group_partial(g: &mut Graph, members: &[NodeId], counting: &Counting, loc: Loc) -> Result<NodeId, String> {
    let mut flat = Vec::with_capacity(members.len());
    for &x in members {
        let n = g.nodes[x].ty.elements();
        flat.push(g.push(Op::Reshape(Reshape { dims: vec![n] }), vec![x], loc)?);
    }
    let joined = join(g, flat, loc)?.ok_or("a count of an empty group of tensors")?;
    let flags = nonfinite_flags(g, joined, loc)?;
    match counting.rows {
        Some(rows) if rows > 0 && g.nodes[flags].ty.elements() > counting.elements.max(rows) => {
            count_rows(g, flags, rows, loc)
        }
        _ => Ok(flags),
    }
}

/// `i32[1]`: the sum of the `i32` vectors `parts`, joined first behind an optimization barrier (XLA's simplifier
/// would turn a sum over the join back into a sum per part); 0 when there is none.
fn total_of_joined(g: &mut Graph, parts: Vec<NodeId>, loc: Loc) -> Result<NodeId, String> {
    let Some(joined) = join(g, parts, loc)? else { return total_of(g, None, loc) };
    let joined = g.push(Op::Checkpoint(Checkpoint::Barrier { index: 0 }), vec![joined], loc)?;
    total_of(g, Some(joined), loc)
}

/// The rank-1 `parts` concatenated, the one part itself, or `None` for none.
fn join(g: &mut Graph, parts: Vec<NodeId>, loc: Loc) -> Result<Option<NodeId>, String> {
    match parts.len() {
        0 => Ok(None),
        1 => Ok(Some(parts[0])),
        _ => g.push(Op::Concatenate(Concatenate { dim: 0 }), parts, loc).map(Some),
    }
}

/// `i32` flags of node `x`'s shape: 1 where an element is NaN or infinite, else 0.
fn nonfinite_flags(g: &mut Graph, x: NodeId, loc: Loc) -> Result<NodeId, String> {
    let ty = g.nodes[x].ty.clone();
    if !ty.dtype.is_float() {
        return Err(format!("counting non-finite values of {ty}, which is not floating-point"));
    }
    let splat = |v: f64, dtype: DType| Op::Constant(Constant::new(v, ty.with_dtype(dtype)));
    let abs = g.push(Op::Unary(Unary { kind: UnaryKind::Abs }), vec![x], loc)?;
    let inf = g.push(splat(f64::INFINITY, ty.dtype), vec![], loc)?;
    let finite = g.push(Op::Compare(Compare { dir: CompareDir::Lt }), vec![abs, inf], loc)?;
    let zero = g.push(splat(0.0, DType::I32), vec![], loc)?;
    let one = g.push(splat(1.0, DType::I32), vec![], loc)?;
    g.push(Op::Select(Select), vec![finite, zero, one], loc)
}

/// `i32[width]`: the `s32` `flags` flattened, padded with zeros to `rows` whole rows and the rows summed into
/// one, behind an optimization barrier.
fn count_rows(g: &mut Graph, flags: NodeId, rows: usize, loc: Loc) -> Result<NodeId, String> {
    let width = g.nodes[flags].ty.elements().div_ceil(rows);
    let table = flags_table(g, flags, rows, width, loc)?;
    let row = g.push(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: vec![0], keep: false }), vec![table], loc)?;
    // XLA's simplifier would merge this reduction with the one summing its row back into one over every element.
    g.push(Op::Checkpoint(Checkpoint::Barrier { index: 0 }), vec![row], loc)
}

/// `i32[rows, width]`: the `s32` `flags` flattened and padded with zeros to `rows · width` elements (at least as
/// many as it holds).
fn flags_table(g: &mut Graph, flags: NodeId, rows: usize, width: usize, loc: Loc) -> Result<NodeId, String> {
    let n = g.nodes[flags].ty.elements();
    let mut flat = g.push(Op::Reshape(Reshape { dims: vec![n] }), vec![flags], loc)?;
    if rows * width > n {
        let zero = g.push(Op::Constant(Constant::new(0.0, TensorType::new(DType::I32, []))), vec![], loc)?;
        let pad = Pad { low: vec![0], high: vec![rows * width - n], interior: vec![0] };
        flat = g.push(Op::Pad(pad), vec![flat, zero], loc)?;
    }
    g.push(Op::Reshape(Reshape { dims: vec![rows, width] }), vec![flat], loc)
}

/// `[1]`: node `x` reduced over all its axes by `kind`.
fn reduce_to_one(g: &mut Graph, x: NodeId, kind: ReduceKind, loc: Loc) -> Result<NodeId, String> {
    let rank = g.nodes[x].ty.rank();
    let mut reduced = x;
    if rank > 0 {
        let axes = (0..rank).collect();
        reduced = g.push(Op::Reduce(Reduce { kind, axes, keep: false }), vec![x], loc)?;
    }
    g.push(Op::Reshape(Reshape { dims: vec![1] }), vec![reduced], loc)
}

/// Add nodes to `g` computing each of `of`'s (floating-point nodes) [`FiniteStats`]: its count of non-finite elements
/// and its range. Nodes of one dtype and size, of at most `stack_up_to` elements, are stacked, up to `stack` at a time
/// and in order of first appearance, into one reduction by rows (a reduction per node is a kernel per node: GPT-2's
/// step watches about 2,500 nodes, which stack into under a hundred reductions); the results are concatenated per
/// result dtype (f32, and f64 for f64 nodes). With `widen`, f16 and bf16 nodes (and their stacks) are converted to
/// f32 behind an optimization barrier before they are reduced, which changes no statistic: XLA's CPU compiler would
/// otherwise fuse the conversion into its reduction loop, which then converts element by element. Returns each
/// concatenation's node with the nodes it holds three values of, in its order.
pub fn stats(
    g: &mut Graph,
    of: &[NodeId],
    stack: usize,
    stack_up_to: usize,
    widen: bool,
    loc: Loc,
) -> Result<Vec<(NodeId, Vec<NodeId>)>, String> {
    // Runs of nodes of one dtype and size, at most `stack` long; an empty or a larger node is alone.
    let mut runs: Vec<(DType, usize, Vec<NodeId>)> = Vec::new();
    for &x in of {
        let (dtype, n) = (g.nodes[x].ty.dtype, g.nodes[x].ty.elements());
        let stacks = 0 < n && n <= stack_up_to;
        let open = runs.iter_mut().rev().find(|(d, m, xs)| (*d, *m) == (dtype, n) && stacks && xs.len() < stack);
        match open {
            Some((_, _, xs)) => xs.push(x),
            None => runs.push((dtype, n, vec![x])),
        }
    }
    let mut by_dtype: Vec<(DType, Vec<NodeId>, Vec<NodeId>)> = Vec::new();
    for (_, n, xs) in runs {
        let part = stats_of_run(g, &xs, n, widen, loc)?;
        let dtype = g.nodes[part].ty.dtype;
        match by_dtype.iter_mut().find(|(d, _, _)| *d == dtype) {
            Some((_, all, parts)) => {
                all.extend(xs);
                parts.push(part);
            }
            None => by_dtype.push((dtype, xs, vec![part])),
        }
    }
    let mut out = Vec::with_capacity(by_dtype.len());
    for (_, xs, parts) in by_dtype {
        let all = match parts[..] {
            [one] => one,
            _ => g.push(Op::Concatenate(Concatenate { dim: 0 }), parts, loc)?,
        };
        out.push((all, xs));
    }
    Ok(out)
}

/// `[3 k]`: the [`FiniteStats`] of `xs` (k nodes of `n` elements each) in order: one node's alone, several
/// flattened into the rows of one table and reduced by rows. With `widen`, 16-bit values are converted to f32
/// first, behind an optimization barrier (see [`stats`]).
fn stats_of_run(g: &mut Graph, xs: &[NodeId], n: usize, widen: bool, loc: Loc) -> Result<NodeId, String> {
    let dtype = g.nodes[xs[0]].ty.dtype;
    let widen = widen && dtype.byte_size() == 2;
    let mut values = Vec::with_capacity(xs.len());
    for &x in xs {
        values.push(match widen {
            true => g.push(Op::Convert(Convert { from: dtype, to: DType::F32 }), vec![x], loc)?,
            false => x,
        });
    }
    let barrier = |g: &mut Graph, x: NodeId| match widen {
        true => g.push(Op::Checkpoint(Checkpoint::Barrier { index: 0 }), vec![x], loc),
        false => Ok(x),
    };
    if let [x] = values[..] {
        let x = barrier(g, x)?;
        return g.push(Op::FiniteStats(FiniteStats { rows: false }), vec![x], loc);
    }
    let rows = values.iter().map(|&x| g.push(Op::Reshape(Reshape { dims: vec![1, n] }), vec![x], loc));
    let rows = rows.collect::<Result<Vec<_>, _>>()?;
    let table = g.push(Op::Concatenate(Concatenate { dim: 0 }), rows, loc)?;
    let table = barrier(g, table)?;
    let three = g.push(Op::FiniteStats(FiniteStats { rows: true }), vec![table], loc)?;
    g.push(Op::Reshape(Reshape { dims: vec![3 * xs.len()] }), vec![three], loc)
}

/// `bool[]`: whether a vector of counts (from [`count_nonfinite`]) has a non-zero count.
pub fn tripped(g: &mut Graph, counts: NodeId, loc: Loc) -> Result<NodeId, String> {
    let total = total(g, counts, loc)?;
    let zero = g.push(Op::Constant(Constant::new(0.0, TensorType::new(DType::I32, []))), vec![], loc)?;
    g.push(Op::Compare(Compare { dir: CompareDir::Ne }), vec![total, zero], loc)
}

/// `bool[]`: a sticky trip flag's next value, `flag OR tripped` (both `bool[]`): once set, it stays set for every
/// later program that reads it.
pub fn sticky(g: &mut Graph, flag: NodeId, tripped: NodeId, loc: Loc) -> Result<NodeId, String> {
    g.push(Op::Binary(crate::ops::elementwise::Binary { kind: BinaryKind::Or }), vec![flag, tripped], loc)
}

/// `i32[]`: the sum of a vector of counts.
fn total(g: &mut Graph, counts: NodeId, loc: Loc) -> Result<NodeId, String> {
    g.push(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: vec![0], keep: false }), vec![counts], loc)
}

/// `i32[1]`: the total of a vector of counts, 0 when there is none.
pub fn total_of(g: &mut Graph, counts: Option<NodeId>, loc: Loc) -> Result<NodeId, String> {
    match counts {
        Some(c) => {
            let t = total(g, c, loc)?;
            g.push(Op::Reshape(Reshape { dims: vec![1] }), vec![t], loc)
        }
        None => g.push(Op::Constant(Constant::new(0.0, TensorType::new(DType::I32, [1]))), vec![], loc),
    }
}

/// Which nodes of `g` hold values already counted: the parameters `counted` (by index), and what layout ops
/// (`Op::only_moves_values`) and widening float converts make from such values alone, since neither can make a
/// non-finite value from finite ones. An update's count leaves these out when an earlier program counted its
/// gradients (a weight's bf16 copy's gradient, widened for its f32 update, is covered by the copy's count).
pub fn covered(g: &Graph, counted: &[usize]) -> Vec<bool> {
    let mut covered = vec![false; g.nodes.len()];
    for &i in counted {
        covered[g.params[i]] = true;
    }
    for (id, node) in g.nodes.iter().enumerate() {
        if covered[id] || node.operands.is_empty() {
            continue;
        }
        let floats: Vec<NodeId> = node.operands.iter().copied().filter(|&o| g.nodes[o].ty.dtype.is_float()).collect();
        let widens = |o: NodeId| {
            let from = g.nodes[o].ty.dtype;
            node.ty.dtype.is_float() && from.byte_size() <= node.ty.dtype.byte_size()
        };
        let keeps_finite = match &node.op {
            Op::Convert(_) => floats.len() == 1 && widens(floats[0]),
            op => op.only_moves_values(),
        };
        covered[id] = keeps_finite && !floats.is_empty() && floats.iter().all(|&o| covered[o]);
    }
    covered
}

/// The floating-point nodes of `g` among `ids`.
pub fn floating(g: &Graph, ids: impl IntoIterator<Item = NodeId>) -> Vec<NodeId> {
    ids.into_iter().filter(|&i| g.nodes[i].ty.dtype.is_float()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, IxDyn};

    /// Each tensor counted alone.
    fn alone(rows: Option<usize>) -> Counting {
        Counting { tensors: 1, elements: 0, rows, total: Total::Joined, guard_rebuilds: false }
    }

    /// Counted parameters cover what layout ops and widening converts make from them alone, and nothing else.
    #[test]
    fn covered_values_are_counted_parameters_moved_or_widened() {
        use crate::ops::elementwise::{Binary, Convert};
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        let mut g = Graph::new();
        let a = g.parameter(TensorType::new(DType::BF16, [2, 3]), loc);
        let b = g.parameter(TensorType::new(DType::F32, [2, 3]), loc);
        let pred = g.parameter(TensorType::new(DType::Bool, [2, 3]), loc);
        let f32_of = |ty: &TensorType| TensorType::new(DType::F32, &ty.dims);
        let convert = |from, to| Op::Convert(Convert { from, to });
        let wide = g.push(convert(DType::BF16, DType::F32), vec![a], loc).unwrap();
        let flat = g.push(Op::Reshape(Reshape { dims: vec![6] }), vec![wide], loc).unwrap();
        let narrow = g.push(convert(DType::F32, DType::BF16), vec![b], loc).unwrap();
        let sum = g.push(Op::Binary(Binary { kind: BinaryKind::Add }), vec![wide, wide], loc).unwrap();
        let mixed = g.push(Op::Select(Select), vec![pred, wide, b], loc).unwrap();
        let both = g.push(Op::Select(Select), vec![pred, wide, wide], loc).unwrap();
        assert_eq!(g.nodes[wide].ty, f32_of(&g.nodes[a].ty));
        let covered = covered(&g, &[0]);
        let got: Vec<bool> = [a, b, wide, flat, narrow, sum, mixed, both].iter().map(|&n| covered[n]).collect();
        assert_eq!(got, [true, false, true, true, false, false, false, true]);
        // With the f32 parameter counted too, its narrowing convert may overflow: still not covered.
        let covered = super::covered(&g, &[0, 1]);
        assert_eq!((covered[narrow], covered[mixed], covered[sum]), (false, true, false));
    }

    /// The reference interpreter counts NaN and both infinities, per node, in order.
    #[test]
    fn counts_by_the_reference() {
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        let mut g = Graph::new();
        let a = g.parameter(TensorType::new(DType::F32, [2, 3]), loc);
        let b = g.parameter(TensorType::new(DType::F16, []), loc);
        let counts = count_nonfinite_grouped(&mut g, &[a, b], &alone(None), loc).unwrap().unwrap();
        g.outputs = vec![counts];
        let av = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.0, f64::NAN, f64::INFINITY, -f64::INFINITY, 0.0, 3.0]);
        let bv = ArrayD::from_elem(IxDyn(&[]), 70000.0); // past f16's largest: rounds to inf
        let out = g.evaluate(&[av.unwrap(), bv]).unwrap();
        assert_eq!(out[0].iter().copied().collect::<Vec<_>>(), vec![3.0, 1.0]);
    }

    /// Counting by rows summed into one gives the whole count: a tensor of whole rows, one padded to whole rows,
    /// and one of no more elements than rows (counted whole), with non-finite values in the first, a middle and the
    /// last row.
    #[test]
    fn counts_in_rows_by_the_reference() {
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        for (dims, rows) in [(vec![4usize, 8], 8usize), (vec![5, 7], 8), (vec![3], 8), (vec![2, 2, 9], 4)] {
            let mut g = Graph::new();
            let x = g.parameter(TensorType::new(DType::F32, dims.clone()), loc);
            let counts = count_nonfinite_grouped(&mut g, &[x], &alone(Some(rows)), loc).unwrap().unwrap();
            g.outputs = vec![counts];
            let n: usize = dims.iter().product();
            let bad = [0, n / 2, n - 1];
            let values: Vec<f64> = (0..n)
                .map(|i| match bad.iter().position(|&b| b == i) {
                    Some(0) => f64::NAN,
                    Some(1) => f64::INFINITY,
                    Some(_) => -f64::INFINITY,
                    None => i as f64 - 3.5,
                })
                .collect();
            let out = g.evaluate(&[ArrayD::from_shape_vec(IxDyn(&dims), values).unwrap()]).unwrap();
            let expected = bad.iter().collect::<std::collections::BTreeSet<_>>().len() as f64;
            assert_eq!(out[0].iter().copied().collect::<Vec<_>>(), vec![expected], "{dims:?} in {rows} rows");
        }
    }

    /// Each node's count and range, grouped by result dtype in the order of `of`; an empty node's range is the
    /// identities'; counts are exact past f32's integers.
    #[test]
    fn stats_by_the_reference() {
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        let mut g = Graph::new();
        let a = g.parameter(TensorType::new(DType::F32, [2, 2]), loc);
        let b = g.parameter(TensorType::new(DType::F64, []), loc);
        let c = g.parameter(TensorType::new(DType::F16, [0]), loc);
        let d = g.parameter(TensorType::new(DType::BF16, [70_000]), loc);
        let groups = stats(&mut g, &[a, b, c, d], GROUP_TENSORS, usize::MAX, false, loc).unwrap();
        assert_eq!(groups.iter().map(|(_, of)| of.clone()).collect::<Vec<_>>(), vec![vec![a, c, d], vec![b]]);
        g.outputs = groups.iter().map(|&(v, _)| v).collect();
        let av = ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![1.5, -3.0, f64::INFINITY, 2.0]).unwrap();
        let bv = ArrayD::from_elem(IxDyn(&[]), -7.0);
        let cv = ArrayD::from_shape_vec(IxDyn(&[0]), vec![]).unwrap();
        let dv = ArrayD::from_elem(IxDyn(&[70_000]), f64::NAN);
        let out = g.evaluate(&[av, bv, cv, dv]).unwrap();
        let read =
            |i: usize, j: usize, dt: DType| FiniteStats::read(dt, &out[i].iter().copied().collect::<Vec<_>>()[3 * j..]);
        assert_eq!(read(0, 0, DType::F32), (1, -3.0, f64::INFINITY));
        assert_eq!(read(0, 1, DType::F32), (0, f64::INFINITY, f64::NEG_INFINITY));
        let (count, min, max) = read(0, 2, DType::F32);
        assert!(count == 70_000 && min.is_nan() && max.is_nan());
        assert_eq!(read(1, 0, DType::F64), (0, -7.0, -7.0));
    }

    /// Nodes of one dtype and size share a reduction by rows, at most `stack` of them, in order of first
    /// appearance; each still gets its own three values, the same as alone; other sizes and dtypes are not stacked.
    #[test]
    fn stacked_stats_are_each_nodes_own() {
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        let (pair, other) = (TensorType::new(DType::F32, [2, 3]), TensorType::new(DType::F32, [5]));
        let mut g = Graph::new();
        let xs = [
            g.parameter(pair.clone(), loc),
            g.parameter(other.clone(), loc),
            g.parameter(pair.clone(), loc),
            g.parameter(TensorType::new(DType::BF16, [2, 3]), loc),
            g.parameter(pair.clone(), loc),
            g.parameter(other, loc),
        ];
        let values: Vec<ArrayD<f64>> = (0..xs.len())
            .map(|i| {
                let n = g.nodes[xs[i]].ty.elements();
                let mut v: Vec<f64> = (0..n).map(|j| (i * 10 + j) as f64 - 20.0).collect();
                v[i % n] = [f64::NAN, f64::INFINITY, -f64::INFINITY][i % 3];
                ArrayD::from_shape_vec(IxDyn(&g.nodes[xs[i]].ty.dims), v).unwrap()
            })
            .collect();
        let read_all_widened = |stack: usize, up_to: usize, widen: bool| {
            let mut g = g.clone();
            let groups = stats(&mut g, &xs, stack, up_to, widen, loc).unwrap();
            g.outputs = groups.iter().map(|&(v, _)| v).collect();
            let out = g.evaluate(&values).unwrap();
            let mut by_node = std::collections::BTreeMap::new();
            for ((_, of), o) in groups.iter().zip(&out) {
                let o: Vec<f64> = o.iter().copied().collect();
                for (j, &x) in of.iter().enumerate() {
                    let (count, min, max) = FiniteStats::read(DType::F32, &o[3 * j..]);
                    by_node.insert(x, (count, min.to_bits(), max.to_bits()));
                }
            }
            (groups.iter().map(|(_, of)| of.clone()).collect::<Vec<_>>(), by_node, g.nodes.len())
        };
        let read_all = |stack: usize, up_to: usize| read_all_widened(stack, up_to, false);
        let (alone, want, _) = read_all(1, usize::MAX);
        assert_eq!(alone, vec![xs.to_vec()]);
        let (stacked, got, nodes) = read_all(2, usize::MAX);
        // [x0, x2] stacked, x1 and x5 stacked, x3 alone (bf16), x4 alone (the run of its size is full).
        assert_eq!(stacked, vec![vec![xs[0], xs[2], xs[1], xs[5], xs[3], xs[4]]]);
        assert_eq!(got, want, "each node's three values, stacked or alone");
        assert!(
            nodes < read_all(1, usize::MAX).2 + 8,
            "stacking adds a few reshapes and joins, not a reduction per node"
        );
        // Only nodes of up to 5 elements stacked: x1 and x5; the others (6 elements) alone.
        let (capped, got, _) = read_all(2, 5);
        assert_eq!(capped, vec![vec![xs[0], xs[1], xs[5], xs[2], xs[3], xs[4]]]);
        assert_eq!(got, want, "each node's three values under a size cap");
        // Widened, the bf16 node is reduced as f32 behind a barrier: the same three values.
        let (_, alone, widened_nodes) = read_all_widened(1, usize::MAX, true);
        let (_, stacked, _) = read_all_widened(2, usize::MAX, true);
        assert_eq!((alone, stacked), (want.clone(), want), "widening changes no statistic");
        assert_eq!(widened_nodes, read_all(1, usize::MAX).2 + 2, "a convert and a barrier for the one bf16 node");
    }

    /// Groups are runs of one dtype, at most `GROUP_TENSORS` long; each counts all of its members' elements.
    #[test]
    fn grouped_counts_cover_each_group() {
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        let mut g = Graph::new();
        let mut xs = vec![g.parameter(TensorType::new(DType::F32, [2, 3]), loc)];
        xs.push(g.parameter(TensorType::new(DType::F32, []), loc));
        xs.push(g.parameter(TensorType::new(DType::F16, [4]), loc));
        xs.extend((0..GROUP_TENSORS + 1).map(|_| g.parameter(TensorType::new(DType::F32, [2]), loc)));
        let types: Vec<TensorType> = xs.iter().map(|&x| g.nodes[x].ty.clone()).collect();
        let groups = count_groups(&types.iter().collect::<Vec<_>>(), &Counting::FOR_GPU);
        let n = xs.len();
        assert_eq!(groups, vec![0..2, 2..3, 3..3 + GROUP_TENSORS, 3 + GROUP_TENSORS..n]);
        let counts = count_nonfinite_grouped(&mut g, &xs, &Counting::FOR_GPU, loc).unwrap().unwrap();
        g.outputs = vec![counts];
        let mut values = vec![
            ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.0, f64::NAN, 0.0, 0.0, f64::INFINITY, 3.0]).unwrap(),
            ArrayD::from_elem(IxDyn(&[]), f64::NEG_INFINITY),
            ArrayD::from_shape_vec(IxDyn(&[4]), vec![70000.0, 1.0, 2.0, 3.0]).unwrap(),
        ];
        values.extend(
            (0..GROUP_TENSORS + 1).map(|i| ArrayD::from_elem(IxDyn(&[2]), if i == 5 { f64::NAN } else { 1.0 })),
        );
        let out = g.evaluate(&values).unwrap();
        assert_eq!(out[0].iter().copied().collect::<Vec<_>>(), vec![3.0, 1.0, 2.0, 0.0]);
    }

    /// A guarded output is the new value while every counted output is finite, else the parameter it replaces;
    /// unguarded outputs keep their value either way.
    #[test]
    fn a_guard_returns_the_old_state_on_a_trip() {
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        let mut g = Graph::new();
        let ty = TensorType::new(DType::F32, [2]);
        let (w, x) = (g.parameter(ty.clone(), loc), g.parameter(ty, loc));
        let new_w = g.push(Op::Binary(crate::ops::elementwise::Binary { kind: BinaryKind::Div }), vec![w, x], loc);
        let new_w = new_w.unwrap();
        g.outputs = vec![new_w, new_w];
        let counts = count_nonfinite_grouped(&mut g, &[new_w], &alone(None), loc).unwrap().unwrap();
        let trip = tripped(&mut g, counts, loc).unwrap();
        guard(&mut g, trip, &[(0, 0)], false, loc).unwrap();
        let run = |x: [f64; 2]| {
            let w = ArrayD::from_shape_vec(IxDyn(&[2]), vec![3.0, 4.0]).unwrap();
            let out = g.evaluate(&[w, ArrayD::from_shape_vec(IxDyn(&[2]), x.to_vec()).unwrap()]).unwrap();
            out.iter().map(|o| o.iter().copied().collect::<Vec<_>>()).collect::<Vec<_>>()
        };
        assert_eq!(run([1.0, 2.0]), vec![vec![3.0, 2.0], vec![3.0, 2.0]]);
        assert_eq!(run([1.0, 0.0]), vec![vec![3.0, 4.0], vec![3.0, f64::INFINITY]]);
    }

    /// A weight's low-precision copy, paired with its old value, is written as the convert of the guarded weight:
    /// the weight's new value's copy while nothing trips, the kept weight's on a trip, and the old copy is read by
    /// nothing (here it differs from the old weight's convert, so the result says which was taken).
    #[test]
    fn a_paired_copy_converts_the_kept_weight() {
        use crate::ops::elementwise::{Binary, Convert};
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        let mut g = Graph::new();
        let w = g.parameter(TensorType::new(DType::F32, [2]), loc);
        let copy = g.parameter(TensorType::new(DType::F16, [2]), loc);
        let x = g.parameter(TensorType::new(DType::F32, [2]), loc);
        let new_w = g.push(Op::Binary(Binary { kind: BinaryKind::Div }), vec![w, x], loc).unwrap();
        let to_f16 = Op::Convert(Convert { from: DType::F32, to: DType::F16 });
        let new_copy = g.push(to_f16, vec![new_w], loc).unwrap();
        g.outputs = vec![new_w, new_copy];
        let counts = count_nonfinite_grouped(&mut g, &[x], &alone(None), loc).unwrap().unwrap();
        let trip = tripped(&mut g, counts, loc).unwrap();
        guard(&mut g, trip, &[(0, 0), (1, 1)], false, loc).unwrap();
        assert!(g.nodes.iter().all(|n| !n.operands.contains(&copy)), "the old copy is read");
        let run = |x: f64| {
            let w = ArrayD::from_shape_vec(IxDyn(&[2]), vec![3.0, 0.375]).unwrap();
            let copy = ArrayD::from_elem(IxDyn(&[2]), 7.0);
            let out = g.evaluate(&[w, copy, ArrayD::from_elem(IxDyn(&[2]), x)]).unwrap();
            out.iter().map(|o| o.iter().copied().collect::<Vec<_>>()).collect::<Vec<_>>()
        };
        assert_eq!(run(1.0), vec![vec![3.0, 0.375]; 2]);
        assert_eq!(run(f64::NAN), vec![vec![3.0, 0.375]; 2]);
        assert_eq!(run(2.0), vec![vec![1.5, 0.1875]; 2]);
        // A pair of different types is still refused.
        let mut bad = g.clone();
        bad.outputs = vec![new_w, new_w];
        assert!(guard(&mut bad, trip, &[(1, 0)], false, loc).unwrap_err().contains("guarding output 0"));
    }

    /// What enters an update: its gradient and the loss, not an unpaired copy of the guarded weight (the update
    /// computed again inside the count) nor the old state; a copy of that copy is counted like any output.
    #[test]
    fn update_inputs_leave_out_copies_of_guarded_state() {
        use crate::ops::elementwise::{Binary, Convert};
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        let mut g = Graph::new();
        let w = g.parameter(TensorType::new(DType::F32, [2]), loc);
        let grad = g.parameter(TensorType::new(DType::F32, [2]), loc);
        let loss = g.parameter(TensorType::new(DType::F32, []), loc);
        let new_w = g.push(Op::Binary(Binary { kind: BinaryKind::Sub }), vec![w, grad], loc).unwrap();
        let copy = g.push(Op::Convert(Convert { from: DType::F32, to: DType::BF16 }), vec![new_w], loc).unwrap();
        let copy2 = g.push(Op::Convert(Convert { from: DType::BF16, to: DType::F16 }), vec![copy], loc).unwrap();
        g.outputs = vec![new_w, copy, loss];
        assert_eq!(update_inputs(&g, &[(0, 0)]), vec![grad, loss]);
        g.outputs.push(copy2);
        assert_eq!(update_inputs(&g, &[(0, 0)]), vec![grad, loss, copy2]);
    }

    /// A sticky flag: a program given a set flag keeps its state and hands the flag on set, even when its own
    /// counts are zero; given a clear one, it sets it exactly when it trips.
    #[test]
    fn a_set_flag_keeps_the_state_and_stays_set() {
        let loc = Loc { file: "t.rs", line: 1, col: 1 };
        let mut g = Graph::new();
        let ty = TensorType::new(DType::F32, [2]);
        let (w, x) = (g.parameter(ty.clone(), loc), g.parameter(ty, loc));
        let flag = g.parameter(TensorType::new(DType::Bool, []), loc);
        let new_w = g.push(Op::Binary(crate::ops::elementwise::Binary { kind: BinaryKind::Div }), vec![w, x], loc);
        g.outputs = vec![new_w.unwrap(), flag];
        let counts = count_nonfinite_grouped(&mut g, &[x], &alone(None), loc).unwrap().unwrap();
        let trip = tripped(&mut g, counts, loc).unwrap();
        let flag_out = g.outputs[1];
        let next = sticky(&mut g, flag_out, trip, loc).unwrap();
        g.outputs[1] = next;
        guard(&mut g, next, &[(0, 0)], false, loc).unwrap();
        let run = |x: f64, flag: f64| {
            let w = ArrayD::from_shape_vec(IxDyn(&[2]), vec![3.0, 4.0]).unwrap();
            let x = ArrayD::from_elem(IxDyn(&[2]), x);
            let out = g.evaluate(&[w, x, ArrayD::from_elem(IxDyn(&[]), flag)]).unwrap();
            out.iter().map(|o| o.iter().copied().collect::<Vec<_>>()).collect::<Vec<_>>()
        };
        assert_eq!(run(2.0, 0.0), vec![vec![1.5, 2.0], vec![0.0]]);
        assert_eq!(run(f64::NAN, 0.0), vec![vec![3.0, 4.0], vec![1.0]]);
        assert_eq!(run(2.0, 1.0), vec![vec![3.0, 4.0], vec![1.0]]);
    }
}
