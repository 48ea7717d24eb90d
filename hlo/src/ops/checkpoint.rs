//! Gradient checkpointing (rematerialization) as one op family. A checkpointed block is data: a [`BlockDef`]
//! holds the block as a [`Program`] of lazuli's ops, recorded from the user's closure. Each of its results is one
//! node ([`Checkpoint::Block`]), whose rules come from that program:
//!
//! - shape: the program's input and output types;
//! - lowering: the program's ops, inline, once per operand list (several result nodes share one lowering);
//! - reference: the program, evaluated op by op;
//! - gradient: the block is recomputed from its operands and differentiated through the recomputation, so
//!   none of its inner activations has to live from the forward pass to the backward pass. The operands go
//!   through one `stablehlo.optimization_barrier` together with the incoming cotangent first
//!   ([`Checkpoint::Barrier`]): XLA can then neither merge the recomputation with the forward pass (CSE) nor
//!   schedule it before the cotangent exists, which is what JAX's `checkpoint` does too;
//! - sharding: through the program's ops.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use ndarray::ArrayD;

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::emit::LowerCx;
use crate::infer_error::InferError;
use crate::op::{Op, OpRules};
use crate::program::Program;
use crate::shard::{DimShards, ShardIn};

/// A checkpointed block, recorded once and shared by its result nodes; compared and hashed by content, with the
/// hash taken once.
#[derive(Debug)]
pub struct BlockDef {
    /// The block's computation: its inputs are the checkpoint's operands, its outputs the results.
    pub program: Program,
    hash: u64,
}

impl BlockDef {
    /// Check that the program can be recomputed (only lazuli's ops, every output present) and make the block.
    pub fn new(program: Program) -> Result<Arc<BlockDef>, String> {
        if program.has_calls() {
            return Err("a checkpointed block may not contain custom calls".into());
        }
        if program.outputs.is_empty() || program.outputs.iter().any(Option::is_none) {
            return Err("a checkpointed block must return at least one tensor".into());
        }
        let mut h = std::hash::DefaultHasher::new();
        program.hash(&mut h);
        let hash = h.finish();
        Ok(Arc::new(BlockDef { program, hash }))
    }

    fn result_type(&self, result: usize) -> Option<&TensorType> {
        self.program.output_types().get(result).copied().flatten()
    }
}

impl PartialEq for BlockDef {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.program == other.program
    }
}

impl Eq for BlockDef {}

impl Hash for BlockDef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.hash.hash(state);
    }
}

/// One node of a checkpointed block.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Checkpoint {
    /// Result `result` of the block on its operands.
    Block { def: Arc<BlockDef>, result: usize },
    /// Operand `index` passed through an optimization barrier over all the node's operands (the block's
    /// operands and the cotangent that starts its recomputation): the identity, which XLA may not see through.
    Barrier { index: usize },
}

impl Checkpoint {
    /// Result `result` of `def`; panics if the block has no such result.
    pub fn block(def: Arc<BlockDef>, result: usize) -> Checkpoint {
        assert!(result < def.program.outputs.len(), "the block has {} results", def.program.outputs.len());
        Checkpoint::Block { def, result }
    }
}

impl OpRules for Checkpoint {
    fn name(&self) -> &'static str {
        match self {
            Checkpoint::Block { .. } => "checkpoint",
            Checkpoint::Barrier { .. } => "optimization_barrier",
        }
    }

    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        match self {
            Checkpoint::Block { def, result } => {
                crate::op::signature("checkpoint", &def.program.inputs, operands)?;
                let ty = def.result_type(*result);
                ty.cloned()
                    .ok_or_else(|| InferError::Attribute(format!("checkpoint: the block has no result {result}")))
            }
            Checkpoint::Barrier { index } => operands.get(*index).map(|t| (*t).clone()).ok_or_else(|| {
                InferError::Attribute(format!("optimization_barrier: operand {index} of {}", operands.len()))
            }),
        }
    }

    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        match self {
            Checkpoint::Block { def, result } => {
                let key = format!("checkpoint {:p}", Arc::as_ptr(def));
                cx.shared(&key, |cx| {
                    let inputs: Vec<String> = (0..cx.num_args()).map(|i| cx.arg(i).to_string()).collect();
                    let outs = def.program.lower(cx, inputs);
                    outs.into_iter().map(|o| o.expect("BlockDef::new checked every output")).collect()
                })[*result]
                    .clone()
            }
            Checkpoint::Barrier { index } => cx.shared("optimization_barrier", |cx| {
                let names: Vec<String> = (0..cx.num_args()).map(|i| cx.arg(i).to_string()).collect();
                let tys: Vec<TensorType> = (0..cx.num_args()).map(|i| cx.arg_ty(i).clone()).collect();
                let tys: Vec<&TensorType> = tys.iter().collect();
                cx.op_multi("stablehlo.optimization_barrier", &names, &tys, "", None, &tys)
            })[*index]
                .clone(),
        }
    }

    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        match self {
            Checkpoint::Block { def, result } => {
                let mut outs = def.program.evaluate(x);
                outs.swap_remove(*result).expect("BlockDef::new checked every output")
            }
            Checkpoint::Barrier { index } => x[*index].clone(),
        }
    }

    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        match self {
            Checkpoint::Block { def, result } => recompute_vjp(b, def, *result, x, g),
            Checkpoint::Barrier { index } => {
                let mut grads = vec![None; x.len()];
                grads[*index] = Some(g.clone());
                grads
            }
        }
    }

    fn shard(&self, x: &[ShardIn<'_>], _: &TensorType) -> Option<DimShards> {
        match self {
            Checkpoint::Block { def, result } => def.program.shard_outputs(x).swap_remove(*result),
            Checkpoint::Barrier { index } => x[*index].dims.cloned(),
        }
    }
}

/// The cotangents of a block's operands `x` for result `result`'s cotangent `g`: the operands and `g` pass
/// through one barrier, the block is recomputed on what comes out, and each recomputed op's own gradient runs
/// backwards. The forward pass's activations are never read; only its operands are.
fn recompute_vjp<B: Builder>(b: &mut B, def: &Arc<BlockDef>, result: usize, x: &[B::V], g: &B::V) -> Vec<Option<B::V>> {
    let mut through: Vec<&B::V> = x.iter().collect();
    through.push(g);
    let held: Vec<B::V> =
        (0..through.len()).map(|index| b.op(Op::Checkpoint(Checkpoint::Barrier { index }), &through)).collect();
    let (x_held, g_held) = held.split_at(x.len());
    crate::ops::composite::vjp(b, x_held, &g_held[0], |tape, args| {
        let mut outs = def.program.replay(tape, args, None);
        outs.swap_remove(result).expect("BlockDef::new checked every output")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::ops::composite::{check_vjp, data};

    /// `tanh(a · b) + a`, a block with a product, a nonlinearity and a skip connection.
    fn block(n: usize) -> Arc<BlockDef> {
        let t = TensorType::new(DType::F64, [n, n]);
        let p = Program::record(&[t.clone(), t], |b, x| {
            let dot = Op::DotGeneral(crate::ops::dot::DotGeneral::new(&[], &[], &[1], &[0]));
            let y = b.op(dot, &[&x[0], &x[1]]);
            let y = b.unary(crate::ops::elementwise::UnaryKind::Tanh, &y);
            vec![Some(b.add(&y, &x[0]))]
        })
        .expect("a well-typed block");
        BlockDef::new(p).expect("a recomputable block")
    }

    /// Inside a checkpointed block (differentiated on a tape, not by the lazy graph's autodiff), a kernel's joint
    /// rule still runs once per call with both results' cotangents.
    #[test]
    fn a_recomputed_block_gives_a_joint_rule_every_cotangent_at_once() {
        use crate::ops::composite::Evaluating;
        use crate::ops::kernel::KernelOp;
        let kernel = crate::ops::kernel::joint_rule_probe(3);
        let t = TensorType::new(DType::F64, [3]);
        let p = Program::record(&[t.clone(), t.clone()], |b, x| {
            let s = b.op(Op::Kernel(KernelOp::new(kernel.clone(), 0)), &[&x[0], &x[1]]);
            let y = b.op(Op::Kernel(KernelOp::new(kernel.clone(), 1)), &[&x[0], &x[1]]);
            vec![Some(b.add(&s, &y))]
        })
        .expect("a block");
        let op = Op::Checkpoint(Checkpoint::block(BlockDef::new(p).expect("recomputable"), 0));
        let (x, a, g) = (data(&[3], 1), data(&[3], 2), data(&[3], 3));
        let v = |a: &ndarray::ArrayD<f64>| (a.clone(), t.clone());
        let out = op.reference(&t, &[&x, &a]);
        let grads = op.vjp(&mut Evaluating, &[v(&x), v(&a)], &v(&out), &v(&g));
        for d in grads {
            let d = d.expect("a cotangent").0;
            for i in 0..3 {
                let s = x[i] + a[i];
                let want = g[i] + 2.0 * s * g[i] + g[i] * g[i];
                assert!((d[i] - want).abs() < 1e-12, "[{i}]: {} against {want}", d[i]);
            }
        }
    }

    #[test]
    fn recomputed_gradient_matches_finite_differences() {
        let op = Op::Checkpoint(Checkpoint::block(block(3), 0));
        check_vjp(&op, &[data(&[3, 3], 1).mapv(|v| v / 2.0), data(&[3, 3], 5).mapv(|v| v / 2.0)]);
    }

    #[test]
    fn barrier_is_the_identity_on_its_operand() {
        use crate::ops::composite::Evaluating;
        let op = Op::Checkpoint(Checkpoint::Barrier { index: 1 });
        let x: Vec<ArrayD<f64>> = vec![data(&[2], 1), data(&[3], 2), data(&[2, 2], 3)];
        let typed: Vec<(ArrayD<f64>, TensorType)> =
            x.iter().map(|a| (a.clone(), TensorType::new(DType::F64, a.shape()))).collect();
        let out_ty = op.infer(&typed.iter().map(|v| &v.1).collect::<Vec<_>>()).expect("in range");
        assert_eq!(op.reference(&out_ty, &x.iter().collect::<Vec<_>>()), x[1]);
        let g = (data(&[3], 7), out_ty.clone());
        let grads = op.vjp(&mut Evaluating, &typed, &g, &g);
        assert!(grads[0].is_none() && grads[2].is_none(), "only the operand passed on has a cotangent");
        assert_eq!(grads[1].as_ref().map(|v| &v.0), Some(&g.0));
    }

    #[test]
    fn a_block_refuses_operands_it_was_not_recorded_for() {
        let op = Checkpoint::block(block(3), 0);
        let wrong = TensorType::new(DType::F64, [2, 2]);
        assert!(op.infer(&[&wrong, &wrong]).is_err());
    }
}
