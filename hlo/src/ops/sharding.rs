//! A sharding constraint inside the graph: the value is laid out as annotated (XLA's SPMD partitioner inserts the
//! collectives), otherwise the identity.

use crate::infer_error::InferError;
use ndarray::ArrayD;

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::emit::LowerCx;
use crate::op::{arity, Op, OpRules};
use crate::shard::{DimShards, ShardIn};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShardingConstraint {
    /// XLA's sharding attribute (`{devices=[4,1]0,1,2,3}`).
    pub attr: String,
    /// The same split as mesh axis indices per dimension.
    pub dims: DimShards,
}

impl OpRules for ShardingConstraint {
    fn name(&self) -> &'static str {
        "sharding_constraint"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("sharding_constraint", operands, 1)?;
        if self.dims.len() != operands[0].rank() {
            return Err(InferError::Attribute(format!(
                "sharding_constraint: {} dimensions for {}",
                self.dims.len(),
                operands[0]
            )));
        }
        Ok(operands[0].clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let attrs = format!("call_target_name = \"Sharding\", mhlo.sharding = \"{}\"", self.attr);
        cx.op_on_args("stablehlo.custom_call", &attrs)
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        x[0].clone()
    }
    fn vjp<B: Builder>(&self, b: &mut B, _: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        // The cotangent is laid out like the value.
        vec![Some(b.op(Op::ShardingConstraint(self.clone()), &[g]))]
    }
    fn shard(&self, _: &[ShardIn<'_>], _: &TensorType) -> Option<DimShards> {
        Some(self.dims.clone())
    }
}
