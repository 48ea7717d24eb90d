//! Finding PJRT plugins, and fetching the CPU plugin into a per-user cache on first use (other devices' plugins,
//! and the CUDA libraries, the same way: `device.rs`, `library_wheels.rs`).
//!
//! The CPU plugin comes from a PyPI wheel, fetched once with `pip download`, checked against a pinned
//! sha256, and unpacked into `<cache>/plugins/<pip name>-<version>/`. The unpacked file has a pinned size
//! and sha256 too, checked before every load ([`cached`] says how often it is hashed); a damaged file is
//! deleted and fetched again, never loaded. Concurrent processes (test binaries run in parallel) coordinate
//! through a lock file; even without it they cannot corrupt the cache, because each writes a private
//! temporary file, checks it and renames it into place atomically, so a loader sees the whole file or none.
//! A plugin named by a variable is the user's file: it is never deleted, only checked to be an intact ELF
//! shared object before `dlopen`.
//!
//! | variable | effect |
//! |---|---|
//! | `LAZULI_PJRT_PLUGIN` | path of the CPU plugin to use; nothing is fetched |
//! | `LAZULI_CPU_PLUGIN` | `lammps-jax-pjrt-cpu` (default) or `xla-cpu-pjrt` |
//! | `LAZULI_CACHE_DIR` | cache root (else `$XDG_CACHE_HOME/lazuli`, else `$HOME/.cache/lazuli`) |
//! | `LAZULI_PYTHON` | the Python that runs pip and knows the site-packages (`python3`); `none`: no Python at all |
//! | `LAZULI_WHEELS` | a directory of wheel files (plugins, CUDA libraries) to take before downloading |
//! | `LAZULI_GPU_PLUGIN` | path of the CUDA plugin |
//! | `LAZULI_TPU_PLUGIN`, `TPU_LIBRARY_PATH` | path of the TPU plugin |

mod cached;
mod cuda_libraries;
mod device;
mod elf;
mod libraries;
mod library_wheels;
pub mod targets;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
use cached::{Cached, Depth};
pub use device::{create_device_client, device_plugin_in, load_device_plugin, DevicePlugin, CLIENT_CREATE_TIMEOUT};
pub(crate) use elf::check_shared_object;
pub use library_wheels::{fetch_library_wheels_in, library_wheels};
pub use targets::{Device, Host, Library, LibraryWheel, Target, TARGETS};

/// The CPU plugins lazuli knows how to fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CpuPluginKind {
    /// `lammps-jax-pjrt-cpu` 0.11.2: XLA of jaxlib 0.11.2, PJRT C API 0.115. The default.
    LammpsJax0112,
    /// `xla-cpu-pjrt` 0.0.1 by the OpenXLA authors, PJRT C API 0.81.
    XlaCpu001,
}

/// Where a plugin comes from and how to check it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PluginSpec {
    pub pip_name: &'static str,
    pub version: &'static str,
    pub wheel_file: &'static str,
    /// sha256 of the wheel file.
    pub sha256: &'static str,
    /// Path of the shared object inside the wheel.
    pub so_member: &'static str,
    /// sha256 of the shared object, checked when unpacked and whenever the cached file changed.
    pub so_sha256: &'static str,
    /// Size of the shared object in bytes, checked before every load.
    pub so_size: u64,
    /// Approximate wheel size, for the one-line notice.
    pub download_mb: u32,
    /// Arguments that make `pip download` pick exactly this file on any host (platform tags).
    pub pip_args: &'static [&'static str],
}

impl CpuPluginKind {
    pub const ALL: [CpuPluginKind; 2] = [CpuPluginKind::LammpsJax0112, CpuPluginKind::XlaCpu001];

    /// The name used in `LAZULI_CPU_PLUGIN` (the pip package name).
    pub fn name(self) -> &'static str {
        self.spec().pip_name
    }

    pub fn from_name(name: &str) -> Option<CpuPluginKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn spec(self) -> PluginSpec {
        self.target().plugin
    }

    /// Its row in [`targets::TARGETS`].
    pub fn target(self) -> &'static Target {
        let name = match self {
            CpuPluginKind::LammpsJax0112 => "lammps-jax-pjrt-cpu",
            CpuPluginKind::XlaCpu001 => "xla-cpu-pjrt",
        };
        targets::target(name).expect("every CPU plugin kind has a row in the target table")
    }
}

/// Where provisioning looks, one field per setting: what lazuli's settings read from the environment
/// (`lazuli_lazy::settings`), or [`Sources::from_env`] for a program that uses this crate alone. Unset fields take
/// their defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sources {
    /// `LAZULI_PJRT_PLUGIN`: any plugin file, instead of a CPU plugin.
    pub pjrt_plugin: Option<PathBuf>,
    /// `LAZULI_CPU_PLUGIN`: which pinned CPU plugin (default `lammps-jax-pjrt-cpu`).
    pub cpu_plugin: Option<CpuPluginKind>,
    /// `LAZULI_GPU_PLUGIN`: the CUDA plugin file, instead of Python's site-packages.
    pub gpu_plugin: Option<PathBuf>,
    /// `LAZULI_TPU_PLUGIN`, else `TPU_LIBRARY_PATH`: libtpu, instead of Python's site-packages.
    pub tpu_plugin: Option<(PathBuf, &'static str)>,
    /// `LAZULI_ROCM_PLUGIN`: the ROCm plugin file.
    pub rocm_plugin: Option<PathBuf>,
    /// `LAZULI_XPU_PLUGIN`: the oneAPI plugin file.
    pub xpu_plugin: Option<PathBuf>,
    /// `LAZULI_TARGET`: a row of [`targets::TARGETS`] by name; its pinned plugin is used even when Python has
    /// one installed (the default: an installed plugin first, else the device's first row).
    pub target: Option<&'static Target>,
    /// `LAZULI_WHEELS`: a directory holding wheel files (`.whl`) to take plugins and their libraries from before
    /// downloading, e.g. on a machine without a network.
    pub wheels: Option<PathBuf>,
    /// `LAZULI_CACHE_DIR`: the cache directory (default `$XDG_CACHE_HOME/lazuli`, else `~/.cache/lazuli`).
    pub cache_dir: Option<PathBuf>,
    /// `LAZULI_PYTHON`: the Python whose pip fetches plugins and libraries and whose site-packages are searched
    /// (`python3`); `none`: no Python at all.
    pub python: Option<String>,
}

impl Sources {
    /// The sources the `LAZULI_*` variables name (for programs that use this crate without lazuli).
    pub fn from_env() -> Result<Sources> {
        let cpu_plugin = match std::env::var("LAZULI_CPU_PLUGIN") {
            Ok(name) if !name.is_empty() => Some(CpuPluginKind::parse(&name, "LAZULI_CPU_PLUGIN")?),
            _ => None,
        };
        let tpu = |var: &'static str| env_path(var).map(|p| (p, var));
        Ok(Sources {
            pjrt_plugin: env_path("LAZULI_PJRT_PLUGIN"),
            cpu_plugin,
            gpu_plugin: env_path("LAZULI_GPU_PLUGIN"),
            tpu_plugin: tpu("LAZULI_TPU_PLUGIN").or_else(|| tpu("TPU_LIBRARY_PATH")),
            rocm_plugin: env_path("LAZULI_ROCM_PLUGIN"),
            xpu_plugin: env_path("LAZULI_XPU_PLUGIN"),
            target: match std::env::var("LAZULI_TARGET") {
                Ok(name) if !name.is_empty() => Some(parse_target(&name)?),
                _ => None,
            },
            wheels: env_path("LAZULI_WHEELS"),
            cache_dir: env_path("LAZULI_CACHE_DIR"),
            python: std::env::var("LAZULI_PYTHON").ok().filter(|p| !p.is_empty()),
        })
    }

    /// The Python to run (and to name in messages).
    pub(crate) fn python(&self) -> String {
        self.python.clone().filter(|_| self.runs_python()).unwrap_or_else(|| "python3".into())
    }

    /// Where installed plugins are looked for, for messages.
    pub(crate) fn site_packages(&self) -> String {
        if self.runs_python() {
            format!("the site-packages of {}", self.python())
        } else {
            "any site-packages (LAZULI_PYTHON=none: none are searched)".into()
        }
    }

    /// `false` for `LAZULI_PYTHON=none`: no site-packages are searched and no pip is run, so everything comes
    /// from lazuli's cache, `LAZULI_WHEELS` or the variables naming files.
    pub(crate) fn runs_python(&self) -> bool {
        self.python.as_deref() != Some("none")
    }
}

impl CpuPluginKind {
    /// The kind named `name`, or an error naming `var` and the known names.
    pub fn parse(name: &str, var: &str) -> Result<CpuPluginKind> {
        CpuPluginKind::from_name(name).ok_or_else(|| {
            let known: Vec<&str> = CpuPluginKind::ALL.iter().map(|k| k.name()).collect();
            Error::Provision(format!("{var}={name:?} is not one of: {}", known.join(", ")))
        })
    }
}

/// The row of [`targets::TARGETS`] called `name`, or an error naming `LAZULI_TARGET` and the rows.
pub fn parse_target(name: &str) -> Result<&'static Target> {
    targets::target(name).ok_or_else(|| {
        let known: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
        Error::Provision(format!("LAZULI_TARGET={name:?} is not one of: {}", known.join(", ")))
    })
}

/// [`cpu_plugin_path_in`] with the environment's [`Sources`].
pub fn cpu_plugin_path() -> Result<PathBuf> {
    cpu_plugin_path_in(&Sources::from_env()?)
}

/// The CPU plugin to use: `pjrt_plugin` if set (any plugin file), else the `cpu_plugin` kind (default
/// `lammps-jax-pjrt-cpu`), fetched into the cache if needed.
pub fn cpu_plugin_path_in(sources: &Sources) -> Result<PathBuf> {
    if let Some(path) = &sources.pjrt_plugin {
        return user_plugin(path.clone(), "LAZULI_PJRT_PLUGIN");
    }
    cpu_plugin_path_for_in(sources.cpu_plugin.unwrap_or(CpuPluginKind::LammpsJax0112), sources)
}

/// [`cpu_plugin_path_for_in`] with the environment's [`Sources`].
pub fn cpu_plugin_path_for(kind: CpuPluginKind) -> Result<PathBuf> {
    cpu_plugin_path_for_in(kind, &Sources::from_env()?)
}

/// The cached plugin of `kind`, fetched on first use (needs `python3 -m pip` and network access once), and
/// fetched again if the cached file is damaged.
pub fn cpu_plugin_path_for_in(kind: CpuPluginKind, sources: &Sources) -> Result<PathBuf> {
    pinned_plugin_path_in(kind.target(), sources)
}

/// The pinned plugin of `target`, unpacked in `<cache>/plugins/<pip name>-<version>/`: checked there, else taken
/// from the wheel in `sources.wheels` (`LAZULI_WHEELS`) or downloaded with pip, checked against the pins and
/// unpacked. A damaged cached file is deleted and fetched again.
pub fn pinned_plugin_path_in(target: &Target, sources: &Sources) -> Result<PathBuf> {
    if let Host::MacOsArm64(needs) = target.host {
        return Err(Error::Provision(format!("the PJRT {} plugin cannot run here: {needs}", target.device.name())));
    }
    let spec = target.plugin;
    let what = target.device.name();
    let dir = cache_dir_in(sources)?.join("plugins").join(format!("{}-{}", spec.pip_name, spec.version));
    let so = dir.join(file_name(spec.so_member));
    if cached::check(&spec, &so, Depth::Hash) == Cached::Intact {
        return Ok(so);
    }
    // One fetch at a time in this process; the lock file covers other processes.
    static FETCHING: Mutex<()> = Mutex::new(());
    let _guard = FETCHING.lock().unwrap_or_else(|p| p.into_inner());
    let create = |e| fetch_error(target, &dir, &format!("cannot create {}: {e}", dir.display()), sources);
    fs::create_dir_all(&dir).map_err(create)?;
    let done = || cached::check(&spec, &so, Depth::MarkerOnly) == Cached::Intact;
    let _lock = match FileLock::acquire(&dir.join(".fetch.lock"), done) {
        LockOutcome::Done => return Ok(so),
        LockOutcome::Locked(lock) => Some(lock),
        LockOutcome::GaveUp => None, // still safe: every write below is a private file renamed into place
    };
    // Checked again under the lock: another process may have replaced the file meanwhile.
    match cached::check(&spec, &so, Depth::Hash) {
        Cached::Intact => return Ok(so),
        Cached::Missing => {}
        Cached::Damaged(reason) => discard(what, &so, &reason)?,
    }
    fetch(target, &dir, &so, sources).map_err(|reason| fetch_error(target, &dir, &reason, sources))?;
    Ok(so)
}

/// Deletes a damaged cached plugin and its marker, saying so in one line.
fn discard(what: &str, so: &Path, reason: &str) -> Result<()> {
    let _ = fs::remove_file(cached::marker_path(so));
    match fs::remove_file(so) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Provision(format!(
            "the cached PJRT {what} plugin {} is damaged ({reason}) and cannot be deleted ({e}); delete it by hand",
            so.display()
        ))),
        _ => {
            eprintln!(
                "lazuli: the cached PJRT {what} plugin {} was damaged ({reason}); deleted it, fetching it again",
                so.display()
            );
            Ok(())
        }
    }
}

/// [`gpu_plugin_path_in`] with the environment's [`Sources`].
pub fn gpu_plugin_path() -> Result<PathBuf> {
    gpu_plugin_path_in(&Sources::from_env()?)
}

/// The CUDA plugin's file (see [`device_plugin_in`]): `gpu_plugin`, else `LAZULI_TARGET`'s, else one installed in
/// the Python environment's site-packages (`jax_plugins/xla_cuda13`, then `xla_cuda12`), else the pinned wheel.
pub fn gpu_plugin_path_in(sources: &Sources) -> Result<PathBuf> {
    device_plugin_in(Device::Cuda, sources).map(|found| found.path)
}

/// [`tpu_plugin_path_in`] with the environment's [`Sources`].
pub fn tpu_plugin_path() -> Result<PathBuf> {
    tpu_plugin_path_in(&Sources::from_env()?)
}

/// The TPU plugin's file (see [`device_plugin_in`]): `tpu_plugin`, else `libtpu/libtpu.so` in site-packages,
/// else the pinned libtpu wheel.
pub fn tpu_plugin_path_in(sources: &Sources) -> Result<PathBuf> {
    device_plugin_in(Device::Tpu, sources).map(|found| found.path)
}

/// [`cache_dir_in`] with the environment's [`Sources`].
pub fn cache_dir() -> Result<PathBuf> {
    cache_dir_in(&Sources::from_env()?)
}

/// `cache_dir`, else `$XDG_CACHE_HOME/lazuli`, else `$HOME/.cache/lazuli`.
pub fn cache_dir_in(sources: &Sources) -> Result<PathBuf> {
    if let Some(dir) = &sources.cache_dir {
        return Ok(dir.clone());
    }
    if let Some(dir) = env_path("XDG_CACHE_HOME") {
        return Ok(dir.join("lazuli"));
    }
    env_path("HOME")
        .map(|home| home.join(".cache").join("lazuli"))
        .ok_or_else(|| Error::Provision("no cache directory: set LAZULI_CACHE_DIR (or XDG_CACHE_HOME or HOME)".into()))
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// A plugin file the user named in `var`: checked (never deleted) so that a bad one is an error naming the
/// variable, not a crash in the loader.
pub(crate) fn user_plugin(path: PathBuf, var: &str) -> Result<PathBuf> {
    if !path.exists() {
        return Err(Error::Provision(format!("{var}={} does not name an existing file", path.display())));
    }
    match check_shared_object(&path) {
        Ok(()) => Ok(path),
        Err(reason) => Err(Error::Provision(format!("{var}={} cannot be a PJRT plugin: {reason}", path.display()))),
    }
}

/// site.getsitepackages() + getusersitepackages() + sys.path of the Python in use; empty if it fails or
/// `LAZULI_PYTHON=none`.
pub(crate) fn python_paths(sources: &Sources) -> Vec<PathBuf> {
    if !sources.runs_python() {
        return Vec::new();
    }
    let script =
        "import site, sys\nfor p in site.getsitepackages() + [site.getusersitepackages()] + sys.path: print(p)";
    match Command::new(sources.python()).args(["-c", script]).output() {
        Ok(out) if out.status.success() => {
            String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(PathBuf::from).collect()
        }
        _ => Vec::new(),
    }
}

pub(crate) fn file_name(member: &str) -> &str {
    member.rsplit('/').next().unwrap_or(member)
}

/// A file name no other thread or process uses.
pub(crate) fn unique(dir: &Path, stem: &str) -> PathBuf {
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    dir.join(format!(".{stem}.{}.{nanos}.tmp", std::process::id()))
}

/// Takes the wheel from `dir` (put there by hand) or `sources.wheels`, else downloads it; verifies and unpacks.
/// Errors are plain reasons; the caller adds the fix.
fn fetch(target: &Target, dir: &Path, so: &Path, sources: &Sources) -> std::result::Result<(), String> {
    let spec = &target.plugin;
    let placed = dir.join(spec.wheel_file);
    let given = sources.wheels.as_ref().map(|d| d.join(spec.wheel_file)).filter(|w| w.is_file());
    let (wheel, download_dir) = if placed.is_file() {
        (placed.clone(), None) // put there by hand, as the error message suggests
    } else if let Some(given) = given {
        eprintln!(
            "lazuli: unpacking PJRT {} plugin from {} into {}",
            target.device.name(),
            given.display(),
            dir.display()
        );
        (given, None)
    } else {
        let download_dir = unique(dir, "download");
        eprintln!(
            "lazuli: fetching PJRT {} plugin {}=={} ({} MB) into {}",
            target.device.name(),
            spec.pip_name,
            spec.version,
            spec.download_mb,
            dir.display()
        );
        let requirement = format!("{}=={}", spec.pip_name, spec.version);
        let wheel = pip_download(&requirement, spec.pip_args, spec.wheel_file, &download_dir, sources);
        if wheel.is_err() {
            let _ = fs::remove_dir_all(&download_dir);
        }
        (wheel?, Some(download_dir))
    };
    let result = verify_and_unpack(spec, &wheel, dir, so);
    match download_dir {
        Some(d) => {
            let _ = fs::remove_dir_all(d);
        }
        // A hand-placed wheel is unpacked now (or bad and would fail every run): the cache keeps only
        // the .so and its marker. A wheel in `LAZULI_WHEELS` is the user's and stays.
        None if wheel == placed => {
            let _ = fs::remove_file(&wheel);
        }
        None => {}
    }
    result
}

/// `pip download --no-deps` of one pinned file into `into`; the path of the file, or why not.
fn pip_download<A: AsRef<std::ffi::OsStr>>(
    requirement: &str,
    pip_args: &[A],
    wheel_file: &str,
    into: &Path,
    sources: &Sources,
) -> std::result::Result<PathBuf, String> {
    if !sources.runs_python() {
        return Err(format!("LAZULI_PYTHON=none: lazuli runs no Python, so no pip downloads {requirement}"));
    }
    let python = sources.python();
    let out = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"])
        .args(pip_args)
        .arg(requirement)
        .arg("-d")
        .arg(into)
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(4).collect::<Vec<_>>().into_iter().rev().collect();
        return Err(format!("`{python} -m pip download {requirement}` failed: {}", tail.join(" / ")));
    }
    let wheel = into.join(wheel_file);
    if wheel.is_file() {
        Ok(wheel)
    } else {
        Err(format!("pip did not produce {wheel_file}"))
    }
}

/// Checks the wheel against its pin, unpacks the shared object into a private file, checks that against its
/// own pins and only then renames it into place, so no process ever sees a partial or wrong file.
fn verify_and_unpack(spec: &PluginSpec, wheel: &Path, dir: &Path, so: &Path) -> std::result::Result<(), String> {
    let digest = cached::sha256_file(wheel).map_err(|e| format!("cannot read {}: {e}", wheel.display()))?;
    if digest != spec.sha256 {
        return Err(format!(
            "{} has sha256 {digest}, expected {} (a corrupt or substituted file)",
            spec.wheel_file, spec.sha256
        ));
    }
    let tmp = unique(dir, file_name(spec.so_member));
    let placed = unpack_member(spec, wheel, &tmp).and_then(|file| {
        fs::rename(&tmp, so).map_err(|e| format!("cannot move the plugin into place: {e}"))?;
        // Read after the rename (which changes ctime), from the file this process wrote and checked.
        file.metadata().map(|meta| cached::identity(&meta)).map_err(|e| format!("cannot stat {}: {e}", so.display()))
    });
    match placed {
        Ok(identity) => {
            cached::record(spec, so, &identity);
            Ok(())
        }
        Err(reason) => {
            let _ = fs::remove_file(&tmp);
            Err(reason)
        }
    }
}

/// Unpacks `spec.so_member` to `to`, hashing it on the way, and checks its size and sha256.
fn unpack_member(spec: &PluginSpec, wheel: &Path, to: &Path) -> std::result::Result<fs::File, String> {
    let member = spec.so_member;
    let file = fs::File::open(wheel).map_err(|e| format!("cannot open {}: {e}", wheel.display()))?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| format!("{} is not a zip archive: {e}", wheel.display()))?;
    let mut entry = archive.by_name(member).map_err(|e| format!("{member} not found in the wheel: {e}"))?;
    let out = fs::File::create(to).map_err(|e| format!("cannot create {}: {e}", to.display()))?;
    let mut writer = cached::HashingWriter::new(out);
    let written = std::io::copy(&mut entry, &mut writer).map_err(|e| format!("cannot unpack {member}: {e}"))?;
    let (mut out, digest) = writer.finish();
    out.flush().and_then(|()| out.sync_all()).map_err(|e| format!("cannot write {}: {e}", to.display()))?;
    if written != spec.so_size || digest != spec.so_sha256 {
        return Err(format!(
            "unpacked {member} has {written} bytes and sha256 {digest}, expected {} and {}",
            spec.so_size, spec.so_sha256
        ));
    }
    Ok(out)
}

fn fetch_error(target: &Target, dir: &Path, reason: &str, sources: &Sources) -> Error {
    let spec = &target.plugin;
    Error::Provision(format!(
        "lazuli could not fetch the PJRT {what} plugin {name}=={version}: {reason}\n\
         Fix it with one of:\n  \
         1. {python} -m pip download --no-deps --only-binary=:all: {args}{name}=={version} -d {dir}\n     \
            (or copy {wheel} there, or into a directory named by LAZULI_WHEELS, by any means); lazuli then \
            verifies and unpacks it on the next run\n  \
         2. set {var}=/path/to/the/plugin to use a PJRT plugin you already have",
        what = target.device.name(),
        name = spec.pip_name,
        version = spec.version,
        args = spec.pip_args.iter().map(|a| format!("{a} ")).collect::<String>(),
        python = sources.python(),
        dir = dir.display(),
        wheel = spec.wheel_file,
        var = target.device.plugin_variable(),
    ))
}

/// A lock file made with `create_new`, removed on drop.
struct FileLock(PathBuf);

enum LockOutcome {
    Locked(FileLock),
    /// Another process finished the work while we waited.
    Done,
    /// Waited too long; go ahead without the lock.
    GaveUp,
}

impl FileLock {
    const STALE: Duration = Duration::from_secs(30 * 60);
    const WAIT: Duration = Duration::from_secs(10 * 60);

    fn acquire(path: &Path, done: impl Fn() -> bool) -> LockOutcome {
        let start = SystemTime::now();
        loop {
            match fs::OpenOptions::new().write(true).create_new(true).open(path) {
                Ok(mut f) => {
                    let _ = writeln!(f, "{}", std::process::id());
                    return LockOutcome::Locked(FileLock(path.to_path_buf()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(_) => return LockOutcome::GaveUp, // e.g. read-only cache: no lock possible
            }
            if done() {
                return LockOutcome::Done;
            }
            let age = fs::metadata(path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
            if age.is_some_and(|a| a > Self::STALE) {
                let _ = fs::remove_file(path); // its owner died mid-fetch
                continue;
            }
            if start.elapsed().is_ok_and(|w| w > Self::WAIT) {
                return LockOutcome::GaveUp;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_names() {
        for kind in CpuPluginKind::ALL {
            assert_eq!(CpuPluginKind::from_name(kind.name()), Some(kind));
            assert!(kind.spec().wheel_file.starts_with(&kind.spec().pip_name.replace('-', "_")));
        }
        assert_eq!(file_name("a/b/c.so"), "c.so");
    }

    #[test]
    fn bad_wheel_is_refused_and_deleted() {
        let dir = std::env::temp_dir().join(format!("lazuli-provision-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let spec = CpuPluginKind::XlaCpu001.spec();
        fs::write(dir.join(spec.wheel_file), b"not a wheel").unwrap();
        let so = dir.join("x.so");
        let err = fetch(CpuPluginKind::XlaCpu001.target(), &dir, &so, &Sources::default()).unwrap_err();
        assert!(err.contains("sha256"), "{err}");
        assert!(!dir.join(spec.wheel_file).exists());
        assert_eq!(cached::check(&spec, &so, Depth::Hash), Cached::Missing);
        fs::remove_dir_all(&dir).unwrap();
    }
}
