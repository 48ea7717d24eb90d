//! `profile`: the device's kernels while a closure runs, through the plugin's own profiler.

use crate::diagnostics::DeviceProfile;
use lazuli_hlo::Loc;

use crate::error::{Error, Result};
use crate::runtime::runtime;

/// Runs `f` (typically `steps` training steps) under the plugin's profiler and returns its result with the device
/// time of every kernel launched meanwhile, grouped by kernel family and kind (see [`DeviceProfile`]). Programs
/// launched before are waited for first and not counted; those launched inside are waited for before the
/// profiler stops, so pipelined steps are counted whole. `steps` only scales what the profile prints.
///
/// On the GPU (and TPU) plugins. The CPU plugins have no profiler: there this is an [`Error::Unsupported`].
/// One profile at a time per process (the plugin's profiler is process-wide). With `LAZULI_PROFILE_TRACE=path`
/// the plugin's whole trace (host spans and device streams, as `*.xplane.pb` files hold it) is also written there.
#[track_caller]
pub fn profile<R>(steps: usize, f: impl FnOnce() -> R) -> Result<(R, DeviceProfile)> {
    let at = Loc::caller();
    let rt = runtime()?;
    super::wait()?;
    let profiler = lazuli_pjrt::Profiler::start(rt.client.plugin()).map_err(|e| match e {
        lazuli_pjrt::Error::Pjrt { code: Some(lazuli_pjrt::ErrorCode::Unimplemented), message, .. } => {
            Error::Unsupported {
                op: "profile",
                backend: rt.client.platform_name().unwrap_or_default(),
                why: format!("cannot profile the device's kernels: {message}"),
                at,
            }
        }
        other => other.into(),
    })?;
    let out = f();
    super::wait()?;
    let (trace, raw) = profiler.finish_with_raw()?;
    if let Some(path) = crate::settings::profile_trace() {
        // The host's spans and every stream's events, for a trace viewer: the profile below keeps kernels only.
        std::fs::write(&path, &raw)
            .map_err(|e| Error::Config(format!("LAZULI_PROFILE_TRACE={}: cannot write it ({e})", path.display())))?;
    }
    Ok((out, DeviceProfile::from_trace(&trace, steps)))
}
