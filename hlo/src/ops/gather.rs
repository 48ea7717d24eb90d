//! Indexing along one axis by an integer tensor: `Take` (index_select, embedding lookup; `stablehlo.gather`) and its
//! transpose `ScatterAdd` (`stablehlo.scatter` with an add body). Each is the other's gradient. `ScatterReduce`
//! scatters by maximum or minimum instead (PyTorch's `scatter_reduce` with `amax`/`amin`, the tensor's own values
//! included), through the same scatter with another body.
//!
//! Out-of-range indices are clamped to `[0, n-1]`, which is what XLA's gather does (it clamps every start index so
//! the slice fits the operand). XLA's scatter would instead drop out-of-range updates, so `ScatterAdd` clamps its
//! indices explicitly before scattering: both ops then address the same elements and stay exact transposes.

use crate::infer_error::InferError;
use ndarray::{ArrayD, IxDyn};

use crate::builder::Builder;
use crate::dtype::{DType, TensorType};
use crate::emit::{i64_array, LowerCx};
use crate::op::{arity, axis_in_range, Op, OpRules};
use crate::ops::elementwise::CompareDir;

/// Result dimensions of indexing `x` along `axis` with indices of dims `idx`: `axis` replaced by `idx`.
fn indexed_dims(x: &TensorType, axis: usize, idx: &TensorType, name: &str) -> Result<Vec<usize>, InferError> {
    axis_in_range(name, x, axis)?;
    if !idx.dtype.is_int() {
        return Err(InferError::DType(format!("{name}: indices must have an integer dtype, got {idx}")));
    }
    // No index reads an empty dimension; an empty list of them reads nothing (NumPy's `x[:, []]`).
    if x.dims[axis] == 0 && idx.elements() > 0 {
        return Err(InferError::Shape(format!("{name}: cannot index the empty dimension {axis} of {x}")));
    }
    let mut dims = x.dims[..axis].to_vec();
    dims.extend(&idx.dims);
    dims.extend(&x.dims[axis + 1..]);
    Ok(dims)
}

/// The window dimensions of the result/updates: every operand dimension but `axis`, around the index dims.
fn window_dims(rank: usize, axis: usize, index_rank: usize) -> Vec<usize> {
    (0..axis).chain(axis + index_rank..rank - 1 + index_rank).collect()
}

/// `[a, b]`, or `None` for an empty list (the attribute syntax omits empty fields).
fn field(name: &str, v: &[usize]) -> Option<String> {
    if v.is_empty() {
        return None;
    }
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    Some(format!("{name} = [{}]", items.join(", ")))
}

/// The shape as `[before, n, after]` around `axis`.
fn split(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (dims[..axis].iter().product(), dims[axis], dims[axis + 1..].iter().product())
}

/// An index value clamped the way gather clamps it.
fn clamp_index(i: f64, n: usize) -> usize {
    i.max(0.0).min((n - 1) as f64) as usize
}

/// `x` indexed along `axis` by an integer tensor of any shape: result dims are `x`'s with `axis` replaced by the
/// indices' dims. Out-of-range indices clamp to the nearest valid one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Take {
    pub axis: usize,
}

impl OpRules for Take {
    fn name(&self) -> &'static str {
        "take"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("take", operands, 2)?;
        let dims = indexed_dims(operands[0], self.axis, operands[1], "take")?;
        Ok(TensorType::new(operands[0].dtype, dims))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let (x, idx) = (cx.arg_ty(0).clone(), cx.arg_ty(1).clone());
        if x.dims[self.axis] == 0 {
            // No indices (`infer`), so an empty result; XLA's gather would need a slice of 1 of the empty axis.
            let out = cx.out_ty().clone();
            let attrs = format!("value = dense<{}> : {}", out.dtype.literal(0.0), out.mlir());
            return cx.op("stablehlo.constant", &[], &[], &attrs, None, &out);
        }
        let fields: Vec<String> = [
            field("offset_dims", &window_dims(x.rank(), self.axis, idx.rank())),
            field("collapsed_slice_dims", &[self.axis]),
            field("start_index_map", &[self.axis]),
            Some(format!("index_vector_dim = {}", idx.rank())),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut sizes = x.dims.clone();
        sizes[self.axis] = 1;
        let attrs = format!(
            "dimension_numbers = #stablehlo.gather<{}>, indices_are_sorted = false, slice_sizes = {}",
            fields.join(", "),
            i64_array(&sizes)
        );
        cx.op_on_args("stablehlo.gather", &attrs)
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let (before, n, after) = split(x[0].shape(), self.axis);
        let src: Vec<f64> = x[0].iter().copied().collect();
        let idx: Vec<usize> = x[1].iter().map(|&i| clamp_index(i, n)).collect();
        let mut v = Vec::with_capacity(out.elements());
        for a in 0..before {
            for &i in &idx {
                v.extend_from_slice(&src[(a * n + i) * after..(a * n + i + 1) * after]);
            }
        }
        ArrayD::from_shape_vec(IxDyn(&out.dims), v).expect("one value per result element")
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let ty = b.ty(&x[0]).clone();
        let zeros = b.constant(0.0, ty);
        let dx = b.op(Op::ScatterAdd(ScatterAdd { axis: self.axis }), &[&zeros, &x[1], g]);
        vec![Some(dx), None]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        // Result: operand dims before `axis`, the indices' dims, operand dims after `axis`.
        let od = x[0].dims.cloned().unwrap_or_else(|| vec![Vec::new(); x[0].ty.rank()]);
        let id = x[1].dims.cloned().unwrap_or_else(|| vec![Vec::new(); x[1].ty.rank()]);
        let mut r: Vec<Vec<usize>> = od[..self.axis].to_vec();
        r.extend(id);
        r.extend(od[self.axis + 1..].iter().cloned());
        if r.len() != out.rank() {
            return None;
        }
        crate::shard::dedupe(r)
    }
}

/// `x` plus `updates` added at `indices` along `axis` (repeated indices accumulate). `updates` has the shape of
/// `Take { axis }` of `x` at `indices`; out-of-range indices clamp like `Take`'s.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScatterAdd {
    pub axis: usize,
}

impl OpRules for ScatterAdd {
    fn name(&self) -> &'static str {
        "scatter_add"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        scatter_infer("scatter_add", self.axis, operands)
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        lower_scatter(cx, self.axis, "stablehlo.add")
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        scatter_reference(x, self.axis, |a, b| a + b)
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let du = b.op(Op::Take(Take { axis: self.axis }), &[g, &x[1]]);
        vec![Some(g.clone()), None, Some(du)]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::keep_unchanged(&x[0], out)
    }
}

/// Which extreme [`ScatterReduce`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterKind {
    Max,
    Min,
}

/// `x` with each update at `indices` along `axis` combined into it by maximum (minimum): an element is the extreme
/// of its old value and every update that lands on it (PyTorch's `scatter_reduce` with `amax`/`amin` and
/// `include_self`). Repeated indices are fine: max and min do not depend on the order. NaN wins, as in
/// `maximum`. Indices clamp like `Take`'s; `updates` is shaped like `ScatterAdd`'s.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScatterReduce {
    pub axis: usize,
    pub kind: ScatterKind,
}

impl OpRules for ScatterReduce {
    fn name(&self) -> &'static str {
        match self.kind {
            ScatterKind::Max => "scatter_max",
            ScatterKind::Min => "scatter_min",
        }
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        scatter_infer(self.name(), self.axis, operands)
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let combine = match self.kind {
            ScatterKind::Max => "stablehlo.maximum",
            ScatterKind::Min => "stablehlo.minimum",
        };
        lower_scatter(cx, self.axis, combine)
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let kind = self.kind;
        scatter_reference(x, self.axis, move |a, b| match (a.is_nan() || b.is_nan(), kind) {
            (true, _) => f64::NAN,
            (false, ScatterKind::Max) => a.max(b),
            (false, ScatterKind::Min) => a.min(b),
        })
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], out: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        // PyTorch's rule: the cotangent of each result element is shared evenly among the values equal to it,
        // its old value and the updates that landed on it.
        let (take, scatter_add) = (Op::Take(Take { axis: self.axis }), Op::ScatterAdd(ScatterAdd { axis: self.axis }));
        let (xv, idx, upd) = (&x[0], &x[1], &x[2]);
        let old_won = b.compare(CompareDir::Eq, xv, out);
        let landed_on = b.op(take.clone(), &[out, idx]);
        let update_won = b.compare(CompareDir::Eq, upd, &landed_on);
        let dt = b.ty(g).dtype;
        let (old_count, update_count) = (b.convert(&old_won, dt), b.convert(&update_won, dt));
        let zeros = b.full_like(g, 0.0);
        let updates_per_element = b.op(scatter_add, &[&zeros, idx, &update_count]);
        let winners = b.add(&old_count, &updates_per_element);
        let share = b.div(g, &winners);
        let dx = b.mask(&old_won, &share);
        let share_at_update = b.op(take, &[&share, idx]);
        let du = b.mask(&update_won, &share_at_update);
        vec![Some(dx), None, Some(du)]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::keep_unchanged(&x[0], out)
    }
}

/// The shape rule of the scatters: (x, indices, updates shaped like `Take` of x at indices) gives x's type.
fn scatter_infer(name: &str, axis: usize, operands: &[&TensorType]) -> Result<TensorType, InferError> {
    arity(name, operands, 3)?;
    let (x, idx, upd) = (operands[0], operands[1], operands[2]);
    if x.dtype == DType::Bool {
        return Err(InferError::DType(format!("{name} is not defined for {x}")));
    }
    let dims = indexed_dims(x, axis, idx, name)?;
    if upd.dtype != x.dtype || upd.dims[..] != dims[..] {
        let want = TensorType::new(x.dtype, dims);
        return Err(InferError::Shape(format!("{name}: updates must be {want} for {x} indexed by {idx}, got {upd}")));
    }
    Ok(x.clone())
}

/// `stablehlo.scatter` of the node's (x, indices, updates) along `axis`, combining by the binary op `combine`.
fn lower_scatter(cx: &mut LowerCx<'_>, axis: usize, combine: &str) -> String {
    let (x, idx, upd) = (cx.arg_ty(0).clone(), cx.arg_ty(1).clone(), cx.arg_ty(2).clone());
    if x.dims[axis] == 0 {
        return cx.arg(0).to_string(); // no indices (`infer`): nothing is written
    }
    // Clamp like gather does (see the module comment); the bound saturates at the index type's maximum.
    let it = TensorType::scalar(idx.dtype);
    let hi = ((x.dims[axis] - 1) as f64).min(idx.dtype.highest());
    let bound = |cx: &mut LowerCx<'_>, v: f64| {
        let attr = format!("value = dense<{}> : {}", idx.dtype.literal(v), it.mlir());
        cx.op("stablehlo.constant", &[], &[], &attr, None, &it)
    };
    let (lo_name, hi_name) = (bound(cx, 0.0), bound(cx, hi));
    let names = [lo_name, cx.arg(1).to_string(), hi_name];
    let clamped = cx.op("stablehlo.clamp", &names, &[&it, &idx, &it], "", None, &idx);

    let s = TensorType::scalar(x.dtype).mlir();
    let region = format!(
        "{{\n    ^bb0(%a: {s}, %b: {s}):\n      %r = \"{combine}\"(%a, %b) : ({s}, {s}) -> {s}\n      \"stablehlo.return\"(%r) : ({s}) -> ()\n    }}"
    );
    let fields: Vec<String> = [
        field("update_window_dims", &window_dims(x.rank(), axis, idx.rank())),
        field("inserted_window_dims", &[axis]),
        field("scatter_dims_to_operand_dims", &[axis]),
        Some(format!("index_vector_dim = {}", idx.rank())),
    ]
    .into_iter()
    .flatten()
    .collect();
    let attrs = format!(
        "indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<{}>, unique_indices = false",
        fields.join(", ")
    );
    let operands = [cx.arg(0).to_string(), clamped, cx.arg(2).to_string()];
    cx.op("stablehlo.scatter", &operands, &[&x, &idx, &upd], &attrs, Some(&region), &x)
}

/// The scatter on the host: `combine(old, update)` at each clamped index, in order.
fn scatter_reference(x: &[&ArrayD<f64>], axis: usize, combine: impl Fn(f64, f64) -> f64) -> ArrayD<f64> {
    let (before, n, after) = split(x[0].shape(), axis);
    let mut flat: Vec<f64> = x[0].iter().copied().collect();
    let idx: Vec<usize> = x[1].iter().map(|&i| clamp_index(i, n)).collect();
    let upd: Vec<f64> = x[2].iter().copied().collect();
    for a in 0..before {
        for (j, &i) in idx.iter().enumerate() {
            for c in 0..after {
                let at = (a * n + i) * after + c;
                flat[at] = combine(flat[at], upd[(a * idx.len() + j) * after + c]);
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(x[0].shape()), flat).expect("same element count")
}
