//! Leaves: program parameters, splat constants and iota.

use crate::infer_error::InferError;
use ndarray::{ArrayD, IxDyn};

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::emit::LowerCx;
use crate::op::{arity, OpRules};

/// Parameter `index` of the program. Its type is the node's; the graph assigns indices in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Parameter {
    pub index: usize,
}

impl OpRules for Parameter {
    fn name(&self) -> &'static str {
        "parameter"
    }
    fn infer(&self, _: &[&TensorType]) -> Result<TensorType, InferError> {
        Err(InferError::Attribute("a parameter's type is given by Graph::parameter, not inferred".to_string()))
    }
    fn lower(&self, _: &mut LowerCx<'_>) -> String {
        unreachable!("parameters are block arguments of @main, never lowered as ops")
    }
    fn reference(&self, out: &TensorType, _: &[&ArrayD<f64>]) -> ArrayD<f64> {
        unreachable!("the interpreter binds parameters before evaluation ({out})")
    }
    fn vjp<B: Builder>(&self, _: &mut B, _: &[B::V], _: &B::V, _: &B::V) -> Vec<Option<B::V>> {
        Vec::new()
    }
    fn shard(&self, _x: &[crate::shard::ShardIn<'_>], _out: &TensorType) -> Option<crate::shard::DimShards> {
        None
    }
}

/// A constant with every element equal to one value (a splat). The value is part of the graph's structure:
/// use it for values that define the program (0 for a sum's init, 1 for a mask), never for user data.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Constant {
    /// `f64::to_bits` of the value (bits keep Hash/Eq total, NaN included).
    pub bits: u64,
    pub ty: TensorType,
}

impl Constant {
    pub fn new(value: f64, ty: TensorType) -> Self {
        Constant { bits: value.to_bits(), ty }
    }
    pub fn value(&self) -> f64 {
        f64::from_bits(self.bits)
    }
}

impl OpRules for Constant {
    fn name(&self) -> &'static str {
        "constant"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("constant", operands, 0)?;
        Ok(self.ty.clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let ty = cx.out_ty().clone();
        let attrs = format!("value = dense<{}> : {}", ty.dtype.literal(self.value()), ty.mlir());
        cx.op("stablehlo.constant", &[], &[], &attrs, None, &ty)
    }
    fn reference(&self, out: &TensorType, _: &[&ArrayD<f64>]) -> ArrayD<f64> {
        ArrayD::from_elem(IxDyn(&out.dims), out.dtype.round(self.value()))
    }
    fn vjp<B: Builder>(&self, _: &mut B, _: &[B::V], _: &B::V, _: &B::V) -> Vec<Option<B::V>> {
        Vec::new()
    }
    fn shard(&self, _x: &[crate::shard::ShardIn<'_>], _out: &TensorType) -> Option<crate::shard::DimShards> {
        None
    }
}

/// `0, 1, 2, …` along dimension `dim` of the given type, constant along the others.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Iota {
    pub dim: usize,
    pub ty: TensorType,
}

impl OpRules for Iota {
    fn name(&self) -> &'static str {
        "iota"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("iota", operands, 0)?;
        if self.dim >= self.ty.rank() {
            return Err(InferError::Axis {
                axis: self.dim as i64,
                rank: self.ty.rank(),
                message: format!("iota dimension {} out of range for {}", self.dim, self.ty),
            });
        }
        if self.ty.dtype == crate::DType::Bool {
            return Err(InferError::DType("iota of bool is not defined".to_string()));
        }
        Ok(self.ty.clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let ty = cx.out_ty().clone();
        let attrs = format!("iota_dimension = {} : i64", self.dim);
        cx.op("stablehlo.iota", &[], &[], &attrs, None, &ty)
    }
    fn reference(&self, out: &TensorType, _: &[&ArrayD<f64>]) -> ArrayD<f64> {
        ArrayD::from_shape_fn(IxDyn(&out.dims), |ix| ix[self.dim] as f64)
    }
    fn vjp<B: Builder>(&self, _: &mut B, _: &[B::V], _: &B::V, _: &B::V) -> Vec<Option<B::V>> {
        Vec::new()
    }
    fn shard(&self, _x: &[crate::shard::ShardIn<'_>], _out: &TensorType) -> Option<crate::shard::DimShards> {
        None
    }
}
