//! Neural-network functionals without parameters: activations, softmax family, layer normalization and losses.
//! What a transformer records every step (GELU, softmax, log-softmax, layer normalization) is one composite op
//! each, with a one-node gradient (`hlo/src/ops/{activation,norm}.rs`); the rest are compositions of recorded
//! ops, so their gradients come from autodiff. Fixed numbers of the formulas (0.5, √(2/π), eps) are constants of
//! the program; `logsumexp`'s max-shift is recorded without a gradient, which is exact because it does not change
//! when its input is shifted.

use lazuli_hlo::{BinaryKind, CompareDir, Loc, Op, Reduce, ReduceKind, UnaryKind};

use crate::graph::autodiff::no_grad;
use crate::graph::constants::constant_like;
use crate::graph::record::{apply, axis, fail};
use crate::graph::tensor::Tensor;

/// Fail unless `t` is floating-point.
fn need_float(t: &Tensor, what: &str, loc: Loc) {
    if !t.dtype().is_float() {
        fail(loc, format!("{what}: needs a floating-point tensor, got {}; convert it first", t.tensor_type()));
    }
}

/// Normalized, sorted, unique axes.
fn axes_of(t: &Tensor, axes: &[isize], what: &'static str, loc: Loc) -> Vec<usize> {
    let mut ax: Vec<usize> = axes.iter().map(|&a| axis(a, t.rank(), what, loc)).collect();
    ax.sort_unstable();
    ax.dedup();
    ax
}

/// `t op c` for a constant scalar `c` of `t`'s dtype.
fn with_constant(t: &Tensor, kind: BinaryKind, c: f64, loc: Loc) -> Tensor {
    t.binary_at(constant_like(c, t.dtype(), t.dims(), loc), kind, loc)
}

/// A unary op on `t`.
fn unary(t: &Tensor, kind: UnaryKind, loc: Loc) -> Tensor {
    apply(Op::Unary(lazuli_hlo::Unary { kind }), &[t], loc)
}

/// Sum over `axes` keeping them as size 1.
fn sum_kept(t: &Tensor, axes: &[usize], loc: Loc) -> Tensor {
    apply(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: axes.to_vec(), keep: true }), &[t], loc)
}

/// Max of `x` over `axes` (kept as size 1) with no gradient, with ±inf replaced by 0 so that `x - max` stays
/// finite for rows that are all -inf.
fn shift_for(x: &Tensor, axes: &[usize], loc: Loc) -> Tensor {
    no_grad(|| {
        let m = apply(Op::Reduce(Reduce { kind: ReduceKind::Max, axes: axes.to_vec(), keep: true }), &[x], loc);
        let inf = constant_like(f64::INFINITY, x.dtype(), m.dims(), loc);
        let infinite = compare(&unary(&m, UnaryKind::Abs, loc), &inf, CompareDir::Eq, loc);
        let zero = constant_like(0.0, x.dtype(), m.dims(), loc);
        apply(Op::Select(lazuli_hlo::Select), &[&infinite, &zero, &m], loc)
    })
}

/// `t <dir> other` with numpy broadcasting.
fn compare(t: &Tensor, other: &Tensor, dir: CompareDir, loc: Loc) -> Tensor {
    let dims = crate::graph::record::broadcast_shapes(t.dims(), other.dims()).unwrap_or_else(|| {
        fail(loc, format!("compare: {} and {} do not broadcast", t.tensor_type(), other.tensor_type()))
    });
    let (a, b) = (t.broadcast_at(&dims, loc), other.broadcast_at(&dims, loc));
    apply(Op::Compare(lazuli_hlo::Compare { dir }), &[&a, &b], loc)
}

/// `log(sum(exp(x)))` over `axes`, kept as size 1 or removed.
fn logsumexp_at(x: &Tensor, axes: &[isize], keep: bool, loc: Loc) -> Tensor {
    need_float(x, "logsumexp", loc);
    let ax = axes_of(x, axes, "logsumexp", loc);
    let m = shift_for(x, &ax, loc);
    let e = unary(&x.binary_at(&m, BinaryKind::Sub, loc), UnaryKind::Exp, loc);
    let lse = unary(&sum_kept(&e, &ax, loc), UnaryKind::Log, loc).binary_at(&m, BinaryKind::Add, loc);
    if keep {
        return lse;
    }
    let out: Vec<usize> = x.dims().iter().enumerate().filter(|(i, _)| !ax.contains(i)).map(|(_, &d)| d).collect();
    apply(Op::Reshape(lazuli_hlo::Reshape { dims: out }), &[&lse], loc)
}

impl Tensor {
    /// `max(x, 0)`; the gradient at 0 is 0.
    #[track_caller]
    pub fn relu(&self) -> Tensor {
        apply(Op::Relu(lazuli_hlo::Relu), &[self], Loc::caller())
    }

    /// GELU, tanh form: `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
    #[track_caller]
    pub fn gelu(&self) -> Tensor {
        let loc = Loc::caller();
        need_float(self, "gelu", loc);
        apply(Op::Gelu(lazuli_hlo::Gelu), &[self], loc)
    }

    /// GELU, exact form: `0.5 x (1 + erf(x / √2))`.
    #[track_caller]
    pub fn gelu_erf(&self) -> Tensor {
        let loc = Loc::caller();
        need_float(self, "gelu_erf", loc);
        let scaled = with_constant(self, BinaryKind::Mul, std::f64::consts::FRAC_1_SQRT_2, loc);
        let e = apply(Op::Erf(lazuli_hlo::Erf), &[&scaled], loc);
        let half_x = with_constant(self, BinaryKind::Mul, 0.5, loc);
        half_x.binary_at(with_constant(&e, BinaryKind::Add, 1.0, loc), BinaryKind::Mul, loc)
    }

    /// `log(sum(exp(x)))` over `axes`, which are removed; stable for large inputs (max-shifted). A slice that is
    /// all `-inf` gives `-inf`.
    #[track_caller]
    pub fn logsumexp(&self, axes: &[isize]) -> Tensor {
        logsumexp_at(self, axes, false, Loc::caller())
    }

    /// [`Tensor::logsumexp`], keeping `axes` with size 1 (as [`Tensor::sum_keepdim`] does), so the result
    /// broadcasts against `self`: `x - x.logsumexp_keepdim(&[-1])` is the log-softmax.
    #[track_caller]
    pub fn logsumexp_keepdim(&self, axes: &[isize]) -> Tensor {
        logsumexp_at(self, axes, true, Loc::caller())
    }

    /// `exp(x) / sum(exp(x))` along `axis` (max-shifted).
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Tensor {
        let loc = Loc::caller();
        need_float(self, "softmax", loc);
        let axis = crate::graph::record::axis(axis, self.rank(), "softmax", loc);
        apply(Op::Softmax(lazuli_hlo::Softmax { axis, log: false }), &[self], loc)
    }

    /// `x - logsumexp(x)` along `axis` (kept).
    #[track_caller]
    pub fn log_softmax(&self, axis: isize) -> Tensor {
        let loc = Loc::caller();
        need_float(self, "log_softmax", loc);
        let axis = crate::graph::record::axis(axis, self.rank(), "log_softmax", loc);
        apply(Op::Softmax(lazuli_hlo::Softmax { axis, log: true }), &[self], loc)
    }

    /// `(x - mean) / sqrt(var + eps)` over `axes` (biased variance), without scale or shift: the affine part is
    /// the layer module's. One node forward and one backward (`Normalize`, `NormalizeGrad`).
    #[track_caller]
    pub fn layer_norm(&self, axes: &[isize], eps: f64) -> Tensor {
        let loc = Loc::caller();
        need_float(self, "layer_norm", loc);
        let ax = axes_of(self, axes, "layer_norm", loc);
        apply(Op::Normalize(lazuli_hlo::Normalize(lazuli_hlo::NormSpec::new(ax, eps))), &[self], loc)
    }

    /// Mean cross-entropy of `[N, C]` logits against integer class `targets` `[N]`: `-mean(log_softmax(x)[i, t_i])`.
    /// A target outside `0..C` contributes 0 to the sum (it still counts in N).
    #[track_caller]
    pub fn cross_entropy(&self, targets: &Tensor) -> Tensor {
        let loc = Loc::caller();
        need_float(self, "cross_entropy", loc);
        if self.rank() != 2 || targets.rank() != 1 || targets.dims()[0] != self.dims()[0] {
            fail(
                loc,
                format!(
                    "cross_entropy: needs logits [N, C] and targets [N], got {} and {}",
                    self.tensor_type(),
                    targets.tensor_type()
                ),
            );
        }
        if !targets.dtype().is_int() {
            fail(loc, format!("cross_entropy: targets must have an integer dtype, got {}", targets.tensor_type()));
        }
        // One node (and one for its gradient); see `lazuli_hlo::CrossEntropy`.
        apply(Op::CrossEntropy(lazuli_hlo::CrossEntropy), &[self, targets], loc)
    }

    /// Mean squared error against `target` of the same type.
    #[track_caller]
    pub fn mse_loss(&self, target: &Tensor) -> Tensor {
        let loc = Loc::caller();
        need_float(self, "mse_loss", loc);
        if self.tensor_type() != target.tensor_type() {
            fail(loc, format!("mse_loss: {} and {} differ", self.tensor_type(), target.tensor_type()));
        }
        let d = self.binary_at(target, BinaryKind::Sub, loc);
        let all: Vec<usize> = (0..self.rank()).collect();
        let sq = d.binary_at(&d, BinaryKind::Mul, loc);
        let s = apply(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: all, keep: false }), &[&sq], loc);
        with_constant(&s, BinaryKind::Div, self.elements() as f64, loc)
    }
}
