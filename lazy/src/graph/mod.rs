//! The lazy graph: `Tensor` handles to nodes (`tensor`), recording ops on them with their shape checks
//! (`record`), the walk of a pending graph at a step boundary (`walk`), reverse-mode autodiff (`autodiff`), closures read back as programs (`trace`), the
//! precision products are recorded with (`precision`), and the Rust types at the host boundary (`element`).

pub mod autodiff;
pub(crate) mod backward_replay;
pub(crate) mod constants;
pub mod element;
pub mod precision;
pub mod record;
pub mod tensor;
pub(crate) mod trace;
pub(crate) mod walk;
