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
        use crate::op::Op;
        use crate::ops::elementwise::Convert;
        let in_ty = cx.arg_ty(0).clone();
        let out = self.dropped(&in_ty);
        let mut x = cx.arg(0).to_string();
        // 16-bit sums accumulate in f32 (as JAX's and PyTorch's do): a bf16 running sum stops growing once it
        // is 256 times the addend. XLA fuses the conversions into the reduction.
        let acc = match (self.kind, in_ty.dtype) {
            (ReduceKind::Sum, DType::BF16 | DType::F16) => DType::F32,
            (_, dt) => dt,
        };
        let (acc_in, acc_out) = (in_ty.with_dtype(acc), out.with_dtype(acc));
        if acc != in_ty.dtype {
            x = cx.lower_op(&Op::Convert(Convert { from: in_ty.dtype, to: acc }), vec![(x, &in_ty)], &acc_in);
        }
        let scalar = TensorType::scalar(acc);
        let (_, body_op, init) = self.kind.row(acc);
        let init_attr = format!("value = dense<{}> : {}", acc.literal(init), scalar.mlir());
        let init_name = cx.op("stablehlo.constant", &[], &[], &init_attr, None, &scalar);
        let s = scalar.mlir();
        let region = format!(
            "{{\n    ^bb0(%a: {s}, %b: {s}):\n      %r = \"{body_op}\"(%a, %b) : ({s}, {s}) -> {s}\n      \"stablehlo.return\"(%r) : ({s}) -> ()\n    }}"
        );
        let attrs = format!("dimensions = {}", i64_array(&self.axes));
        let mut r = cx.op("stablehlo.reduce", &[x, init_name], &[&acc_in, &scalar], &attrs, Some(&region), &acc_out);
        if acc != in_ty.dtype {
            r = cx.lower_op(&Op::Convert(Convert { from: acc, to: in_ty.dtype }), vec![(r, &acc_out)], &out);
        }
        if !self.keep {
            return r;
        }
        let kept = cx.out_ty().clone();
        let reshape = Op::Reshape(crate::ops::layout::Reshape { dims: kept.dims.to_vec() });
        cx.lower_op(&reshape, vec![(r, &out)], &kept)
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let (_, _, init) = self.kind.row(out.dtype);
        if x[0].is_empty() {
            // Nothing to fold: every result is the initial value. (An empty array may still have a vast count of
            // empty lanes to walk, `[2^40, 0, 5]`.)
            return ArrayD::from_elem(ndarray::IxDyn(&out.dims), init);
        }
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

/// A floating-point tensor's count of non-finite elements and its smallest and largest element, in one variadic
/// reduction (one kernel, one read): the NaN locator's probe of every node it watches (`finite.rs`). The result is
/// `[3]` in f32 (f64 for f64 tensors): the count's bits (an i32, or for f64 an i64, reinterpreted, so that it is
/// exact at any size: [`FiniteStats::read`] turns it back), then the minimum and the maximum (NaN if there is a
/// NaN; the dtype's `highest` and `lowest` for an empty tensor). With `rows`, the operand is `[k, n]` and the
/// result `[k, 3]`, each row's three: one reduction for several same-sized tensors stacked. No gradient: it only
/// reports. Counts wrap past `i32::MAX` elements, as the step's own check does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FiniteStats {
    pub rows: bool,
}

impl FiniteStats {
    /// The count, minimum and maximum in a [`FiniteStats`] result of type `dtype`, read as f64 values.
    pub fn read(dtype: DType, values: &[f64]) -> (u64, f64, f64) {
        let count = match dtype {
            DType::F64 => values[0].to_bits(),
            _ => (values[0] as f32).to_bits() as u64,
        };
        (count, values[1], values[2])
    }

    fn result_dtype(x: DType) -> DType {
        if x == DType::F64 {
            DType::F64
        } else {
            DType::F32
        }
    }

    /// The reducer over (count, min, max) pairs.
    fn region(dt: DType) -> String {
        let (i, s) = (TensorType::scalar(DType::I32).mlir(), TensorType::scalar(dt).mlir());
        format!(
            "{{\n    ^bb0(%c0: {i}, %l0: {s}, %h0: {s}, %c1: {i}, %l1: {s}, %h1: {s}):\n      %c = \"stablehlo.add\"(%c0, %c1) : ({i}, {i}) -> {i}\n      %l = \"stablehlo.minimum\"(%l0, %l1) : ({s}, {s}) -> {s}\n      %h = \"stablehlo.maximum\"(%h0, %h1) : ({s}, {s}) -> {s}\n      \"stablehlo.return\"(%c, %l, %h) : ({i}, {s}, {s}) -> ()\n    }}"
        )
    }
}

impl OpRules for FiniteStats {
    fn name(&self) -> &'static str {
        "finite_stats"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("finite_stats", operands, 1)?;
        let t = operands[0];
        if !t.dtype.is_float() {
            return Err(InferError::DType(format!("finite_stats is defined for floating-point tensors, not {t}")));
        }
        let out = FiniteStats::result_dtype(t.dtype);
        match (self.rows, &t.dims[..]) {
            (false, _) => Ok(TensorType::new(out, [3])),
            (true, &[k, _]) => Ok(TensorType::new(out, [k, 3])),
            (true, _) => Err(InferError::Shape(format!("finite_stats by rows takes a [rows, n] tensor, not {t}"))),
        }
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        use crate::op::Op;
        use crate::ops::elementwise::Convert;
        use crate::ops::layout::Reshape;
        use crate::ops::leaf::Constant;
        use crate::ops::random::BitcastConvert;
        use crate::ops::slicing::Concatenate;
        let x_ty = cx.arg_ty(0).clone();
        let (dt, out_dt) = (x_ty.dtype, FiniteStats::result_dtype(x_ty.dtype));
        // Reduced over its last axis: `[n]` (the tensor flattened), or `[k, n]` by rows; `kept` the axes left.
        let (table, kept) = match self.rows {
            false => (TensorType::new(dt, [x_ty.elements()]), vec![]),
            true => (x_ty.clone(), vec![x_ty.dims[0]]),
        };
        let (flags_ty, finite_ty) = (table.with_dtype(DType::I32), table.with_dtype(DType::Bool));
        let (int, scalar) = (TensorType::scalar(DType::I32), TensorType::scalar(dt));
        let (ints, values) = (TensorType::new(DType::I32, kept.clone()), TensorType::new(dt, kept.clone()));
        let out = cx.out_ty().clone();
        let splat = |v: f64, ty: &TensorType| Op::Constant(Constant::new(v, ty.clone()));
        let x = cx.arg(0).to_string();
        let x = cx.lower_op(&Op::Reshape(Reshape { dims: table.dims.to_vec() }), vec![(x, &x_ty)], &table);
        // 1 where the element is NaN or infinite.
        let finite = cx.op("stablehlo.is_finite", std::slice::from_ref(&x), &[&table], "", None, &finite_ty);
        let bad = cx.op("stablehlo.not", &[finite], &[&finite_ty], "", None, &finite_ty);
        let flags = cx.op("stablehlo.convert", &[bad], &[&finite_ty], "", None, &flags_ty);
        let inits = [
            cx.lower_op(&splat(0.0, &int), vec![], &int),
            cx.lower_op(&splat(dt.highest(), &scalar), vec![], &scalar),
            cx.lower_op(&splat(dt.lowest(), &scalar), vec![], &scalar),
        ];
        let [c0, l0, h0] = inits;
        let operands = [flags, x.clone(), x, c0, l0, h0];
        let tys = [&flags_ty, &table, &table, &int, &scalar, &scalar];
        let attrs = format!("dimensions = array<i64: {}>", table.rank() - 1);
        let region = FiniteStats::region(dt);
        let r = cx.op_multi("stablehlo.reduce", &operands, &tys, &attrs, Some(&region), &[&ints, &values, &values]);
        // The count's bits in the result's type, then the range in it; each as one column, joined.
        let (out_values, column) =
            (TensorType::new(out_dt, kept.clone()), TensorType::new(out_dt, [kept, vec![1]].concat()));
        // The count as an integer of the result's width (i64 for f64), then its bits.
        let (mut count, mut count_ty) = (r[0].clone(), ints);
        if out_dt == DType::F64 {
            let wide = count_ty.with_dtype(DType::I64);
            count = cx.lower_op(
                &Op::Convert(Convert { from: DType::I32, to: DType::I64 }),
                vec![(count, &count_ty)],
                &wide,
            );
            count_ty = wide;
        }
        let bits = Op::BitcastConvert(BitcastConvert { from: count_ty.dtype, to: out_dt });
        let count = cx.lower_op(&bits, vec![(count, &count_ty)], &out_values);
        let as_column = Op::Reshape(Reshape { dims: column.dims.to_vec() });
        let mut parts = vec![cx.lower_op(&as_column, vec![(count, &out_values)], &column)];
        for v in [r[1].clone(), r[2].clone()] {
            let v = match dt == out_dt {
                true => v,
                false => cx.lower_op(&Op::Convert(Convert { from: dt, to: out_dt }), vec![(v, &values)], &out_values),
            };
            parts.push(cx.lower_op(&as_column, vec![(v, &out_values)], &column));
        }
        let join = Op::Concatenate(Concatenate { dim: column.rank() - 1 });
        cx.lower_op(&join, parts.into_iter().map(|p| (p, &column)).collect(), &out)
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let three = |values: &mut dyn Iterator<Item = f64>| {
            let (mut count, mut min, mut max) = (0u64, f64::INFINITY, f64::NEG_INFINITY);
            for v in values {
                count += !v.is_finite() as u64;
                (min, max) = if v.is_nan() || min.is_nan() { (f64::NAN, f64::NAN) } else { (min.min(v), max.max(v)) };
            }
            let bits = match out.dtype {
                DType::F64 => f64::from_bits(count),
                _ => f32::from_bits(count as u32) as f64,
            };
            [bits, min, max]
        };
        let all = match self.rows {
            false => three(&mut x[0].iter().copied()).to_vec(),
            true => x[0].outer_iter().flat_map(|row| three(&mut row.iter().copied())).collect(),
        };
        ArrayD::from_shape_vec(ndarray::IxDyn(&out.dims), all).expect("three values a row")
    }
    fn vjp<B: Builder>(&self, _: &mut B, _: &[B::V], _: &B::V, _: &B::V) -> Vec<Option<B::V>> {
        vec![None]
    }
    fn shard(&self, _: &[crate::shard::ShardIn<'_>], _out: &TensorType) -> Option<crate::shard::DimShards> {
        None
    }
}
