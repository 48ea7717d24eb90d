//! The libraries a plugin needs: where each is, which to open before the plugin, and, when `dlopen` fails, which
//! are nowhere to be found and where they come from.
//!
//! A library from a wheel is looked for in the Python environment's site-packages, then in the cache: a pinned
//! one (CUDA's `nvidia-*`) in `<cache>/libs/<library_dir>/`, where `library_wheels` fetches it, others in
//! `<cache>/libs/` (unpacked there from wheels in `LAZULI_WHEELS`). Those found are opened by absolute path
//! before the plugin, in the table's order (dependencies first, as jax's own loader does): the plugin's `dlopen`
//! of the soname then finds them loaded, whatever its run path says, with no `LD_LIBRARY_PATH`.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::elf::dynamic_section;
use super::library_wheels::{fetch_library_wheels_in, is_unpacked, library_dir_in};
use super::targets::{Library, LibraryWheel, Target};
use super::{cache_dir_in, file_name, python_paths, unique, Sources};
use crate::error::Result;

/// Which of a target's libraries to open first, and which were found nowhere.
pub(super) struct Arranged {
    pub preload: Vec<PathBuf>,
    pub missing: Vec<&'static Library>,
    /// The target's `cuda_data_dir` where it holds `bin/ptxas`.
    pub cuda_data_dir: Option<PathBuf>,
}

/// Finds each of `target`'s libraries: in site-packages or the cache (to be preloaded), or on the system's
/// search path (left to the loader); unpacks those still missing from wheels in `LAZULI_WHEELS`, and fetches the
/// pinned wheels of those found nowhere when the machine has what the plugin needs beyond them (its driver):
/// without it the plugin cannot start, so nothing is downloaded. An error only when that fetch fails.
pub(super) fn arrange(target: &'static Target, plugin: &Path, sources: &Sources) -> Result<Arranged> {
    if target.libraries.is_empty() && target.cuda_data_dir.is_empty() {
        // Nothing to look for: no Python or loader cache to ask (every CPU process starts here).
        return Ok(Arranged { preload: Vec::new(), missing: Vec::new(), cuda_data_dir: None });
    }
    let site = python_paths(sources);
    let cache = cache_dir_in(sources).ok().map(|d| d.join("libs"));
    if let (Some(cache), Some(wheels)) = (&cache, &sources.wheels) {
        unpack_from_wheels(target, wheels, cache);
    }
    let pinned_dir = (!target.library_dir.is_empty()).then(|| library_dir_in(target, sources).ok()).flatten();
    let system = SystemSearch::new(plugin);
    if let Some(dir) = &pinned_dir {
        let absent = absent_wheels(target, &site, dir, &system);
        if !absent.is_empty() && missing_system_libraries(target).is_empty() {
            fetch_library_wheels_in(target, &absent, sources)?;
        }
    }
    // A pinned library comes from its own wheel's directory, an unpinned one from those unpacked by hand.
    let pinned_roots: Vec<PathBuf> = site.iter().chain(&pinned_dir).cloned().collect();
    let other_roots: Vec<PathBuf> = site.iter().chain(&cache).cloned().collect();
    let (mut preload, mut missing) = (Vec::new(), Vec::new());
    for library in target.libraries {
        let roots = if library.pinned.is_some() { &pinned_roots } else { &other_roots };
        let in_wheel_dir = (!library.dir.is_empty())
            .then(|| roots.iter().map(|r| r.join(library.dir).join(library.soname)).find(|p| p.is_file()))
            .flatten();
        match in_wheel_dir {
            Some(path) => preload.push(path.canonicalize().unwrap_or(path)),
            None if system.finds(library.soname) => {}
            None => missing.push(library),
        }
    }
    note_other_versions(target, &site);
    let cuda_data_dir = (!target.cuda_data_dir.is_empty())
        .then(|| pinned_roots.iter().map(|r| r.join(target.cuda_data_dir)).find(|d| has_cuda_tools(d)))
        .flatten()
        .or_else(|| (!target.cuda_data_dir.is_empty()).then(system_cuda_toolkit).flatten());
    Ok(Arranged { preload, missing, cuda_data_dir })
}

/// A CUDA toolkit installed on the system (`CUDA_HOME`, `CUDA_PATH`, else `/usr/local/cuda`) that holds what XLA
/// compiles with: then no tools wheel is fetched, and XLA is pointed at it.
fn system_cuda_toolkit() -> Option<PathBuf> {
    let named = ["CUDA_HOME", "CUDA_PATH"].into_iter().filter_map(std::env::var_os).map(PathBuf::from);
    named.chain([PathBuf::from("/usr/local/cuda")]).find(|root| has_cuda_tools(root))
}

/// `bin/ptxas` and libdevice, what XLA compiles CUDA kernels with.
fn has_cuda_tools(dir: &Path) -> bool {
    dir.join("bin").join("ptxas").is_file() && dir.join("nvvm").join("libdevice").is_dir()
}

/// The pinned wheels whose libraries (or tools) are neither in site-packages, nor unpacked in `dir`, nor on
/// the system's search path (for the tools: in a system CUDA toolkit).
fn absent_wheels(target: &Target, site: &[PathBuf], dir: &Path, system: &SystemSearch) -> Vec<&'static LibraryWheel> {
    let in_site = |relative: &Path| site.iter().any(|r| r.join(relative).exists());
    let mut absent: Vec<&'static LibraryWheel> = Vec::new();
    for library in target.libraries {
        let Some(wheel) = library.pinned else { continue };
        let found = in_site(&Path::new(library.dir).join(library.soname))
            || is_unpacked(dir, wheel)
            || system.finds(library.soname);
        if !found && !absent.contains(&wheel) {
            absent.push(wheel);
        }
    }
    let tools_in_site = site.iter().any(|r| has_cuda_tools(&r.join(target.cuda_data_dir)));
    if !tools_in_site && system_cuda_toolkit().is_none() {
        absent.extend(target.cuda_tools.iter().filter(|w| !is_unpacked(dir, w)));
    }
    absent
}

/// Says so, once per wheel, when a library preloaded from site-packages is another version than the pinned one:
/// it is used (it is what the user installed), but a difference in behaviour may come from it.
fn note_other_versions(target: &Target, site: &[PathBuf]) {
    let mut noted: Vec<&str> = Vec::new();
    for library in target.libraries {
        let Some(wheel) = library.pinned else { continue };
        // Site-packages come first in the search: a copy there is the one preloaded.
        let Some(root) = site.iter().find(|r| r.join(library.dir).join(library.soname).is_file()) else { continue };
        if noted.contains(&wheel.file) {
            continue;
        }
        noted.push(wheel.file);
        match installed_version(root, wheel.name()) {
            Some(version) if version != wheel.version() => eprintln!(
                "lazuli: using {} {version} from {} ({} of the PJRT {} plugin); lazuli pins {}",
                wheel.name(),
                root.display(),
                library.soname,
                target.device.name(),
                wheel.version()
            ),
            _ => {}
        }
    }
}

/// The version of the distribution `name` installed in `site_packages`, from its `.dist-info` directory's name.
fn installed_version(site_packages: &Path, name: &str) -> Option<String> {
    let prefix = format!("{}-", name.replace('-', "_"));
    fs::read_dir(site_packages).ok()?.flatten().find_map(|entry| {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        file_name.strip_prefix(&prefix)?.strip_suffix(".dist-info").map(String::from)
    })
}

/// The part of a load error that says which of the plugin's `DT_NEEDED` libraries cannot be found, and where
/// each comes from; empty when they all can (the failure is something else).
pub(super) fn explain_missing(target: &Target, plugin: &Path, preloaded: &[PathBuf]) -> String {
    let Ok(dynamic) = dynamic_section(plugin) else { return String::new() };
    let system = SystemSearch::new(plugin);
    let loaded: HashSet<&str> = preloaded.iter().filter_map(|p| p.file_name()?.to_str()).collect();
    let missing: Vec<&str> =
        dynamic.needed.iter().map(String::as_str).filter(|n| !loaded.contains(n) && !system.finds(n)).collect();
    if missing.is_empty() {
        return String::new();
    }
    let mut text = format!("\nIt needs {} libraries that are not found:", missing.len());
    let mut wheels: Vec<&str> = Vec::new();
    for name in &missing {
        match target.libraries.iter().find(|l| l.soname == *name) {
            Some(library) => {
                text.push_str(&describe(&[library]));
                wheels.extend(library.wheel.filter(|w| !wheels.contains(w)));
            }
            None => text.push_str(&format!("\n  {name} (not in lazuli's table of {} libraries)", target.name)),
        }
    }
    if !wheels.is_empty() {
        let quoted: Vec<String> = wheels.iter().map(|w| format!("\"{w}\"")).collect();
        text.push_str(&format!("\nInstall them with: python3 -m pip install {}", quoted.join(" ")));
    }
    text
}

/// One line per library: its name, the wheel that carries it, and the system's alternative.
pub(super) fn describe(libraries: &[&Library]) -> String {
    libraries
        .iter()
        .map(|l| match l.wheel {
            // Intel's wheels put their libraries in the environment's lib/, two levels above site-packages.
            Some(wheel) if l.dir.starts_with("..") => {
                format!("\n  {} (pip wheel {wheel}, in the environment's lib/; or {})", l.soname, l.system)
            }
            Some(wheel) => format!("\n  {} (pip wheel {wheel}, in {}; or {})", l.soname, l.dir, l.system),
            None => format!("\n  {} ({})", l.soname, l.system),
        })
        .collect()
}

/// The system libraries (no wheel provides them: a driver) of `target` that the loader cannot find.
pub(super) fn missing_system_libraries(target: &Target) -> Vec<&'static Library> {
    let system = SystemSearch::new(Path::new("/"));
    target.libraries.iter().filter(|l| l.wheel.is_none() && !system.finds(l.soname)).collect()
}

/// Unpacks, from the wheel files in `wheels`, every library of `target` not yet in `cache` (keeping each
/// wheel's directory layout, e.g. `nvidia/cu13/lib/`), together with the other files of its directory (cuDNN
/// opens its sub-libraries from beside itself). Best effort: a bad wheel leaves its libraries missing.
fn unpack_from_wheels(target: &Target, wheels: &Path, cache: &Path) {
    let Ok(entries) = fs::read_dir(wheels) else { return };
    let wheel_files: Vec<PathBuf> =
        entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "whl")).collect();
    // The pinned ones come from their own files, checked by sha256 (`library_wheels`).
    for library in target.libraries.iter().filter(|l| l.wheel.is_some() && l.pinned.is_none() && !l.dir.is_empty()) {
        if cache.join(library.dir).join(library.soname).is_file() {
            continue;
        }
        for wheel in &wheel_files {
            if unpack_dir_holding(wheel, library, cache).unwrap_or(false) {
                break;
            }
        }
    }
}

/// If `wheel` holds `library`, unpacks its directory into `cache`; each file through a private name renamed into
/// place, the library itself last, so a reader never sees a partial file.
fn unpack_dir_holding(wheel: &Path, library: &Library, cache: &Path) -> std::io::Result<bool> {
    let mut archive = zip::ZipArchive::new(fs::File::open(wheel)?)?;
    let member = format!("{}/{}", library.dir, library.soname);
    if archive.index_for_name(&member).is_none() {
        return Ok(false);
    }
    let prefix = format!("{}/", library.dir);
    let mut names: Vec<String> = archive
        .file_names()
        .filter(|n| n.starts_with(&prefix) && !n[prefix.len()..].contains('/'))
        .map(String::from)
        .collect();
    names.sort_by_key(|n| *n == member); // the library last: its presence means the directory is complete
    let dir = cache.join(library.dir);
    fs::create_dir_all(&dir)?;
    for name in names {
        let to = dir.join(file_name(&name));
        if to.is_file() {
            continue;
        }
        let tmp = unique(&dir, file_name(&name));
        let copied = fs::File::create(&tmp)
            .and_then(|mut out| std::io::copy(&mut archive.by_name(&name)?, &mut out))
            .and_then(|_| fs::rename(&tmp, &to));
        if let Err(e) = copied {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
    }
    eprintln!("lazuli: unpacked {} from {}", library.soname, wheel.display());
    Ok(true)
}

/// Where the dynamic loader looks for a library the plugin names: the plugin's run path, `LD_LIBRARY_PATH`,
/// the loader's cache (`ldconfig -p`) and the default directories.
struct SystemSearch {
    dirs: Vec<PathBuf>,
    cached: HashSet<String>,
}

impl SystemSearch {
    fn new(plugin: &Path) -> SystemSearch {
        let origin = plugin.parent().unwrap_or(Path::new("/")).to_string_lossy().into_owned();
        let run_path = dynamic_section(plugin).map(|d| d.search_path).unwrap_or_default();
        let mut dirs: Vec<PathBuf> = run_path
            .iter()
            .map(|p| PathBuf::from(p.replace("$ORIGIN", &origin).replace("${ORIGIN}", &origin)))
            .collect();
        if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
            dirs.extend(std::env::split_paths(&paths).filter(|p| !p.as_os_str().is_empty()));
        }
        for default in
            ["/lib64", "/usr/lib64", "/lib", "/usr/lib", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"]
        {
            dirs.push(PathBuf::from(default));
        }
        SystemSearch { dirs, cached: loader_cache() }
    }

    fn finds(&self, soname: &str) -> bool {
        self.cached.contains(soname) || self.dirs.iter().any(|d| d.join(soname).is_file())
    }
}

/// The library names in the dynamic loader's cache, from `ldconfig -p` (empty where it cannot run).
fn loader_cache() -> HashSet<String> {
    for ldconfig in ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"] {
        if let Ok(out) = Command::new(ldconfig).arg("-p").output() {
            if out.status.success() {
                let text = String::from_utf8_lossy(&out.stdout);
                return text.lines().filter_map(|l| l.split_whitespace().next()).map(String::from).collect();
            }
        }
    }
    HashSet::new()
}
