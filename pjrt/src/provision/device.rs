//! The plugin of any device in [`super::targets`]: found, loaded and its client created with checks.
//!
//! Where the plugin comes from, first match wins: the device's path variable (`LAZULI_GPU_PLUGIN`, …); the
//! pinned plugin of `LAZULI_TARGET`; a plugin installed in the site-packages of `LAZULI_PYTHON` (e.g. by
//! `pip install "jax[cuda13]"`); else the device's first row, from the cache, a wheel in `LAZULI_WHEELS`, or
//! downloaded. Its libraries are arranged by [`super::libraries`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::libraries::{self, Arranged};
use super::library_wheels;
use super::targets::{targets_of, Device, Library, LibraryWheel, Target};
use super::{cpu_plugin_path_in, pinned_plugin_path_in, python_paths, user_plugin, Sources};
use crate::error::{Error, Result};
use crate::{Client, ClientOptions, Plugin};

/// A device's plugin, ready to load.
#[derive(Clone, Debug)]
pub struct DevicePlugin {
    pub path: PathBuf,
    /// Its row in the table (for a file named by a variable: the device's row it most likely is).
    pub target: &'static Target,
    /// Where it was found, for messages: a variable's name, "Python's site-packages" or "the pinned wheel".
    pub origin: String,
    /// Libraries opened before the plugin (absolute paths, in that order), so that its own `dlopen` finds them.
    pub preload: Vec<PathBuf>,
    /// The target's libraries found nowhere.
    pub missing: Vec<&'static Library>,
    /// Libraries found that could not be opened, with the loader's reason.
    pub unopened: Vec<String>,
    /// For CUDA: the directory of `ptxas` and libdevice beside the libraries found, for XLA's
    /// `xla_gpu_cuda_data_dir` (XLA looks beside the plugin file otherwise, which a cached plugin is not).
    pub cuda_data_dir: Option<PathBuf>,
}

/// The start of [`DevicePlugin::origin`] for a plugin installed in site-packages.
const INSTALLED: &str = "the site-packages of ";

/// Finds (or fetches) `device`'s plugin and arranges its libraries. Loads nothing.
pub fn device_plugin_in(device: Device, sources: &Sources) -> Result<DevicePlugin> {
    let (path, target, origin) = locate(device, sources)?;
    let Arranged { preload, missing, cuda_data_dir } = libraries::arrange(target, &path, sources)?;
    // An installed plugin's XLA finds the tools beside itself, in the same site-packages.
    let cuda_data_dir = cuda_data_dir.filter(|_| !origin.starts_with(INSTALLED));
    Ok(DevicePlugin { path, target, origin, preload, missing, unopened: Vec::new(), cuda_data_dir })
}

/// [`device_plugin_in`], then the libraries opened and the plugin loaded: its C API version must lie in the
/// target's accepted range. A `dlopen` failure names the libraries the plugin needs that are nowhere to be found
/// and where they come from.
pub fn load_device_plugin(device: Device, sources: &Sources) -> Result<(Plugin, DevicePlugin)> {
    let mut found = device_plugin_in(device, sources)?;
    if device == Device::Tpu {
        skip_tpu_metadata_without_tpus();
    }
    #[cfg(unix)]
    found.preload.retain(|library| match crate::ffi::preload_library(library) {
        Ok(()) => true,
        // Not fatal: the plugin may not need it, and if it does, its own error and `hints` say so.
        Err(reason) => {
            found.unopened.push(format!("{} ({reason})", library.display()));
            false
        }
    });
    let ((min, max), path) = (found.target.accepts, found.path.clone());
    let loaded = bounded(CLIENT_CREATE_TIMEOUT, move || Plugin::load_accepting(&path, min, max)).unwrap_or_else(|| {
        Err(Error::Provision(format!(
            "the PJRT {} plugin {} (from {}) did not finish initializing within {} s, so lazuli gave up on it",
            device.name(),
            found.path.display(),
            found.origin,
            CLIENT_CREATE_TIMEOUT.as_secs()
        )))
    });
    match loaded {
        Ok(plugin) => Ok((plugin, found)),
        Err(Error::Load { path, reason }) => {
            let reason = format!("{reason}{}", libraries::explain_missing(found.target, &path, &found.preload));
            Err(Error::Load { path, reason })
        }
        Err(e) => Err(e),
    }
}

/// libtpu asks Google Cloud's metadata server for the slice's shape while it initializes, 30 times per key with
/// pauses, about 30 s a key and minutes in all, on a machine that is not a TPU VM. `TPU_SKIP_MDS_QUERY=1` stops
/// that; set here (before the plugin is loaded) only when the machine has no TPU device files and the user did
/// not set it, so a TPU VM keeps libtpu's own behaviour.
fn skip_tpu_metadata_without_tpus() {
    let has_tpus = ["/dev", "/dev/vfio"].iter().any(|dir| {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("accel") || (*dir == "/dev/vfio" && name.chars().all(|c| c.is_ascii_digit()))
            })
        })
    });
    if !has_tpus && std::env::var_os("TPU_SKIP_MDS_QUERY").is_none() {
        std::env::set_var("TPU_SKIP_MDS_QUERY", "1");
    }
}

/// How long client creation may take before lazuli gives up on it: libtpu, for one, waits on cloud metadata
/// servers and device files that a machine without the hardware never answers.
pub const CLIENT_CREATE_TIMEOUT: Duration = Duration::from_secs(60);

/// Creates the client of a loaded device plugin within `timeout`, and checks it: the platform the target
/// promises, at least one device. Errors say what is missing (libraries, a driver, the hardware).
pub fn create_device_client(
    plugin: &Plugin,
    found: &DevicePlugin,
    options: &ClientOptions,
    timeout: Duration,
) -> Result<Client> {
    let (plugin_copy, options_copy) = (plugin.clone(), options.clone());
    let created = bounded(timeout, move || Client::new(&plugin_copy, &options_copy));
    let what =
        format!("the PJRT {} plugin {} (from {})", found.target.device.name(), found.path.display(), found.origin);
    let client = match created {
        Some(Ok(client)) => client,
        Some(Err(e)) => return Err(Error::Provision(format!("{what} cannot create a client: {e}{}", hints(found)))),
        None => {
            return Err(Error::Provision(format!(
                "{what} did not create a client within {} s, so lazuli gave up on it; a machine without this \
                 hardware often waits like this{}",
                timeout.as_secs(),
                hints(found)
            )))
        }
    };
    check_client(&client, found, &what)?;
    Ok(client)
}

/// `work()` on a thread of its own, or `None` if it did not finish within `timeout`. A plugin call that hangs
/// cannot be interrupted: its thread is left behind and the caller gets the error.
fn bounded<T: Send + 'static>(
    timeout: Duration,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Option<Result<T>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name("lazuli-plugin-start".into()).spawn(move || {
        let _ = tx.send(work());
    });
    if let Err(e) = spawned {
        return Some(Err(Error::Provision(format!("cannot start a thread for the plugin: {e}"))));
    }
    rx.recv_timeout(timeout).ok()
}

fn check_client(client: &Client, found: &DevicePlugin, what: &str) -> Result<()> {
    let platform = client.platform_name()?;
    if !platform.eq_ignore_ascii_case(found.target.platform) {
        return Err(Error::Provision(format!(
            "{what} runs on platform {platform:?}, not {:?} as LAZULI_DEVICE={} expects",
            found.target.platform,
            found.target.device.setting()
        )));
    }
    if client.devices().is_empty() {
        return Err(Error::Provision(format!("{what} created a client that sees no devices{}", hints(found))));
    }
    Ok(())
}

/// What the user can do about a failed client: the missing libraries and where they come from.
fn hints(found: &DevicePlugin) -> String {
    let mut text = String::new();
    if !found.missing.is_empty() {
        text.push_str(&format!("\nThese libraries it needs were not found:{}", libraries::describe(&found.missing)));
        let mut pinned: Vec<&LibraryWheel> = Vec::new();
        let mut wheels: Vec<String> = Vec::new();
        for library in &found.missing {
            match (library.pinned, library.wheel) {
                (Some(pin), _) if !pinned.contains(&pin) => pinned.push(pin),
                (None, Some(wheel)) if !wheels.contains(&format!("\"{wheel}\"")) => wheels.push(format!("\"{wheel}\"")),
                _ => {}
            }
        }
        if !pinned.is_empty() && found.cuda_data_dir.is_none() && !found.origin.starts_with(INSTALLED) {
            pinned.extend(found.target.cuda_tools); // ptxas and libdevice, for XLA's compiler
        }
        if !pinned.is_empty() {
            let system: Vec<&str> =
                found.target.libraries.iter().filter(|l| l.wheel.is_none()).map(|l| l.soname).collect();
            text.push_str(&format!(
                "\nlazuli fetches their pinned wheels itself where the plugin can run (with {}); to fetch them \
                 elsewhere:{}\nthen set LAZULI_WHEELS=DIR here",
                system.join(", "),
                library_wheels::download_commands(&pinned, "python3")
            ));
        }
        if !wheels.is_empty() {
            text.push_str(&format!(
                "\nInstall their wheels into the Python lazuli uses (python3 -m pip install {list}), or fetch them \
                 where there is a network with `python3 -m pip download --no-deps --only-binary=:all: {platforms} \
                 {list} -d DIR` and set LAZULI_WHEELS=DIR here",
                list = wheels.join(" "),
                // Wheels carry older manylinux tags than the plugins; pip matches only the tags named.
                platforms = ["manylinux_2_27", "manylinux_2_17", "manylinux2014", "manylinux_2_5", "manylinux1"]
                    .map(|p| format!("--platform {p}_x86_64"))
                    .join(" ")
            ));
        }
    }
    for library in &found.unopened {
        text.push_str(&format!("\nThis library was found but could not be opened: {library}"));
    }
    text
}

/// The plugin file and its row: from a variable, `LAZULI_TARGET`, site-packages or the default row.
fn locate(device: Device, sources: &Sources) -> Result<(PathBuf, &'static Target, String)> {
    let default = targets_of(device).next().expect("every device has a row");
    if let Some(target) = sources.target.filter(|t| t.device != device) {
        return Err(Error::Provision(format!(
            "LAZULI_TARGET={} is a {} target, but LAZULI_DEVICE={}",
            target.name,
            target.device.name(),
            device.setting()
        )));
    }
    if device == Device::Cpu && sources.target.is_none() {
        let target = sources.cpu_plugin.map_or(default, |kind| kind.target());
        let origin = if sources.pjrt_plugin.is_some() { "LAZULI_PJRT_PLUGIN" } else { "the pinned wheel" };
        return Ok((cpu_plugin_path_in(sources)?, target, origin.into()));
    }
    if let Some((path, var)) = explicit(device, sources) {
        let target = sources.target.unwrap_or_else(|| likely_target(device, &path));
        return Ok((user_plugin(path, var)?, target, var.into()));
    }
    if let Some(target) = sources.target {
        return Ok((pinned_plugin_path_in(target, sources)?, target, "the pinned wheel".into()));
    }
    if let Some((path, target)) = installed(device, sources) {
        return Ok((path, target, format!("{INSTALLED}{}", sources.python())));
    }
    // Not worth a download: without its driver the plugin cannot create a client.
    let absent = libraries::missing_system_libraries(default);
    if !absent.is_empty() {
        return Err(Error::Provision(format!(
            "LAZULI_DEVICE={}: no PJRT {} plugin is installed in {}, and this machine lacks what it needs to run \
             one, so none was fetched:{}\nSet LAZULI_TARGET={} to fetch its plugin anyway.",
            device.setting(),
            device.name(),
            sources.site_packages(),
            libraries::describe(&absent),
            default.name
        )));
    }
    let path = pinned_plugin_path_in(default, sources).map_err(|e| not_installed(default, sources, e))?;
    Ok((path, default, "the pinned wheel".into()))
}

fn explicit(device: Device, sources: &Sources) -> Option<(PathBuf, &'static str)> {
    match device {
        Device::Cuda => sources.gpu_plugin.clone().map(|p| (p, "LAZULI_GPU_PLUGIN")),
        Device::Tpu => sources.tpu_plugin.clone(),
        Device::Rocm => sources.rocm_plugin.clone().map(|p| (p, "LAZULI_ROCM_PLUGIN")),
        Device::Xpu => sources.xpu_plugin.clone().map(|p| (p, "LAZULI_XPU_PLUGIN")),
        Device::Cpu => sources.pjrt_plugin.clone().map(|p| (p, "LAZULI_PJRT_PLUGIN")),
        Device::Metal => None,
    }
}

/// The device's row whose installed path the file's path ends with (`xla_cuda12/…` is CUDA 12), else its first.
fn likely_target(device: Device, path: &Path) -> &'static Target {
    let mut rows = targets_of(device);
    let first = rows.next().expect("every device has a row");
    std::iter::once(first).chain(rows).find(|t| path.ends_with(t.installed_as)).unwrap_or(first)
}

/// A plugin of `device` installed in the Python environment's site-packages (its first row that is).
fn installed(device: Device, sources: &Sources) -> Option<(PathBuf, &'static Target)> {
    let dirs = python_paths(sources);
    targets_of(device).find_map(|t| dirs.iter().map(|d| d.join(t.installed_as)).find(|p| p.is_file()).map(|p| (p, t)))
}

/// The fetch error, with the other ways to get a plugin first.
fn not_installed(target: &Target, sources: &Sources, fetch: Error) -> Error {
    Error::Provision(format!(
        "no PJRT {} plugin is installed in {} and none could be fetched.\n{fetch}\n  \
         3. or install it into the Python lazuli uses: {} -m pip install {}=={}",
        target.device.name(),
        sources.site_packages(),
        sources.python(),
        target.plugin.pip_name,
        target.plugin.version,
    ))
}
