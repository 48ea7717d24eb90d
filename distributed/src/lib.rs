//! lazuli's multi-process layer.
//!
//! - [`Coordinator`]: a gRPC service (tonic) that a group of processes shares: a key-value store (what the
//!   PJRT clients of a multi-process run exchange through their create callbacks), registration with checks,
//!   barriers, heartbeats, and failure detection. Process 0 hosts it by default.
//! - [`Member`]: one process's membership, with blocking calls; the loss of any member (it exited, was
//!   killed, or stopped heartbeating) fails every other member's next call and runs their failure hooks at once,
//!   with an error naming the lost process and its last reported step.
//! - [`launcher`]: the `lazuli-run` command line, which starts a group of local processes.
#![forbid(unsafe_code)]

mod client;
mod error;
pub mod launcher;
mod proto;
mod server;

/// The generated gRPC client and server (`build.rs`).
mod rpc {
    include!(concat!(env!("OUT_DIR"), "/lazuli.distributed.Coordinator.rs"));
}

pub use client::{report_failure, FailureHook, Member, MemberConfig};
pub use error::{Error, Failure, Result};
pub use server::{Coordinator, CoordinatorConfig};

/// The variables a launched process reads (`lazuli-run` sets them).
pub mod env {
    /// The coordinator's "host:port".
    pub const COORDINATOR: &str = "LAZULI_COORDINATOR";
    /// This process's id, 0 to `LAZULI_NUM_PROCESSES - 1`.
    pub const PROCESS_ID: &str = "LAZULI_PROCESS_ID";
    /// The group's size.
    pub const NUM_PROCESSES: &str = "LAZULI_NUM_PROCESSES";
    /// Set to 1 when the coordinator is a separate service (no process serves it).
    pub const COORDINATOR_EXTERNAL: &str = "LAZULI_COORDINATOR_EXTERNAL";
}
