//! Activations recorded every step, as composites (`composite.rs`): ReLU, GELU (tanh form), and softmax with its
//! log form. Each is one node forward and one node for its gradient, where the recorded formulas were two (ReLU)
//! to about ten nodes forward and up to twenty backward. The formulas below are their only
//! definition; the compiled program is what the recorded ops gave (XLA fuses the expansion the same way).

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::infer_error::InferError;
use crate::op::{axis_in_range, Op, OpRules};
use crate::ops::composite::{expanded, same_float};
use crate::ops::elementwise::{CompareDir, UnaryKind};
use crate::ops::reduce::ReduceKind;

/// √(2/π) and the cubic coefficient of GELU's tanh form.
pub const GELU_K: f64 = 0.797_884_560_802_865_4;
pub const GELU_A: f64 = 0.044715;

/// `tanh(√(2/π) (x + 0.044715 x³))`, the inner value both GELU and its gradient need.
fn gelu_tanh<B: Builder>(b: &mut B, x: &B::V) -> B::V {
    let x2 = b.mul(x, x);
    let x3 = b.mul(&x2, x);
    let x3 = b.scale(&x3, GELU_A);
    let inner = b.add(x, &x3);
    let scaled = b.scale(&inner, GELU_K);
    b.unary(UnaryKind::Tanh, &scaled)
}

/// `x + c` for a constant `c` of `x`'s type.
fn plus<B: Builder>(b: &mut B, x: &B::V, c: f64) -> B::V {
    let c = b.full_like(x, c);
    b.add(x, &c)
}

/// GELU, tanh form: `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Gelu;

impl Gelu {
    /// Full-sized results of the recorded formula, for the planner (see `Op::cost_weight`).
    pub const FULL_RESULTS: usize = 9;

    fn expand<B: Builder>(&self, b: &mut B, x: &[B::V]) -> B::V {
        let t = gelu_tanh(b, &x[0]);
        let half_x = b.scale(&x[0], 0.5);
        let one_t = plus(b, &t, 1.0);
        b.mul(&half_x, &one_t)
    }
}

impl OpRules for Gelu {
    fn name(&self) -> &'static str {
        "gelu"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        same_float("gelu", operands, 1)
    }
    expanded!();
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        vec![Some(b.op(Op::GeluGrad(GeluGrad), &[&x[0], g]))]
    }
}

/// The gradient of [`Gelu`] at `x` for the cotangent `g`:
/// `g (0.5 (1 + t) + 0.5 x (1 - t²) √(2/π) (1 + 3 · 0.044715 x²))` with `t` the inner tanh.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GeluGrad;

impl GeluGrad {
    fn expand<B: Builder>(&self, b: &mut B, x: &[B::V]) -> B::V {
        let (x, g) = (&x[0], &x[1]);
        let t = gelu_tanh(b, x);
        let one_t = plus(b, &t, 1.0);
        let left = b.scale(&one_t, 0.5);
        let t2 = b.mul(&t, &t);
        let sech2 = b.neg(&t2);
        let sech2 = plus(b, &sech2, 1.0);
        let x2 = b.mul(x, x);
        let dinner = b.scale(&x2, 3.0 * GELU_A * GELU_K);
        let dinner = plus(b, &dinner, GELU_K);
        let half_x = b.scale(x, 0.5);
        let right = b.mul(&half_x, &sech2);
        let right = b.mul(&right, &dinner);
        let d = b.add(&left, &right);
        b.mul(g, &d)
    }
}

impl OpRules for GeluGrad {
    fn name(&self) -> &'static str {
        "gelu_grad"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        same_float("gelu_grad", operands, 2)
    }
    expanded!(taped);
}

/// `max(x, 0)` (any numeric type), with gradient 0 at 0: one node, where a comparison and a selection were two
/// (and their gradient one more). NaN stays NaN, as `max` propagates it (and as in JAX and PyTorch); its gradient
/// there is 0, as theirs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Relu;

/// `x > 0`.
fn positive<B: Builder>(b: &mut B, x: &B::V) -> B::V {
    let zero = b.full_like(x, 0.0);
    b.compare(CompareDir::Gt, x, &zero)
}

impl Relu {
    /// `x <= 0 ? 0 : x`: the comparison is false for NaN, which then passes through (`x > 0 ? x : 0` would zero it).
    fn expand<B: Builder>(&self, b: &mut B, x: &[B::V]) -> B::V {
        let zero = b.full_like(&x[0], 0.0);
        let not_positive = b.compare(CompareDir::Le, &x[0], &zero);
        b.select(&not_positive, &zero, &x[0])
    }
}

impl OpRules for Relu {
    fn name(&self) -> &'static str {
        "relu"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        crate::op::arity("relu", operands, 1)?;
        match operands[0] {
            t if t.dtype == crate::DType::Bool => {
                Err(InferError::DType(format!("relu needs a numeric operand, got {t}")))
            }
            t => Ok(t.clone()),
        }
    }
    expanded!();
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        vec![Some(b.op(Op::ReluGrad(ReluGrad), &[&x[0], g]))]
    }
}

/// The gradient of [`Relu`] at `x` for the cotangent `g`: `g` where `x > 0`, else 0.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReluGrad;

impl ReluGrad {
    fn expand<B: Builder>(&self, b: &mut B, x: &[B::V]) -> B::V {
        let p = positive(b, &x[0]);
        b.mask(&p, &x[1])
    }
}

impl OpRules for ReluGrad {
    fn name(&self) -> &'static str {
        "relu_grad"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        same_float("relu_grad", operands, 2)
    }
    expanded!(taped);
}

/// `x - max(x)` along `axis`, with an infinite maximum taken as 0 (a row that is all -inf stays -inf rather
/// than becoming NaN before the exponential): the stable start of the softmax family.
fn shifted<B: Builder>(b: &mut B, x: &B::V, axis: usize) -> B::V {
    let dims = b.ty(x).dims.clone();
    let m = b.finite_max_kept(x, axis);
    let m = b.expand(&m, &dims);
    b.sub(x, &m)
}

/// `exp(x) / sum(exp(x))` along `axis`, or with `log` its logarithm `x - log(sum(exp(x)))` (the log-probabilities
/// a cross-entropy reads); shifted by the maximum for stability (a row that is all -inf is shifted by 0, so it
/// stays NaN-free up to the division, as an all-masked row should show NaN).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Softmax {
    pub axis: usize,
    pub log: bool,
}

impl Softmax {
    /// Full-sized results of the recorded formula (shifted, exponentiated, divided or subtracted), for the planner.
    pub const FULL_RESULTS: usize = 3;

    fn expand<B: Builder>(&self, b: &mut B, x: &[B::V]) -> B::V {
        let dims = b.ty(&x[0]).dims.clone();
        let shifted = shifted(b, &x[0], self.axis);
        let e = b.unary(UnaryKind::Exp, &shifted);
        let s = b.reduce_kept(ReduceKind::Sum, &e, &[self.axis]);
        if self.log {
            let lse = b.unary(UnaryKind::Log, &s);
            let lse = b.expand(&lse, &dims);
            return b.sub(&shifted, &lse);
        }
        let s = b.expand(&s, &dims);
        b.div(&e, &s)
    }

    /// `n` operands of one float type, and the axis in range; `name` is the checking op's.
    fn check(&self, name: &str, operands: &[&TensorType], n: usize) -> Result<TensorType, InferError> {
        let t = same_float(name, operands, n)?;
        axis_in_range(name, &t, self.axis)?;
        Ok(t)
    }
}

impl OpRules for Softmax {
    fn name(&self) -> &'static str {
        if self.log {
            "log_softmax"
        } else {
            "softmax"
        }
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        self.check(self.name(), operands, 1)
    }
    expanded!();
    fn vjp<B: Builder>(&self, b: &mut B, _: &[B::V], out: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        vec![Some(b.op(Op::SoftmaxGrad(SoftmaxGrad(self.clone())), &[out, g]))]
    }
}

/// The gradient of [`Softmax`] given its result `y` and the cotangent `g`, along the axis: `y (g - sum(g y))`,
/// or for the log form `g - exp(y) sum(g)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SoftmaxGrad(pub Softmax);

impl SoftmaxGrad {
    fn expand<B: Builder>(&self, b: &mut B, x: &[B::V]) -> B::V {
        let (y, g, axis) = (&x[0], &x[1], self.0.axis);
        let dims = b.ty(y).dims.clone();
        if self.0.log {
            let p = b.unary(UnaryKind::Exp, y);
            let s = b.reduce_kept(ReduceKind::Sum, g, &[axis]);
            let s = b.expand(&s, &dims);
            let ps = b.mul(&p, &s);
            return b.sub(g, &ps);
        }
        let gy = b.mul(g, y);
        let s = b.reduce_kept(ReduceKind::Sum, &gy, &[axis]);
        let s = b.expand(&s, &dims);
        let d = b.sub(g, &s);
        b.mul(y, &d)
    }
}

impl OpRules for SoftmaxGrad {
    fn name(&self) -> &'static str {
        if self.0.log {
            "log_softmax_grad"
        } else {
            "softmax_grad"
        }
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        self.0.check(self.name(), operands, 2)
    }
    expanded!(taped);
}

#[cfg(test)]
mod tests {
    use ndarray::{ArrayD, IxDyn};

    use super::*;
    use crate::ops::composite::{check_vjp, data};

    fn eval(op: &Op, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let ty = TensorType::new(crate::DType::F64, x[0].shape());
        op.reference(&ty, x)
    }

    #[test]
    fn values_match_the_formulas() {
        let x = data(&[3, 4], 1);
        let relu = eval(&Op::Relu(Relu), &[&x]);
        assert!(relu.iter().zip(&x).all(|(r, v)| *r == v.max(0.0)), "{relu} vs max({x}, 0)");
        let gelu = eval(&Op::Gelu(Gelu), &[&x]);
        let want = x.mapv(|v| 0.5 * v * (1.0 + (GELU_K * (v + GELU_A * v * v * v)).tanh()));
        assert!(gelu.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12), "{gelu} vs {want}");
        let sm = eval(&Op::Softmax(Softmax { axis: 0, log: false }), &[&x]);
        for c in 0..4 {
            let col = x.index_axis(ndarray::Axis(1), c);
            let total: f64 = col.iter().map(|v| v.exp()).sum();
            for r in 0..3 {
                assert!((sm[[r, c]] - x[[r, c]].exp() / total).abs() < 1e-12, "softmax [{r}, {c}]");
            }
        }
        let lsm = eval(&Op::Softmax(Softmax { axis: 0, log: true }), &[&x]);
        assert!(lsm.iter().zip(&sm).all(|(l, p)| (l - p.ln()).abs() < 1e-12), "{lsm} vs log {sm}");
        // A row that is all -inf: no shift by -inf, so the exponentials are 0 and the division 0/0.
        let masked = ArrayD::from_elem(IxDyn(&[1, 3]), f64::NEG_INFINITY);
        assert!(eval(&Op::Softmax(Softmax { axis: 1, log: false }), &[&masked]).iter().all(|v| v.is_nan()));
    }

    #[test]
    fn gradients_match_finite_differences() {
        let x = data(&[3, 5], 2);
        check_vjp(&Op::Gelu(Gelu), std::slice::from_ref(&x));
        check_vjp(&Op::GeluGrad(GeluGrad), &[x.clone(), data(&[3, 5], 3)]);
        // (ReluGrad's own derivative in `x` is zero almost everywhere: its taped gradient records none.)
        check_vjp(&Op::Relu(Relu), std::slice::from_ref(&x));
        for axis in 0..2 {
            for log in [false, true] {
                let sm = Softmax { axis, log };
                check_vjp(&Op::Softmax(sm.clone()), std::slice::from_ref(&x));
                let y = eval(&Op::Softmax(sm.clone()), &[&x]);
                check_vjp(&Op::SoftmaxGrad(SoftmaxGrad(sm)), &[y, data(&[3, 5], 4)]);
            }
        }
    }
}
