//! Graph-break and recompile diagnostics: events for every materialization, step accounting, explanations of
//! cache misses, strict mode, and the report behind the `lazuli-report` tool.

mod compare;
pub mod events;
pub mod explain;
pub mod metrics;
pub mod profile;
pub mod report;
mod steps;

pub use events::{Event, EventKind};
pub use explain::{DiffKind, Difference};
pub use profile::{DeviceProfile, KernelKind, KernelTime, Launch};
pub use steps::{
    advice, cause_name, current_step, set_strict, strict_budget, strict_scope, unchecked, Budget, StrictScope,
};
pub(crate) use steps::{before_program, end_step, Compiling, ProgramCheck};

/// Why a materialization happened (diagnostics build on this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// `item()`.
    Item,
    /// `to_vec()`, `to_ndarray()` and the other typed reads.
    ToVec,
    /// Printing a tensor (`Display`).
    Display,
    /// `sync()`, the step boundary.
    Sync,
    /// An optimizer's `step()` computing the step's gradients before recording its update
    /// (`LAZULI_SPLIT_UPDATE`): the first of the step boundary's two programs, not a graph break.
    Gradients,
    /// `Tensor::materialize()`.
    Explicit,
    /// Saving a checkpoint.
    Checkpoint,
    /// A tensor's value decided a host-side branch (`if loss > 1.0`).
    HostControlFlow,
    /// The pending graph outgrew `exec::MAX_GRAPH_NODES`; a piece of it was computed first.
    GraphSize,
}
