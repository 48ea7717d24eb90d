//! Normalization over a set of axes, `(x - mean) / sqrt(var + eps)` with the biased variance: layer
//! normalization without its scale and shift. Recorded as ops it is about ten nodes forward and twenty backward;
//! as a composite it is one node each way, [`Normalize`] and its gradient [`NormalizeGrad`], which matters for a
//! framework that re-records every step (a GPT step is a quarter layer norm otherwise).
//!
//! Both are composites (`composite.rs`): the formulas below are their only definition, lowered op by op (XLA
//! fuses them as it fused the recorded ops) and evaluated by the reference interpreter. The gradient of
//! `Normalize` is `NormalizeGrad`; the gradient of `NormalizeGrad` (second order) runs through its formula.

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::infer_error::InferError;
use crate::op::{Op, OpRules};
use crate::ops::composite::{expanded, same_float};
use crate::ops::elementwise::UnaryKind;
use crate::ops::reduce::ReduceKind;

/// The axes normalized over (sorted, unique) and epsilon: what an op and its gradient share.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NormSpec {
    pub axes: Vec<usize>,
    /// `f64::to_bits` of epsilon (bits keep Hash/Eq total).
    eps_bits: u64,
}

impl NormSpec {
    pub fn new(axes: Vec<usize>, eps: f64) -> NormSpec {
        NormSpec { axes, eps_bits: eps.to_bits() }
    }
    pub fn eps(&self) -> f64 {
        f64::from_bits(self.eps_bits)
    }

    /// `x`'s type, checked: axes in range.
    fn check(&self, name: &str, x: &TensorType) -> Result<TensorType, InferError> {
        // A negative eps makes a constant row's scale NaN, a NaN or infinite one every row's.
        if !(self.eps().is_finite() && self.eps() >= 0.0) {
            return Err(InferError::Attribute(format!(
                "{name}: eps = {} is not a finite number ≥ 0 (the variance's guard against dividing by zero)",
                self.eps()
            )));
        }
        if self.axes.is_empty() {
            return Err(InferError::Attribute(format!(
                "{name} needs at least one axis to normalize over, got none for {x}"
            )));
        }
        if self.axes.windows(2).any(|w| w[0] >= w[1]) || self.axes.iter().any(|&a| a >= x.rank()) {
            return Err(InferError::Attribute(format!(
                "{name}: axes {:?} are not sorted unique dimensions of {x}",
                self.axes
            )));
        }
        Ok(x.clone())
    }

    /// The mean of `v` over the axes, kept as size 1.
    fn mean<B: Builder>(&self, b: &mut B, v: &B::V) -> B::V {
        let count: usize = self.axes.iter().map(|&a| b.ty(v).dims[a]).product();
        let s = b.reduce_kept(ReduceKind::Sum, v, &self.axes);
        let n = b.full_like(&s, count as f64);
        b.div(&s, &n)
    }

    /// `x - mean(x)` and `1 / sqrt(var(x) + eps)`, both of `x`'s shape.
    fn centered_and_scale<B: Builder>(&self, b: &mut B, x: &B::V) -> (B::V, B::V) {
        let dims = b.ty(x).dims.clone();
        let mean = self.mean(b, x);
        let mean = b.expand(&mean, &dims);
        let c = b.sub(x, &mean);
        let sq = b.mul(&c, &c);
        let var = self.mean(b, &sq);
        let eps = b.full_like(&var, self.eps());
        let var = b.add(&var, &eps);
        let r = b.unary(UnaryKind::Rsqrt, &var);
        let r = b.expand(&r, &dims);
        (c, r)
    }
}

/// `(x - mean) / sqrt(var + eps)` over the spec's axes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Normalize(pub NormSpec);

impl Normalize {
    /// Full-sized results of the recorded formula (centered, squared, scaled): the planner counts this node as
    /// that many elementwise results, as it counted the formula's ops.
    pub const FULL_RESULTS: usize = 3;

    fn expand<B: Builder>(&self, b: &mut B, x: &[B::V]) -> B::V {
        let (c, r) = self.0.centered_and_scale(b, &x[0]);
        b.mul(&c, &r)
    }
}

impl OpRules for Normalize {
    fn name(&self) -> &'static str {
        "normalize"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        let t = same_float("normalize", operands, 1)?;
        self.0.check("normalize", &t)
    }
    expanded!();
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        vec![Some(b.op(Op::NormalizeGrad(NormalizeGrad(self.0.clone())), &[&x[0], g]))]
    }
}

/// The gradient of [`Normalize`] at `x` for the cotangent `g`: with `x̂` the normalized `x` and `r` the inverse
/// deviation, `r (g - mean(g) - x̂ mean(g x̂))`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NormalizeGrad(pub NormSpec);

impl NormalizeGrad {
    fn expand<B: Builder>(&self, b: &mut B, x: &[B::V]) -> B::V {
        let (x, g) = (&x[0], &x[1]);
        let dims = b.ty(x).dims.clone();
        let (c, r) = self.0.centered_and_scale(b, x);
        let xhat = b.mul(&c, &r);
        let gm = self.0.mean(b, g);
        let gm = b.expand(&gm, &dims);
        let gx = b.mul(g, &xhat);
        let gx = self.0.mean(b, &gx);
        let gx = b.expand(&gx, &dims);
        let along = b.mul(&xhat, &gx);
        let d = b.sub(g, &gm);
        let d = b.sub(&d, &along);
        b.mul(&r, &d)
    }
}

impl OpRules for NormalizeGrad {
    fn name(&self) -> &'static str {
        "normalize_grad"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        let t = same_float("normalize_grad", operands, 2)?;
        self.0.check("normalize_grad", &t)
    }
    expanded!(taped);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::composite::{check_vjp, data};

    #[test]
    fn normalize_matches_the_formula() {
        let x = data(&[3, 5], 1);
        let ty = TensorType::new(crate::DType::F64, vec![3, 5]);
        let y = Normalize(NormSpec::new(vec![1], 1e-5)).reference(&ty, &[&x]);
        for r in 0..3 {
            let row = x.index_axis(ndarray::Axis(0), r);
            let mean = row.sum() / 5.0;
            let var = row.mapv(|v| (v - mean).powi(2)).sum() / 5.0;
            for c in 0..5 {
                let want = (x[[r, c]] - mean) / (var + 1e-5).sqrt();
                assert!((y[[r, c]] - want).abs() < 1e-12, "[{r}, {c}]: {} vs {want}", y[[r, c]]);
            }
        }
    }

    #[test]
    fn gradients_match_finite_differences() {
        for (dims, axes) in [(&[4, 6][..], vec![1]), (&[2, 3, 4], vec![0, 2]), (&[5], vec![0])] {
            let spec = NormSpec::new(axes, 1e-3);
            let x = data(dims, 2);
            check_vjp(&Op::Normalize(Normalize(spec.clone())), std::slice::from_ref(&x));
            // Second order: the gradient's own gradient, through its formula.
            check_vjp(&Op::NormalizeGrad(NormalizeGrad(spec)), &[x, data(dims, 3)]);
        }
    }
}
