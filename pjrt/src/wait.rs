//! How this process waits for the device: every wait (a launched program's completion, a buffer read to the
//! host, a buffer becoming ready) first polls its event, then sleeps on it. Waking a sleeping thread costs tens of
//! microseconds, and a core left idle through a long wait may drop into a deep sleep state that empties its
//! caches, so the host work after the wait (recording the next step) starts cold. Polling keeps the core busy
//! instead; where the host computes the program itself (the CPU plugin), a long poll would take a core from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The default poll: long enough for a small program, short enough to leave CPU plugins their cores.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);

static SPIN_NANOS: AtomicU64 = AtomicU64::new(DEFAULT_SPIN.as_nanos() as u64);

/// How long every later wait polls its event before sleeping on it (for the whole process).
pub fn set_spin_before_sleeping(spin: Duration) {
    SPIN_NANOS.store(u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// Calls `ready` until it says yes or the poll's time is up.
pub(crate) fn spin_until(mut ready: impl FnMut() -> bool) {
    let spin = Duration::from_nanos(SPIN_NANOS.load(Ordering::Relaxed));
    if spin.is_zero() {
        return;
    }
    let t0 = std::time::Instant::now();
    while !ready() && t0.elapsed() < spin {
        std::hint::spin_loop();
    }
}
