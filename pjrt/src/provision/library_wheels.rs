//! The pinned wheels of a target's libraries and tools (CUDA's `nvidia-*`), fetched like the plugin's own wheel:
//! taken from `LAZULI_WHEELS`, else downloaded with `pip download --no-deps` of the pinned file, checked against
//! the pinned sha256, and unpacked into `<cache>/libs/<library_dir>/`, laid out as pip lays them out in
//! site-packages (`nvidia/cu13/lib/…`). Every file is written under a private name and renamed into place, and a
//! marker `.unpacked/<wheel file>` is written after a wheel's last file, so a wheel counts as present only when
//! it is whole; concurrent processes coordinate through the directory's lock file.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::targets::{LibraryWheel, Target};
use super::{cache_dir_in, cached, pip_download, unique, FileLock, LockOutcome, Sources};
use crate::error::{Error, Result};

/// `<cache>/libs/<library_dir>/`: where `target`'s pinned wheels are unpacked.
pub(super) fn library_dir_in(target: &Target, sources: &Sources) -> Result<PathBuf> {
    Ok(cache_dir_in(sources)?.join("libs").join(target.library_dir))
}

/// The pinned wheels of `target`, each once: those of its libraries in the table's order, then its CUDA tools.
pub fn library_wheels(target: &Target) -> Vec<&'static LibraryWheel> {
    let mut wheels: Vec<&'static LibraryWheel> = Vec::new();
    for wheel in target.libraries.iter().filter_map(|l| l.pinned).chain(target.cuda_tools) {
        if !wheels.contains(&wheel) {
            wheels.push(wheel);
        }
    }
    wheels
}

/// Whether every file of `wheel` is unpacked in `dir`.
pub(super) fn is_unpacked(dir: &Path, wheel: &LibraryWheel) -> bool {
    fs::read_to_string(marker(dir, wheel)).is_ok_and(|text| text.trim() == wheel.sha256)
}

fn marker(dir: &Path, wheel: &LibraryWheel) -> PathBuf {
    dir.join(".unpacked").join(wheel.file)
}

/// Fetches, checks and unpacks those of `wheels` (pinned wheels of `target`) not yet unpacked in its library
/// directory, which it returns. An error says why, and what to run where there is a network.
pub fn fetch_library_wheels_in(target: &Target, wheels: &[&LibraryWheel], sources: &Sources) -> Result<PathBuf> {
    let dir = library_dir_in(target, sources)?;
    let absent =
        |dir: &Path| -> Vec<&LibraryWheel> { wheels.iter().copied().filter(|w| !is_unpacked(dir, w)).collect() };
    if absent(&dir).is_empty() {
        return Ok(dir);
    }
    // One fetch at a time in this process; the lock file covers other processes.
    static FETCHING: Mutex<()> = Mutex::new(());
    let _guard = FETCHING.lock().unwrap_or_else(|p| p.into_inner());
    let fail = |reason: String, missing: &[&LibraryWheel]| offline_error(target, missing, &dir, &reason, sources);
    fs::create_dir_all(dir.join(".unpacked"))
        .map_err(|e| fail(format!("cannot create {}: {e}", dir.display()), wheels))?;
    let _lock = match FileLock::acquire(&dir.join(".fetch.lock"), || absent(&dir).is_empty()) {
        LockOutcome::Done => return Ok(dir),
        LockOutcome::Locked(lock) => Some(lock),
        LockOutcome::GaveUp => None, // still safe: every file is written privately and renamed into place
    };
    let missing = absent(&dir); // again, under the lock
    let to_download: Vec<&&LibraryWheel> = missing.iter().filter(|w| given(w, sources).is_none()).collect();
    if !to_download.is_empty() && sources.runs_python() {
        eprintln!(
            "lazuli: fetching the libraries of the PJRT {} plugin: {}, {} MB in all, into {}",
            target.device.name(),
            count(to_download.len()),
            to_download.iter().map(|w| w.megabytes()).sum::<u64>(),
            dir.display()
        );
    }
    for (i, wheel) in missing.iter().enumerate() {
        fetch_one(wheel, &dir, sources).map_err(|reason| fail(reason, &missing[i..]))?;
    }
    Ok(dir)
}

/// The file `wheel` in `LAZULI_WHEELS`, if it is there.
fn given(wheel: &LibraryWheel, sources: &Sources) -> Option<PathBuf> {
    sources.wheels.as_ref().map(|d| d.join(wheel.file)).filter(|p| p.is_file())
}

/// Takes `wheel` from `LAZULI_WHEELS` (the user's file: kept) or downloads it (deleted once unpacked); checks its
/// sha256 and unpacks it. Errors are plain reasons.
fn fetch_one(wheel: &LibraryWheel, dir: &Path, sources: &Sources) -> std::result::Result<(), String> {
    if let Some(path) = given(wheel, sources) {
        eprintln!("lazuli: unpacking {} from {} into {}", wheel.requirement, path.display(), dir.display());
        return verify(wheel, &path).and_then(|()| unpack(wheel, &path, dir));
    }
    if sources.runs_python() {
        eprintln!("lazuli: fetching {} ({} MB)", wheel.requirement, wheel.megabytes());
    }
    let download_dir = unique(dir, "download");
    let result = pip_download(wheel.requirement, &wheel.pip_args(), wheel.file, &download_dir, sources)
        .and_then(|path| verify(wheel, &path).and_then(|()| unpack(wheel, &path, dir)));
    let _ = fs::remove_dir_all(&download_dir);
    result
}

/// The wheel file against its pinned sha256: a corrupt or substituted file is refused, naming both digests.
fn verify(wheel: &LibraryWheel, path: &Path) -> std::result::Result<(), String> {
    let digest = cached::sha256_file(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if digest != wheel.sha256 {
        return Err(format!(
            "{} has sha256 {digest}, expected {} (a corrupt or substituted file)",
            wheel.file, wheel.sha256
        ));
    }
    Ok(())
}

/// Every file of the wheel but its `.dist-info`, each through a private name renamed into place with the
/// wheel's permissions (`ptxas` must stay executable); the marker last.
fn unpack(wheel: &LibraryWheel, path: &Path, dir: &Path) -> std::result::Result<(), String> {
    let open = fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut archive = zip::ZipArchive::new(open).map_err(|e| format!("{} is not a zip archive: {e}", wheel.file))?;
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(|e| format!("cannot read {}: {e}", wheel.file))?;
        let Some(relative) = entry.enclosed_name() else { continue }; // a name escaping the directory
        let is_metadata = relative.iter().next().is_some_and(|c| c.to_string_lossy().ends_with(".dist-info"));
        if entry.is_dir() || is_metadata {
            continue;
        }
        let to = dir.join(&relative);
        let parent = to.parent().unwrap_or(dir);
        let tmp = unique(parent, &entry.name().replace('/', "_"));
        let written = fs::create_dir_all(parent)
            .and_then(|()| fs::File::create(&tmp))
            .and_then(|mut out| std::io::copy(&mut entry, &mut out).and_then(|_| out.flush()))
            .and_then(|()| set_mode(&tmp, entry.unix_mode()))
            .and_then(|()| fs::rename(&tmp, &to));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(format!("cannot unpack {} of {} into {}: {e}", entry.name(), wheel.file, dir.display()));
        }
    }
    let done = marker(dir, wheel);
    let tmp = unique(dir, "marker");
    fs::write(&tmp, format!("{}\n", wheel.sha256))
        .and_then(|()| fs::rename(&tmp, &done))
        .map_err(|e| format!("cannot write {}: {e}", done.display()))
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: Option<u32>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let executable = mode.is_some_and(|m| m & 0o111 != 0);
    fs::set_permissions(path, fs::Permissions::from_mode(if executable { 0o755 } else { 0o644 }))
}

#[cfg(not(unix))]
fn set_mode(_: &Path, _: Option<u32>) -> std::io::Result<()> {
    Ok(())
}

fn count(wheels: usize) -> String {
    if wheels == 1 {
        "1 wheel".into()
    } else {
        format!("{wheels} wheels")
    }
}

/// The `pip download` line of each wheel, with its pinned version and its own platform tags.
pub(super) fn download_commands(wheels: &[&LibraryWheel], python: &str) -> String {
    wheels
        .iter()
        .map(|w| {
            format!(
                "\n  {python} -m pip download --no-deps --only-binary=:all: {} {} -d DIR",
                w.pip_args().join(" "),
                w.requirement
            )
        })
        .collect()
}

fn offline_error(target: &Target, missing: &[&LibraryWheel], dir: &Path, reason: &str, sources: &Sources) -> Error {
    Error::Provision(format!(
        "lazuli could not fetch the libraries of the PJRT {what} plugin ({name}): {reason}\n\
         Where there is a network, fetch these {count} ({mb} MB):{commands}\n\
         then copy DIR here and set LAZULI_WHEELS=DIR: lazuli checks each wheel's sha256 and unpacks it into {dir}. \
         Or install them into the Python lazuli uses (python3 -m pip install {list}).",
        what = target.device.name(),
        name = target.name,
        count = count(missing.len()),
        mb = missing.iter().map(|w| w.megabytes()).sum::<u64>(),
        commands = download_commands(missing, &sources.python()),
        dir = dir.display(),
        list = missing.iter().map(|w| w.requirement).collect::<Vec<_>>().join(" "),
    ))
}
