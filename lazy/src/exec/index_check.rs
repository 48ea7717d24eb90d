//! Checked indexing (`Tensor::index_select_checked`; `index_select`, `embedding` and cross-entropy targets under
//! `LAZULI_CHECK_INDICES=1`)
//! without a host sync per call. The indexing op records beside its gather a small report computed in the same
//! program: how many indices are out of range, the first bad one's position and its value (`i64[3]`). The report
//! is watched on this thread; every materialization while it is pending computes it along with its targets, and
//! it is read once computed: right after a read's own materialization (which waits for the step anyway), at the
//! start of the next materialization, and by `wait()`. A bad index is then [`Error::IndexOutOfRange`], naming the
//! index, its position, the valid range and the line of the indexing op; the gather itself still clamps, as XLA's
//! does.

use std::cell::RefCell;
use std::rc::Rc;

use lazuli_hlo::{
    BinaryKind, Compare, CompareDir, Concatenate, Convert, DType, Iota, Loc, Op, Reduce, ReduceKind, Reshape, Select,
    Take, TensorType,
};

use crate::error::{Error, Result};
use crate::graph::constants::constant_like;
use crate::graph::element::bytes_to_f64;
use crate::graph::record::{apply, try_apply};
use crate::graph::tensor::{Node, Tensor};

/// One checked indexing op whose report has not been read yet.
struct Watched {
    report: Tensor,
    op: &'static str,
    axis: usize,
    size: usize,
    index_dims: Vec<usize>,
    at: Loc,
}

thread_local! {
    static WATCHED: RefCell<Vec<Watched>> = const { RefCell::new(Vec::new()) };
}

/// Whether `LAZULI_CHECK_INDICES` asks for every `index_select` and `embedding` to be checked (read once, at the
/// first indexing op; a bad value stops at that op's line).
pub(crate) fn checking_all(loc: Loc) -> bool {
    static ON: std::sync::OnceLock<std::result::Result<bool, String>> = std::sync::OnceLock::new();
    match ON.get_or_init(crate::settings::check_indices) {
        Ok(on) => *on,
        Err(why) => crate::graph::record::fail(loc, why),
    }
}

/// Record the report of `indices` into an axis `axis` of size `size` for the op `op` at `at`, and watch it.
pub(crate) fn watch(op: &'static str, indices: &Tensor, axis: usize, size: usize, at: Loc) -> Result<()> {
    let total = indices.elements();
    if total == 0 {
        return Ok(());
    }
    let report = report(indices, size, at)?;
    let index_dims = indices.dims().to_vec();
    WATCHED.with_borrow_mut(|w| w.push(Watched { report, op, axis, size, index_dims, at }));
    Ok(())
}

/// `i64[3]`: the number of indices outside `[0, size)`, the row-major position of the first (`total` if none),
/// and its value (with none bad, the last index's: never read).
fn report(indices: &Tensor, size: usize, at: Loc) -> Result<Tensor> {
    let total = indices.elements();
    let i64_of = |t: &Tensor| -> Result<Tensor> {
        if t.dtype() == DType::I64 {
            return Ok(t.clone());
        }
        try_apply(Op::Convert(Convert { from: t.dtype(), to: DType::I64 }), &[t], at)
    };
    let flat = try_apply(Op::Reshape(Reshape { dims: vec![total] }), &[&i64_of(indices)?], at)?;
    let c = |v: f64| constant_like(v, DType::I64, &[total], at);
    // Unsigned indices above i64's range wrap negative in the conversion and count as bad, as they are.
    let below = apply(Op::Compare(Compare { dir: CompareDir::Lt }), &[&flat, &c(0.0)], at);
    let above = apply(Op::Compare(Compare { dir: CompareDir::Ge }), &[&flat, &c(size as f64)], at);
    let bad = below.binary_at(&above, BinaryKind::Or, at);
    let position = apply(Op::Iota(Iota { dim: 0, ty: TensorType::new(DType::I64, [total]) }), &[], at);
    let bad_position = apply(Op::Select(Select), &[&bad, &position, &c(total as f64)], at);
    let reduce = |t: &Tensor, kind| apply(Op::Reduce(Reduce { kind, axes: vec![0], keep: true }), &[t], at);
    let first = reduce(&bad_position, ReduceKind::Min);
    let count = reduce(&i64_of(&bad)?, ReduceKind::Sum);
    let last = constant_like((total - 1) as f64, DType::I64, &[1], at);
    let first_in_range = first.binary_at(&last, BinaryKind::Min, at);
    let value = apply(Op::Take(Take { axis: 0 }), &[&flat, &first_in_range], at);
    try_apply(Op::Concatenate(Concatenate { dim: 0 }), &[&count, &first, &value], at)
}

/// `targets` and the watched reports still to compute (the step computes them too).
pub(crate) fn with_reports(targets: &[Rc<Node>]) -> Option<Vec<Rc<Node>>> {
    WATCHED.with_borrow(|w| {
        let pending: Vec<Rc<Node>> = w
            .iter()
            .map(|c| c.report.node.clone())
            .filter(|n| n.is_pending() && !targets.iter().any(|t| Rc::ptr_eq(t, n)))
            .collect();
        (!pending.is_empty()).then(|| targets.iter().cloned().chain(pending).collect())
    })
}

/// Read every computed report; the first with a bad index is the error (the others are dropped with it: one
/// step's first error is what the user fixes).
pub(crate) fn read_computed() -> Result<()> {
    let done: Vec<Watched> = WATCHED.with_borrow_mut(|w| {
        if w.is_empty() {
            return Vec::new();
        }
        let (done, pending) = std::mem::take(w).into_iter().partition(|c| !c.report.node.is_pending());
        *w = pending;
        done
    });
    for c in done {
        let data = c.report.node.lock().data.clone();
        let Some(data) = data else { continue };
        let v = bytes_to_f64(DType::I64, &data.to_host(&c.report.node.ty)?);
        if v[0] > 0.0 {
            return Err(Error::IndexOutOfRange {
                op: c.op,
                index: v[2] as i64,
                position: unravel(v[1] as usize, &c.index_dims),
                axis: c.axis,
                size: c.size,
                count: v[0] as u64,
                total: c.index_dims.iter().product(),
                at: c.at,
            });
        }
    }
    Ok(())
}

/// The multi-index of row-major position `p` in `dims`.
fn unravel(mut p: usize, dims: &[usize]) -> Vec<usize> {
    let mut at = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        at[d] = p % dims[d];
        p /= dims[d];
    }
    at
}
