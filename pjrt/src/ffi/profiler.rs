//! The plugin's profiler extension (`PJRT_Extension_Type_Profiler`): one function table for a profiling
//! session (create, start, stop, collect the serialized `XSpace`, destroy) with an error type of its own.
//! Layouts from `xla/backends/profiler/plugin/profiler_c_api.h` (version 1) and
//! `xla/pjrt/c/pjrt_c_api_profiler_extension.h` (version 1).

use std::ffi::{c_char, c_int, c_void};
use std::ptr::{self, NonNull};

use super::{copy_str, Api};
use crate::error::{Error, ErrorCode, Result};

/// `PJRT_Extension_Type_Profiler`.
const PROFILER_EXTENSION: c_int = 1;

/// `PJRT_Extension_Base`: every extension in the chain starts with it.
#[repr(C)]
struct ExtensionBase {
    struct_size: usize,
    kind: c_int,
    next: *const ExtensionBase,
}

#[repr(C)]
struct ProfilerExtension {
    base: ExtensionBase,
    api: *const ProfilerApiTable,
    traceme_context_id: i64,
}

#[repr(C)]
struct PluginError {
    _opaque: [u8; 0],
}

#[repr(C)]
struct ErrorDestroyArgs {
    struct_size: usize,
    priv_: *mut c_void,
    error: *mut PluginError,
}

#[repr(C)]
struct ErrorMessageArgs {
    struct_size: usize,
    priv_: *mut c_void,
    error: *const PluginError,
    message: *const c_char,
    message_size: usize,
}

#[repr(C)]
struct ErrorGetCodeArgs {
    struct_size: usize,
    priv_: *mut c_void,
    error: *const PluginError,
    code: c_int,
}

#[repr(C)]
struct CreateArgs {
    struct_size: usize,
    options: *const c_char,
    options_size: usize,
    profiler: *mut c_void,
}

/// The arguments of destroy, start and stop.
#[repr(C)]
struct SessionArgs {
    struct_size: usize,
    profiler: *mut c_void,
}

#[repr(C)]
struct CollectDataArgs {
    struct_size: usize,
    profiler: *mut c_void,
    buffer: *mut u8,
    buffer_size_in_bytes: usize,
}

type Call<A> = Option<unsafe extern "C" fn(*mut A) -> *mut PluginError>;

/// `PLUGIN_Profiler_Api`.
#[repr(C)]
struct ProfilerApiTable {
    struct_size: usize,
    priv_: *mut c_void,
    error_destroy: Option<unsafe extern "C" fn(*mut ErrorDestroyArgs)>,
    error_message: Option<unsafe extern "C" fn(*mut ErrorMessageArgs)>,
    error_get_code: Call<ErrorGetCodeArgs>,
    create: Call<CreateArgs>,
    destroy: Call<SessionArgs>,
    start: Call<SessionArgs>,
    stop: Call<SessionArgs>,
    collect_data: Call<CollectDataArgs>,
}

/// The plugin's profiler table. Lives as long as the plugin (never unloaded).
#[derive(Clone, Copy)]
pub(crate) struct ProfilerApi(NonNull<ProfilerApiTable>);

// SAFETY: an immutable table of the never-unloaded plugin; its calls may be made from any thread.
unsafe impl Send for ProfilerApi {}
// SAFETY: as above.
unsafe impl Sync for ProfilerApi {}

/// One profiling session of the plugin; destroyed exactly once by its owner (`crate::profiler::Profiler`).
pub(crate) struct SessionHandle(NonNull<c_void>);

// SAFETY: an address the plugin handed out; the owner serializes calls on it.
unsafe impl Send for SessionHandle {}

impl Api {
    /// The profiler extension's table, if the plugin offers one.
    pub(crate) fn profiler_api(self) -> Option<ProfilerApi> {
        // SAFETY: `extension_start` is the table's second field, present in every version.
        let mut ext =
            unsafe { ptr::addr_of!((*self.table()).extension_start).read() }.cast::<ExtensionBase>().cast_const();
        while !ext.is_null() {
            // SAFETY: each link of the chain is a live extension of the plugin, starting with the base.
            let base = unsafe { &*ext };
            if base.kind == PROFILER_EXTENSION && base.struct_size >= std::mem::size_of::<ProfilerExtension>() {
                // SAFETY: its type and size say it is a `PJRT_Profiler_Extension`.
                let table = unsafe { (*ext.cast::<ProfilerExtension>()).api };
                return NonNull::new(table.cast_mut()).map(ProfilerApi);
            }
            ext = base.next;
        }
        None
    }
}

/// Reads one entry of the table, refusing one past the plugin's table or left null.
macro_rules! entry {
    ($api:expr, $field:ident) => {{
        let table = $api.0.as_ptr();
        let offset = std::mem::offset_of!(ProfilerApiTable, $field);
        // SAFETY: `struct_size` is the table's first field.
        let size = unsafe { ptr::addr_of!((*table).struct_size).read() };
        let f = if offset + std::mem::size_of::<usize>() <= size {
            // SAFETY: the field lies inside the plugin's table.
            unsafe { ptr::addr_of!((*table).$field).read() }
        } else {
            None
        };
        f.ok_or_else(|| Error::Pjrt {
            call: concat!("PLUGIN_Profiler_", stringify!($field)),
            code: Some(ErrorCode::Unimplemented),
            message: concat!("this plugin's profiler has no ", stringify!($field)).into(),
        })
    }};
}

impl ProfilerApi {
    /// Turns a returned profiler error into a `Result`, freeing it.
    fn status(self, err: *mut PluginError, call: &'static str) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let mut message = String::from("(the plugin gave no message)");
        if let Ok(f) = entry!(self, error_message) {
            let mut args = ErrorMessageArgs {
                struct_size: std::mem::size_of::<ErrorMessageArgs>(),
                priv_: ptr::null_mut(),
                error: err,
                message: ptr::null(),
                message_size: 0,
            };
            // SAFETY: `err` is a live error returned by the plugin.
            unsafe { f(&mut args) };
            message = copy_str(args.message, args.message_size);
        }
        let mut code = None;
        if let Ok(f) = entry!(self, error_get_code) {
            let mut args = ErrorGetCodeArgs {
                struct_size: std::mem::size_of::<ErrorGetCodeArgs>(),
                priv_: ptr::null_mut(),
                error: err,
                code: 0,
            };
            // SAFETY: as above; the call only reads the error.
            if unsafe { f(&mut args) }.is_null() {
                code = ErrorCode::from_raw(args.code);
            }
        }
        if let Ok(f) = entry!(self, error_destroy) {
            let mut args = ErrorDestroyArgs {
                struct_size: std::mem::size_of::<ErrorDestroyArgs>(),
                priv_: ptr::null_mut(),
                error: err,
            };
            // SAFETY: `err` is live and freed exactly once, here.
            unsafe { f(&mut args) };
        }
        Err(Error::Pjrt { call, code, message })
    }

    /// Creates a session from serialized `tensorflow.ProfileOptions`.
    pub(crate) fn create(self, options: &[u8]) -> Result<SessionHandle> {
        let f = entry!(self, create)?;
        let mut args = CreateArgs {
            struct_size: std::mem::size_of::<CreateArgs>(),
            options: options.as_ptr().cast(),
            options_size: options.len(),
            profiler: ptr::null_mut(),
        };
        // SAFETY: `options` outlives the call; the plugin writes the new session into `args.profiler`.
        self.status(unsafe { f(&mut args) }, "PLUGIN_Profiler_Create")?;
        NonNull::new(args.profiler).map(SessionHandle).ok_or_else(|| Error::Pjrt {
            call: "PLUGIN_Profiler_Create",
            code: None,
            message: "the plugin returned no profiler session".into(),
        })
    }

    fn session_call(self, f: Call<SessionArgs>, session: &SessionHandle, call: &'static str) -> Result<()> {
        let f = f.ok_or_else(|| Error::Pjrt {
            call,
            code: Some(ErrorCode::Unimplemented),
            message: format!("this plugin's profiler has no {call}"),
        })?;
        let mut args = SessionArgs { struct_size: std::mem::size_of::<SessionArgs>(), profiler: session.0.as_ptr() };
        // SAFETY: `session` is live (its owner destroys it only once, after every other call).
        self.status(unsafe { f(&mut args) }, call)
    }

    pub(crate) fn start(self, session: &SessionHandle) -> Result<()> {
        self.session_call(entry!(self, start).ok(), session, "PLUGIN_Profiler_Start")
    }

    pub(crate) fn stop(self, session: &SessionHandle) -> Result<()> {
        self.session_call(entry!(self, stop).ok(), session, "PLUGIN_Profiler_Stop")
    }

    /// Frees the session; it must not be used again.
    pub(crate) fn destroy(self, session: SessionHandle) {
        let _ = self.session_call(entry!(self, destroy).ok(), &session, "PLUGIN_Profiler_Destroy");
    }

    /// The serialized `XSpace` of a stopped session. Plugins differ on the first call with a null buffer:
    /// the header says it only reports the size (the caller then passes a buffer), current plugins also
    /// hand back a pointer to bytes they own. Both are handled.
    pub(crate) fn collect(self, session: &SessionHandle) -> Result<Vec<u8>> {
        let f = entry!(self, collect_data)?;
        let mut args = CollectDataArgs {
            struct_size: std::mem::size_of::<CollectDataArgs>(),
            profiler: session.0.as_ptr(),
            buffer: ptr::null_mut(),
            buffer_size_in_bytes: 0,
        };
        // SAFETY: `session` is live and stopped.
        self.status(unsafe { f(&mut args) }, "PLUGIN_Profiler_CollectData")?;
        let size = args.buffer_size_in_bytes;
        if size == 0 {
            return Ok(Vec::new());
        }
        if !args.buffer.is_null() {
            // SAFETY: the plugin returned `size` bytes it owns at `buffer`, alive until the session is destroyed.
            let mut bytes = unsafe { std::slice::from_raw_parts(args.buffer, size) }.to_vec();
            // The CUDA plugin counts a NUL after the message in the size. No protobuf field starts with a zero
            // byte (field number 0 is invalid), so a trailing one is never part of the message.
            if bytes.last() == Some(&0) {
                bytes.pop();
            }
            return Ok(bytes);
        }
        let mut bytes = vec![0u8; size];
        args.buffer = bytes.as_mut_ptr();
        // SAFETY: `bytes` holds the `size` bytes the plugin asked for and outlives the call.
        self.status(unsafe { f(&mut args) }, "PLUGIN_Profiler_CollectData")?;
        bytes.truncate(args.buffer_size_in_bytes.min(size));
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Offsets from the C headers (x86-64): a typo above fails here, not inside the plugin.
    #[test]
    fn layouts_match_headers() {
        assert_eq!(size_of::<ExtensionBase>(), 24);
        assert_eq!(offset_of!(ProfilerExtension, api), 24);
        assert_eq!(size_of::<ProfilerExtension>(), 40);
        assert_eq!(offset_of!(ProfilerApiTable, create), 40);
        assert_eq!(offset_of!(ProfilerApiTable, collect_data), 72);
        assert_eq!(size_of::<CreateArgs>(), 32);
        assert_eq!(size_of::<CollectDataArgs>(), 32);
        assert_eq!(offset_of!(CollectDataArgs, buffer_size_in_bytes), 24);
        assert_eq!(size_of::<ErrorMessageArgs>(), 40);
    }
}
