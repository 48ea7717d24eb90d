//! Scatter variants beside `scatter_add` (`array_ops.rs`): `scatter` (replace), `scatter_max`, `scatter_min`. All
//! take `index_select`'s layout: `updates` is shaped like `self.index_select(axis, indices)`, and indices clamp
//! to the axis the same way.

use lazuli_hlo::{
    BroadcastInDim, Compare, CompareDir, DType, Iota, Loc, Op, Reshape, ScatterAdd, ScatterKind, ScatterReduce, Select,
    Take, TensorType,
};

use crate::error::{Error, Result};
use crate::graph::constants::constant_like;
use crate::graph::record::{raise, try_apply, try_axis};
use crate::graph::tensor::Tensor;

/// `t` (of `dims[map[i]]`-sized dimensions) broadcast to `dims`.
fn spread(t: &Tensor, dims: &[usize], map: Vec<usize>, loc: Loc) -> Result<Tensor> {
    try_apply(Op::BroadcastInDim(BroadcastInDim { dims: dims.to_vec(), map }), &[t], loc)
}

fn scatter_reduce_at(x: &Tensor, ax: isize, idx: &Tensor, upd: &Tensor, kind: ScatterKind, loc: Loc) -> Result<Tensor> {
    let name = if kind == ScatterKind::Max { "scatter_max" } else { "scatter_min" };
    let axis = try_axis(ax, x.rank(), name, loc)?;
    try_apply(Op::ScatterReduce(ScatterReduce { axis, kind }), &[x, idx, upd], loc)
}

/// NumPy's `x[..., indices, ...] = updates` along `axis`, the last update in the indices' row-major order
/// winning where indices repeat. Recorded as: the winning position per slot (a scatter-max of positions), the
/// winners scattered by `scatter_add` into zeros, and a select against `x`; so the gradient is those ops': the
/// cotangent of `x` where nothing landed, of each winning update where it landed, zero for the losers.
fn scatter_replace_at(x: &Tensor, ax: isize, idx: &Tensor, upd: &Tensor, loc: Loc) -> Result<Tensor> {
    let axis = try_axis(ax, x.rank(), "scatter", loc)?;
    check_operands(x, axis, idx, upd, loc)?;
    let (wins, hit) = last_writers(x.dims()[axis], idx, loc)?;
    let wins = spread(&wins, upd.dims(), (axis..axis + idx.rank()).collect(), loc)?;
    let hit = spread(&hit, x.dims(), vec![axis], loc)?;
    let upd_zeros = constant_like(0.0, x.dtype(), upd.dims(), loc);
    let winners = try_apply(Op::Select(Select), &[&wins, upd, &upd_zeros], loc)?;
    let zeros = constant_like(0.0, x.dtype(), x.dims(), loc);
    let written = try_apply(Op::ScatterAdd(ScatterAdd { axis }), &[&zeros, idx, &winners], loc)?;
    try_apply(Op::Select(Select), &[&hit, &written, x], loc)
}

/// `scatter`'s operands, checked here so that errors name `scatter` rather than the ops it records.
fn check_operands(x: &Tensor, axis: usize, idx: &Tensor, upd: &Tensor, loc: Loc) -> Result<()> {
    let op = "scatter";
    let (xt, it, ut) = (x.tensor_type(), idx.tensor_type(), upd.tensor_type());
    if x.dtype() == DType::Bool || !idx.dtype().is_int() {
        let why = format!("{op} is not defined for {xt} indexed by {it}: x must be numbers, indices integers");
        return Err(Error::WrongDType { op, dtypes: vec![x.dtype(), idx.dtype(), upd.dtype()], why, at: loc });
    }
    let shapes = vec![x.dims().to_vec(), idx.dims().to_vec(), upd.dims().to_vec()];
    if x.dims()[axis] == 0 && idx.elements() > 0 {
        let why = format!("{op}: cannot index the empty axis {axis} of {xt}");
        return Err(Error::ShapeMismatch { op, shapes, why, at: loc });
    }
    let want = TensorType::new(x.dtype(), [&x.dims()[..axis], idx.dims(), &x.dims()[axis + 1..]].concat());
    if *ut != want {
        let why = format!("{op}: updates must be {want} for {xt} indexed by {it}, got {ut}");
        return Err(Error::ShapeMismatch { op, shapes, why, at: loc });
    }
    Ok(())
}

/// For indices into an axis of size `n`: whether each index's update is the last one to its slot (bool, the
/// indices' shape), and whether each slot is written at all (bool `[n]`).
fn last_writers(n: usize, idx: &Tensor, loc: Loc) -> Result<(Tensor, Tensor)> {
    let m = idx.elements();
    let positions = try_apply(Op::Iota(Iota { dim: 0, ty: TensorType::new(DType::I64, [m]) }), &[], loc)?;
    let positions = try_apply(Op::Reshape(Reshape { dims: idx.dims().to_vec() }), &[&positions], loc)?;
    let nobody = constant_like(-1.0, DType::I64, &[n], loc);
    let last = scatter_reduce_at(&nobody, 0, idx, &positions, ScatterKind::Max, loc)?;
    let last_at_index = try_apply(Op::Take(Take { axis: 0 }), &[&last, idx], loc)?;
    let compare = |dir, a: &Tensor, b: &Tensor| try_apply(Op::Compare(Compare { dir }), &[a, b], loc);
    let wins = compare(CompareDir::Eq, &last_at_index, &positions)?;
    let hit = compare(CompareDir::Ge, &last, &constant_like(0.0, DType::I64, &[n], loc))?;
    Ok((wins, hit))
}

impl Tensor {
    /// This tensor with `updates` written at `indices` along `axis` (NumPy's `x[:, idx] = updates` for `axis`
    /// 1). `updates` has the shape of `self.index_select(axis, indices)`; out-of-range indices clamp like
    /// `index_select`'s. Where an index repeats, the last update (in the indices' row-major order) wins, on every
    /// device: the result does not depend on the order XLA applies updates in. The gradient reaches `self` where
    /// nothing was written and each update that won.
    #[track_caller]
    pub fn scatter(&self, axis: isize, indices: &Tensor, updates: &Tensor) -> Tensor {
        scatter_replace_at(self, axis, indices, updates, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::scatter`], with [`Error::BadAxis`], [`Error::WrongDType`] or [`Error::ShapeMismatch`] (updates
    /// not shaped like `index_select`'s result) instead of a panic.
    #[track_caller]
    pub fn try_scatter(&self, axis: isize, indices: &Tensor, updates: &Tensor) -> Result<Tensor> {
        scatter_replace_at(self, axis, indices, updates, Loc::caller())
    }

    /// Each element the largest of its value and the updates landing on it (PyTorch's `scatter_reduce` with
    /// `"amax"` and `include_self`, in `index_select`'s layout; repeated indices all count). NaN wins. The
    /// gradient of each result element is shared evenly among the values equal to it, as in PyTorch.
    #[track_caller]
    pub fn scatter_max(&self, axis: isize, indices: &Tensor, updates: &Tensor) -> Tensor {
        scatter_reduce_at(self, axis, indices, updates, ScatterKind::Max, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::scatter_max`] with the smallest value instead (`"amin"`).
    #[track_caller]
    pub fn scatter_min(&self, axis: isize, indices: &Tensor, updates: &Tensor) -> Tensor {
        scatter_reduce_at(self, axis, indices, updates, ScatterKind::Min, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::scatter_max`] or [`Tensor::scatter_min`] (`max` false), with [`Error::BadAxis`],
    /// [`Error::WrongDType`] or [`Error::ShapeMismatch`] instead of a panic.
    #[track_caller]
    pub fn try_scatter_reduce(&self, axis: isize, indices: &Tensor, updates: &Tensor, max: bool) -> Result<Tensor> {
        let kind = if max { ScatterKind::Max } else { ScatterKind::Min };
        scatter_reduce_at(self, axis, indices, updates, kind, Loc::caller())
    }
}
