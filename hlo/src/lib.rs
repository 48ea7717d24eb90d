//! lazuli's graph IR and its lowering to StableHLO text. No runtime: `lazuli-lazy` records into this IR and
//! `lazuli-pjrt` compiles the text it emits.
//!
//! - [`dtype`]: element types and tensor types.
//! - [`graph`]: nodes with op, operands, type and the user's source location; a reference interpreter.
//! - [`op`] and [`ops`]: the op set; each family's shape rule, lowering and reference stand in one file.
//! - [`emit`](mod@emit): the StableHLO text emitter.
#![forbid(unsafe_code)]

pub mod builder;
pub mod dtype;
pub mod emit;
pub mod finite;
pub mod graph;
pub mod infer_error;
pub mod op;
pub mod ops;
pub mod program;
pub mod repeats;
pub mod shard;

pub use builder::Builder;
pub use dtype::{DType, Dims, TensorType};
pub use emit::{emit, EmitOptions};
pub use graph::{Graph, Loc, Node, NodeId};
pub use infer_error::InferError;
pub use op::{Op, OpRules};
pub use ops::activation::{Gelu, GeluGrad, Relu, ReluGrad, Softmax, SoftmaxGrad, GELU_A, GELU_K};
pub use ops::checkpoint::{BlockDef, Checkpoint};
pub use ops::control::{Control, ControlDef, ControlOp, ScanForm, ScanGrad};
pub use ops::conv::Convolution;
pub use ops::dot::{DotGeneral, Precision};
pub use ops::elementwise::{Binary, BinaryKind, Compare, CompareDir, Convert, Select, Unary, UnaryKind};
pub use ops::fused::{Fused, FusedBuilder};
pub use ops::gather::{ScatterAdd, ScatterKind, ScatterReduce, Take};
pub use ops::kernel::{Choice, Gradient, KernelDef, KernelOp};
pub use ops::layout::{BroadcastInDim, Reshape, Transpose};
pub use ops::leaf::{Constant, Iota, Parameter};
pub use ops::loss::{CrossEntropy, CrossEntropyGrad};
pub use ops::norm::{NormSpec, Normalize, NormalizeGrad};
pub use ops::random::{BitcastConvert, RngAlgorithm, RngBitGenerator, RngOutput};
pub use ops::reduce::{FiniteStats, Reduce, ReduceKind};
pub use ops::scan::{ArgKind, ArgReduce, CumSum};
pub use ops::sharding::ShardingConstraint;
pub use ops::slicing::{Concatenate, Pad, Reverse, Slice};
pub use ops::sort::{Sort, SortResult};
pub use ops::special::Erf;
pub use ops::window::{ReduceWindow, SelectAndScatter, WindowKind};
pub use program::{BackendConfig, CustomCall, Program, Recorder, Step, Value, ValueId};
pub use repeats::{find_repeats, Repeat};
pub use shard::{DimShards, ShardIn};
