//! Errors of the coordinator and its members.

use std::time::Duration;

use crate::proto::GroupFailure;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A bad setting: an address, a process id or count, a timeout.
    #[error("distributed configuration: {0}")]
    Config(String),
    /// The coordinator refused this process: duplicate or out-of-range id, mismatched process count.
    #[error("the coordinator at {coordinator} refused process {process_id}: {message}")]
    Refused { coordinator: String, process_id: u32, message: String },
    /// No coordinator answered at the address within the connect timeout.
    #[error("no coordinator answered at {coordinator} within {:.1} s: {reason}", waited.as_secs_f64())]
    Unreachable { coordinator: String, waited: Duration, reason: String },
    /// A member of the group was lost (exited, killed, stalled), or the coordinator was: the group is over.
    #[error("{0}")]
    GroupFailed(Failure),
    /// A get or barrier that did not complete in time.
    #[error("{0}")]
    Timeout(String),
    /// Any other error of a call to the coordinator.
    #[error("coordinator call {call} failed: {message}")]
    Call { call: &'static str, message: String },
}

/// Why a group failed: which process was lost, at which step, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The lost process; `None` when the coordinator itself was lost (its host's process id is in `reason`).
    pub lost_process: Option<u32>,
    /// The lost process's last reported step, if it reported one.
    pub last_step: Option<u64>,
    pub reason: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.lost_process {
            Some(p) => write!(f, "distributed group failed: process {p} was lost ({})", self.reason)?,
            None => write!(f, "distributed group failed: {}", self.reason)?,
        }
        match self.last_step {
            Some(s) => write!(f, "; its last reported step was {s}"),
            None if self.lost_process.is_some() => write!(f, "; it had reported no step"),
            None => Ok(()),
        }
    }
}

impl From<&GroupFailure> for Failure {
    fn from(f: &GroupFailure) -> Failure {
        Failure { lost_process: Some(f.lost_process), last_step: f.last_step, reason: f.reason.clone() }
    }
}

/// The message a failed group's calls carry (the coordinator's `ABORTED` status).
pub(crate) fn describe_failure(f: &GroupFailure) -> String {
    Failure::from(f).to_string()
}
