//! Loading a PJRT plugin (`Plugin::load`) and reading its attributes.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::ffi::{self, Api};

/// A plugin attribute value (`PJRT_NamedValue`).
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    String(String),
    Int64(i64),
    Int64List(Vec<i64>),
    Float(f32),
    Bool(bool),
    /// A value type newer than this crate (the raw `PJRT_NamedValue_Type`).
    Unknown(i32),
}

pub(crate) struct PluginInner {
    pub(crate) api: Api,
    path: PathBuf,
    version: (i32, i32),
    /// Never unloaded: XLA starts threads and registers static destructors and atexit handlers that
    /// would run on unmapped code after a dlclose. Kept only to tie the library to the plugin.
    _library: ManuallyDrop<libloading::Library>,
}

/// A loaded PJRT plugin (a shared library exporting `GetPjrtApi`). Cheap to clone.
///
/// Loading the same library twice returns the already initialized plugin: `PJRT_Plugin_Initialize` runs
/// once per library per process.
#[derive(Clone)]
pub struct Plugin {
    pub(crate) inner: Arc<PluginInner>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin").field("path", &self.inner.path).field("api_version", &self.inner.version).finish()
    }
}

/// Plugins loaded in this process, keyed by the address of their function table (a second dlopen of the
/// same file, even by another path, yields the same table).
fn registry() -> &'static Mutex<HashMap<usize, Arc<PluginInner>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<usize, Arc<PluginInner>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl Plugin {
    /// Loads the plugin at `path` (dlopen with RTLD_LOCAL), checks its C API version and initializes it.
    ///
    /// Accepts C API major version 0 with minor ≥ 57: 0.57 last rearranged the function table, and this
    /// crate's struct layouts come from the 0.81 header, which newer plugins still accept.
    pub fn load(path: impl AsRef<Path>) -> Result<Plugin> {
        Self::load_with_min_version(path, ffi::MIN_API_VERSION)
    }

    /// [`Plugin::load`] with another minimum version; exists so tests can provoke the version error.
    #[doc(hidden)]
    pub fn load_with_min_version(path: impl AsRef<Path>, min: (i32, i32)) -> Result<Plugin> {
        Self::load_accepting(path, min, (min.0, i32::MAX))
    }

    /// [`Plugin::load`] accepting only C API versions from `min` to `max` (inclusive): a target's range in
    /// [`crate::provision::targets`]. A plugin outside it is never initialized.
    pub fn load_accepting(path: impl AsRef<Path>, min: (i32, i32), max: (i32, i32)) -> Result<Plugin> {
        let path = path.as_ref();
        if !path.exists() {
            return Err(Error::Load { path: path.to_path_buf(), reason: "no such file".into() });
        }
        // The loader maps a truncated file without complaint and the process dies of SIGBUS later.
        #[cfg(target_os = "linux")]
        crate::provision::check_shared_object(path)
            .map_err(|reason| Error::Load { path: path.to_path_buf(), reason })?;
        // Serialize loads so two threads never initialize the same plugin concurrently.
        let mut loaded = registry().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (library, api) = ffi::open_plugin(path)?;
        let version = api.version();
        if version < min || version > max || version.0 != min.0 {
            // The library stays mapped (dlclose is never called, see `PluginInner`); harmless.
            std::mem::forget(library);
            return Err(Error::ApiVersion { path: path.to_path_buf(), found: version, need: min, newest: max });
        }
        let key = api_key(api);
        if let Some(inner) = loaded.get(&key) {
            std::mem::forget(library); // dlopen refcount only; same mapping as `inner`
            return Ok(Plugin { inner: Arc::clone(inner) });
        }
        if let Err(e) = api.plugin_initialize() {
            std::mem::forget(library);
            return Err(e);
        }
        let inner = Arc::new(PluginInner {
            api,
            path: path.canonicalize().unwrap_or_else(|_| path.to_path_buf()),
            version,
            _library: ManuallyDrop::new(library),
        });
        loaded.insert(key, Arc::clone(&inner));
        Ok(Plugin { inner })
    }

    /// (major, minor) PJRT C API version the plugin implements.
    pub fn api_version(&self) -> (i32, i32) {
        self.inner.version
    }

    /// Where the plugin was first loaded from (canonical path).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// `PJRT_Plugin_Attributes`: typically `xla_version`, `stablehlo_current_version`,
    /// `stablehlo_minimum_version`.
    pub fn attributes(&self) -> Result<Vec<(String, AttrValue)>> {
        self.inner.api.plugin_attributes()
    }

    pub(crate) fn api(&self) -> Api {
        self.inner.api
    }
}

fn api_key(api: Api) -> usize {
    api.address()
}
