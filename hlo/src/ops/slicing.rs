//! Ops that cut, join, pad and flip tensors: slice, concatenate, pad, reverse. Their gradients are each other:
//! the cotangent of a slice is the cotangent padded with zeros, of a concatenation its slices, of a pad its slice.

use crate::infer_error::InferError;
use ndarray::{ArrayD, Axis, IxDyn, Slice as NdSlice};

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::emit::{i64_array, LowerCx};
use crate::op::{arity, Op, OpRules};

/// `x[start..limit:stride]` in every dimension (`stablehlo.slice`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Slice {
    pub start: Vec<usize>,
    pub limit: Vec<usize>,
    pub stride: Vec<usize>,
}

impl Slice {
    /// Elements `start..limit` with step `stride` along one dimension of size `dim`, all of every other one.
    pub fn along(dims: &[usize], axis: usize, start: usize, limit: usize, stride: usize) -> Slice {
        let mut s = Slice { start: vec![0; dims.len()], limit: dims.to_vec(), stride: vec![1; dims.len()] };
        s.start[axis] = start;
        s.limit[axis] = limit;
        s.stride[axis] = stride;
        s
    }
}

/// Number of elements `start, start+stride, …` below `limit`.
fn strided_len(start: usize, limit: usize, stride: usize) -> usize {
    (limit - start).div_ceil(stride)
}

impl OpRules for Slice {
    fn name(&self) -> &'static str {
        "slice"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("slice", operands, 1)?;
        let t = operands[0];
        let r = t.rank();
        if self.start.len() != r || self.limit.len() != r || self.stride.len() != r {
            return Err(InferError::Attribute(format!("slice: {self:?} does not have one entry per dimension of {t}")));
        }
        let mut dims = Vec::with_capacity(r);
        for d in 0..r {
            let (s, l, st) = (self.start[d], self.limit[d], self.stride[d]);
            if st == 0 || s > l || l > t.dims[d] {
                return Err(InferError::Shape(format!(
                    "slice: {s}..{l} step {st} is out of range for dimension {d} (size {}) of {t}",
                    t.dims[d]
                )));
            }
            dims.push(strided_len(s, l, st));
        }
        Ok(TensorType::new(t.dtype, dims))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let attrs = format!(
            "start_indices = {}, limit_indices = {}, strides = {}",
            i64_array(&self.start),
            i64_array(&self.limit),
            i64_array(&self.stride)
        );
        cx.op_on_args("stablehlo.slice", &attrs)
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        x[0].slice_each_axis(|ax| {
            let d = ax.axis.index();
            NdSlice::new(self.start[d] as isize, Some(self.limit[d] as isize), self.stride[d] as isize)
        })
        .to_owned()
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], out: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        // Put g back where the slice took it from: low padding `start`, `stride - 1` zeros between elements, and
        // whatever is left of the dimension as high padding.
        let dims = b.ty(&x[0]).dims.clone();
        let odims = b.ty(out).dims.clone();
        let mut pad = Pad { low: self.start.clone(), high: vec![0; dims.len()], interior: vec![0; dims.len()] };
        for d in 0..dims.len() {
            pad.interior[d] = self.stride[d] - 1;
            let covered = if odims[d] == 0 { 0 } else { (odims[d] - 1) * self.stride[d] + 1 };
            pad.high[d] = dims[d] - self.start[d] - covered;
        }
        let zero = b.constant(0.0, TensorType::scalar(b.ty(g).dtype));
        vec![Some(b.op(Op::Pad(pad), &[g, &zero]))]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::keep_unchanged(&x[0], out)
    }
}

/// Operands joined along dimension `dim`; every other dimension must agree.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Concatenate {
    pub dim: usize,
}

impl OpRules for Concatenate {
    fn name(&self) -> &'static str {
        "concatenate"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        let Some(first) = operands.first() else {
            return Err(InferError::Shape("concatenate needs at least one operand".to_string()));
        };
        if self.dim >= first.rank() {
            return Err(InferError::Axis {
                axis: self.dim as i64,
                rank: first.rank(),
                message: format!("concatenate: dimension {} is out of range for {first}", self.dim),
            });
        }
        let mut dims = first.dims.clone();
        dims[self.dim] = 0;
        for t in operands {
            let same_elsewhere =
                t.rank() == first.rank() && (0..t.rank()).all(|d| d == self.dim || t.dims[d] == first.dims[d]);
            if t.dtype != first.dtype || !same_elsewhere {
                let all: Vec<String> = operands.iter().map(|t| t.to_string()).collect();
                let message = format!(
                    "concatenate: operands must share dtype and every dimension but {}; got {}",
                    self.dim,
                    all.join(", ")
                );
                return Err(if same_elsewhere { InferError::DType(message) } else { InferError::Shape(message) });
            }
            dims[self.dim] += t.dims[self.dim];
        }
        Ok(TensorType::new(first.dtype, dims))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        cx.op_on_args("stablehlo.concatenate", &format!("dimension = {} : i64", self.dim))
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let views: Vec<_> = x.iter().map(|a| a.view()).collect();
        ndarray::concatenate(Axis(self.dim), &views).expect("checked by infer")
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let gdims = b.ty(g).dims.clone();
        let mut offset = 0;
        let mut grads = Vec::with_capacity(x.len());
        for xi in x {
            let n = b.ty(xi).dims[self.dim];
            let s = Slice::along(&gdims, self.dim, offset, offset + n, 1);
            grads.push(Some(b.op(Op::Slice(s), &[g])));
            offset += n;
        }
        grads
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::keep_unchanged(&x[0], out)
    }
}

/// `x` with `low`/`high` elements of the scalar operand `value` added at each end of every dimension and
/// `interior` between neighbouring elements (`stablehlo.pad`, non-negative amounts only).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pad {
    pub low: Vec<usize>,
    pub high: Vec<usize>,
    pub interior: Vec<usize>,
}

impl OpRules for Pad {
    fn name(&self) -> &'static str {
        "pad"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("pad", operands, 2)?;
        let (t, v) = (operands[0], operands[1]);
        if v.rank() != 0 || v.dtype != t.dtype {
            return Err(InferError::Shape(format!("pad: the padding value must be a scalar of {t}'s dtype, got {v}")));
        }
        let r = t.rank();
        if self.low.len() != r || self.high.len() != r || self.interior.len() != r {
            return Err(InferError::Attribute(format!("pad: {self:?} does not have one entry per dimension of {t}")));
        }
        let dims = (0..r)
            .map(|d| self.low[d] + self.high[d] + t.dims[d] + t.dims[d].saturating_sub(1) * self.interior[d])
            .collect::<Vec<_>>();
        Ok(TensorType::new(t.dtype, dims))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let attrs = format!(
            "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
            i64_array(&self.low),
            i64_array(&self.high),
            i64_array(&self.interior)
        );
        cx.op_on_args("stablehlo.pad", &attrs)
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let value = x[1].iter().next().copied().unwrap_or(0.0);
        let mut r = ArrayD::from_elem(IxDyn(&out.dims), value);
        r.slice_each_axis_mut(|ax| self.inner(ax.axis.index(), x[0].shape()[ax.axis.index()])).assign(x[0]);
        r
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let dims = b.ty(&x[0]).dims.clone();
        let gdims = b.ty(g).dims.clone();
        let mut s = Slice { start: self.low.clone(), limit: self.low.clone(), stride: vec![1; dims.len()] };
        for d in 0..dims.len() {
            let inner = self.inner(d, dims[d]);
            s.start[d] = inner.start as usize;
            s.limit[d] = inner.end.map_or(gdims[d], |e| e as usize);
            s.stride[d] = inner.step as usize;
        }
        let dx = b.op(Op::Slice(s), &[g]);
        // The padding value fills every position the operand does not: its cotangent is the rest of g's sum.
        let all_g: Vec<usize> = (0..gdims.len()).collect();
        let total = b.sum(g, &all_g);
        let inside = b.sum(&dx, &all_g);
        vec![Some(dx), Some(b.sub(&total, &inside))]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::keep_unchanged(&x[0], out)
    }
}

impl Pad {
    /// Where the operand's elements land along dimension `d` (of operand size `n`), as an ndarray slice.
    fn inner(&self, d: usize, n: usize) -> NdSlice {
        let step = self.interior[d] + 1;
        let end = self.low[d] + if n == 0 { 0 } else { (n - 1) * step + 1 };
        NdSlice::new(self.low[d] as isize, Some(end as isize), step as isize)
    }
}

/// Reverse the order of elements along `dims` (`stablehlo.reverse`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reverse {
    pub dims: Vec<usize>,
}

impl OpRules for Reverse {
    fn name(&self) -> &'static str {
        "reverse"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("reverse", operands, 1)?;
        let t = operands[0];
        if self.dims.windows(2).any(|w| w[0] >= w[1]) || self.dims.iter().any(|&d| d >= t.rank()) {
            return Err(InferError::Attribute(format!(
                "reverse: {:?} are not sorted unique dimensions of {t}",
                self.dims
            )));
        }
        Ok(t.clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        cx.op_on_args("stablehlo.reverse", &format!("dimensions = {}", i64_array(&self.dims)))
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let mut v = x[0].view();
        for &d in &self.dims {
            v.invert_axis(Axis(d));
        }
        v.to_owned()
    }
    fn vjp<B: Builder>(&self, b: &mut B, _: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        vec![Some(b.op(Op::Reverse(self.clone()), &[g]))]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::keep_unchanged(&x[0], out)
    }
}
