//! Graph-break and recompile diagnostics: events for every materialization, step accounting, explanations of
//! cache misses, strict mode, and the report behind the `lazuli-report` tool.

mod compare;
pub mod events;
pub mod explain;
pub mod report;
mod steps;

pub use events::{Event, EventKind};
pub use explain::{DiffKind, Difference};
pub use steps::{
    advice, cause_name, current_step, set_strict, strict_budget, strict_scope, unchecked, Budget, StrictScope,
};
pub(crate) use steps::{before_program, end_step};
