//! Sorting along one axis: `Sort` gives the sorted values or the permutation that sorts them (argsort). Both
//! lower to one stable two-operand `stablehlo.sort` of the values and their positions, shared by every node that
//! sorts the same operand the same way, so values and indices (`topk`, a sort's gradient) cost one sort.
//!
//! Order: ascending puts NaN last, descending puts NaN first (NaN counts as the largest value, as in NumPy and
//! PyTorch); equal elements (and NaNs, and -0.0 beside 0.0) keep their order, so the sort is stable both ways.

use std::cmp::Ordering;
use std::fmt::Write;

use ndarray::{ArrayD, Axis};

use crate::builder::Builder;
use crate::dtype::{DType, TensorType};
use crate::emit::LowerCx;
use crate::infer_error::InferError;
use crate::op::{arity, axis_in_range, Op, OpRules};
use crate::ops::gather::ScatterAdd;
use crate::ops::leaf::Iota;

/// Which result of the sort a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SortResult {
    /// The values in sorted order (the operand's type).
    Values,
    /// Where each sorted value came from along the axis (i64), argsort.
    Indices,
}

/// `x` sorted along `axis`, ascending or descending, stably; see the module comment for NaN.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sort {
    pub axis: usize,
    pub descending: bool,
    pub result: SortResult,
}

/// The order of two values along the sorted axis: `Less` if `a` goes first. NaN is the largest value.
pub fn sort_order(a: f64, b: f64, descending: bool) -> Ordering {
    let ascending = match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    };
    if descending {
        ascending.reverse()
    } else {
        ascending
    }
}

impl OpRules for Sort {
    fn name(&self) -> &'static str {
        match self.result {
            SortResult::Values => "sort",
            SortResult::Indices => "argsort",
        }
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        let name = self.name();
        arity(name, operands, 1)?;
        let t = operands[0];
        axis_in_range(name, t, self.axis)?;
        if t.dtype == DType::Bool {
            return Err(InferError::DType(format!("{name} is not defined for {t}; convert to a number type first")));
        }
        Ok(match self.result {
            SortResult::Values => t.clone(),
            SortResult::Indices => t.with_dtype(DType::I64),
        })
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let key = format!("sort {} {}", self.axis, self.descending);
        let results = cx.shared(&key, |cx| self.lower_sort(cx));
        match self.result {
            SortResult::Values => results[0].clone(),
            SortResult::Indices => results[1].clone(),
        }
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let mut out = x[0].to_owned();
        for mut lane in out.lanes_mut(Axis(self.axis)) {
            let values: Vec<f64> = lane.iter().copied().collect();
            let mut order: Vec<usize> = (0..values.len()).collect();
            // `sort_by` is stable: equal values keep their order, as the device's sort does.
            order.sort_by(|&i, &j| sort_order(values[i], values[j], self.descending));
            for (slot, &i) in lane.iter_mut().zip(&order) {
                *slot = match self.result {
                    SortResult::Values => values[i],
                    SortResult::Indices => i as f64,
                };
            }
        }
        out
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        if self.result == SortResult::Indices {
            return vec![None];
        }
        // Sorted value j came from position indices[j]: its cotangent goes back there.
        let indices = b.op(Op::Sort(Sort { result: SortResult::Indices, ..self.clone() }), &[&x[0]]);
        vec![Some(scatter_along_axis(b, g, &indices, self.axis))]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        // Every lane is sorted whole: the sorted axis cannot stay split, the others can.
        let mut d = x[0].dims?.clone();
        d.get_mut(self.axis)?.clear();
        crate::shard::keep_unchanged(&crate::shard::ShardIn { ty: x[0].ty, dims: Some(&d) }, out)
    }
}

impl Sort {
    /// The two-operand sort of (values, positions along the axis); returns both results' names.
    fn lower_sort(&self, cx: &mut LowerCx<'_>) -> Vec<String> {
        let x = cx.arg_ty(0).clone();
        let ix = x.with_dtype(DType::I64);
        let iota = cx.op("stablehlo.iota", &[], &[], &format!("iota_dimension = {} : i64", self.axis), None, &ix);
        let attrs = format!("dimension = {} : i64, is_stable = true", self.axis);
        let operands = [cx.arg(0).to_string(), iota];
        let region = self.comparator(x.dtype);
        cx.op_multi("stablehlo.sort", &operands, &[&x, &ix], &attrs, Some(&region), &[&x, &ix])
    }

    /// The comparator over (a, b, a's position, b's position): does `a` go strictly before `b`? Positions are
    /// not compared: `is_stable` keeps equal elements in order.
    fn comparator(&self, dt: DType) -> String {
        let (s, i, p) = (TensorType::scalar(dt).mlir(), TensorType::scalar(DType::I64).mlir(), "tensor<i1>");
        let mut r = format!("{{\n    ^bb0(%a: {s}, %b: {s}, %ai: {i}, %bi: {i}):\n");
        let ct = dt.compare_type();
        let cmp = |r: &mut String, name: &str, a: &str, b: &str, dir: &str| {
            let _ = writeln!(
                r,
                "      %{name} = \"stablehlo.compare\"(%{a}, %{b}) {{comparison_direction = #stablehlo<comparison_direction {dir}>, compare_type = #stablehlo<comparison_type {ct}>}} : ({s}, {s}) -> {p}"
            );
        };
        cmp(&mut r, "ahead", "a", "b", if self.descending { "GT" } else { "LT" });
        let answer = if dt.is_float() {
            // NaN compares false with everything. Ascending: a number goes before a NaN; descending: a NaN before
            // a number.
            let (nan, num) = if self.descending { ("a", "b") } else { ("b", "a") };
            cmp(&mut r, "isnan", nan, nan, "NE");
            cmp(&mut r, "isnum", num, num, "EQ");
            let _ = writeln!(r, "      %nanorder = \"stablehlo.and\"(%isnan, %isnum) : ({p}, {p}) -> {p}");
            let _ = writeln!(r, "      %first = \"stablehlo.or\"(%ahead, %nanorder) : ({p}, {p}) -> {p}");
            "first"
        } else {
            "ahead"
        };
        let _ = write!(r, "      \"stablehlo.return\"(%{answer}) : ({p}) -> ()\n    }}");
        r
    }
}

/// The transpose of gathering along `axis` by per-lane `indices` (same shape as `g`, i64): element j of each lane
/// of `g` is added at position `indices[j]` of that lane. Recorded as one scatter-add into the flattened result
/// at computed linear positions; for a permutation (a sort's) every position receives exactly one value.
pub fn scatter_along_axis<B: Builder>(b: &mut B, g: &B::V, indices: &B::V, axis: usize) -> B::V {
    let ty = b.ty(g).clone();
    let n = ty.elements();
    if n == 0 {
        return b.full_like(g, 0.0);
    }
    let ity = ty.with_dtype(DType::I64);
    let stride = |d: usize| ty.dims[d + 1..].iter().product::<usize>();
    let scaled = |b: &mut B, v: B::V, s: usize| {
        if s == 1 {
            return v;
        }
        let c = b.constant(s as f64, ity.clone());
        b.mul(&v, &c)
    };
    let mut linear = scaled(b, indices.clone(), stride(axis));
    for d in (0..ty.rank()).filter(|&d| d != axis && ty.dims[d] > 1) {
        let position = b.op(Op::Iota(Iota { dim: d, ty: ity.clone() }), &[]);
        let term = scaled(b, position, stride(d));
        linear = b.add(&linear, &term);
    }
    let flat_linear = b.reshape(&linear, &[n]);
    let flat_g = b.reshape(g, &[n]);
    let zeros = b.constant(0.0, TensorType::new(ty.dtype, vec![n]));
    let flat = b.op(Op::ScatterAdd(ScatterAdd { axis: 0 }), &[&zeros, &flat_linear, &flat_g]);
    b.reshape(&flat, &ty.dims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::ShardIn;

    /// Lanes are sorted whole: a split of the sorted axis is dropped, the others stay, for both results.
    #[test]
    fn the_sorted_axis_is_not_split() {
        let ty = TensorType::new(DType::F32, [4, 6]);
        let split = vec![vec![0], vec![1]];
        for result in [SortResult::Values, SortResult::Indices] {
            let sort = Sort { axis: 1, descending: false, result };
            let out = sort.infer(&[&ty]).unwrap();
            let got = sort.shard(&[ShardIn { ty: &ty, dims: Some(&split) }], &out);
            assert_eq!(got, Some(vec![vec![0], vec![]]), "{result:?}");
            let only_sorted = vec![vec![], vec![1]];
            assert_eq!(sort.shard(&[ShardIn { ty: &ty, dims: Some(&only_sorted) }], &out), None);
        }
    }
}
