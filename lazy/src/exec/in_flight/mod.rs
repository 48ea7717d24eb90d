//! In flight: programs launched but perhaps still running, bounded in number; waiting for them (reads wait for
//! their own values, `wait()` for everything), and at process exit.

pub(crate) mod reaper;

use std::sync::Arc;
use std::time::Instant;

use lazuli_hlo::Loc;

use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::error::{Error, Result};
use crate::runtime::launcher::{self, Ticket};

/// Programs launched but perhaps still running, oldest first, with the line that caused each. Execution is
/// asynchronous: `sync()` returns once the step's program is enqueued, so the host records the next step while
/// the device runs this one. Reads wait for the data they need; `wait()` waits for everything.
static IN_FLIGHT: std::sync::Mutex<std::collections::VecDeque<Launched>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());

/// Programs allowed in flight at once (bounds device memory held by queued steps, and how late an error shows).
pub(crate) const MAX_IN_FLIGHT: usize = 2;

/// A launched program: its completion and the line that launched it.
pub(crate) enum Launched {
    /// Launched from the materializing thread.
    Here { done: lazuli_pjrt::Completion, at: Loc },
    /// Queued on the launcher (`runtime/launcher.rs`); the ticket knows the line.
    Queued(Arc<Ticket>),
}

impl Launched {
    fn wait(self) -> Result<()> {
        match self {
            Launched::Here { done, at } => done.wait().map_err(|source| Error::Execute { at, source }),
            Launched::Queued(ticket) => ticket.wait(),
        }
    }
}

fn in_flight() -> std::sync::MutexGuard<'static, std::collections::VecDeque<Launched>> {
    IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Note a launched program; it is waited for by `throttle`, `wait` or at exit.
pub(crate) fn push(launched: Launched) {
    in_flight().push_back(launched);
}

/// Wait for the oldest launched programs until at most `keep` remain; an error names the line that launched it.
pub(crate) fn throttle(keep: usize) -> Result<()> {
    if in_flight().len() <= keep {
        return Ok(());
    }
    let t0 = Instant::now();
    let mut status = Ok(());
    loop {
        let Some(launched) = ({
            let mut q = in_flight();
            if q.len() > keep {
                q.pop_front()
            } else {
                None
            }
        }) else {
            break;
        };
        if let (Err(e), true) = (launched.wait(), status.is_ok()) {
            status = Err(e);
        }
    }
    Counters::add(&COUNTERS.wait_ns, t0.elapsed().as_nanos() as u64);
    status
}

/// At process exit: wait for launched programs, unless another thread holds the queue (it is then mid-launch);
/// then keep the launcher out of the plugin, which is torn down next.
pub(crate) fn wait_at_exit() {
    let pending: Vec<_> = match IN_FLIGHT.try_lock() {
        Ok(mut q) => q.drain(..).collect(),
        Err(_) => Vec::new(),
    };
    for launched in pending {
        let _ = launched.wait();
    }
    reaper::drain(std::time::Duration::from_secs(5));
    launcher::shutdown();
}

/// Wait until every launched program has finished on its devices (`exec::wait` is the public form).
pub(crate) fn wait() -> Result<()> {
    launcher::note_wait();
    launcher::flush_graves();
    throttle(0)
}
