//! Ops along one axis: the running sum `CumSum` (`stablehlo.reduce_window` with a window as long as the axis) and
//! `ArgMax`/`ArgMin` (a variadic `stablehlo.reduce` over values and their indices).

use crate::infer_error::InferError;
use std::fmt::Write;

use ndarray::{ArrayD, Axis};

use crate::builder::Builder;
use crate::dtype::{DType, TensorType};
use crate::emit::{i64_array, LowerCx};
use crate::op::{arity, axis_in_range, Op, OpRules};
use crate::ops::elementwise::Convert;

/// `x[0], x[0]+x[1], …` along `axis`; with `reverse`, the sums run from the end (`x[n-1], x[n-1]+x[n-2], …`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CumSum {
    pub axis: usize,
    pub reverse: bool,
}

/// The body of a reduction by `stablehlo.add` over scalars `s`.
fn add_region(s: &str) -> String {
    format!(
        "{{\n    ^bb0(%a: {s}, %b: {s}):\n      %r = \"stablehlo.add\"(%a, %b) : ({s}, {s}) -> {s}\n      \"stablehlo.return\"(%r) : ({s}) -> ()\n    }}"
    )
}

impl OpRules for CumSum {
    fn name(&self) -> &'static str {
        "cumsum"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("cumsum", operands, 1)?;
        let t = operands[0];
        axis_in_range("cumsum", t, self.axis)?;
        if t.dtype == DType::Bool {
            return Err(InferError::DType(format!("cumsum is not defined for {t}; convert to an integer type first")));
        }
        Ok(t.clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let in_ty = cx.arg_ty(0).clone();
        let n = in_ty.dims[self.axis];
        if n == 0 {
            return cx.arg(0).to_string(); // nothing to sum; a zero-sized window is not allowed
        }
        // 16-bit running sums accumulate in f32, as `Reduce`'s sums do: each output is its window's sum in the
        // window's type, and a bf16 sum rounds at every addend (`-4.03 - 4.75 + 8.5` gave -0.25, not -0.28).
        let acc = match in_ty.dtype {
            DType::BF16 | DType::F16 => DType::F32,
            dt => dt,
        };
        let x = in_ty.with_dtype(acc);
        let mut operand = cx.arg(0).to_string();
        if acc != in_ty.dtype {
            let convert = Op::Convert(Convert { from: in_ty.dtype, to: acc });
            operand = cx.lower_op(&convert, vec![(operand, &in_ty)], &x);
        }
        // Output i sums the window of n elements ending at i (starting at i when reversed); the n-1 elements of
        // zero padding before (after) the axis make the window see exactly the prefix (suffix).
        let r = x.rank();
        let mut window = vec![1; r];
        window[self.axis] = n;
        let pads: Vec<String> = (0..r)
            .map(|d| match (d == self.axis, self.reverse) {
                (false, _) => "[0, 0]".to_string(),
                (true, false) => format!("[{}, 0]", n - 1),
                (true, true) => format!("[0, {}]", n - 1),
            })
            .collect();
        let scalar = TensorType::scalar(x.dtype);
        let init_attr = format!("value = dense<{}> : {}", x.dtype.literal(0.0), scalar.mlir());
        let init = cx.op("stablehlo.constant", &[], &[], &init_attr, None, &scalar);
        let attrs = format!(
            "padding = dense<[{}]> : tensor<{r}x2xi64>, window_dimensions = {}, window_strides = {}",
            pads.join(", "),
            i64_array(&window),
            i64_array(&vec![1; r])
        );
        let region = add_region(&scalar.mlir());
        let sums = cx.op("stablehlo.reduce_window", &[operand, init], &[&x, &scalar], &attrs, Some(&region), &x);
        if acc == in_ty.dtype {
            return sums;
        }
        cx.lower_op(&Op::Convert(Convert { from: acc, to: in_ty.dtype }), vec![(sums, &x)], &in_ty)
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let mut out = x[0].to_owned();
        for mut lane in out.lanes_mut(Axis(self.axis)) {
            let mut acc = 0.0;
            let n = lane.len();
            for k in 0..n {
                let i = if self.reverse { n - 1 - k } else { k };
                acc += lane[i];
                lane[i] = acc;
            }
        }
        out
    }
    fn vjp<B: Builder>(&self, b: &mut B, _: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        // Input i reaches every output at or after i: the transpose is the running sum from the other end.
        vec![Some(b.op(Op::CumSum(CumSum { axis: self.axis, reverse: !self.reverse }), &[g]))]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::keep_unchanged(&x[0], out)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgKind {
    Max,
    Min,
}

/// The index (i64) of the largest (smallest) element along `axis`, which is removed. Ties go to the lowest index;
/// NaN counts as the extreme value, as in NumPy and PyTorch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ArgReduce {
    pub kind: ArgKind,
    pub axis: usize,
}

/// Does `a` beat `b` (strictly)? NaN beats any number; two NaNs are equal.
fn beats(kind: ArgKind, a: f64, b: f64) -> bool {
    match (a.is_nan(), b.is_nan()) {
        (true, false) => true,
        (_, true) => false,
        _ => match kind {
            ArgKind::Max => a > b,
            ArgKind::Min => a < b,
        },
    }
}

impl OpRules for ArgReduce {
    fn name(&self) -> &'static str {
        match self.kind {
            ArgKind::Max => "argmax",
            ArgKind::Min => "argmin",
        }
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        let name = self.name();
        arity(name, operands, 1)?;
        let t = operands[0];
        axis_in_range(name, t, self.axis)?;
        if t.dtype == DType::Bool || t.dims[self.axis] == 0 {
            return Err(InferError::DType(format!("{name} is not defined for {t} along axis {}", self.axis)));
        }
        let mut dims = t.dims.clone();
        dims.remove(self.axis);
        Ok(TensorType::new(DType::I64, dims))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let x = cx.arg_ty(0).clone();
        let out = cx.out_ty().clone();
        let ix = x.with_dtype(DType::I64);
        let (vs, is) = (TensorType::scalar(x.dtype), TensorType::scalar(DType::I64));
        let iota = cx.op("stablehlo.iota", &[], &[], &format!("iota_dimension = {} : i64", self.axis), None, &ix);
        let init_value = match self.kind {
            ArgKind::Max => x.dtype.lowest(),
            ArgKind::Min => x.dtype.highest(),
        };
        let v_attr = format!("value = dense<{}> : {}", x.dtype.literal(init_value), vs.mlir());
        let init_v = cx.op("stablehlo.constant", &[], &[], &v_attr, None, &vs);
        let init_i = cx.op("stablehlo.constant", &[], &[], &format!("value = dense<0> : {}", is.mlir()), None, &is);
        let region = self.region(x.dtype);
        let attrs = format!("dimensions = {}", i64_array(&[self.axis]));
        let operands = [cx.arg(0).to_string(), iota, init_v, init_i];
        let results = cx.op_multi(
            "stablehlo.reduce",
            &operands,
            &[&x, &ix, &vs, &is],
            &attrs,
            Some(&region),
            &[&out.with_dtype(x.dtype), &out],
        );
        results[1].clone()
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        x[0].map_axis(Axis(self.axis), |lane| {
            let mut best = 0;
            for (i, &v) in lane.iter().enumerate() {
                if beats(self.kind, v, lane[best]) {
                    best = i;
                }
            }
            best as f64
        })
    }
    fn vjp<B: Builder>(&self, _: &mut B, _: &[B::V], _: &B::V, _: &B::V) -> Vec<Option<B::V>> {
        vec![None]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], _out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::drop_dims(&x[0], &[self.axis])
    }
}

impl ArgReduce {
    /// The reducer over pairs (value, index): keep `a` if it beats `b`, or if they tie and `a`'s index is lower.
    /// This is a total order on pairs, so the result does not depend on the order XLA combines elements in.
    fn region(&self, dt: DType) -> String {
        let (s, i, p) = (TensorType::scalar(dt).mlir(), TensorType::scalar(DType::I64).mlir(), "tensor<i1>");
        let mut r = format!("{{\n    ^bb0(%av: {s}, %ai: {i}, %bv: {s}, %bi: {i}):\n");
        let cmp = |r: &mut String, name: &str, a: &str, b: &str, dir: &str, ty: &str, ct: &str| {
            let _ = writeln!(
                r,
                "      %{name} = \"stablehlo.compare\"(%{a}, %{b}) {{comparison_direction = #stablehlo<comparison_direction {dir}>, compare_type = #stablehlo<comparison_type {ct}>}} : ({ty}, {ty}) -> {p}"
            );
        };
        let logic = |r: &mut String, name: &str, op: &str, a: &str, b: &str| {
            let _ = writeln!(r, "      %{name} = \"stablehlo.{op}\"(%{a}, %{b}) : ({p}, {p}) -> {p}");
        };
        let ct = dt.compare_type();
        let dir = if self.kind == ArgKind::Max { "GT" } else { "LT" };
        cmp(&mut r, "gt", "av", "bv", dir, &s, ct);
        cmp(&mut r, "eq", "av", "bv", "EQ", &s, ct);
        let (better, same) = if dt.is_float() {
            // NaN compares false with everything: a NaN beats a number, and two NaNs tie.
            cmp(&mut r, "anan", "av", "av", "NE", &s, ct);
            cmp(&mut r, "bnan", "bv", "bv", "NE", &s, ct);
            cmp(&mut r, "bnum", "bv", "bv", "EQ", &s, ct);
            logic(&mut r, "nanwin", "and", "anan", "bnum");
            logic(&mut r, "better", "or", "gt", "nanwin");
            logic(&mut r, "bothnan", "and", "anan", "bnan");
            logic(&mut r, "same", "or", "eq", "bothnan");
            ("better", "same")
        } else {
            ("gt", "eq")
        };
        cmp(&mut r, "first", "ai", "bi", "LT", &i, "SIGNED");
        logic(&mut r, "tie", "and", same, "first");
        logic(&mut r, "pick", "or", better, "tie");
        let _ = writeln!(r, "      %v = \"stablehlo.select\"(%pick, %av, %bv) : ({p}, {s}, {s}) -> {s}");
        let _ = writeln!(r, "      %i = \"stablehlo.select\"(%pick, %ai, %bi) : ({p}, {i}, {i}) -> {i}");
        let _ = write!(r, "      \"stablehlo.return\"(%v, %i) : ({s}, {i}) -> ()\n    }}");
        r
    }
}
