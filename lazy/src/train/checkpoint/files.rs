//! Writing a checkpoint atomically, and cleaning up after saves that were killed.
//!
//! The file is written to `<target>.lazuli-tmp-<pid>-<n>` next to the target (the same filesystem, so the
//! final rename is atomic), fsynced, renamed over the target, and the directory fsynced: a crash leaves either
//! the old file or the new one. A save killed on the way leaves its temp file; the temp name carries the target
//! and the writer's pid so that the next save of the same target can remove the ones whose writer is gone
//! ([`remove_stale`]) and keep those of a live process saving at the same moment. SIGINT and SIGTERM during a
//! save remove the temp file at once ([`super::signals`]); SIGKILL cannot be caught, which is what the stale
//! clean-up is for.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::signals::TempFile;

/// What follows the target's file name in a temp file's name.
const TMP_TAG: &str = ".lazuli-tmp-";
/// Distinguishes concurrent saves of one target by threads of one process.
static SEQ: AtomicU64 = AtomicU64::new(0);

/// Write `header` and then `parts` to `path` atomically, first removing stale temp files of `path`. The error
/// says which step failed.
pub(crate) fn write_atomically(path: &Path, header: &[u8], parts: &[&[u8]]) -> Result<(), String> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or("the path does not name a file")?;
    remove_stale(dir, name);
    let mut tmp_name = OsString::from(name);
    tmp_name.push(format!("{TMP_TAG}{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let tmp_path = dir.join(tmp_name);
    let step = |what: &'static str| {
        let tmp = tmp_path.display().to_string();
        move |e: io::Error| format!("{what} {tmp} failed: {e}")
    };
    let (tmp, file) = TempFile::create(tmp_path.clone()).map_err(step("creating"))?;
    write_all(file, header, parts).map_err(step("writing"))?;
    tmp.persist(path).map_err(step("renaming"))?;
    sync_dir(dir);
    Ok(())
}

fn write_all(file: File, header: &[u8], parts: &[&[u8]]) -> io::Result<()> {
    let mut out = BufWriter::with_capacity(1 << 20, file);
    out.write_all(header)?;
    for part in parts {
        out.write_all(part)?;
    }
    out.into_inner().map_err(io::IntoInnerError::into_error)?.sync_all()
}

/// Make the rename itself durable. Best effort: some filesystems refuse to fsync a directory, and the file is
/// already complete under its final name.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        tracing::debug!("checkpoint: fsync of {} failed: {e}", dir.display());
    }
    #[cfg(not(unix))]
    let _ = dir;
}

/// Remove temp files of saves of `name` in `dir` whose writer is gone: killed (SIGKILL, a crash, power loss)
/// before it could clean up. Also the previous naming's `.<name>.tmp-<pid>`.
fn remove_stale(dir: &Path, name: &std::ffi::OsStr) {
    let (Some(name), Ok(entries)) = (name.to_str(), std::fs::read_dir(dir)) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(pid) = entry.file_name().to_str().and_then(|f| writer_pid(f, name)) else { continue };
        if writer_alive(pid, &path) {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::info!("checkpoint: removed {}, left by a save that was killed", path.display()),
            Err(e) => tracing::debug!("checkpoint: could not remove stale {}: {e}", path.display()),
        }
    }
}

/// The pid in a temp file name of target `name`: `<name>.lazuli-tmp-<pid>-<n>` or `.<name>.tmp-<pid>`.
fn writer_pid(file: &str, name: &str) -> Option<u32> {
    let current = file.strip_prefix(name).and_then(|r| r.strip_prefix(TMP_TAG)).and_then(|r| {
        let (pid, n) = r.split_once('-')?;
        (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(pid)
    });
    let old = || file.strip_prefix('.')?.strip_prefix(name)?.strip_prefix(".tmp-");
    let pid = current.or_else(old)?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Whether the process that wrote `path` may still be writing it. Our own pid: only if one of our saves has it
/// open (a file of ours we don't know is from an earlier process that had our pid). Another pid: on Linux,
/// while `/proc/<pid>` exists; elsewhere always, so nothing is removed.
fn writer_alive(pid: u32, path: &Path) -> bool {
    if pid == std::process::id() {
        return TempFile::is_open(path);
    }
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_are_recognized_only_for_their_target() {
        assert_eq!(writer_pid("run.st.lazuli-tmp-123-0", "run.st"), Some(123));
        assert_eq!(writer_pid(".run.st.tmp-77", "run.st"), Some(77));
        assert_eq!(writer_pid("run.st", "run.st"), None);
        assert_eq!(writer_pid("run.st.lazuli-tmp-123-0", "run"), None);
        assert_eq!(writer_pid("run.st.lazuli-tmp-123-0", "un.st"), None);
        assert_eq!(writer_pid("run.st.x.lazuli-tmp-123-0", "run.st"), None);
        assert_eq!(writer_pid("run.st.lazuli-tmp--0", "run.st"), None);
        assert_eq!(writer_pid("run.st.lazuli-tmp-12x-0", "run.st"), None);
        assert_eq!(writer_pid("run.st.lazuli-tmp-123-", "run.st"), None);
        assert_eq!(writer_pid("run.st.lazuli-tmp-123-0x", "run.st"), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn stale_files_of_dead_writers_go_and_live_ones_stay() {
        let dir = std::env::temp_dir().join(format!("lazuli-ckpt-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A pid above the kernel's maximum (2^22) is never alive.
        let dead = dir.join("a.st.lazuli-tmp-4194304999-0");
        let old = dir.join(".a.st.tmp-4194304999");
        let parent = dir.join(format!("a.st.lazuli-tmp-{}-0", std::os::unix::process::parent_id()));
        let other = dir.join("b.st.lazuli-tmp-4194304999-0");
        // Our pid but no save of ours has it open: an earlier process that had our pid left it.
        let reused = dir.join(format!("a.st.lazuli-tmp-{}-999999", std::process::id()));
        for p in [&dead, &old, &parent, &other, &reused] {
            std::fs::write(p, b"x").unwrap();
        }
        write_atomically(&dir.join("a.st"), b"head", &[b"er"]).unwrap();
        assert!(!dead.exists() && !old.exists() && !reused.exists(), "files of dead writers are removed");
        assert!(parent.exists(), "a live writer's file stays");
        assert!(other.exists(), "another target's file stays");
        assert_eq!(std::fs::read(dir.join("a.st")).unwrap(), b"header");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
