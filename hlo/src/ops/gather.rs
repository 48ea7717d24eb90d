//! Indexing along one axis by an integer tensor: `Take` (index_select, embedding lookup; `stablehlo.gather`) and its
//! transpose `ScatterAdd` (`stablehlo.scatter` with an add body). Each is the other's gradient.
//!
//! Out-of-range indices are clamped to `[0, n-1]`, which is what XLA's gather does (it clamps every start index so
//! the slice fits the operand). XLA's scatter would instead drop out-of-range updates, so `ScatterAdd` clamps its
//! indices explicitly before scattering: both ops then address the same elements and stay exact transposes.

use crate::infer_error::InferError;
use ndarray::{ArrayD, IxDyn};

use crate::builder::Builder;
use crate::dtype::{DType, TensorType};
use crate::emit::{i64_array, LowerCx};
use crate::op::{arity, Op, OpRules};

/// Result dimensions of indexing `x` along `axis` with indices of dims `idx`: `axis` replaced by `idx`.
fn indexed_dims(x: &TensorType, axis: usize, idx: &TensorType, name: &str) -> Result<Vec<usize>, InferError> {
    if axis >= x.rank() {
        return Err(InferError::Axis {
            axis: axis as i64,
            rank: x.rank(),
            message: format!("{name}: axis {axis} is out of range for {x}"),
        });
    }
    if !idx.dtype.is_int() {
        return Err(InferError::DType(format!("{name}: indices must have an integer dtype, got {idx}")));
    }
    if x.dims[axis] == 0 {
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
        arity("scatter_add", operands, 3)?;
        let (x, idx, upd) = (operands[0], operands[1], operands[2]);
        if x.dtype == DType::Bool {
            return Err(InferError::DType(format!("scatter_add is not defined for {x}")));
        }
        let dims = indexed_dims(x, self.axis, idx, "scatter_add")?;
        if upd.dtype != x.dtype || upd.dims[..] != dims[..] {
            let want = TensorType::new(x.dtype, dims);
            return Err(InferError::Shape(format!(
                "scatter_add: updates must be {want} for {x} indexed by {idx}, got {upd}"
            )));
        }
        Ok(x.clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let (x, idx, upd) = (cx.arg_ty(0).clone(), cx.arg_ty(1).clone(), cx.arg_ty(2).clone());
        // Clamp like gather does (see the module comment); the bound saturates at the index type's maximum.
        let it = TensorType::scalar(idx.dtype);
        let hi = ((x.dims[self.axis] - 1) as f64).min(idx.dtype.highest());
        let bound = |cx: &mut LowerCx<'_>, v: f64| {
            let attr = format!("value = dense<{}> : {}", idx.dtype.literal(v), it.mlir());
            cx.op("stablehlo.constant", &[], &[], &attr, None, &it)
        };
        let (lo_name, hi_name) = (bound(cx, 0.0), bound(cx, hi));
        let names = [lo_name, cx.arg(1).to_string(), hi_name];
        let clamped = cx.op("stablehlo.clamp", &names, &[&it, &idx, &it], "", None, &idx);

        let s = TensorType::scalar(x.dtype).mlir();
        let region = format!(
            "{{\n    ^bb0(%a: {s}, %b: {s}):\n      %r = \"stablehlo.add\"(%a, %b) : ({s}, {s}) -> {s}\n      \"stablehlo.return\"(%r) : ({s}) -> ()\n    }}"
        );
        let fields: Vec<String> = [
            field("update_window_dims", &window_dims(x.rank(), self.axis, idx.rank())),
            field("inserted_window_dims", &[self.axis]),
            field("scatter_dims_to_operand_dims", &[self.axis]),
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
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let (before, n, after) = split(x[0].shape(), self.axis);
        let mut flat: Vec<f64> = x[0].iter().copied().collect();
        let idx: Vec<usize> = x[1].iter().map(|&i| clamp_index(i, n)).collect();
        let upd: Vec<f64> = x[2].iter().copied().collect();
        for a in 0..before {
            for (j, &i) in idx.iter().enumerate() {
                for c in 0..after {
                    flat[(a * n + i) * after + c] += upd[(a * idx.len() + j) * after + c];
                }
            }
        }
        ArrayD::from_shape_vec(IxDyn(x[0].shape()), flat).expect("same element count")
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let du = b.op(Op::Take(Take { axis: self.axis }), &[g, &x[1]]);
        vec![Some(g.clone()), None, Some(du)]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::keep_unchanged(&x[0], out)
    }
}
