//! `DeviceValue`: the value of a node on a device, a buffer that may still be in the making (by the CPU
//! launcher) and that reads wait for.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use lazuli_hlo::Loc;
use lazuli_pjrt::{Buffer, ErrorCode};

use super::launcher::{bury, wait_until};
use crate::error::{Error, Result};

/// A device buffer that the launcher may still be computing (or uploading). Reads wait for it.
pub(crate) struct DeviceValue {
    pub(super) cell: OnceLock<std::result::Result<Buffer, Failure>>,
    /// Filled by the launcher (every pending value is): its buffer is destroyed there too.
    by_launcher: bool,
    /// The number of the program that computes it on the thread that launched it (`next_program`); 0 for an
    /// upload.
    pub(super) program: u64,
    /// Under `stop`: the finite check's epoch in which its program counted it (`exec/finite/`), 0 if none did.
    counted: AtomicU64,
}

/// Why a value was never computed: the program that was to compute it failed.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    pub(super) at: Loc,
    pub(super) code: Option<ErrorCode>,
    pub(super) message: String,
}

impl Failure {
    pub(super) fn new(at: Loc, e: &lazuli_pjrt::Error) -> Failure {
        Failure { at, code: e.code(), message: e.to_string() }
    }

    /// The error, naming the line whose materialization launched the failed program.
    pub fn error(&self) -> Error {
        let source = lazuli_pjrt::Error::Pjrt {
            call: "PJRT_LoadedExecutable_Execute",
            code: self.code,
            message: self.message.clone(),
        };
        Error::Execute { at: self.at, source }
    }
}

impl DeviceValue {
    /// A buffer made here: an upload (`program` 0) or an output of program number `program`.
    pub fn ready(buffer: Buffer, program: u64) -> Arc<DeviceValue> {
        let cell = OnceLock::new();
        let _ = cell.set(Ok(buffer));
        Arc::new(DeviceValue { cell, by_launcher: false, program, counted: AtomicU64::new(0) })
    }

    /// A value the launcher fills: an upload (`program` 0) or an output of program number `program`.
    pub fn pending(program: u64) -> Arc<DeviceValue> {
        Arc::new(DeviceValue { cell: OnceLock::new(), by_launcher: true, program, counted: AtomicU64::new(0) })
    }

    /// The buffer, once the launcher has made it.
    pub fn buffer(&self) -> Result<&Buffer> {
        if self.cell.get().is_none() {
            wait_until(|| self.cell.get().is_some());
        }
        match self.cell.get() {
            Some(Ok(b)) => Ok(b),
            Some(Err(f)) => Err(f.error()),
            None => Err(Error::Internal("a device value was read before the launcher made it".into())),
        }
    }

    /// The number of the program that computes it on its thread (0 for an upload).
    pub fn program(&self) -> u64 {
        self.program
    }

    /// Note that its program's finite check counted it, in check epoch `epoch` (non-zero).
    pub fn set_counted(&self, epoch: u64) {
        self.counted.store(epoch, Ordering::Relaxed);
    }

    /// The check epoch in which its program counted it; 0 if none did.
    pub fn counted(&self) -> u64 {
        self.counted.load(Ordering::Relaxed)
    }

    /// The program (or upload) that was to make it failed.
    pub fn failed(&self) -> bool {
        matches!(self.cell.get(), Some(Err(_)))
    }

    /// Called on the launcher only.
    pub(super) fn fill(&self, value: std::result::Result<Buffer, Failure>) {
        let _ = self.cell.set(value);
    }
}

impl Drop for DeviceValue {
    fn drop(&mut self) {
        if let Some(Ok(buffer)) = self.cell.take() {
            if self.by_launcher {
                bury(buffer);
            }
        }
    }
}
