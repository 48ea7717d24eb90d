//! Profiling through the plugin's own profiler (the PJRT profiler extension): what XLA ran, on which device,
//! for how long, named as XLA names it (kernels, fusions, custom calls). Used by `lazuli::diagnostics::profile`
//! and `lazuli-bench profile`.

use crate::error::{Error, ErrorCode, Result};
use crate::ffi::{ProfilerApi, SessionHandle};
use crate::trace::Trace;
use crate::Plugin;

/// A running profiling session. The plugin's profiler is process-wide: a second session while one runs is
/// refused by the plugin with an error.
pub struct Profiler {
    api: ProfilerApi,
    session: Option<SessionHandle>,
}

impl Profiler {
    /// Starts recording what the plugin runs, with the host's spans at the usual level and the device's kernels.
    pub fn start(plugin: &Plugin) -> Result<Profiler> {
        let api = plugin.api().profiler_api().ok_or_else(|| Error::Pjrt {
            call: "PJRT_Profiler_Extension",
            code: Some(ErrorCode::Unimplemented),
            message: "this plugin has no profiler extension".into(),
        })?;
        let session = api.create(&profile_options())?;
        let profiler = Profiler { api, session: Some(session) };
        profiler.api.start(profiler.session())?;
        Ok(profiler)
    }

    fn session(&self) -> &SessionHandle {
        self.session.as_ref().expect("a profiler holds its session until dropped")
    }

    /// Stops recording and returns what was recorded.
    pub fn finish(self) -> Result<Trace> {
        self.finish_with_raw().map(|(trace, _)| trace)
    }

    /// [`Profiler::finish`], with the serialized `XSpace` as the plugin gave it (what `*.xplane.pb` files hold).
    pub fn finish_with_raw(mut self) -> Result<(Trace, Vec<u8>)> {
        let bytes = self.stop_and_collect()?;
        let trace = Trace::decode(&bytes).map_err(|e| Error::Pjrt {
            call: "PLUGIN_Profiler_CollectData",
            code: None,
            message: e.to_string(),
        })?;
        Ok((trace, bytes))
    }

    fn stop_and_collect(&mut self) -> Result<Vec<u8>> {
        self.api.stop(self.session())?;
        self.api.collect(self.session())
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.api.destroy(session);
        }
    }
}

/// `tensorflow.ProfileOptions` as protobuf bytes: version 1 (so the levels below are read, not defaulted),
/// host tracer level 2, device tracer level 1, no Python tracer.
fn profile_options() -> Vec<u8> {
    const VERSION: u8 = 5 << 3;
    const HOST_TRACER_LEVEL: u8 = 2 << 3;
    const DEVICE_TRACER_LEVEL: u8 = 3 << 3;
    vec![VERSION, 1, HOST_TRACER_LEVEL, 2, DEVICE_TRACER_LEVEL, 1]
}
