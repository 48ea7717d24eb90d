//! Ops that move elements without computing: reshape, transpose, broadcast_in_dim.

use crate::infer_error::InferError;
use ndarray::{ArrayD, IxDyn};

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::emit::{i64_array, LowerCx};
use crate::op::{arity, OpRules};

/// Row-major reshape to `dims` (same element count).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reshape {
    pub dims: Vec<usize>,
}

impl OpRules for Reshape {
    fn name(&self) -> &'static str {
        "reshape"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("reshape", operands, 1)?;
        let t = operands[0];
        // Checked: an empty tensor reshaped to `[2^40, 2, 2^40]` would otherwise wrap to 0 elements and pass.
        let Some(n) = self.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) else {
            return Err(InferError::Shape(format!(
                "reshape: cannot reshape {t} to {:?}: its element count overflows",
                self.dims
            )));
        };
        if n != t.elements() {
            return Err(InferError::Shape(format!(
                "reshape: cannot reshape {t} ({} elements) to {:?} ({n} elements)",
                t.elements(),
                self.dims
            )));
        }
        Ok(TensorType::new(t.dtype, self.dims.clone()))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        cx.op_on_args("stablehlo.reshape", "")
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let flat: Vec<f64> = x[0].iter().copied().collect();
        ArrayD::from_shape_vec(IxDyn(&self.dims), flat).expect("checked by infer")
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let dims = b.ty(&x[0]).dims.clone();
        vec![Some(b.reshape(g, &dims))]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::reshape(&x[0], out)
    }
}

/// Result dimension `i` is operand dimension `perm[i]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Transpose {
    pub perm: Vec<usize>,
}

/// Is `perm` a permutation of `0..n`?
pub fn is_permutation(perm: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    perm.len() == n && perm.iter().all(|&p| p < n && !std::mem::replace(&mut seen[p], true))
}

impl OpRules for Transpose {
    fn name(&self) -> &'static str {
        "transpose"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("transpose", operands, 1)?;
        let t = operands[0];
        if !is_permutation(&self.perm, t.rank()) {
            return Err(InferError::Attribute(format!(
                "transpose: {:?} is not a permutation of the {} dimensions of {t}",
                self.perm,
                t.rank()
            )));
        }
        Ok(TensorType::new(t.dtype, self.perm.iter().map(|&p| t.dims[p]).collect::<Vec<_>>()))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        cx.op_on_args("stablehlo.transpose", &format!("permutation = {}", i64_array(&self.perm)))
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        x[0].view().permuted_axes(IxDyn(&self.perm)).to_owned()
    }
    fn vjp<B: Builder>(&self, b: &mut B, _: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let mut inverse = vec![0; self.perm.len()];
        for (i, &p) in self.perm.iter().enumerate() {
            inverse[p] = i;
        }
        vec![Some(b.transpose(g, &inverse))]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], _out: &TensorType) -> Option<crate::shard::DimShards> {
        x[0].dims.and_then(|d| crate::shard::dedupe(self.perm.iter().map(|&p| d[p].clone()).collect()))
    }
}

/// Broadcast to `dims`: operand dimension `i` becomes result dimension `map[i]` (size 1 or equal); the other
/// result dimensions repeat. `map` is strictly increasing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BroadcastInDim {
    pub dims: Vec<usize>,
    pub map: Vec<usize>,
}

impl OpRules for BroadcastInDim {
    fn name(&self) -> &'static str {
        "broadcast"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("broadcast", operands, 1)?;
        let t = operands[0];
        let bad = || {
            InferError::Shape(format!(
                "broadcast: cannot broadcast {t} to {:?} with dimension map {:?}",
                self.dims, self.map
            ))
        };
        if self.map.len() != t.rank() || self.map.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad());
        }
        for (i, &m) in self.map.iter().enumerate() {
            if m >= self.dims.len() || (t.dims[i] != 1 && t.dims[i] != self.dims[m]) {
                return Err(bad());
            }
        }
        Ok(TensorType::new(t.dtype, self.dims.clone()))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        cx.op_on_args("stablehlo.broadcast_in_dim", &format!("broadcast_dimensions = {}", i64_array(&self.map)))
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let mut expanded = vec![1usize; self.dims.len()];
        for (i, &m) in self.map.iter().enumerate() {
            expanded[m] = x[0].shape()[i];
        }
        let flat: Vec<f64> = x[0].iter().copied().collect();
        let a = ArrayD::from_shape_vec(IxDyn(&expanded), flat).expect("same element count");
        a.broadcast(IxDyn(&self.dims)).expect("checked by infer").to_owned()
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let like = b.ty(&x[0]).dims.clone();
        vec![Some(b.unbroadcast(g, &like, &self.map))]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        let d = x[0].dims?;
        let mut r = vec![Vec::new(); out.rank()];
        for (i, &m) in self.map.iter().enumerate() {
            if x[0].ty.dims[i] == out.dims[m] {
                r[m] = d[i].clone();
            }
        }
        crate::shard::dedupe(r)
    }
}
