//! Reductions over a set of axes (sum, max, min); mean is sum divided by the count, composed by the recorder.
//! `max` and `min` of floats propagate NaN on every device (the runtime turns XLA's fast min/max off, as JAX does;
//! `docs/numerics.md`); integer sums wrap.

use crate::infer_error::InferError;
use ndarray::{ArrayD, Axis};

use crate::builder::Builder;
use crate::dtype::{DType, TensorType};
use crate::emit::{i64_array, LowerCx};
use crate::op::{arity, OpRules};
use crate::ops::elementwise::{nan_where_nan, CompareDir};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Max,
    Min,
}

impl ReduceKind {
    /// Name, the StableHLO op of the reducer body, and the identity value for a dtype.
    fn row(self, dt: DType) -> (&'static str, &'static str, f64) {
        match self {
            ReduceKind::Sum => ("sum", "stablehlo.add", 0.0),
            ReduceKind::Max => ("max", "stablehlo.maximum", dt.lowest()),
            ReduceKind::Min => ("min", "stablehlo.minimum", dt.highest()),
        }
    }
}

/// Reduce the listed axes (sorted, unique) away, or to size 1 with `keep` (one node for what would otherwise be
/// a reduction and a reshape, in the forward pass and in its gradient).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reduce {
    pub kind: ReduceKind,
    pub axes: Vec<usize>,
    pub keep: bool,
}

impl Reduce {
    /// The reduction's result without kept axes.
    fn dropped(&self, t: &TensorType) -> TensorType {
        let dims: Vec<usize> =
            t.dims.iter().enumerate().filter(|(i, _)| !self.axes.contains(i)).map(|(_, &d)| d).collect();
        TensorType::new(t.dtype, dims)
    }
}

impl OpRules for Reduce {
    fn name(&self) -> &'static str {
        self.kind.row(DType::F32).0
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        let name = self.name();
        arity(name, operands, 1)?;
        let t = operands[0];
        if self.axes.windows(2).any(|w| w[0] >= w[1]) || self.axes.iter().any(|&a| a >= t.rank()) {
            return Err(InferError::Attribute(format!(
                "{name}: axes {:?} are not sorted unique dimensions of {t}",
                self.axes
            )));
        }
        if self.kind == ReduceKind::Sum && t.dtype == DType::Bool {
            return Err(InferError::DType(format!("sum is not defined for {t}; convert to an integer type first")));
        }
        if self.keep {
            let dims: Vec<usize> = (0..t.rank()).map(|i| if self.axes.contains(&i) { 1 } else { t.dims[i] }).collect();
            return Ok(TensorType::new(t.dtype, dims));
        }
        Ok(self.dropped(t))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let in_ty = cx.arg_ty(0).clone();
        let out = self.dropped(&in_ty);
        let scalar = TensorType::scalar(in_ty.dtype);
        let (_, body_op, init) = self.kind.row(in_ty.dtype);
        let init_attr = format!("value = dense<{}> : {}", in_ty.dtype.literal(init), scalar.mlir());
        let init_name = cx.op("stablehlo.constant", &[], &[], &init_attr, None, &scalar);
        let s = scalar.mlir();
        let region = format!(
            "{{\n    ^bb0(%a: {s}, %b: {s}):\n      %r = \"{body_op}\"(%a, %b) : ({s}, {s}) -> {s}\n      \"stablehlo.return\"(%r) : ({s}) -> ()\n    }}"
        );
        let x = cx.arg(0).to_string();
        let attrs = format!("dimensions = {}", i64_array(&self.axes));
        let r = cx.op("stablehlo.reduce", &[x, init_name], &[&in_ty, &scalar], &attrs, Some(&region), &out);
        if !self.keep {
            return r;
        }
        let kept = cx.out_ty().clone();
        let reshape = crate::op::Op::Reshape(crate::ops::layout::Reshape { dims: kept.dims.to_vec() });
        cx.lower_op(&reshape, vec![(r, &out)], &kept)
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let (_, _, init) = self.kind.row(out.dtype);
        let kind = self.kind;
        let mut a = x[0].clone();
        for &ax in self.axes.iter().rev() {
            a = a.fold_axis(Axis(ax), init, |&acc, &v| match kind {
                ReduceKind::Sum => acc + v,
                ReduceKind::Max => {
                    if v.is_nan() || acc.is_nan() {
                        f64::NAN
                    } else {
                        acc.max(v)
                    }
                }
                ReduceKind::Min => {
                    if v.is_nan() || acc.is_nan() {
                        f64::NAN
                    } else {
                        acc.min(v)
                    }
                }
            });
        }
        if self.keep {
            return a.into_shape_with_order(ndarray::IxDyn(&out.dims)).expect("same element count");
        }
        a
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], out: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let dims = b.ty(&x[0]).dims.clone();
        let kept: Vec<usize> = (0..dims.len()).filter(|d| !self.axes.contains(d)).collect();
        // A kept result has every dimension, the reduced ones of size 1.
        let all: Vec<usize> = (0..dims.len()).collect();
        let map = if self.keep { &all } else { &kept };
        let gb = b.broadcast(g, &dims, map);
        let dx = match self.kind {
            ReduceKind::Sum => gb,
            // The gradient goes to the extremal elements, split evenly among ties. A NaN result (max and min
            // propagate NaN) equals no element, so the numbers get 0 and each NaN element gets NaN.
            ReduceKind::Max | ReduceKind::Min => {
                let ob = b.broadcast(out, &dims, map);
                let hit = b.compare(CompareDir::Eq, &x[0], &ob);
                let one = b.full_like(&x[0], 1.0);
                let ones = b.mask(&hit, &one);
                let count = b.sum(&ones, &self.axes);
                let count = b.broadcast(&count, &dims, &kept);
                let share = b.div(&gb, &count);
                let dx = b.mask(&hit, &share);
                if !b.ty(&x[0]).dtype.is_float() {
                    return vec![Some(dx)];
                }
                nan_where_nan(b, &x[0], &dx)
            }
        };
        vec![Some(dx)]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], _out: &TensorType) -> Option<crate::shard::DimShards> {
        if self.keep {
            let d = x[0].dims?;
            let kept: crate::shard::DimShards = d
                .iter()
                .enumerate()
                .map(|(i, a)| if self.axes.contains(&i) { Default::default() } else { a.clone() })
                .collect();
            return kept.iter().any(|a| !a.is_empty()).then_some(kept);
        }
        crate::shard::drop_dims(&x[0], &self.axes)
    }
}
