//! Softmax cross-entropy against integer class ids, the loss of nearly every classifier and language model, as
//! one composite node (`composite.rs`) with a one-node gradient. Recorded as ops it was log-softmax, a one-hot
//! mask (convert, broadcast, iota, compare), a select, a sum and a division forward, and five more nodes
//! backward; a framework that re-records every step pays for each of them. The gradient is the textbook
//! `(softmax(x) - onehot(t)) · g / N`, computed from the logits, so the log-probabilities need not be kept for
//! the backward pass.

use crate::infer_error::InferError;
use ndarray::ArrayD;

use crate::builder::Builder;
use crate::dtype::{DType, TensorType};
use crate::emit::LowerCx;
use crate::op::{arity, Op, OpRules};
use crate::ops::activation::Softmax;
use crate::ops::composite::{self, Evaluating};
use crate::ops::elementwise::{BinaryKind, CompareDir, UnaryKind};
use crate::ops::leaf::Iota;
use crate::shard::{DimShards, ShardIn};

/// Check logits `[N, C]` (float) and class ids `[N]` (integer); `name` is the checking op's.
fn check_pair(name: &str, x: &TensorType, t: &TensorType) -> Result<(), InferError> {
    if !x.dtype.is_float() || x.rank() != 2 {
        let message = format!("{name} needs floating-point logits [N, C], got {x}");
        return Err(if x.dtype.is_float() { InferError::Shape(message) } else { InferError::DType(message) });
    }
    if !t.dtype.is_int() || t.rank() != 1 || t.dims[0] != x.dims[0] {
        let message = format!("{name} needs integer class ids [{}] for logits {x}, got {t}", x.dims[0]);
        return Err(if t.dtype.is_int() { InferError::Shape(message) } else { InferError::DType(message) });
    }
    Ok(())
}

/// `t[i] == j` as a bool `[N, C]` mask. Ids are compared as i64, so that no class count wraps a narrow type
/// (u8 ids with 300 classes).
fn one_hot<B: Builder>(b: &mut B, t: &B::V, classes: usize) -> B::V {
    let t = b.convert(t, DType::I64);
    let dims = vec![b.ty(&t).dims[0], classes];
    let wide = b.broadcast(&t, &dims, &[0]);
    let ids = b.op(Op::Iota(Iota { dim: 1, ty: TensorType::new(DType::I64, dims) }), &[]);
    b.compare(CompareDir::Eq, &wide, &ids)
}

/// `0 <= t[i] < classes` as a bool `[N]` (compared as i64, as in [`one_hot`]): the rows a cross-entropy counts.
pub fn in_range<B: Builder>(b: &mut B, t: &B::V, classes: usize) -> B::V {
    let t = &b.convert(t, DType::I64);
    let zero = b.full_like(t, 0.0);
    let top = b.full_like(t, classes as f64);
    let above = b.compare(CompareDir::Ge, t, &zero);
    let below = b.compare(CompareDir::Lt, t, &top);
    b.binary(BinaryKind::And, &above, &below)
}

/// The reference value of a loss op's expansion, with the class ids (operand 1) typed as integers.
fn reference_of(
    out_dtype: DType,
    x: &[&ArrayD<f64>],
    expand: impl FnOnce(&mut Evaluating, &[(ArrayD<f64>, TensorType)]) -> (ArrayD<f64>, TensorType),
) -> ArrayD<f64> {
    let args: Vec<(ArrayD<f64>, TensorType)> = x
        .iter()
        .enumerate()
        .map(|(i, a)| ((*a).clone(), TensorType::new(if i == 1 { DType::I64 } else { out_dtype }, a.shape())))
        .collect();
    expand(&mut Evaluating, &args).0
}

/// Mean cross-entropy of logits `[N, C]` against class ids `[N]`: `-mean_i log_softmax(x)[i, t_i]`. A class id
/// outside `0..C` picks nothing: that row adds 0 and gets no gradient (the mean still divides by `N`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CrossEntropy;

impl CrossEntropy {
    /// Full-sized results of the recorded formula (log-softmax's three, the mask, the selection): the planner
    /// counts this node as that many elementwise results (see `Op::cost_weight`).
    pub const FULL_RESULTS: usize = 5;

    fn expand<B: Builder>(&self, b: &mut B, x: &[B::V]) -> B::V {
        let (logits, t) = (&x[0], &x[1]);
        let [n, c] = b.ty(logits).dims[..] else { unreachable!("checked [N, C]") };
        let lsm = b.op(Op::Softmax(Softmax { axis: 1, log: true }), &[logits]);
        let hot = one_hot(b, t, c);
        let picked = b.mask(&hot, &lsm);
        let total = b.sum(&picked, &[0, 1]);
        let count = b.full_like(&total, -(n as f64));
        b.div(&total, &count)
    }
}

impl OpRules for CrossEntropy {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("cross_entropy", operands, 2)?;
        check_pair("cross_entropy", operands[0], operands[1])?;
        Ok(TensorType::scalar(operands[0].dtype))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        composite::lower(cx, |b, x| self.expand(b, x))
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        reference_of(out.dtype, x, |b, x| self.expand(b, x))
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        vec![Some(b.op(Op::CrossEntropyGrad(CrossEntropyGrad), &[&x[0], &x[1], g])), None]
    }
    fn shard(&self, _: &[ShardIn<'_>], _: &TensorType) -> Option<DimShards> {
        // A scalar: whole on every device.
        None
    }
}

/// The gradient of [`CrossEntropy`] with respect to the logits `x`, for class ids `t` and the loss's cotangent
/// `g` (a scalar): `(softmax(x) - onehot(t)) · g / N`, and 0 on rows whose class id is out of range.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CrossEntropyGrad;

impl CrossEntropyGrad {
    fn expand<B: Builder>(&self, b: &mut B, x: &[B::V]) -> B::V {
        let (logits, t, g) = (&x[0], &x[1], &x[2]);
        let ty = b.ty(logits).clone();
        // exp(log_softmax(x)), not softmax(x): XLA then shares the forward's log-softmax and fuses as it did the
        // recorded gradient (softmax's division would need the row sums as a separate kernel).
        let lsm = b.op(Op::Softmax(Softmax { axis: 1, log: true }), &[logits]);
        let p = b.unary(UnaryKind::Exp, &lsm);
        let hot = one_hot(b, t, ty.dims[1]);
        let hot = b.convert(&hot, ty.dtype);
        let d = b.sub(&p, &hot);
        let count = b.full_like(g, ty.dims[0] as f64);
        let scale = b.div(g, &count);
        let scale = b.broadcast(&scale, &ty.dims, &[]);
        let d = b.mul(&d, &scale);
        // A row whose class id is out of range adds a constant 0 to the loss, so its gradient is 0 (elementwise
        // on the ids: XLA fuses it into the same kernel).
        let valid = in_range(b, t, ty.dims[1]);
        let valid = b.broadcast(&valid, &ty.dims, &[0]);
        b.mask(&valid, &d)
    }
}

impl OpRules for CrossEntropyGrad {
    fn name(&self) -> &'static str {
        "cross_entropy_grad"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("cross_entropy_grad", operands, 3)?;
        let (x, t, g) = (operands[0], operands[1], operands[2]);
        check_pair("cross_entropy_grad", x, t)?;
        if g.rank() != 0 || g.dtype != x.dtype {
            let message = format!("cross_entropy_grad needs a scalar cotangent of {}, got {g}", x.dtype);
            return Err(if g.dtype != x.dtype { InferError::DType(message) } else { InferError::Shape(message) });
        }
        Ok(x.clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        composite::lower(cx, |b, x| self.expand(b, x))
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        reference_of(out.dtype, x, |b, x| self.expand(b, x))
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        // Second order, through the formula; the class ids get no cotangent.
        let mut d = composite::vjp(b, x, g, |t, x| self.expand(t, x));
        d[1] = None;
        d
    }
    fn shard(&self, x: &[ShardIn<'_>], out: &TensorType) -> Option<DimShards> {
        // Split like the logits.
        crate::shard::elementwise(&x[..1], out)
    }
}

#[cfg(test)]
mod tests {
    use ndarray::IxDyn;

    use super::*;
    use crate::ops::composite::{check_vjp_but, data};

    /// Class ids `[n]` in `0..c`.
    fn ids(n: usize, c: usize) -> ArrayD<f64> {
        ArrayD::from_shape_fn(IxDyn(&[n]), |ix| ((ix[0] * 7 + 2) % c) as f64)
    }

    #[test]
    fn the_loss_matches_the_formula() {
        let (x, t) = (data(&[4, 5], 1), ids(4, 5));
        let out = TensorType::scalar(DType::F64);
        let got = CrossEntropy.reference(&out, &[&x, &t]).into_iter().next().expect("a scalar");
        let mut want = 0.0;
        for i in 0..4 {
            let row = x.index_axis(ndarray::Axis(0), i);
            let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
            want -= row[t[i] as usize] - lse;
        }
        want /= 4.0;
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }

    #[test]
    fn gradients_match_finite_differences() {
        // Ids out of range (a row that adds nothing) have no gradient, like the loss they add.
        let wild = ArrayD::from_shape_vec(IxDyn(&[4]), vec![2.0, 7.0, 0.0, -1.0]).expect("four ids");
        check_vjp_but(&Op::CrossEntropy(CrossEntropy), &[data(&[4, 5], 5), wild], &[1]);
        let (x, t) = (data(&[4, 5], 2), ids(4, 5));
        check_vjp_but(&Op::CrossEntropy(CrossEntropy), &[x.clone(), t.clone()], &[1]);
        // Second order: the gradient's own gradient, through its formula (the cotangent `g` is a scalar).
        let g = ArrayD::from_elem(IxDyn(&[]), 0.7);
        check_vjp_but(&Op::CrossEntropyGrad(CrossEntropyGrad), &[x, t, g], &[1]);
    }

    /// u8 ids against 300 classes: no class count wraps the ids' type.
    #[test]
    fn narrow_ids_pick_their_own_class() {
        let x = data(&[2, 300], 6);
        // Wrapped to u8, class 266 would be 10 too, and the bound 300 would be 44.
        let t = ArrayD::from_shape_vec(IxDyn(&[2]), vec![10.0, 255.0]).expect("two ids");
        let tys = [TensorType::new(DType::F64, vec![2, 300]), TensorType::new(DType::U8, vec![2])];
        let args: Vec<(ArrayD<f64>, TensorType)> = vec![(x.clone(), tys[0].clone()), (t, tys[1].clone())];
        let got = CrossEntropy.expand(&mut Evaluating, &args).0.into_iter().next().expect("a scalar");
        let g = (ArrayD::from_elem(IxDyn(&[]), 1.0), TensorType::scalar(DType::F64));
        let d = CrossEntropyGrad.expand(&mut Evaluating, &[args[0].clone(), args[1].clone(), g]).0;
        let mut want = 0.0;
        for (i, id) in [10, 255].into_iter().enumerate() {
            let row = x.index_axis(ndarray::Axis(0), i);
            let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
            want -= (row[id] - lse) / 2.0;
            // The gradient is softmax - onehot, over 2 rows: negative only at the row's own class.
            let negative: Vec<usize> = (0..300).filter(|&j| d[[i, j]] < 0.0).collect();
            assert_eq!(negative, [id], "row {i}");
        }
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }

    #[test]
    fn bad_operands_are_refused_with_their_types() {
        let x = TensorType::new(DType::F32, vec![4, 5]);
        let e = CrossEntropy.infer(&[&x, &TensorType::new(DType::F32, vec![4])]).unwrap_err();
        assert!(matches!(e, InferError::DType(_)), "{e:?}");
        assert!(e.message().contains("integer class ids [4]") && e.message().contains("f32[4]"), "{e}");
        let e = CrossEntropy.infer(&[&x, &TensorType::new(DType::I32, vec![3])]).unwrap_err();
        assert!(matches!(e, InferError::Shape(_)), "{e:?}");
        assert!(e.message().contains("i32[3]"), "{e}");
    }
}
