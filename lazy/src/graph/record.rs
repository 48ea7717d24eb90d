//! Recording: the user-facing ops. Each is `#[track_caller]`, checks its operands with the op's shape rule at the
//! call, and panics naming the user's line when they do not fit, before anything reaches XLA. Numpy broadcasting is
//! made explicit here (`broadcast_in_dim`), so the IR's elementwise ops see equal shapes.

use lazuli_hlo::{
    Binary, BinaryKind, BroadcastInDim, Compare, CompareDir, Constant, Convert, DType, DotGeneral, InferError, Iota,
    Loc, Op, Reduce, ReduceKind, Reshape, Select, TensorType, Transpose, Unary, UnaryKind,
};

use crate::error::{Error, Result};
use crate::graph::tensor::Tensor;

/// A recording error is a programmer error: panic with the op's message and the user's line.
#[track_caller]
pub(crate) fn fail(loc: Loc, msg: impl std::fmt::Display) -> ! {
    panic!("lazuli: {msg}\n  recorded at {loc}")
}

/// The panicking form of a `try_*` op: the same message as its `Err` (which names the user's line).
#[track_caller]
pub(crate) fn raise(e: Error) -> ! {
    panic!("lazuli: {e}")
}

/// The user-facing error for an op's shape rule refusing `operands` at `loc`.
pub(crate) fn op_error(op: &Op, why: InferError, operands: &[&TensorType], loc: Loc) -> Error {
    named_op_error(op.name(), why, operands, loc)
}

/// [`op_error`] for the op named `op` (one not yet made: a loop whose body does not fit).
pub(crate) fn named_op_error(op: &'static str, why: InferError, operands: &[&TensorType], loc: Loc) -> Error {
    match why {
        InferError::Shape(why) => {
            let shapes = operands.iter().map(|t| t.dims.to_vec()).collect();
            Error::ShapeMismatch { op, shapes, why, at: loc }
        }
        InferError::DType(why) => {
            Error::WrongDType { op, dtypes: operands.iter().map(|t| t.dtype).collect(), why, at: loc }
        }
        InferError::Axis { axis, rank, message } => Error::BadAxis { op, axis, rank, why: message, at: loc },
        InferError::Attribute(why) => Error::InvalidArgument { op, why, at: loc },
    }
}

/// Record `op` on `operands` at `loc`, inferring the result type by the op's rule; the rule's refusal, or a
/// result too large to address, is the `Err`.
pub(crate) fn try_apply(op: Op, operands: &[&Tensor], loc: Loc) -> Result<Tensor> {
    let tys: smallvec::SmallVec<[&TensorType; 4]> = operands.iter().map(|t| t.tensor_type()).collect();
    match op.infer(&tys) {
        Ok(ty) => {
            if let Some(why) = ty.addressable() {
                return Err(Error::InvalidArgument { op: op.name(), why, at: loc });
            }
            Ok(Tensor::record(op, operands.iter().map(|t| t.node.clone()).collect(), ty, loc))
        }
        Err(why) => Err(op_error(&op, why, &tys, loc)),
    }
}

/// [`try_apply`], panicking at the user's line on bad operands.
#[track_caller]
pub(crate) fn apply(op: Op, operands: &[&Tensor], loc: Loc) -> Tensor {
    try_apply(op, operands, loc).unwrap_or_else(|e| raise(e))
}

/// Record a fused elementwise expression on `operands` (same shape, or rank 0).
#[track_caller]
pub(crate) fn fused(expr: &lazuli_hlo::Fused, operands: &[&Tensor], loc: Loc) -> Tensor {
    apply(Op::Fused(expr.clone()), operands, loc)
}

impl Tensor {
    /// Record `expr` (built with [`lazuli_hlo::FusedBuilder`]) on `operands` as one node: operands of one shape,
    /// rank-0 operands broadcast. Computes what the same chain of elementwise ops computes, with their gradient;
    /// a step's graph gets smaller to record and walk (the optimizers' updates are recorded this way). Panics at
    /// the caller's line when the operands do not fit the expression.
    #[track_caller]
    pub fn fused(expr: &lazuli_hlo::Fused, operands: &[&Tensor]) -> Tensor {
        fused(expr, operands, Loc::caller())
    }
}

/// `numpy.where(cond, on_true, on_false)`: elements of `on_true` where the bool `cond` is true, of `on_false`
/// elsewhere, all three broadcast together by numpy's rules. A thin alias of [`Tensor::select`] (the same op
/// and gradient: `on_true` gets the cotangent where `cond` holds, `on_false` elsewhere, `cond` none). A host
/// scalar `on_false` becomes a program parameter of `on_true`'s dtype; a host scalar `on_true` one of f32. Panics at
/// the caller's line when `cond` is not bool, the branches' dtypes differ or the shapes do not broadcast.
#[track_caller]
pub fn where_(cond: &Tensor, on_true: impl Operand, on_false: impl Operand) -> Tensor {
    cond.select(on_true, on_false)
}

/// Numpy's broadcast of two shapes, or `None`.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// Normalize a possibly negative axis of `op`'s operand of rank `rank`.
pub(crate) fn try_axis(ax: isize, rank: usize, op: &'static str, loc: Loc) -> Result<usize> {
    let a = if ax < 0 { ax + rank as isize } else { ax };
    if a < 0 || a as usize >= rank {
        let why = format!("{op}: axis {ax} is out of range for a tensor of rank {rank}");
        return Err(Error::BadAxis { op, axis: ax as i64, rank, why, at: loc });
    }
    Ok(a as usize)
}

/// [`try_axis`], panicking at the user's line.
#[track_caller]
pub(crate) fn axis(ax: isize, rank: usize, op: &'static str, loc: Loc) -> usize {
    try_axis(ax, rank, op, loc).unwrap_or_else(|e| raise(e))
}

/// Something usable as the second operand of a binary op: a tensor, or a host scalar that becomes a program
/// parameter of the other operand's dtype (so a new value, e.g. a learning rate, does not recompile).
pub trait Operand {
    /// The operand as a tensor recorded at `loc`: a tensor as it is, a host scalar as a program parameter of dtype
    /// `like`.
    fn into_tensor(self, like: DType, loc: Loc) -> Tensor;

    /// `f` on the operand as a tensor: a borrowed tensor is lent as it is, without a handle of its own (two
    /// reference counts up and down again, per op).
    fn with_tensor<R>(self, like: DType, loc: Loc, f: impl FnOnce(&Tensor) -> R) -> R
    where
        Self: Sized,
    {
        f(&self.into_tensor(like, loc))
    }
}

impl Operand for &Tensor {
    fn into_tensor(self, _: DType, _: Loc) -> Tensor {
        self.clone()
    }
    fn with_tensor<R>(self, _: DType, _: Loc, f: impl FnOnce(&Tensor) -> R) -> R {
        f(self)
    }
}
impl Operand for Tensor {
    fn into_tensor(self, _: DType, _: Loc) -> Tensor {
        self
    }
}
macro_rules! scalar_operand {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            fn into_tensor(self, like: DType, loc: Loc) -> Tensor {
                Tensor::host(TensorType::scalar(like), crate::graph::element::scalar_bytes(like, self as f64), loc)
            }
        }
    )*};
}
// Only f64: with more scalar types a literal like `2.0` would be ambiguous. It is cast to the tensor's dtype.
scalar_operand!(f64);

impl Tensor {
    /// Broadcast to `dims` by numpy's rules (leading dimensions added, size-1 dimensions repeated).
    #[track_caller]
    pub fn broadcast_to(&self, dims: &[usize]) -> Tensor {
        self.broadcast_at(dims, Loc::caller())
    }

    /// [`Tensor::broadcast_to`], with [`Error::ShapeMismatch`] when the shapes do not broadcast.
    #[track_caller]
    pub fn try_broadcast_to(&self, dims: &[usize]) -> Result<Tensor> {
        self.try_broadcast_at(dims, Loc::caller())
    }

    #[track_caller]
    pub(crate) fn broadcast_at(&self, dims: &[usize], loc: Loc) -> Tensor {
        self.try_broadcast_at(dims, loc).unwrap_or_else(|e| raise(e))
    }

    pub(crate) fn try_broadcast_at(&self, dims: &[usize], loc: Loc) -> Result<Tensor> {
        if self.dims() == dims {
            return Ok(self.clone());
        }
        if dims.len() < self.rank() {
            let why = format!("broadcast: cannot broadcast {} to fewer dimensions {dims:?}", self.tensor_type());
            return Err(Error::ShapeMismatch {
                op: "broadcast",
                shapes: vec![self.dims().to_vec(), dims.to_vec()],
                why,
                at: loc,
            });
        }
        let map = (dims.len() - self.rank()..dims.len()).collect();
        try_apply(Op::BroadcastInDim(BroadcastInDim { dims: dims.to_vec(), map }), &[self], loc)
    }

    /// Broadcast operands to one shape; they must share a dtype (but for `where`'s condition).
    fn broadcast_all(ts: &[&Tensor], op: &'static str, loc: Loc) -> Result<Vec<Tensor>> {
        let mut dims = ts[0].dims().to_vec();
        for t in &ts[1..] {
            if t.dtype() != ts[0].dtype() && op != "where" {
                let (a, b) = (ts[0].tensor_type(), t.tensor_type());
                let why = format!("{op}: dtypes differ: {a} vs {b}; convert one with .to_dtype(…)");
                return Err(Error::WrongDType { op, dtypes: ts.iter().map(|t| t.dtype()).collect(), why, at: loc });
            }
            dims = match broadcast_shapes(&dims, t.dims()) {
                Some(d) => d,
                None => {
                    let all: Vec<String> = ts.iter().map(|t| t.tensor_type().to_string()).collect();
                    let why = format!("{op}: shapes {} do not broadcast", all.join(" and "));
                    let shapes = ts.iter().map(|t| t.dims().to_vec()).collect();
                    return Err(Error::ShapeMismatch { op, shapes, why, at: loc });
                }
            };
        }
        ts.iter().map(|t| t.try_broadcast_at(&dims, loc)).collect()
    }

    #[track_caller]
    pub(crate) fn binary_at(&self, other: impl Operand, kind: BinaryKind, loc: Loc) -> Tensor {
        self.try_binary_at(other, kind, loc).unwrap_or_else(|e| raise(e))
    }

    pub(crate) fn try_binary_at(&self, other: impl Operand, kind: BinaryKind, loc: Loc) -> Result<Tensor> {
        other.with_tensor(self.dtype(), loc, |other| {
            let op = Op::Binary(Binary { kind });
            if self.tensor_type() == other.tensor_type() {
                return try_apply(op, &[self, other], loc);
            }
            let v = Tensor::broadcast_all(&[self, other], op.name(), loc)?;
            try_apply(op, &[&v[0], &v[1]], loc)
        })
    }

    /// `self + other`, broadcasting, with an `Err` ([`Error::ShapeMismatch`], [`Error::WrongDType`]) for operands
    /// that do not fit, where `+` panics.
    #[track_caller]
    pub fn try_add(&self, other: impl Operand) -> Result<Tensor> {
        self.try_binary_at(other, BinaryKind::Add, Loc::caller())
    }
    /// `self - other`, as [`Tensor::try_add`].
    #[track_caller]
    pub fn try_sub(&self, other: impl Operand) -> Result<Tensor> {
        self.try_binary_at(other, BinaryKind::Sub, Loc::caller())
    }
    /// `self * other`, as [`Tensor::try_add`].
    #[track_caller]
    pub fn try_mul(&self, other: impl Operand) -> Result<Tensor> {
        self.try_binary_at(other, BinaryKind::Mul, Loc::caller())
    }
    /// `self / other`, as [`Tensor::try_add`].
    #[track_caller]
    pub fn try_div(&self, other: impl Operand) -> Result<Tensor> {
        self.try_binary_at(other, BinaryKind::Div, Loc::caller())
    }

    #[track_caller]
    fn unary(&self, kind: UnaryKind) -> Tensor {
        apply(Op::Unary(Unary { kind }), &[self], Loc::caller())
    }

    #[track_caller]
    fn compare(&self, other: impl Operand, dir: CompareDir) -> Tensor {
        let loc = Loc::caller();
        other.with_tensor(self.dtype(), loc, |other| {
            let op = Op::Compare(Compare { dir });
            let v = Tensor::broadcast_all(&[self, other], op.name(), loc).unwrap_or_else(|e| raise(e));
            apply(op, &[&v[0], &v[1]], loc)
        })
    }

    /// Elementwise maximum (broadcasting).
    #[track_caller]
    pub fn maximum(&self, other: impl Operand) -> Tensor {
        self.binary_at(other, BinaryKind::Max, Loc::caller())
    }
    /// Elementwise minimum (broadcasting).
    #[track_caller]
    pub fn minimum(&self, other: impl Operand) -> Tensor {
        self.binary_at(other, BinaryKind::Min, Loc::caller())
    }
    /// Elementwise power (broadcasting).
    #[track_caller]
    pub fn pow(&self, other: impl Operand) -> Tensor {
        self.binary_at(other, BinaryKind::Pow, Loc::caller())
    }
    /// Logical/bitwise and of bool or integer tensors.
    #[track_caller]
    pub fn and(&self, other: impl Operand) -> Tensor {
        self.binary_at(other, BinaryKind::And, Loc::caller())
    }
    /// Logical/bitwise or of bool or integer tensors.
    #[track_caller]
    pub fn or(&self, other: impl Operand) -> Tensor {
        self.binary_at(other, BinaryKind::Or, Loc::caller())
    }

    /// `e^x`, elementwise (floating point).
    #[track_caller]
    pub fn exp(&self) -> Tensor {
        self.unary(UnaryKind::Exp)
    }
    /// Natural logarithm, elementwise (floating point).
    #[track_caller]
    pub fn log(&self) -> Tensor {
        self.unary(UnaryKind::Log)
    }
    /// Square root, elementwise (floating point).
    #[track_caller]
    pub fn sqrt(&self) -> Tensor {
        self.unary(UnaryKind::Sqrt)
    }
    /// `1 / sqrt(x)`, elementwise (floating point).
    #[track_caller]
    pub fn rsqrt(&self) -> Tensor {
        self.unary(UnaryKind::Rsqrt)
    }
    /// Hyperbolic tangent, elementwise (floating point).
    #[track_caller]
    pub fn tanh(&self) -> Tensor {
        self.unary(UnaryKind::Tanh)
    }
    /// Sine, elementwise (floating point).
    #[track_caller]
    pub fn sin(&self) -> Tensor {
        self.unary(UnaryKind::Sin)
    }
    /// Cosine, elementwise (floating point).
    #[track_caller]
    pub fn cos(&self) -> Tensor {
        self.unary(UnaryKind::Cos)
    }
    /// Absolute value, elementwise.
    #[track_caller]
    pub fn abs(&self) -> Tensor {
        self.unary(UnaryKind::Abs)
    }
    /// `1 / (1 + e^-x)`, elementwise (floating point).
    #[track_caller]
    pub fn sigmoid(&self) -> Tensor {
        self.unary(UnaryKind::Logistic)
    }
    /// `-x`, elementwise.
    #[track_caller]
    pub fn neg(&self) -> Tensor {
        self.unary(UnaryKind::Neg)
    }

    /// `self == other` elementwise, as a bool tensor.
    #[track_caller]
    pub fn eq(&self, other: impl Operand) -> Tensor {
        self.compare(other, CompareDir::Eq)
    }
    /// `self != other` elementwise, as a bool tensor.
    #[track_caller]
    pub fn ne(&self, other: impl Operand) -> Tensor {
        self.compare(other, CompareDir::Ne)
    }
    /// `self < other` elementwise, as a bool tensor.
    #[track_caller]
    pub fn lt(&self, other: impl Operand) -> Tensor {
        self.compare(other, CompareDir::Lt)
    }
    /// `self <= other` elementwise, as a bool tensor.
    #[track_caller]
    pub fn le(&self, other: impl Operand) -> Tensor {
        self.compare(other, CompareDir::Le)
    }
    /// `self > other` elementwise, as a bool tensor.
    #[track_caller]
    pub fn gt(&self, other: impl Operand) -> Tensor {
        self.compare(other, CompareDir::Gt)
    }
    /// `self >= other` elementwise, as a bool tensor.
    #[track_caller]
    pub fn ge(&self, other: impl Operand) -> Tensor {
        self.compare(other, CompareDir::Ge)
    }

    /// `where(self, on_true, on_false)`: `self` is a bool tensor; all three broadcast together.
    #[track_caller]
    pub fn select(&self, on_true: impl Operand, on_false: impl Operand) -> Tensor {
        let loc = Loc::caller();
        if self.dtype() != DType::Bool {
            fail(loc, format!("select: the condition must be bool, got {}", self.tensor_type()));
        }
        let t = on_true.into_tensor(DType::F32, loc);
        let f = on_false.into_tensor(t.dtype(), loc);
        if t.dtype() != f.dtype() {
            fail(loc, format!("select: branch dtypes differ: {} vs {}", t.tensor_type(), f.tensor_type()));
        }
        let v = Tensor::broadcast_all(&[self, &t, &f], "where", loc).unwrap_or_else(|e| raise(e));
        apply(Op::Select(Select), &[&v[0], &v[1], &v[2]], loc)
    }

    /// `where(self, on_true, on_false)`, numpy's and PyTorch's name for [`Tensor::select`] (the same op):
    /// `self` is the bool condition; the three broadcast together by numpy's rules.
    #[track_caller]
    pub fn where_(&self, on_true: impl Operand, on_false: impl Operand) -> Tensor {
        self.select(on_true, on_false)
    }

    /// Convert the element type.
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Tensor {
        self.to_dtype_at(dtype, Loc::caller())
    }

    /// [`Tensor::to_dtype`] recorded at `loc` (itself where it already has `dtype`).
    pub(crate) fn to_dtype_at(&self, dtype: DType, loc: Loc) -> Tensor {
        if dtype == self.dtype() {
            return self.clone();
        }
        apply(Op::Convert(Convert { from: self.dtype(), to: dtype }), &[self], loc)
    }

    /// Reshape (row-major); one dimension may be `-1` and is inferred.
    #[track_caller]
    pub fn reshape(&self, dims: &[isize]) -> Tensor {
        self.try_reshape_at(dims, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::reshape`], with [`Error::ShapeMismatch`] when the element counts differ.
    #[track_caller]
    pub fn try_reshape(&self, dims: &[isize]) -> Result<Tensor> {
        self.try_reshape_at(dims, Loc::caller())
    }

    pub(crate) fn try_reshape_at(&self, dims: &[isize], loc: Loc) -> Result<Tensor> {
        let mismatch = |why: String| {
            let asked = dims.iter().map(|&d| d.max(0) as usize).collect();
            Error::ShapeMismatch { op: "reshape", shapes: vec![self.dims().to_vec(), asked], why, at: loc }
        };
        let known = dims.iter().filter(|&&d| d >= 0).fold(1usize, |n, &d| n.saturating_mul(d as usize));
        let holes = dims.iter().filter(|&&d| d < 0).count();
        let fill = if holes == 1 && known > 0 && self.elements().is_multiple_of(known) {
            self.elements() / known
        } else if holes == 0 {
            0
        } else {
            return Err(mismatch(format!("reshape: cannot reshape {} to {dims:?}", self.tensor_type())));
        };
        if dims.iter().any(|&d| d < -1) {
            let why = format!("reshape: invalid dimension in {dims:?}");
            return Err(Error::InvalidArgument { op: "reshape", why, at: loc });
        }
        let dims: Vec<usize> = dims.iter().map(|&d| if d < 0 { fill } else { d as usize }).collect();
        if dims == self.dims() {
            return Ok(self.clone());
        }
        try_apply(Op::Reshape(Reshape { dims }), &[self], loc).map_err(|e| match e {
            Error::ShapeMismatch { why, .. } => mismatch(why),
            other => other,
        })
    }

    /// Permute dimensions: result dimension `i` is dimension `perm[i]` of `self` (negative axes allowed).
    #[track_caller]
    pub fn permute(&self, perm: &[isize]) -> Tensor {
        self.permute_at(perm, Loc::caller())
    }

    pub(crate) fn permute_at(&self, perm: &[isize], loc: Loc) -> Tensor {
        let perm: Vec<usize> = perm.iter().map(|&p| axis(p, self.rank(), "permute", loc)).collect();
        apply(Op::Transpose(Transpose { perm }), &[self], loc)
    }

    /// Swap the last two dimensions (matrix transpose).
    #[track_caller]
    pub fn t(&self) -> Tensor {
        let loc = Loc::caller();
        let r = self.rank();
        if r < 2 {
            fail(loc, format!("t: needs rank ≥ 2, got {}", self.tensor_type()));
        }
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        apply(Op::Transpose(Transpose { perm }), &[self], loc)
    }

    #[track_caller]
    fn reduce(&self, kind: ReduceKind, axes: &[isize], keepdim: bool) -> Tensor {
        let loc = Loc::caller();
        let mut ax: Vec<usize> = axes.iter().map(|&a| axis(a, self.rank(), "reduce", loc)).collect();
        ax.sort_unstable();
        ax.dedup();
        apply(Op::Reduce(Reduce { kind, axes: ax, keep: keepdim }), &[self], loc)
    }

    /// Sum over `axes` (negative allowed), removing them.
    #[track_caller]
    pub fn sum(&self, axes: &[isize]) -> Tensor {
        self.reduce(ReduceKind::Sum, axes, false)
    }
    /// Sum over `axes`, keeping them with size 1.
    #[track_caller]
    pub fn sum_keepdim(&self, axes: &[isize]) -> Tensor {
        self.reduce(ReduceKind::Sum, axes, true)
    }
    /// Sum of all elements (a scalar).
    #[track_caller]
    pub fn sum_all(&self) -> Tensor {
        let all: Vec<isize> = (0..self.rank() as isize).collect();
        self.reduce(ReduceKind::Sum, &all, false)
    }
    /// Maximum over `axes` (negative allowed), removing them.
    #[track_caller]
    pub fn max(&self, axes: &[isize]) -> Tensor {
        self.reduce(ReduceKind::Max, axes, false)
    }
    /// Maximum over `axes`, keeping them with size 1.
    #[track_caller]
    pub fn max_keepdim(&self, axes: &[isize]) -> Tensor {
        self.reduce(ReduceKind::Max, axes, true)
    }
    /// Minimum over `axes` (negative allowed), removing them.
    #[track_caller]
    pub fn min(&self, axes: &[isize]) -> Tensor {
        self.reduce(ReduceKind::Min, axes, false)
    }
    /// Minimum over `axes`, keeping them with size 1.
    #[track_caller]
    pub fn min_keepdim(&self, axes: &[isize]) -> Tensor {
        self.reduce(ReduceKind::Min, axes, true)
    }

    /// Mean over `axes` of a floating-point tensor.
    #[track_caller]
    pub fn mean(&self, axes: &[isize]) -> Tensor {
        self.mean_impl(axes, false)
    }
    /// Mean over `axes`, keeping them with size 1.
    #[track_caller]
    pub fn mean_keepdim(&self, axes: &[isize]) -> Tensor {
        self.mean_impl(axes, true)
    }
    /// Mean of all elements (a scalar).
    #[track_caller]
    pub fn mean_all(&self) -> Tensor {
        let all: Vec<isize> = (0..self.rank() as isize).collect();
        self.mean_impl(&all, false)
    }

    #[track_caller]
    fn mean_impl(&self, axes: &[isize], keepdim: bool) -> Tensor {
        let loc = Loc::caller();
        if !self.dtype().is_float() {
            fail(loc, format!("mean: needs a floating-point tensor, got {}; convert it first", self.tensor_type()));
        }
        let mut count = 1usize;
        let mut seen = Vec::new();
        for &a in axes {
            let a = axis(a, self.rank(), "mean", loc);
            if !seen.contains(&a) {
                seen.push(a);
                count *= self.dims()[a];
            }
        }
        let s = self.reduce(ReduceKind::Sum, axes, keepdim);
        // The count is structure (it follows from the shape), so it is a constant, not a parameter.
        let c = crate::graph::constants::constant_like(count as f64, self.dtype(), s.dims(), loc);
        s.binary_at(&c, BinaryKind::Div, loc)
    }

    /// Matrix product with numpy's rules: 1-D operands are vectors, batch dimensions broadcast.
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Tensor {
        self.try_matmul_at(other, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`Tensor::matmul`], with [`Error::ShapeMismatch`] when the inner or batch dimensions do not fit and
    /// [`Error::WrongDType`] when the element types differ.
    #[track_caller]
    pub fn try_matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.try_matmul_at(other, Loc::caller())
    }

    fn try_matmul_at(&self, other: &Tensor, loc: Loc) -> Result<Tensor> {
        let (a, b) = (self, other);
        let mismatch = |why: String| Error::ShapeMismatch {
            op: "matmul",
            shapes: vec![a.dims().to_vec(), b.dims().to_vec()],
            why,
            at: loc,
        };
        if a.rank() == 0 || b.rank() == 0 {
            let why = format!("matmul: operands must have rank ≥ 1, got {} and {}", a.tensor_type(), b.tensor_type());
            return Err(mismatch(why));
        }
        let a2 = if a.rank() == 1 { a.try_reshape_at(&[1, a.dims()[0] as isize], loc)? } else { a.clone() };
        let b2 = if b.rank() == 1 { b.try_reshape_at(&[b.dims()[0] as isize, 1], loc)? } else { b.clone() };
        let (ra, rb) = (a2.rank(), b2.rank());
        let (m, k1) = (a2.dims()[ra - 2], a2.dims()[ra - 1]);
        let (k2, n) = (b2.dims()[rb - 2], b2.dims()[rb - 1]);
        if k1 != k2 {
            return Err(mismatch(format!(
                "matmul: inner dimensions differ: {} @ {}",
                a.tensor_type(),
                b.tensor_type()
            )));
        }
        let precision = crate::graph::precision::precision_at(loc);
        if a.rank() == 2 && b.rank() == 2 {
            // The common case (a layer's product, and most of their gradients) without the batch path's lists.
            let dot = DotGeneral::new(&[], &[], &[1], &[0]).with_precision(precision);
            return try_apply(Op::DotGeneral(dot), &[&a2, &b2], loc);
        }
        if ra > 2 && rb == 2 {
            // [..., m, k] @ [k, n]: one 2-D product over the flattened rows, not a broadcast of the matrix per batch.
            let rows: usize = a2.dims()[..ra - 1].iter().product(); // not elements / k: k may be 0
            let dot = DotGeneral::new(&[], &[], &[1], &[0]).with_precision(precision);
            let r =
                try_apply(Op::DotGeneral(dot), &[&a2.try_reshape_at(&[rows as isize, k1 as isize], loc)?, &b2], loc)?;
            let mut out: Vec<isize> = a2.dims()[..ra - 1].iter().map(|&d| d as isize).collect();
            out.push(n as isize);
            return r.try_reshape_at(&out, loc);
        }
        let Some(batch) = broadcast_shapes(&a2.dims()[..ra - 2], &b2.dims()[..rb - 2]) else {
            return Err(mismatch(format!(
                "matmul: batch dimensions do not broadcast: {} @ {}",
                a.tensor_type(),
                b.tensor_type()
            )));
        };
        let nb = batch.len();
        let mut da = batch.clone();
        da.extend([m, k1]);
        let mut db = batch.clone();
        db.extend([k2, n]);
        let (a3, b3) = (a2.try_broadcast_at(&da, loc)?, b2.try_broadcast_at(&db, loc)?);
        let batch_dims: Vec<usize> = (0..nb).collect();
        let dot = DotGeneral::new(&batch_dims, &batch_dims, &[nb + 1], &[nb]).with_precision(precision);
        let r = try_apply(Op::DotGeneral(dot), &[&a3, &b3], loc)?;
        // Drop the unit dimensions that stood for vectors.
        let mut out: Vec<isize> = batch.iter().map(|&d| d as isize).collect();
        if a.rank() > 1 {
            out.push(m as isize);
        }
        if b.rank() > 1 {
            out.push(n as isize);
        }
        if out.len() == r.rank() {
            Ok(r)
        } else {
            r.try_reshape_at(&out, loc)
        }
    }

    /// A rank-0 constant compiled into the program: for values that define the model (an attention scale, a
    /// mask value), not for hyperparameters you change (those are host scalars, i.e. parameters).
    #[track_caller]
    pub fn constant(value: f64, dtype: DType) -> Tensor {
        apply(Op::Constant(Constant::new(value, TensorType::scalar(dtype))), &[], Loc::caller())
    }

    /// A tensor of zeros (a constant: zeros define structure, not data).
    #[track_caller]
    pub fn zeros(dims: &[usize], dtype: DType) -> Tensor {
        apply(Op::Constant(Constant::new(0.0, TensorType::new(dtype, dims))), &[], Loc::caller())
    }

    /// A tensor of ones (a constant).
    #[track_caller]
    pub fn ones(dims: &[usize], dtype: DType) -> Tensor {
        apply(Op::Constant(Constant::new(1.0, TensorType::new(dtype, dims))), &[], Loc::caller())
    }

    /// A tensor filled with `value`. The value is a program parameter: another value reuses the compiled program.
    #[track_caller]
    pub fn full(dims: &[usize], value: f64, dtype: DType) -> Tensor {
        let loc = Loc::caller();
        Tensor::host(TensorType::scalar(dtype), crate::graph::element::scalar_bytes(dtype, value), loc)
            .broadcast_at(dims, loc)
    }

    /// `0, 1, …, n-1`.
    #[track_caller]
    pub fn arange(n: usize, dtype: DType) -> Tensor {
        apply(Op::Iota(Iota { dim: 0, ty: TensorType::new(dtype, [n]) }), &[], Loc::caller())
    }

    /// `start, start+step, …` below `end` (the count is structure; start and step are parameters).
    #[track_caller]
    pub fn arange_step(start: f64, end: f64, step: f64, dtype: DType) -> Tensor {
        let loc = Loc::caller();
        if step == 0.0 || !((end - start) / step).is_finite() {
            fail(loc, format!("arange: invalid range {start}..{end} step {step}"));
        }
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        let i = apply(Op::Iota(Iota { dim: 0, ty: TensorType::new(dtype, [n]) }), &[], loc);
        i.binary_at(step, BinaryKind::Mul, loc).binary_at(start, BinaryKind::Add, loc)
    }
}
