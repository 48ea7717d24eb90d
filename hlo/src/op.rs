//! The op set. Each op family lives in one file of `ops/` and implements [`OpRules`]: its shape/dtype rule, its
//! StableHLO lowering and its reference semantics stand together, and a family that forgets one fails to compile.
//! The `match`es below are exhaustive, so a new variant without rules fails to compile too.

use crate::infer_error::InferError;
use ndarray::ArrayD;

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::emit::LowerCx;
use crate::ops::{
    activation::{Gelu, GeluGrad, Relu, ReluGrad, Softmax, SoftmaxGrad},
    checkpoint::Checkpoint,
    control::ControlOp,
    conv::Convolution,
    dot::DotGeneral,
    elementwise::{Binary, Compare, Convert, Select, Unary},
    fused::Fused,
    gather::{ScatterAdd, ScatterReduce, Take},
    kernel::KernelOp,
    layout::{BroadcastInDim, Reshape, Transpose},
    leaf::{Constant, Iota, Parameter},
    loss::{CrossEntropy, CrossEntropyGrad},
    norm::{Normalize, NormalizeGrad},
    random::{BitcastConvert, RngBitGenerator},
    reduce::{FiniteStats, Reduce},
    scan::{ArgReduce, CumSum},
    sharding::ShardingConstraint,
    slicing::{Concatenate, Pad, Reverse, Slice},
    sort::Sort,
    special::Erf,
    window::{ReduceWindow, SelectAndScatter},
};
use crate::shard::{DimShards, ShardIn};

/// The rules every op family provides.
pub trait OpRules {
    /// Short name used in diagnostics (`add`, `dot_general`, …).
    fn name(&self) -> &'static str;
    /// Shape and dtype of the result, or a message saying why the operands do not fit.
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError>;
    /// Write the StableHLO for this op; returns the SSA value holding the result.
    fn lower(&self, cx: &mut LowerCx<'_>) -> String;
    /// Reference semantics on the host, in f64 (the interpreter rounds the result to the node's dtype).
    fn reference(&self, out: &TensorType, operands: &[&ArrayD<f64>]) -> ArrayD<f64>;
    /// Vector-Jacobian product: the cotangents of the operands `x`, given the result `out` and its cotangent `g`
    /// (recorded through `b`). `None` for operands without a gradient (integers, predicates, indices).
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], out: &B::V, g: &B::V) -> Vec<Option<B::V>>;
    /// Sharding propagation: how the result is split over a mesh given the operands' splits (`None`: whole).
    /// See `shard.rs` for the shared helpers.
    fn shard(&self, x: &[ShardIn<'_>], out: &TensorType) -> Option<DimShards>;
}

/// One node's operation. Hash and Eq cover structure only (no values of parameters), which is what the
/// executable cache keys on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Parameter(Parameter),
    Constant(Constant),
    Iota(Iota),
    Unary(Unary),
    Binary(Binary),
    Compare(Compare),
    Select(Select),
    Convert(Convert),
    Reshape(Reshape),
    Transpose(Transpose),
    BroadcastInDim(BroadcastInDim),
    Reduce(Reduce),
    DotGeneral(DotGeneral),
    Slice(Slice),
    Concatenate(Concatenate),
    Pad(Pad),
    Reverse(Reverse),
    Take(Take),
    ScatterAdd(ScatterAdd),
    ScatterReduce(ScatterReduce),
    CumSum(CumSum),
    ArgReduce(ArgReduce),
    FiniteStats(FiniteStats),
    Sort(Sort),
    Erf(Erf),
    RngBitGenerator(RngBitGenerator),
    BitcastConvert(BitcastConvert),
    // Boxed: rare and large; inline they would make every node's op as large as theirs.
    Convolution(Box<Convolution>),
    ReduceWindow(Box<ReduceWindow>),
    SelectAndScatter(Box<SelectAndScatter>),
    ShardingConstraint(ShardingConstraint),
    Fused(Fused),
    Normalize(Normalize),
    NormalizeGrad(NormalizeGrad),
    Gelu(Gelu),
    GeluGrad(GeluGrad),
    Softmax(Softmax),
    SoftmaxGrad(SoftmaxGrad),
    Relu(Relu),
    ReluGrad(ReluGrad),
    CrossEntropy(CrossEntropy),
    CrossEntropyGrad(CrossEntropyGrad),
    /// A custom kernel's result (`ops/kernel.rs`): its rules come from the kernel's programs.
    Kernel(KernelOp),
    /// One result of a `scan`, `while_loop` or `cond` (`ops/control.rs`): its bodies are programs.
    Control(ControlOp),
    /// A checkpointed block's result, or the barrier its recomputation starts behind (`ops/checkpoint.rs`).
    Checkpoint(Checkpoint),
}

macro_rules! dispatch {
    ($self:ident, $o:ident => $e:expr) => {
        match $self {
            Op::Parameter($o) => $e,
            Op::Constant($o) => $e,
            Op::Iota($o) => $e,
            Op::Unary($o) => $e,
            Op::Binary($o) => $e,
            Op::Compare($o) => $e,
            Op::Select($o) => $e,
            Op::Convert($o) => $e,
            Op::Reshape($o) => $e,
            Op::Transpose($o) => $e,
            Op::BroadcastInDim($o) => $e,
            Op::Reduce($o) => $e,
            Op::DotGeneral($o) => $e,
            Op::Slice($o) => $e,
            Op::Concatenate($o) => $e,
            Op::Pad($o) => $e,
            Op::Reverse($o) => $e,
            Op::Take($o) => $e,
            Op::ScatterAdd($o) => $e,
            Op::ScatterReduce($o) => $e,
            Op::CumSum($o) => $e,
            Op::ArgReduce($o) => $e,
            Op::FiniteStats($o) => $e,
            Op::Sort($o) => $e,
            Op::Erf($o) => $e,
            Op::RngBitGenerator($o) => $e,
            Op::BitcastConvert($o) => $e,
            Op::Convolution($o) => $e,
            Op::ReduceWindow($o) => $e,
            Op::SelectAndScatter($o) => $e,
            Op::ShardingConstraint($o) => $e,
            Op::Fused($o) => $e,
            Op::Normalize($o) => $e,
            Op::NormalizeGrad($o) => $e,
            Op::Gelu($o) => $e,
            Op::GeluGrad($o) => $e,
            Op::Softmax($o) => $e,
            Op::SoftmaxGrad($o) => $e,
            Op::Relu($o) => $e,
            Op::ReluGrad($o) => $e,
            Op::CrossEntropy($o) => $e,
            Op::CrossEntropyGrad($o) => $e,
            Op::Kernel($o) => $e,
            Op::Control($o) => $e,
            Op::Checkpoint($o) => $e,
        }
    };
}

impl Op {
    pub fn name(&self) -> &'static str {
        dispatch!(self, o => o.name())
    }

    pub fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        dispatch!(self, o => o.infer(operands))
    }

    pub fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        dispatch!(self, o => o.lower(cx))
    }

    pub fn reference(&self, out: &TensorType, operands: &[&ArrayD<f64>]) -> ArrayD<f64> {
        // An empty result is known without computing it, and computing it may not be possible: its operands, or a
        // composite's intermediates (softmax along an empty axis of `[2^40, 0, 5]` reduces to `[2^40, 1, 5]`), can
        // be vast. Each node is one result with its own type, so this holds for every op.
        if out.elements() == 0 {
            return ArrayD::zeros(ndarray::IxDyn(&out.dims));
        }
        dispatch!(self, o => o.reference(out, operands))
    }

    pub fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], out: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        dispatch!(self, o => o.vjp(b, x, out, g))
    }

    pub fn shard(&self, x: &[ShardIn<'_>], out: &TensorType) -> Option<DimShards> {
        dispatch!(self, o => o.shard(x, out))
    }

    /// How many full-sized elementwise results this op counts as in the planner's cost model: a forward
    /// composite as the ops its formula used to record (so one cost model serves both), everything else as one.
    pub fn cost_weight(&self) -> usize {
        match self {
            Op::Normalize(_) => Normalize::FULL_RESULTS,
            Op::Gelu(_) => Gelu::FULL_RESULTS,
            Op::Softmax(_) => Softmax::FULL_RESULTS,
            Op::CrossEntropy(_) => CrossEntropy::FULL_RESULTS,
            _ => 1,
        }
    }
}

impl Op {
    /// How much this op adds to a chain that XLA fuses into one elementwise loop (`emit` cuts long chains):
    /// `Some(weight)` for ops fused with their operands into their consumers' loop, `None` for ops whose result
    /// a consumer cannot fuse into its own loop (products, reductions, gathers, …: the chain starts over after
    /// them). Exhaustive, so a new op must say which it is.
    pub fn loop_weight(&self) -> Option<usize> {
        match self {
            Op::Parameter(_) | Op::Constant(_) | Op::Iota(_) | Op::ShardingConstraint(_) => Some(0),
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select(_)
            | Op::Convert(_)
            | Op::BitcastConvert(_)
            | Op::Erf(_)
            | Op::Relu(_)
            | Op::ReluGrad(_)
            | Op::Gelu(_)
            | Op::GeluGrad(_)
            | Op::Reshape(_)
            | Op::Transpose(_)
            | Op::BroadcastInDim(_)
            | Op::Slice(_)
            | Op::Concatenate(_)
            | Op::Pad(_)
            | Op::Reverse(_) => Some(1),
            Op::Fused(f) => Some(f.steps.len()),
            Op::Reduce(_)
            | Op::DotGeneral(_)
            | Op::Take(_)
            | Op::ScatterAdd(_)
            | Op::ScatterReduce(_)
            | Op::CumSum(_)
            | Op::ArgReduce(_)
            | Op::FiniteStats(_)
            | Op::Sort(_)
            | Op::RngBitGenerator(_)
            | Op::Convolution(_)
            | Op::ReduceWindow(_)
            | Op::SelectAndScatter(_)
            | Op::Normalize(_)
            | Op::NormalizeGrad(_)
            | Op::Softmax(_)
            | Op::SoftmaxGrad(_)
            | Op::CrossEntropy(_)
            | Op::CrossEntropyGrad(_)
            | Op::Kernel(_)
            | Op::Control(_) => None,
            Op::Checkpoint(_) => None,
        }
    }

    /// Whether every element of this op's result is an element of one of its operands (layout, slicing,
    /// gathering, selection, sorting): such an op cannot make a non-finite value from finite operands, so the
    /// NaN locator does not count its result (`lazy/src/exec/finite/locate.rs`). Exhaustive, so a new op must say.
    pub fn only_moves_values(&self) -> bool {
        match self {
            Op::Reshape(_)
            | Op::Transpose(_)
            | Op::BroadcastInDim(_)
            | Op::Slice(_)
            | Op::Concatenate(_)
            | Op::Pad(_)
            | Op::Reverse(_)
            | Op::Take(_)
            | Op::Select(_)
            | Op::Sort(_)
            | Op::ShardingConstraint(_) => true,
            // Parameters and constants are where non-finite inputs and masks enter: counted, so that they are seen.
            Op::Parameter(_)
            | Op::Constant(_)
            | Op::Iota(_)
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Convert(_)
            | Op::BitcastConvert(_)
            | Op::Reduce(_)
            | Op::DotGeneral(_)
            | Op::ScatterAdd(_)
            | Op::ScatterReduce(_)
            | Op::CumSum(_)
            | Op::ArgReduce(_)
            | Op::FiniteStats(_)
            | Op::Erf(_)
            | Op::RngBitGenerator(_)
            | Op::Convolution(_)
            | Op::ReduceWindow(_)
            | Op::SelectAndScatter(_)
            | Op::Fused(_)
            | Op::Normalize(_)
            | Op::NormalizeGrad(_)
            | Op::Gelu(_)
            | Op::GeluGrad(_)
            | Op::Softmax(_)
            | Op::SoftmaxGrad(_)
            | Op::Relu(_)
            | Op::ReluGrad(_)
            | Op::CrossEntropy(_)
            | Op::CrossEntropyGrad(_)
            | Op::Kernel(_)
            | Op::Control(_)
            | Op::Checkpoint(_) => false,
        }
    }
}

/// Check an operand count; every family's `infer` starts with this.
/// The shape rule of an op made for one signature (a kernel, a loop, a checkpointed block): its operands must be
/// exactly the types it was built for.
pub(crate) fn signature(name: &str, want: &[TensorType], operands: &[&TensorType]) -> Result<(), InferError> {
    if operands.len() == want.len() && operands.iter().zip(want).all(|(a, b)| *a == b) {
        return Ok(());
    }
    let got: Vec<String> = operands.iter().map(|t| t.to_string()).collect();
    let want: Vec<String> = want.iter().map(|t| t.to_string()).collect();
    Err(InferError::Shape(format!("{name} was built for ({}), got ({})", want.join(", "), got.join(", "))))
}

/// `axis` names a dimension of `t`; `name` is the checking op's.
pub(crate) fn axis_in_range(name: &str, t: &TensorType, axis: usize) -> Result<(), InferError> {
    if axis < t.rank() {
        return Ok(());
    }
    Err(InferError::Axis {
        axis: axis as i64,
        rank: t.rank(),
        message: format!("{name}: axis {axis} is out of range for {t}"),
    })
}

pub(crate) fn arity(name: &str, operands: &[&TensorType], n: usize) -> Result<(), InferError> {
    if operands.len() == n {
        Ok(())
    } else {
        Err(InferError::Shape(format!("{name} takes {n} operand(s), got {}", operands.len())))
    }
}
