//! Values let go at a moment the host should not pay for it, dropped on a thread of their own. A checked step keeps
//! its inputs until its check is read (`exec/finite/`), and on a GPU that read comes right after `wait()` saw the
//! device finish, while the device idles: letting go of a few hundred kept buffers there (a call into the plugin
//! for each, through its holds and its deallocation) held up the next step's recording.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// What the reaper drops.
type Grave = Box<dyn Send>;

/// The reaper's queue; `None` where its thread could not start (values are then dropped where they are let go).
static REAPER: OnceLock<Option<Mutex<Sender<Grave>>>> = OnceLock::new();

/// Drop `value` on the reaper's thread (started on first use).
pub(crate) fn release_later(value: impl Send + 'static) {
    let reaper = REAPER.get_or_init(|| {
        let (tx, rx) = channel::<Grave>();
        let spawned =
            std::thread::Builder::new().name("lazuli-reaper".into()).spawn(move || rx.into_iter().for_each(drop));
        spawned.ok().map(|_| Mutex::new(tx))
    });
    match reaper {
        Some(tx) => {
            // A reaper gone (its thread ended) hands the value back: dropped here.
            if let Err(back) = tx.lock().unwrap_or_else(|e| e.into_inner()).send(Box::new(value)) {
                drop(back.0);
            }
        }
        None => drop(value),
    }
}

/// Wait (at most `limit`) until the reaper has dropped everything it was given so far: at process exit, before the
/// plugin those values belong to is torn down.
pub(crate) fn drain(limit: Duration) {
    if REAPER.get().is_none_or(Option::is_none) {
        return;
    }
    /// Signals when dropped, after everything queued before it.
    struct Marker(Sender<()>);
    impl Drop for Marker {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    let (tx, rx) = channel();
    release_later(Marker(tx));
    let _ = rx.recv_timeout(limit);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// Everything given to the reaper is dropped, on another thread, by the time `drain` returns.
    #[test]
    fn what_the_reaper_is_given_is_dropped_by_the_drain() {
        struct Counted(Arc<AtomicUsize>, std::thread::ThreadId);
        impl Drop for Counted {
            fn drop(&mut self) {
                assert_ne!(std::thread::current().id(), self.1, "dropped on the reaper's thread");
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicUsize::new(0));
        for _ in 0..100 {
            super::release_later(Counted(dropped.clone(), std::thread::current().id()));
        }
        super::drain(Duration::from_secs(30));
        assert_eq!(dropped.load(Ordering::SeqCst), 100);
    }
}
