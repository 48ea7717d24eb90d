//! The crate's one error type. Every failing PJRT call becomes [`Error::Pjrt`] with the call's name, the
//! plugin's status code and its message; inputs that would crash a plugin are refused as
//! [`Error::InvalidInput`] before any call is made.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A PJRT status code (the absl status codes the C API reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl ErrorCode {
    /// The `PJRT_Error_Code` value.
    pub fn to_raw(self) -> i32 {
        use ErrorCode::*;
        match self {
            Cancelled => 1,
            Unknown => 2,
            InvalidArgument => 3,
            DeadlineExceeded => 4,
            NotFound => 5,
            AlreadyExists => 6,
            PermissionDenied => 7,
            ResourceExhausted => 8,
            FailedPrecondition => 9,
            Aborted => 10,
            OutOfRange => 11,
            Unimplemented => 12,
            Internal => 13,
            Unavailable => 14,
            DataLoss => 15,
            Unauthenticated => 16,
        }
    }

    /// Maps `PJRT_Error_Code`; `None` for OK (0) and for values this crate does not know.
    pub fn from_raw(code: i32) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match code {
            1 => Cancelled,
            2 => Unknown,
            3 => InvalidArgument,
            4 => DeadlineExceeded,
            5 => NotFound,
            6 => AlreadyExists,
            7 => PermissionDenied,
            8 => ResourceExhausted,
            9 => FailedPrecondition,
            10 => Aborted,
            11 => OutOfRange,
            12 => Unimplemented,
            13 => Internal,
            14 => Unavailable,
            15 => DataLoss,
            16 => Unauthenticated,
            _ => return None,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The plugin file could not be opened as a PJRT plugin (missing, not a shared object, no `GetPjrtApi`).
    #[error("cannot load PJRT plugin {}: {reason}", path.display())]
    Load { path: PathBuf, reason: String },

    /// The plugin speaks a PJRT C API version outside the range lazuli accepts from it.
    #[error(
        "PJRT plugin {} implements C API {}.{}, but lazuli accepts {}.{} to {} for it; {}",
        path.display(), found.0, found.1, need.0, need.1, version_text(*newest),
        if found < need { "use a newer plugin" } else { "use an older plugin, or a newer lazuli" }
    )]
    ApiVersion { path: PathBuf, found: (i32, i32), need: (i32, i32), newest: (i32, i32) },

    /// A PJRT call returned an error.
    #[error("{call} failed ({}): {message}", code.map_or("no status code".to_string(), |c| format!("{c:?}")))]
    Pjrt { call: &'static str, code: Option<ErrorCode>, message: String },

    /// An argument was refused before reaching the plugin.
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// A plugin could not be found or fetched; the message says how to fix it.
    #[error("{0}")]
    Provision(String),
}

impl Error {
    /// The status code: the plugin's for [`Error::Pjrt`], `InvalidArgument` for [`Error::InvalidInput`],
    /// `None` otherwise.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Pjrt { code, .. } => *code,
            Error::InvalidInput(_) => Some(ErrorCode::InvalidArgument),
            _ => None,
        }
    }

    /// The PJRT entry point that failed (e.g. `"PJRT_Client_Compile"`), for errors from the plugin.
    pub fn call(&self) -> Option<&'static str> {
        match self {
            Error::Pjrt { call, .. } => Some(call),
            _ => None,
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Error {
        Error::InvalidInput(msg.into())
    }
}

/// `0.117`, or "any newer 0.x" for an open range.
fn version_text(newest: (i32, i32)) -> String {
    if newest.1 == i32::MAX {
        format!("any newer {}.x", newest.0)
    } else {
        format!("{}.{}", newest.0, newest.1)
    }
}
