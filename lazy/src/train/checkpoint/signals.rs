//! SIGINT and SIGTERM during a save: remove the save's temp file, then die of the signal as its default action
//! would have (so the exit status still says "killed by SIGTERM").
//!
//! On the first save, for each of the two signals whose disposition is still the default (neither caught nor
//! ignored, read from `/proc/self/status`), lazuli registers through `signal-hook` (this crate has no raw signal code of its own):
//! - a handler that runs the default action at once while no save is writing ([`IDLE`]), so outside saves the
//!   process behaves as before;
//! - a watcher thread that receives the signal while a save is writing, removes the temp files of all saves in
//!   progress ([`OPEN`]) and then runs the default action.
//!
//! Limits: SIGKILL (and a crash, or power loss) cannot be handled; the next save of the same target removes what
//! those leave (`files::remove_stale`). A signal the program already handles or ignores when it first saves is
//! left alone, so its own handler decides (and temp files are cleaned up by the next save). A handler installed
//! after the first save through `signal-hook`'s registry (as tokio's is) runs alongside lazuli's, which then
//! still ends the process on that signal: install such handlers before the first save. Other platforms: no
//! handlers.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

/// Temp files of the saves in progress in this process.
static OPEN: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// True while no save is writing, or when there is no watcher thread: a signal then gets its default action
/// straight from the handler.
static IDLE: AtomicBool = AtomicBool::new(true);
/// Whether the watcher thread runs (without it a save never clears [`IDLE`]).
static WATCHING: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

fn open_files() -> MutexGuard<'static, Vec<PathBuf>> {
    OPEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A save's temp file: registered for removal on SIGINT/SIGTERM while it exists, removed when dropped unless
/// it was renamed to the target.
pub(super) struct TempFile {
    path: PathBuf,
    renamed: bool,
}

impl TempFile {
    /// Create `path` (it must not exist) and register it.
    pub(super) fn create(path: PathBuf) -> io::Result<(TempFile, File)> {
        INSTALL.call_once(install);
        let mut open = open_files();
        // Cleared before the file exists: from here a signal goes to the watcher, which waits for this lock
        // and then sees the file.
        IDLE.store(!WATCHING.load(Ordering::SeqCst), Ordering::SeqCst);
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => {
                open.push(path.clone());
                Ok((TempFile { path, renamed: false }, file))
            }
            Err(e) => {
                IDLE.store(open.is_empty() || !WATCHING.load(Ordering::SeqCst), Ordering::SeqCst);
                Err(e)
            }
        }
    }

    /// Rename the file to `target`.
    pub(super) fn persist(mut self, target: &Path) -> io::Result<()> {
        std::fs::rename(&self.path, target)?;
        self.renamed = true;
        Ok(())
    }

    /// Whether a save in this process is writing `path`.
    pub(super) fn is_open(path: &Path) -> bool {
        open_files().iter().any(|p| p == path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let mut open = open_files();
        if !self.renamed {
            let _ = std::fs::remove_file(&self.path);
        }
        if let Some(i) = open.iter().position(|p| *p == self.path) {
            open.swap_remove(i);
        }
        // Set only once the file is gone: a signal from here on takes the default action at once.
        IDLE.store(open.is_empty() || !WATCHING.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

#[cfg(target_os = "linux")]
fn install() {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let signals: Vec<i32> = [SIGINT, SIGTERM]
        .into_iter()
        .filter(|&s| default_disposition(s))
        .filter(|&s| signal_hook::flag::register_conditional_default(s, &IDLE).is_ok())
        .collect();
    if signals.is_empty() {
        return;
    }
    let watcher = signal_hook::iterator::Signals::new(&signals).and_then(|mut incoming| {
        std::thread::Builder::new().name("lazuli-checkpoint-signals".into()).spawn(move || {
            for signal in incoming.forever() {
                // The lock is kept: no save creates another temp file before the process ends.
                let open = open_files();
                for path in open.iter() {
                    let _ = std::fs::remove_file(path);
                }
                // Resets the default action and raises the signal again: the process ends here.
                let _ = signal_hook::low_level::emulate_default_handler(signal);
                drop(open);
            }
        })
    });
    match watcher {
        Ok(_) => WATCHING.store(true, Ordering::SeqCst),
        Err(e) => tracing::warn!("checkpoint: no clean-up of temp files on SIGINT/SIGTERM: {e}"),
    }
}

#[cfg(not(target_os = "linux"))]
fn install() {}

/// Whether `signal` is neither caught nor ignored by this process (`SigCgt` and `SigIgn` in `/proc/self/status`).
#[cfg(target_os = "linux")]
fn default_disposition(signal: i32) -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    let mask = |field: &str| {
        status.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    };
    let bit = 1u64 << (signal - 1);
    matches!((mask("SigCgt:"), mask("SigIgn:")), (Some(caught), Some(ignored)) if (caught | ignored) & bit == 0)
}
