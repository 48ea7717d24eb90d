//! Array ops: slicing, joining, padding and flipping; indexing by integer tensors (index_select, embedding,
//! scatter_add, one_hot); triangular masks; clamp; argmax/argmin; running sums; erf. Every op is
//! `#[track_caller]`, accepts negative axes and reports bad input as a panic naming the caller's line.

use lazuli_hlo::{
    ArgKind, ArgReduce, BinaryKind, BroadcastInDim, Compare, CompareDir, Concatenate, CumSum, DType, Erf, Iota, Loc,
    Op, Pad, Reshape, Reverse, ScatterAdd, Slice, Take, TensorType,
};

use crate::error::{Error, Result};
use crate::exec::index_check;
use crate::graph::constants::constant_like;
use crate::graph::record::{apply, axis, fail, raise, try_apply, try_axis, Operand};
use crate::graph::tensor::Tensor;

/// `iota` along `dim` of an i64 tensor of `dims`.
fn iota(dims: &[usize], dim: usize, loc: Loc) -> Tensor {
    apply(Op::Iota(Iota { dim, ty: TensorType::new(DType::I64, dims) }), &[], loc)
}

/// Bool `[rows, cols]`: `j - i <= k` (lower) or `j - i >= k` (upper) at row i, column j.
fn triangle(rows: usize, cols: usize, k: isize, lower: bool, loc: Loc) -> Tensor {
    let (i, j) = (iota(&[rows, cols], 0, loc), iota(&[rows, cols], 1, loc));
    let diff = j.binary_at(&i, BinaryKind::Sub, loc);
    let kk = constant_like(k as f64, DType::I64, &[rows, cols], loc);
    let dir = if lower { CompareDir::Le } else { CompareDir::Ge };
    apply(Op::Compare(Compare { dir }), &[&diff, &kk], loc)
}

/// `t` sliced along one axis, checked at `loc`.
fn slice_at(
    t: &Tensor,
    op: &'static str,
    ax: isize,
    (start, end, step): (usize, usize, usize),
    loc: Loc,
) -> Result<Tensor> {
    let a = try_axis(ax, t.rank(), op, loc)?;
    let n = t.dims()[a];
    if step == 0 {
        let why = format!("{op}: step 0 along axis {ax} of {}", t.tensor_type());
        return Err(Error::InvalidArgument { op, why, at: loc });
    }
    if start > end || end > n {
        let why = format!("{op}: {start}..{end} step {step} is out of range for axis {ax} of {}", t.tensor_type());
        return Err(Error::ShapeMismatch { op, shapes: vec![t.dims().to_vec()], why, at: loc });
    }
    if (start, end, step) == (0, n, 1) {
        return Ok(t.clone());
    }
    try_apply(Op::Slice(Slice::along(t.dims(), a, start, end, step)), &[t], loc)
}

/// Bool one-hot of the integer ids `t`: `t.dims() + [n]`.
pub(crate) fn one_hot_mask(t: &Tensor, n: usize, loc: Loc) -> Tensor {
    if !t.dtype().is_int() {
        fail(loc, format!("one_hot: ids must have an integer dtype, got {}", t.tensor_type()));
    }
    let wide = if t.dtype() == DType::I64 {
        t.clone()
    } else {
        apply(Op::Convert(lazuli_hlo::Convert { from: t.dtype(), to: DType::I64 }), &[t], loc)
    };
    let mut dims = t.dims().to_vec();
    dims.push(n);
    let map = (0..t.rank()).collect();
    let wide = apply(Op::BroadcastInDim(BroadcastInDim { dims: dims.clone(), map }), &[&wide], loc);
    let classes = iota(&dims, t.rank(), loc);
    apply(Op::Compare(Compare { dir: CompareDir::Eq }), &[&wide, &classes], loc)
}

/// `t` where the triangle holds on its last two dimensions, zero elsewhere.
fn triangle_part(t: &Tensor, k: isize, lower: bool, loc: Loc) -> Tensor {
    let r = t.rank();
    if r < 2 {
        fail(loc, format!("tril/triu: needs rank ≥ 2, got {}", t.tensor_type()));
    }
    let mask = triangle(t.dims()[r - 2], t.dims()[r - 1], k, lower, loc).broadcast_at(t.dims(), loc);
    let zeros = constant_like(0.0, t.dtype(), t.dims(), loc);
    apply(Op::Select(lazuli_hlo::Select), &[&mask, t, &zeros], loc)
}

/// The index of the extreme element of `t` along one axis.
fn arg_reduce(t: &Tensor, kind: ArgKind, ax: isize, loc: Loc) -> Tensor {
    let a = axis(ax, t.rank(), "argmax/argmin", loc);
    apply(Op::ArgReduce(ArgReduce { kind, axis: a }), &[t], loc)
}

impl Tensor {
    /// Elements `start..end` along `axis`. Panics if the range does not fit the dimension.
    #[track_caller]
    pub fn slice(&self, axis: isize, start: usize, end: usize) -> Tensor {
        slice_at(self, "slice", axis, (start, end, 1), Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::slice`], with [`Error::ShapeMismatch`] when the range does not fit the dimension and
    /// [`Error::BadAxis`] for an axis out of range.
    #[track_caller]
    pub fn try_slice(&self, axis: isize, start: usize, end: usize) -> Result<Tensor> {
        slice_at(self, "slice", axis, (start, end, 1), Loc::caller())
    }

    /// Elements `start, start+step, …` below `end` along `axis`.
    #[track_caller]
    pub fn slice_step(&self, axis: isize, start: usize, end: usize, step: usize) -> Tensor {
        slice_at(self, "slice", axis, (start, end, step), Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// `len` elements from `start` along `axis`.
    #[track_caller]
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Tensor {
        self.narrow_at(axis, start, len, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::narrow`], with [`Error::ShapeMismatch`] when the range does not fit the dimension (a batch
    /// window past the end of the data, say).
    #[track_caller]
    pub fn try_narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        self.narrow_at(axis, start, len, Loc::caller())
    }

    fn narrow_at(&self, axis: isize, start: usize, len: usize, loc: Loc) -> Result<Tensor> {
        let Some(end) = start.checked_add(len) else {
            let why = format!("narrow: {start} + {len} overflows");
            return Err(Error::InvalidArgument { op: "narrow", why, at: loc });
        };
        slice_at(self, "narrow", axis, (start, end, 1), loc)
    }

    /// Join tensors along `axis`; they must share dtype, rank and every other dimension.
    #[track_caller]
    pub fn concat(tensors: &[&Tensor], axis: isize) -> Tensor {
        Tensor::concat_at(tensors, axis, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::concat`], with [`Error::ShapeMismatch`] or [`Error::WrongDType`] when the tensors do not fit
    /// together.
    #[track_caller]
    pub fn try_concat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        Tensor::concat_at(tensors, axis, Loc::caller())
    }

    fn concat_at(tensors: &[&Tensor], axis: isize, loc: Loc) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(Error::InvalidArgument {
                op: "concat",
                why: "concat: needs at least one tensor".into(),
                at: loc,
            });
        };
        let a = try_axis(axis, first.rank(), "concat", loc)?;
        try_apply(Op::Concatenate(Concatenate { dim: a }), tensors, loc)
    }

    /// Join tensors of one shape along a new dimension `axis` (`-1` appends it last).
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], axis: isize) -> Tensor {
        Tensor::stack_at(tensors, axis, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::stack`], with [`Error::ShapeMismatch`] or [`Error::WrongDType`] when the tensors differ.
    #[track_caller]
    pub fn try_stack(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        Tensor::stack_at(tensors, axis, Loc::caller())
    }

    fn stack_at(tensors: &[&Tensor], axis: isize, loc: Loc) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(Error::InvalidArgument {
                op: "stack",
                why: "stack: needs at least one tensor".into(),
                at: loc,
            });
        };
        let a = try_axis(axis, first.rank() + 1, "stack", loc)?;
        if let Some(t) = tensors.iter().find(|t| t.tensor_type() != first.tensor_type()) {
            let why = format!("stack: tensors must have one type, got {} and {}", first.tensor_type(), t.tensor_type());
            return Err(if t.dtype() != first.dtype() {
                Error::WrongDType { op: "stack", dtypes: tensors.iter().map(|t| t.dtype()).collect(), why, at: loc }
            } else {
                Error::ShapeMismatch {
                    op: "stack",
                    shapes: tensors.iter().map(|t| t.dims().to_vec()).collect(),
                    why,
                    at: loc,
                }
            });
        }
        let mut dims = first.dims().to_vec();
        dims.insert(a, 1);
        let expanded = tensors
            .iter()
            .map(|t| try_apply(Op::Reshape(Reshape { dims: dims.clone() }), &[t], loc))
            .collect::<Result<Vec<Tensor>>>()?;
        let refs: Vec<&Tensor> = expanded.iter().collect();
        try_apply(Op::Concatenate(Concatenate { dim: a }), &refs, loc)
    }

    /// Pad every dimension with `(before, after)` elements of `value` (a host scalar becomes a program
    /// parameter of this tensor's dtype; a rank-0 tensor of that dtype works too). One pair per dimension.
    #[track_caller]
    pub fn pad(&self, pads: &[(usize, usize)], value: impl Operand) -> Tensor {
        let loc = Loc::caller();
        if pads.len() != self.rank() {
            fail(
                loc,
                format!("pad: {} (before, after) pairs for {}; give one per dimension", pads.len(), self.tensor_type()),
            );
        }
        let v = value.into_tensor(self.dtype(), loc);
        let op = Pad {
            low: pads.iter().map(|p| p.0).collect(),
            high: pads.iter().map(|p| p.1).collect(),
            interior: vec![0; self.rank()],
        };
        apply(Op::Pad(op), &[self, &v], loc)
    }

    /// Reverse the order of elements along `axes`.
    #[track_caller]
    pub fn flip(&self, axes: &[isize]) -> Tensor {
        let loc = Loc::caller();
        let mut dims: Vec<usize> = axes.iter().map(|&a| axis(a, self.rank(), "flip", loc)).collect();
        dims.sort_unstable();
        dims.dedup();
        apply(Op::Reverse(Reverse { dims }), &[self], loc)
    }

    /// Select entries along `axis` by an integer tensor of any shape: the result has `axis` replaced by the
    /// indices' dimensions. Out-of-range indices clamp to `[0, n-1]` (XLA's gather semantics; no error), unless
    /// `LAZULI_CHECK_INDICES=1` makes every call [`Tensor::index_select_checked`].
    #[track_caller]
    pub fn index_select(&self, axis: isize, indices: &Tensor) -> Tensor {
        self.index_select_at(axis, indices, false, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::index_select`], with [`Error::BadAxis`] or [`Error::WrongDType`] (indices that are not
    /// integers) instead of a panic.
    #[track_caller]
    pub fn try_index_select(&self, axis: isize, indices: &Tensor) -> Result<Tensor> {
        self.index_select_at(axis, indices, false, Loc::caller())
    }

    /// [`Tensor::index_select`] whose indices are checked on the device: an index outside `[0, n)` is
    /// [`Error::IndexOutOfRange`] (the first bad index in row-major order, its position in the indices, the valid
    /// range, the count of bad ones and this call's line), returned by the read of any result of the step that
    /// computed it, or by the next materialization or `wait()`. The check is a few small ops in the same program
    /// and forces no host sync of its own; the result is still computed with clamped indices.
    #[track_caller]
    pub fn index_select_checked(&self, axis: isize, indices: &Tensor) -> Tensor {
        self.index_select_at(axis, indices, true, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::index_select_checked`], with [`Error::BadAxis`] or [`Error::WrongDType`] at the call instead of
    /// a panic (the indices' values are still checked when the step runs).
    #[track_caller]
    pub fn try_index_select_checked(&self, axis: isize, indices: &Tensor) -> Result<Tensor> {
        self.index_select_at(axis, indices, true, Loc::caller())
    }

    fn index_select_at(&self, axis: isize, indices: &Tensor, checked: bool, loc: Loc) -> Result<Tensor> {
        let a = try_axis(axis, self.rank(), "index_select", loc)?;
        let out = try_apply(Op::Take(Take { axis: a }), &[self, indices], loc)?;
        if checked || index_check::checking_all(loc) {
            index_check::watch("index_select", indices, a, self.dims()[a], loc)?;
        }
        Ok(out)
    }

    /// numpy's `take_along_axis(x, indices, axis)`: `out[..., j, ...] = x[..., indices[..., j, ...], ...]` along
    /// `axis`. `indices` is an integer tensor of `x`'s rank; its other dimensions broadcast against `x`'s (numpy's
    /// rules), so the result has the broadcast shape with `indices`' length along `axis`. Negative indices count
    /// from the end as in numpy (-1 is the last); indices still outside `[-n, n)` clamp to `[0, n-1]`, as
    /// [`Tensor::index_select`]'s do (no error: the device cannot raise one). The gradient adds the cotangent
    /// back at the indices (repeated indices accumulate). For example
    /// `logits.take_along_axis(&targets.reshape(&[b, t, 1]), -1)` is each position's target logit, `[b, t, 1]`.
    ///
    /// Recorded as a gather from the flattened `x` at computed linear indices (`index_select`'s op), so its
    /// lowering, reference and gradient are that op's.
    #[track_caller]
    pub fn take_along_axis(&self, indices: &Tensor, axis: isize) -> Tensor {
        self.take_along_axis_at(indices, axis, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::take_along_axis`], with [`Error::BadAxis`], [`Error::WrongDType`] (indices that are not
    /// integers), [`Error::ShapeMismatch`] (ranks differ, shapes do not broadcast) or [`Error::InvalidArgument`]
    /// (indices into an empty axis) instead of a panic.
    #[track_caller]
    pub fn try_take_along_axis(&self, indices: &Tensor, axis: isize) -> Result<Tensor> {
        self.take_along_axis_at(indices, axis, Loc::caller())
    }

    pub(crate) fn take_along_axis_at(&self, indices: &Tensor, axis: isize, loc: Loc) -> Result<Tensor> {
        let op = "take_along_axis";
        let a = try_axis(axis, self.rank(), op, loc)?;
        let (x, i) = (self.tensor_type(), indices.tensor_type());
        if !indices.dtype().is_int() {
            let why = format!("{op}: indices must have an integer dtype, got {i}");
            return Err(Error::WrongDType { op, dtypes: vec![self.dtype(), indices.dtype()], why, at: loc });
        }
        let mismatch = |why: String| Error::ShapeMismatch {
            op,
            shapes: vec![self.dims().to_vec(), indices.dims().to_vec()],
            why,
            at: loc,
        };
        if indices.rank() != self.rank() {
            return Err(mismatch(format!("{op}: indices must have the rank of x, got {x} and {i}")));
        }
        let mut out = Vec::with_capacity(self.rank());
        for (d, (&xd, &id)) in self.dims().iter().zip(indices.dims()).enumerate() {
            out.push(match (xd, id) {
                _ if d == a => id,
                (p, q) if p == q => p,
                (1, q) => q,
                (p, 1) => p,
                _ => return Err(mismatch(format!("{op}: {x} and {i} do not broadcast beside axis {axis}"))),
            });
        }
        let n = self.dims()[a];
        let count: usize = out.iter().product();
        if n == 0 && count > 0 {
            let why = format!("{op}: indices into axis {axis} of {x}, which is empty");
            return Err(Error::InvalidArgument { op, why, at: loc });
        }
        let mut xdims = out.clone();
        xdims[a] = n;
        let xb = self.try_broadcast_at(&xdims, loc)?;
        let ib = indices.try_broadcast_at(&out, loc)?;
        let ib = if ib.dtype() == DType::I64 {
            ib
        } else {
            try_apply(Op::Convert(lazuli_hlo::Convert { from: ib.dtype(), to: DType::I64 }), &[&ib], loc)?
        };
        // numpy's negative indices, then index_select's clamp.
        let zero = constant_like(0.0, DType::I64, &out, loc);
        let negative = apply(Op::Compare(Compare { dir: CompareDir::Lt }), &[&ib, &zero], loc);
        let wrapped = ib.binary_at(constant_like(n as f64, DType::I64, &out, loc), BinaryKind::Add, loc);
        let ib = apply(Op::Select(lazuli_hlo::Select), &[&negative, &wrapped, &ib], loc);
        let ib = ib.binary_at(&zero, BinaryKind::Max, loc).binary_at(
            constant_like(n.saturating_sub(1) as f64, DType::I64, &out, loc),
            BinaryKind::Min,
            loc,
        );
        // Row-major linear index into the broadcast x.
        let strides: Vec<usize> = (0..xdims.len()).map(|d| xdims[d + 1..].iter().product()).collect();
        let scaled = |t: Tensor, stride: usize| {
            if stride == 1 {
                t
            } else {
                t.binary_at(constant_like(stride as f64, DType::I64, &out, loc), BinaryKind::Mul, loc)
            }
        };
        let mut lin = scaled(ib, strides[a]);
        for d in (0..out.len()).filter(|&d| d != a && out[d] > 1) {
            lin = lin.binary_at(scaled(iota(&out, d, loc), strides[d]), BinaryKind::Add, loc);
        }
        let flat = try_apply(Op::Reshape(Reshape { dims: vec![xb.elements()] }), &[&xb], loc)?;
        try_apply(Op::Take(Take { axis: 0 }), &[&flat, &lin], loc)
    }

    /// Rows of this `[vocab, d]` table for integer `ids` of any shape: `ids.dims() + [d]`. Ids outside the table
    /// clamp like `index_select`'s, or, with `LAZULI_CHECK_INDICES=1`, are checked like
    /// [`Tensor::index_select_checked`]'s.
    #[track_caller]
    pub fn embedding(&self, ids: &Tensor) -> Tensor {
        let loc = Loc::caller();
        if self.rank() != 2 {
            fail(loc, format!("embedding: the table must be [vocab, dim], got {}", self.tensor_type()));
        }
        let rows = apply(Op::Take(Take { axis: 0 }), &[self, ids], loc);
        if index_check::checking_all(loc) {
            index_check::watch("embedding", ids, 0, self.dims()[0], loc).unwrap_or_else(|e| raise(e));
        }
        rows
    }

    /// This tensor plus `updates` added at `indices` along `axis` (repeated indices accumulate). `updates` has the
    /// shape of `self.index_select(axis, indices)`; out-of-range indices clamp like `index_select`'s.
    #[track_caller]
    pub fn scatter_add(&self, axis: isize, indices: &Tensor, updates: &Tensor) -> Tensor {
        self.scatter_add_at(axis, indices, updates, Loc::caller())
    }

    pub(crate) fn scatter_add_at(&self, axis: isize, indices: &Tensor, updates: &Tensor, loc: Loc) -> Tensor {
        let a = crate::graph::record::axis(axis, self.rank(), "scatter_add", loc);
        apply(Op::ScatterAdd(ScatterAdd { axis: a }), &[self, indices, updates], loc)
    }

    /// One-hot encoding of integer ids: `dims + [n]` of `dtype`, 1 at each id. Ids outside `0..n` give a row of
    /// zeros.
    #[track_caller]
    pub fn one_hot(&self, n: usize, dtype: DType) -> Tensor {
        let loc = Loc::caller();
        let hot = one_hot_mask(self, n, loc);
        if dtype == DType::Bool {
            hot
        } else {
            apply(Op::Convert(lazuli_hlo::Convert { from: hot.dtype(), to: dtype }), &[&hot], loc)
        }
    }

    /// Bool `[n, n]`, true on and below diagonal `k` (`k > 0` above the main diagonal, `k < 0` below).
    #[track_caller]
    pub fn tril_mask(n: usize, k: isize) -> Tensor {
        triangle(n, n, k, true, Loc::caller())
    }

    /// Bool `[n, n]`, true on and above diagonal `k`.
    #[track_caller]
    pub fn triu_mask(n: usize, k: isize) -> Tensor {
        triangle(n, n, k, false, Loc::caller())
    }

    /// The lower triangle (on and below diagonal `k`) of the last two dimensions; zeros elsewhere.
    #[track_caller]
    pub fn tril(&self, k: isize) -> Tensor {
        triangle_part(self, k, true, Loc::caller())
    }

    /// The upper triangle (on and above diagonal `k`) of the last two dimensions; zeros elsewhere.
    #[track_caller]
    pub fn triu(&self, k: isize) -> Tensor {
        triangle_part(self, k, false, Loc::caller())
    }

    /// Limit every element to `[lo, hi]` (`max` then `min`, so `lo > hi` gives `hi`, as in PyTorch). Host scalars
    /// become parameters of this tensor's dtype; tensors broadcast. A composite of the existing maximum and
    /// minimum: their gradients already pass g where the bound is not active, and XLA fuses the pair.
    #[track_caller]
    pub fn clamp(&self, lo: impl Operand, hi: impl Operand) -> Tensor {
        let loc = Loc::caller();
        self.binary_at(lo, BinaryKind::Max, loc).binary_at(hi, BinaryKind::Min, loc)
    }

    /// Index (i64) of the largest element along `axis`, which is removed; ties go to the first, NaN counts as
    /// largest.
    #[track_caller]
    pub fn argmax(&self, axis: isize) -> Tensor {
        arg_reduce(self, ArgKind::Max, axis, Loc::caller())
    }

    /// Index (i64) of the smallest element along `axis`, which is removed; ties go to the first, NaN counts as
    /// smallest.
    #[track_caller]
    pub fn argmin(&self, axis: isize) -> Tensor {
        arg_reduce(self, ArgKind::Min, axis, Loc::caller())
    }

    /// [`Tensor::argmax`] with `axis` kept as size 1 (PyTorch's `keepdim=True`), to index or compare against the
    /// input by broadcasting.
    #[track_caller]
    pub fn argmax_keepdim(&self, axis: isize) -> Tensor {
        arg_reduce_kept(self, ArgKind::Max, axis, Loc::caller())
    }

    /// [`Tensor::argmin`] with `axis` kept as size 1.
    #[track_caller]
    pub fn argmin_keepdim(&self, axis: isize) -> Tensor {
        arg_reduce_kept(self, ArgKind::Min, axis, Loc::caller())
    }

    /// Running sum along `axis`: element i is the sum of elements 0..=i.
    #[track_caller]
    pub fn cumsum(&self, axis: isize) -> Tensor {
        let loc = Loc::caller();
        let a = crate::graph::record::axis(axis, self.rank(), "cumsum", loc);
        apply(Op::CumSum(CumSum { axis: a, reverse: false }), &[self], loc)
    }

    /// The error function, elementwise (floating-point tensors).
    #[track_caller]
    pub fn erf(&self) -> Tensor {
        apply(Op::Erf(Erf), &[self], Loc::caller())
    }
}

/// An arg-reduction with its axis put back as size 1 (a reshape of the reduced indices).
fn arg_reduce_kept(x: &Tensor, kind: ArgKind, axis: isize, loc: Loc) -> Tensor {
    let a = crate::graph::record::axis(axis, x.rank(), "argmax_keepdim/argmin_keepdim", loc);
    let mut dims: Vec<isize> = x.dims().iter().map(|&d| d as isize).collect();
    dims[a] = 1;
    arg_reduce(x, kind, axis, loc).try_reshape_at(&dims, loc).unwrap_or_else(|e| raise(e))
}
