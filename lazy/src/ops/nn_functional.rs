//! Neural-network functionals without parameters: activations, softmax family, layer normalization and losses.
//! What a transformer records every step (GELU, softmax, log-softmax, layer normalization) is one composite op
//! each, with a one-node gradient (`hlo/src/ops/{activation,norm}.rs`); the rest are compositions of recorded
//! ops, so their gradients come from autodiff. Fixed numbers of the formulas (0.5, √(2/π), eps) are constants of
//! the program; `logsumexp`'s max-shift is recorded without a gradient, which is exact because it does not change
//! when its input is shifted.

use lazuli_hlo::{BinaryKind, CompareDir, DType, KernelOp, Loc, Op, Reduce, ReduceKind, TensorType, UnaryKind};
use lazuli_kernels::cross_entropy::{cross_entropy, CrossEntropyCall};

use crate::graph::autodiff::no_grad;
use crate::graph::constants::constant_like;
use crate::graph::record::{apply, axis, fail, raise};
use crate::graph::tensor::Tensor;
use crate::ops::fused_layers::kernel;

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

/// Options of [`Tensor::cross_entropy_with`], PyTorch's names and meanings; the default is plain
/// [`Tensor::cross_entropy`]. Build with the methods or set the fields:
/// `CrossEntropyOptions::default().ignore_index(-100).label_smoothing(0.1)`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CrossEntropyOptions {
    /// Positions whose target equals this add nothing and are left out of the mean (PyTorch uses -100).
    pub ignore_index: Option<i64>,
    /// ε in `[0, 1]`: the target distribution is `(1 - ε)·onehot + ε/C`.
    pub label_smoothing: f64,
}

impl CrossEntropyOptions {
    /// Ignore positions whose target is `id`.
    pub fn ignore_index(mut self, id: i64) -> Self {
        self.ignore_index = Some(id);
        self
    }
    /// Smooth the targets by `eps` (in `[0, 1]`).
    pub fn label_smoothing(mut self, eps: f64) -> Self {
        self.label_smoothing = eps;
        self
    }
}

/// The mean cross-entropy of `[N, C]` logits against `[N]` ids as one node: lazuli's kernel where it runs (NVIDIA
/// GPUs, `LAZULI_CROSS_ENTROPY`), else the `CrossEntropy` op, so CPU programs do not change. Logits that are a
/// pending widening of 16-bit values (a bf16 matmul's product converted to f32, maybe reshaped) reach the kernel
/// before the conversion: it widens them as it reads them and writes their gradient in their own type.
fn cross_entropy_node(x: &Tensor, t: &Tensor, loc: Loc) -> Tensor {
    let narrow = narrow_source(x);
    let dtype = narrow.as_ref().map_or(x.dtype(), |n| n.dtype());
    let logits = TensorType::new(dtype, x.dims());
    // Logits that will be differentiated get their gradient from the forward kernel (where the setting says so);
    // the autodiff records the forward and backward kernels instead if the loss's cotangent is not one.
    let differentiated = crate::graph::autodiff::grad_enabled() && (x.node.grad_path || x.node.requires_grad());
    let made = kernel("cross_entropy", "LAZULI_CROSS_ENTROPY", loc, |rt| {
        let grad_in_forward = rt.config.cross_entropy_grad.filter(|_| differentiated);
        let call = CrossEntropyCall { logits, ids: t.tensor_type().clone(), out: x.dtype(), grad_in_forward };
        cross_entropy(&call, &rt.target, rt.config.cross_entropy)
    });
    let def = match made {
        Ok(def) if def.device.is_some() => def,
        Ok(_) => return apply(Op::CrossEntropy(lazuli_hlo::CrossEntropy), &[x, t], loc),
        Err(e) => raise(e),
    };
    let logits = match narrow {
        Some(n) if n.dims() == x.dims() => n,
        Some(n) => apply(Op::Reshape(lazuli_hlo::Reshape { dims: x.dims().to_vec() }), &[&n], loc),
        None => x.clone(),
    };
    apply(Op::Kernel(KernelOp::new(def, 0)), &[&logits, t], loc)
}

/// The 16-bit float tensor `x` is a pending widening of, through reshapes (a model's `[B, T, C]` logits flattened
/// to `[N, C]`), in its own shape; `None` where `x` is not one, or where `x` or a tensor looked through is a
/// gradient leaf (`Node::looked_through`).
fn narrow_source(x: &Tensor) -> Option<Tensor> {
    let widening = |op: &Op| matches!(op, Op::Convert(c) if matches!(c.from, DType::BF16 | DType::F16) && c.to.byte_size() > c.from.byte_size());
    let mut node = x.node.clone();
    while let Some(reshaped) = node.looked_through(|op| matches!(op, Op::Reshape(_))) {
        node = reshaped;
    }
    node.looked_through(widening).map(Tensor::from_node)
}

/// Under `LAZULI_CHECK_INDICES`, the targets are checked as indices into the logits' class axis (`classes`: the
/// axis and its size), as an embedding's ids are: a target outside it that is not `ignore_index` is an
/// `Error::IndexOutOfRange` naming the loss's line and the target's position, where unchecked it silently adds
/// nothing to the loss.
fn check_targets(targets: &Tensor, ignore_index: Option<i64>, classes: (usize, usize), loc: Loc) {
    let checked = match ignore_index {
        // Ignored positions are checked as class 0, which is in range.
        Some(ignored) => {
            let (dtype, dims) = (targets.dtype(), targets.dims());
            let ignored = constant_like(ignored as f64, dtype, dims, loc);
            let is_ignored = apply(Op::Compare(lazuli_hlo::Compare { dir: CompareDir::Eq }), &[targets, &ignored], loc);
            apply(Op::Select(lazuli_hlo::Select), &[&is_ignored, &constant_like(0.0, dtype, dims, loc), targets], loc)
        }
        None => targets.clone(),
    };
    let (axis, size) = classes;
    crate::exec::index_check::watch("cross_entropy", &checked, axis, size, loc).unwrap_or_else(|e| raise(e));
}

/// Cross-entropy of `[..., C]` logits flattened to `[N, C]`. Without options it is the `CrossEntropy` node; with
/// them it stays one: ignored positions get target -1, which that node counts as 0 (value and gradient), its mean
/// is scaled from `N` to the positions kept, and the smoothing term `Σ_i (lse_i - mean_c x_ic)` over kept
/// positions is added as a composite.
fn cross_entropy_at(x: &Tensor, targets: &Tensor, opts: &CrossEntropyOptions, loc: Loc) -> Tensor {
    need_float(x, "cross_entropy", loc);
    let r = x.rank();
    if r == 0 || targets.dims() != &x.dims()[..r - 1] {
        fail(
            loc,
            format!(
                "cross_entropy: needs logits [..., C] and targets [...] of their leading shape, got {} and {}",
                x.tensor_type(),
                targets.tensor_type()
            ),
        );
    }
    if !targets.dtype().is_int() {
        fail(loc, format!("cross_entropy: targets must have an integer dtype, got {}", targets.tensor_type()));
    }
    let eps = opts.label_smoothing;
    if !(0.0..=1.0).contains(&eps) {
        fail(loc, format!("cross_entropy: label_smoothing must be in [0, 1], got {eps}"));
    }
    let c = x.dims()[r - 1];
    let n: usize = targets.dims().iter().product();
    let reshape = |t: &Tensor, dims: Vec<usize>| {
        if t.dims() == dims {
            t.clone()
        } else {
            apply(Op::Reshape(lazuli_hlo::Reshape { dims }), &[t], loc)
        }
    };
    if crate::exec::index_check::checking_all(loc) {
        check_targets(targets, opts.ignore_index, (r - 1, c), loc);
    }
    let (x2, t2) = (reshape(x, vec![n, c]), reshape(targets, vec![n]));
    let ce = |t: &Tensor| cross_entropy_node(&x2, t, loc);
    if opts.ignore_index.is_none() && eps == 0.0 {
        return ce(&t2);
    }
    // Counts in f32 at least: a sum of ones in half precision stops being exact at 256 (bf16) or 2048 (f16).
    let wide = DType::computing([x.dtype()]);
    let sum_all = |t: &Tensor| {
        let all: Vec<usize> = (0..t.rank()).collect();
        apply(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: all, keep: false }), &[t], loc)
    };
    // `kept`: bool [N], the positions not ignored; `count`: how many, as a scalar of `wide`.
    let (t2, kept, count) = match opts.ignore_index {
        Some(id) => {
            let t64 = t2.to_dtype_at(DType::I64, loc);
            let id = constant_like(id as f64, DType::I64, &[n], loc);
            let kept = compare(&t64, &id, CompareDir::Ne, loc);
            let minus_one = constant_like(-1.0, DType::I64, &[n], loc);
            let t = apply(Op::Select(lazuli_hlo::Select), &[&kept, &t64, &minus_one], loc);
            let count = sum_all(&kept.to_dtype_at(wide, loc));
            (t, Some(kept), count)
        }
        None => (t2, None, constant_like(n as f64, wide, &[], loc)),
    };
    // CrossEntropy is the mean over all N positions, ignored ones adding 0: times N is the sum over kept ones.
    let mut total = with_constant(&ce(&t2), BinaryKind::Mul, (1.0 - eps) * n as f64, loc);
    if eps > 0.0 {
        // -Σ_c (ε/C) log_softmax(x)_c = ε (lse - mean_c x_c), per position.
        let lse = logsumexp_at(&x2, &[1], false, loc);
        let mean = with_constant(&sum_kept(&x2, &[1], loc), BinaryKind::Div, c as f64, loc);
        let mean = reshape(&mean, vec![n]);
        let mut smooth = lse.binary_at(&mean, BinaryKind::Sub, loc);
        if let Some(kept) = &kept {
            let zero = constant_like(0.0, x.dtype(), &[n], loc);
            smooth = apply(Op::Select(lazuli_hlo::Select), &[kept, &smooth, &zero], loc);
        }
        total = total.binary_at(with_constant(&sum_all(&smooth), BinaryKind::Mul, eps, loc), BinaryKind::Add, loc);
    }
    total.to_dtype_at(wide, loc).binary_at(&count, BinaryKind::Div, loc).to_dtype_at(x.dtype(), loc)
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

    /// Mean cross-entropy of `[..., C]` logits against integer class `targets` of the leading shape `[...]`:
    /// `-mean(log_softmax(x, -1)[..., t])` over every position (`[N, C]` with `[N]` is the usual case). A target
    /// outside `0..C` contributes 0 to the sum (it still counts in the mean). One node, and one for its
    /// gradient; [`Tensor::cross_entropy_with`] adds PyTorch's `ignore_index` and `label_smoothing`.
    #[track_caller]
    pub fn cross_entropy(&self, targets: &Tensor) -> Tensor {
        cross_entropy_at(self, targets, &CrossEntropyOptions::default(), Loc::caller())
    }

    /// [`Tensor::cross_entropy`] with options, as PyTorch's `cross_entropy(..., ignore_index, label_smoothing)`
    /// with the mean reduction computes it: position `i` with target `t` (not ignored) adds
    /// `-Σ_c q_c log_softmax(x_i)_c` with `q = (1 - ε)·onehot(t) + ε/C`, and the sum is divided by the number of
    /// positions that are not ignored. Positions whose target is `ignore_index` add nothing, to the loss or to its
    /// gradient; when every position is ignored the result is NaN (0/0, as in PyTorch). A target outside `0..C`
    /// that is not `ignore_index` has no one-hot term (only the smoothing term) and still counts. Panics at the
    /// caller's line for shapes that do not fit, non-integer targets, or `label_smoothing` outside `[0, 1]`.
    ///
    /// ```no_run
    /// # use lazuli_lazy::{CrossEntropyOptions, DType, Tensor};
    /// let logits = Tensor::zeros(&[2, 7, 10], DType::F32);
    /// let targets = Tensor::from_slice(&[3i64, -100, 1, 2, 0, 9, 9, 4, -100, 5, 6, 7, 8, 1], &[2, 7]);
    /// let opts = CrossEntropyOptions::default().ignore_index(-100).label_smoothing(0.1);
    /// let loss = logits.cross_entropy_with(&targets, &opts);
    /// ```
    #[track_caller]
    pub fn cross_entropy_with(&self, targets: &Tensor, options: &CrossEntropyOptions) -> Tensor {
        cross_entropy_at(self, targets, options, Loc::caller())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel reads bf16 logits through their widening and a reshape, unless one of those is a gradient leaf.
    #[test]
    fn narrow_logits_are_looked_through_but_not_past_a_gradient_leaf() {
        let narrow = Tensor::from_slice(&[0.5f32; 24], &[2, 3, 4]).to_dtype(DType::BF16);
        let logits = narrow.to_dtype(DType::F32).reshape(&[6, 4]);
        let found = narrow_source(&logits).expect("looked through");
        assert_eq!((found.dtype(), found.dims()), (DType::BF16, &[2usize, 3, 4][..]));
        assert!(narrow_source(&logits.clone().requires_grad()).is_none(), "the logits are a leaf");
        let wide = narrow.to_dtype(DType::F32).requires_grad();
        assert!(narrow_source(&wide.reshape(&[6, 4])).is_none(), "the widened logits are a leaf");
        assert!(narrow_source(&Tensor::from_slice(&[0.5f32; 4], &[1, 4])).is_none(), "not a widening");
    }
}
