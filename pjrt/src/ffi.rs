//! The only place with `unsafe`: loading a plugin and calling its PJRT C API.
//!
//! Each wrapper fills one argument struct (layouts in [`layout`]), calls the entry point, turns a returned
//! `PJRT_Error` into [`Error::Pjrt`] (freeing it), and copies out what it needs. Handles are plain
//! pointers; the owning types elsewhere in the crate (`Client`, `Buffer`, `LoadedExecutable`) keep each
//! one alive and destroy it exactly once, and keep the client alive while anything made by it lives.

mod key_value;
mod layout;
mod profiler;

pub(crate) use profiler::{ProfilerApi, SessionHandle};

use std::ffi::{c_char, c_void};
use std::path::Path;
use std::ptr::{self, NonNull};

use crate::error::{Error, ErrorCode, Result};
use crate::plugin::AttrValue;
use layout as c;

/// Oldest PJRT C API this crate accepts: 0.57 rearranged the `PJRT_Api` function table, and the table
/// has only grown at its end since, so the entry offsets declared from the 0.81 header hold from 0.57 on.
/// Argument structs only grow too; an older plugin reads the prefix it knows.
pub(crate) const MIN_API_VERSION: (i32, i32) = (0, 57);

/// The plugin's function table. Plugins are never unloaded (see `Plugin`), so the table lives for the
/// rest of the process.
#[derive(Clone, Copy)]
pub(crate) struct Api(NonNull<c::PJRT_Api>);

// SAFETY: the table is immutable after `GetPjrtApi` returns and the library is never unloaded; PJRT
// entry points may be called from any thread.
unsafe impl Send for Api {}
// SAFETY: as above; sharing `&Api` only shares reads of an immutable table.
unsafe impl Sync for Api {}

/// Uploads up to this size are staged by the plugin during the call (see `buffer_from_host`).
const SMALL_UPLOAD_BYTES: usize = 1 << 20;

macro_rules! handle {
    ($($name:ident => $raw:ident),* $(,)?) => {$(
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub(crate) struct $name(NonNull<c::$raw>);
        // SAFETY: PJRT clients, devices, buffers and loaded executables are thread-safe objects in the
        // PJRT contract (the C API wraps xla::PjRtClient/PjRtBuffer/PjRtLoadedExecutable, whose methods
        // may be called concurrently); the handle is only an address.
        unsafe impl Send for $name {}
        // SAFETY: as above.
        unsafe impl Sync for $name {}
        impl $name {
            #[allow(dead_code)] // not every handle is ever returned by a call that can fail this way
            fn from_raw(p: *mut c::$raw, call: &'static str) -> Result<$name> {
                NonNull::new(p).map($name).ok_or_else(|| Error::Pjrt {
                    call,
                    code: None,
                    message: "the plugin returned a null handle without an error".into(),
                })
            }
            fn raw(self) -> *mut c::$raw { self.0.as_ptr() }
        }
    )*};
}
handle!(
    ClientHandle => PJRT_Client,
    DeviceHandle => PJRT_Device,
    BufferHandle => PJRT_Buffer,
    ExecHandle => PJRT_LoadedExecutable,
    EventHandle => PJRT_Event,
);

/// A value for a `PJRT_NamedValue` create option.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum NamedValueIn {
    Int64(i64),
    Bool(bool),
}

/// Calls `PJRT_Api.$entry` with `&mut $args` and checks the returned error.
macro_rules! call {
    ($api:expr, $entry:ident, $args:expr) => {{
        let api: Api = $api;
        let offset = std::mem::offset_of!(c::PJRT_Api, $entry);
        let entry = api.entry(offset, stringify!($entry), |t| {
            // SAFETY: `entry` checked that the field lies inside the plugin's table.
            unsafe { ptr::addr_of!((*t).$entry).read() }
        });
        match entry {
            // SAFETY: `f` is the plugin's entry point for this argument struct; the struct is
            // initialised with the 0.81 `struct_size` and every pointer in it is valid for the call.
            Ok(f) => api.status(unsafe { f($args) }, stringify!($entry)),
            Err(e) => Err(e),
        }
    }};
}

mod executable_calls;

/// Copies a (pointer, length) string the plugin owns.
fn copy_str(p: *const c_char, len: usize) -> String {
    if p.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: the plugin returned `len` readable bytes at `p`, alive at least until our next call on
    // the owning object.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

fn copy_slice<T: Copy>(p: *const T, len: usize) -> Vec<T> {
    if p.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: as in `copy_str`: the plugin returned `len` elements at `p`.
    unsafe { std::slice::from_raw_parts(p, len) }.to_vec()
}

fn load_error(path: &Path, reason: impl Into<String>) -> Error {
    Error::Load { path: path.to_path_buf(), reason: reason.into() }
}

/// dlopen(RTLD_NOW | RTLD_LOCAL) the plugin and fetch its table through `GetPjrtApi`.
pub(crate) fn open_plugin(path: &Path) -> Result<(libloading::Library, Api)> {
    #[cfg(unix)]
    let lib: libloading::Library = {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: loading runs the library's initialisers; a PJRT plugin is built to be loaded this way,
        // and RTLD_LOCAL keeps its symbols (LLVM, absl, protobuf) from clashing with other plugins.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| load_error(path, e.to_string()))?.into()
    };
    #[cfg(not(unix))]
    // SAFETY: as above.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| load_error(path, e.to_string()))?;

    type GetPjrtApi = unsafe extern "C" fn() -> *const c::PJRT_Api;
    // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
    let get = unsafe { lib.get::<GetPjrtApi>(b"GetPjrtApi\0") }
        .map_err(|e| load_error(path, format!("not a PJRT plugin (no GetPjrtApi symbol): {e}")))?;
    // SAFETY: calling the plugin's exported, argument-free entry point.
    let raw = unsafe { get() };
    let table = NonNull::new(raw.cast_mut()).ok_or_else(|| load_error(path, "GetPjrtApi returned null"))?;
    // SAFETY: `struct_size` is the table's first field, present in every version.
    let size = unsafe { ptr::addr_of!((*table.as_ptr()).struct_size).read() };
    if size < std::mem::offset_of!(c::PJRT_Api, PJRT_Error_Destroy) {
        return Err(load_error(path, format!("PJRT_Api struct_size {size} is too small to be a PJRT table")));
    }
    Ok((lib, Api(table)))
}

/// Opens the library at `path` (an absolute path) and keeps it loaded for the life of the process, so that a
/// plugin's later `dlopen` of the same soname finds it already loaded instead of searching for it.
#[cfg(unix)]
pub(crate) fn preload_library(path: &Path) -> std::result::Result<(), String> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    // SAFETY: loading runs the library's initialisers; the libraries preloaded are the runtime libraries a plugin
    // would open itself (CUDA's), opened the way jax opens them (RTLD_LOCAL).
    let library = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| e.to_string())?;
    std::mem::forget(library); // never unloaded, like the plugins that use it
    Ok(())
}

impl Api {
    fn table(self) -> *const c::PJRT_Api {
        self.0.as_ptr()
    }

    fn struct_size(self) -> usize {
        // SAFETY: checked readable in `open_plugin`.
        unsafe { ptr::addr_of!((*self.table()).struct_size).read() }
    }

    /// (major, minor) C API version the plugin was built with.
    pub(crate) fn version(self) -> (i32, i32) {
        // SAFETY: `open_plugin` checked that the table is large enough to hold the version.
        let v = unsafe { ptr::addr_of!((*self.table()).pjrt_api_version).read() };
        (v.major_version, v.minor_version)
    }

    /// Reads one entry, refusing entries past the plugin's table (an older plugin) or left null.
    fn entry<F>(
        self,
        offset: usize,
        name: &'static str,
        read: impl FnOnce(*const c::PJRT_Api) -> Option<F>,
    ) -> Result<F> {
        let missing = || Error::Pjrt {
            call: name,
            code: Some(ErrorCode::Unimplemented),
            message: format!("this plugin does not provide {name}"),
        };
        if offset + std::mem::size_of::<usize>() > self.struct_size() {
            return Err(missing());
        }
        read(self.table()).ok_or_else(missing)
    }

    /// Turns a returned `PJRT_Error*` into a `Result`, freeing the error.
    fn status(self, err: *mut c::PJRT_Error, call: &'static str) -> Result<()> {
        let Some(err) = NonNull::new(err) else {
            return Ok(());
        };
        let err = err.as_ptr();
        let mut message = String::from("(the plugin gave no message)");
        if let Ok(f) = self.entry(std::mem::offset_of!(c::PJRT_Api, PJRT_Error_Message), "", |t| {
            // SAFETY: offset checked by `entry`.
            unsafe { ptr::addr_of!((*t).PJRT_Error_Message).read() }
        }) {
            let mut args = c::PJRT_Error_Message_Args::new();
            args.error = err;
            // SAFETY: `err` is a live error returned by the plugin.
            unsafe { f(&mut args) };
            message = copy_str(args.message, args.message_size);
        }
        let mut code_args = c::PJRT_Error_GetCode_Args::new();
        code_args.error = err;
        let code = match call!(self, PJRT_Error_GetCode, &mut code_args) {
            Ok(()) => ErrorCode::from_raw(code_args.code),
            Err(_) => None,
        };
        self.destroy_error(err);
        Err(Error::Pjrt { call, code, message })
    }

    fn destroy_error(self, err: *mut c::PJRT_Error) {
        if let Ok(f) = self.entry(std::mem::offset_of!(c::PJRT_Api, PJRT_Error_Destroy), "", |t| {
            // SAFETY: offset checked by `entry`.
            unsafe { ptr::addr_of!((*t).PJRT_Error_Destroy).read() }
        }) {
            let mut args = c::PJRT_Error_Destroy_Args::new();
            args.error = err;
            // SAFETY: `err` is live and destroyed exactly once, here.
            unsafe { f(&mut args) };
        }
    }

    /// Ignores a failure in a destructor (nothing can be done about it), but still frees the error.
    fn ignore(result: Result<()>) {
        let _ = result;
    }

    /// Blocks until `event` is ready, destroys it and returns its status.
    /// Waits for an event the caller owns and destroys it.
    pub(crate) fn event_await(self, event: EventHandle, call: &'static str) -> Result<()> {
        self.await_event(event.raw(), call)
    }

    /// Whether `event` has fired (it stays owned by the caller).
    pub(crate) fn event_is_ready(self, event: &EventHandle) -> bool {
        self.is_ready(event.raw())
    }

    fn is_ready(self, event: *mut c::PJRT_Event) -> bool {
        let mut args = c::PJRT_Event_IsReady_Args::new();
        args.event = event;
        call!(self, PJRT_Event_IsReady, &mut args).map(|()| args.is_ready).unwrap_or(true)
    }

    /// Polls the event for the process's spin time (`crate::wait`), then sleeps on it; destroys it.
    fn await_event(self, event: *mut c::PJRT_Event, call: &'static str) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        crate::wait::spin_until(|| self.is_ready(event));
        let mut args = c::PJRT_Event_Await_Args::new();
        args.event = event;
        let status = call!(self, PJRT_Event_Await, &mut args).map_err(|e| rename_call(e, call));
        let mut destroy = c::PJRT_Event_Destroy_Args::new();
        destroy.event = event;
        Self::ignore(call!(self, PJRT_Event_Destroy, &mut destroy));
        status
    }

    pub(crate) fn plugin_initialize(self) -> Result<()> {
        call!(self, PJRT_Plugin_Initialize, &mut c::PJRT_Plugin_Initialize_Args::new())
    }

    pub(crate) fn plugin_attributes(self) -> Result<Vec<(String, AttrValue)>> {
        let mut args = c::PJRT_Plugin_Attributes_Args::new();
        call!(self, PJRT_Plugin_Attributes, &mut args)?;
        Ok(read_named_values(args.attributes, args.num_attributes))
    }

    /// Creates a client; `store`, when given, backs the key-value callbacks: boxed, and kept until the client is
    /// destroyed.
    pub(crate) fn client_create(
        self,
        options: &[(&str, NamedValueIn)],
        store: Option<&std::sync::Arc<dyn crate::key_value::KeyValueStore>>,
    ) -> Result<ClientHandle> {
        let values: Vec<c::PJRT_NamedValue> = options
            .iter()
            .map(|(name, value)| {
                let mut v = c::PJRT_NamedValue::new();
                v.name = name.as_ptr().cast();
                v.name_size = name.len();
                v.value_size = 1;
                match *value {
                    NamedValueIn::Int64(i) => {
                        v.type_ = c::NAMED_VALUE_INT64;
                        v.value.int64_value = i;
                    }
                    NamedValueIn::Bool(b) => {
                        v.type_ = c::NAMED_VALUE_BOOL;
                        v.value.bool_value = b;
                    }
                }
                v
            })
            .collect();
        let mut args = c::PJRT_Client_Create_Args::new();
        args.create_options = values.as_ptr();
        args.num_options = values.len();
        if let Some(store) = store {
            let kv = key_value::callbacks(store);
            (args.kv_get_callback, args.kv_try_get_callback, args.kv_put_callback) = (kv.get, kv.try_get, kv.put);
            (args.kv_get_user_arg, args.kv_try_get_user_arg, args.kv_put_user_arg) =
                (kv.user_arg, kv.user_arg, kv.user_arg);
        }
        call!(self, PJRT_Client_Create, &mut args)?;
        ClientHandle::from_raw(args.client, "PJRT_Client_Create")
    }

    pub(crate) fn client_destroy(self, client: ClientHandle) {
        let mut args = c::PJRT_Client_Destroy_Args::new();
        args.client = client.raw();
        Self::ignore(call!(self, PJRT_Client_Destroy, &mut args));
    }

    pub(crate) fn client_platform_name(self, client: ClientHandle) -> Result<String> {
        let mut args = c::PJRT_Client_PlatformName_Args::new();
        args.client = client.raw();
        call!(self, PJRT_Client_PlatformName, &mut args)?;
        Ok(copy_str(args.platform_name, args.platform_name_size))
    }

    pub(crate) fn client_addressable_devices(self, client: ClientHandle) -> Result<Vec<DeviceHandle>> {
        let mut args = c::PJRT_Client_AddressableDevices_Args::new();
        args.client = client.raw();
        call!(self, PJRT_Client_AddressableDevices, &mut args)?;
        device_list(args.addressable_devices, args.num_addressable_devices, "PJRT_Client_AddressableDevices")
    }

    /// Every device of the client's group, addressable or not (several processes' devices in a multi-process
    /// client).
    pub(crate) fn client_devices(self, client: ClientHandle) -> Result<Vec<DeviceHandle>> {
        let mut args = c::PJRT_Client_Devices_Args::new();
        args.client = client.raw();
        call!(self, PJRT_Client_Devices, &mut args)?;
        device_list(args.devices, args.num_devices, "PJRT_Client_Devices")
    }

    /// This client's process index in its group (0 in a single process).
    pub(crate) fn client_process_index(self, client: ClientHandle) -> Result<i32> {
        let mut args = c::PJRT_Client_ProcessIndex_Args::new();
        args.client = client.raw();
        call!(self, PJRT_Client_ProcessIndex, &mut args)?;
        Ok(args.process_index)
    }

    /// (id, kind, local hardware id) of a device.
    pub(crate) fn device_info(self, device: DeviceHandle) -> Result<(i32, String, i32)> {
        let mut desc = c::PJRT_Device_GetDescription_Args::new();
        desc.device = device.raw();
        call!(self, PJRT_Device_GetDescription, &mut desc)?;
        let mut id = c::PJRT_DeviceDescription_Id_Args::new();
        id.device_description = desc.device_description;
        call!(self, PJRT_DeviceDescription_Id, &mut id)?;
        let mut kind = c::PJRT_DeviceDescription_Kind_Args::new();
        kind.device_description = desc.device_description;
        call!(self, PJRT_DeviceDescription_Kind, &mut kind)?;
        let mut hw = c::PJRT_Device_LocalHardwareId_Args::new();
        hw.device = device.raw();
        call!(self, PJRT_Device_LocalHardwareId, &mut hw)?;
        Ok((id.id, copy_str(kind.device_kind, kind.device_kind_size), hw.local_hardware_id))
    }

    /// The device description's attributes (the CUDA plugin's `compute_capability`, `core_count`, …).
    pub(crate) fn device_attributes(self, device: DeviceHandle) -> Result<Vec<(String, AttrValue)>> {
        let mut desc = c::PJRT_Device_GetDescription_Args::new();
        desc.device = device.raw();
        call!(self, PJRT_Device_GetDescription, &mut desc)?;
        let mut args = c::PJRT_DeviceDescription_Attributes_Args::new();
        args.device_description = desc.device_description;
        call!(self, PJRT_DeviceDescription_Attributes, &mut args)?;
        Ok(read_named_values(args.attributes, args.num_attributes))
    }

    /// The device allocator's statistics: (bytes in use, peak bytes in use, bytes limit); the last two only
    /// where the plugin reports them.
    pub(crate) fn device_memory_stats(self, device: DeviceHandle) -> Result<(i64, Option<i64>, Option<i64>)> {
        let mut args = c::PJRT_Device_MemoryStats_Args::new();
        args.device = device.raw();
        call!(self, PJRT_Device_MemoryStats, &mut args)?;
        Ok((
            args.bytes_in_use,
            args.peak_bytes_in_use_is_set.then_some(args.peak_bytes_in_use),
            args.bytes_limit_is_set.then_some(args.bytes_limit),
        ))
    }

    pub(crate) fn client_compile(
        self,
        client: ClientHandle,
        code: &str,
        format: &str,
        options: &[u8],
    ) -> Result<ExecHandle> {
        let mut program = c::PJRT_Program::new();
        // The plugin only reads `code` (allow_in_place_mlir_modification is never set).
        program.code = code.as_ptr().cast_mut().cast();
        program.code_size = code.len();
        program.format = format.as_ptr().cast();
        program.format_size = format.len();
        let mut args = c::PJRT_Client_Compile_Args::new();
        args.client = client.raw();
        args.program = &program;
        args.compile_options = options.as_ptr().cast();
        args.compile_options_size = options.len();
        call!(self, PJRT_Client_Compile, &mut args)?;
        ExecHandle::from_raw(args.executable, "PJRT_Client_Compile")
    }

    /// Copies dense row-major `data` to `device`; returns once the plugin no longer reads `data`.
    pub(crate) fn buffer_from_host(
        self,
        client: ClientHandle,
        data: &[u8],
        element_type: i32,
        dims: &[i64],
        device: DeviceHandle,
    ) -> Result<BufferHandle> {
        let mut args = c::PJRT_Client_BufferFromHostBuffer_Args::new();
        args.client = client.raw();
        args.data = data.as_ptr().cast();
        args.type_ = element_type;
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        // Small arrays (batches of tokens, host scalars) are copied during the call, so the call need not wait
        // for the transfer; large ones are read in place until the transfer completes (no staging copy).
        args.host_buffer_semantics = if data.len() <= SMALL_UPLOAD_BYTES {
            c::HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL
        } else {
            c::HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES
        };
        args.device = device.raw();
        call!(self, PJRT_Client_BufferFromHostBuffer, &mut args)?;
        let done = self.await_event(args.done_with_host_buffer, "PJRT_Client_BufferFromHostBuffer");
        let buffer = BufferHandle::from_raw(args.buffer, "PJRT_Client_BufferFromHostBuffer");
        match (done, buffer) {
            (Ok(()), Ok(b)) => Ok(b),
            (Err(e), Ok(b)) => {
                self.buffer_destroy(b);
                Err(e)
            }
            (_, Err(e)) => Err(e),
        }
    }

    pub(crate) fn buffer_destroy(self, buffer: BufferHandle) {
        let mut args = c::PJRT_Buffer_Destroy_Args::new();
        args.buffer = buffer.raw();
        Self::ignore(call!(self, PJRT_Buffer_Destroy, &mut args));
    }

    pub(crate) fn buffer_element_type(self, buffer: BufferHandle) -> Result<i32> {
        let mut args = c::PJRT_Buffer_ElementType_Args::new();
        args.buffer = buffer.raw();
        call!(self, PJRT_Buffer_ElementType, &mut args)?;
        Ok(args.type_)
    }

    pub(crate) fn buffer_dimensions(self, buffer: BufferHandle) -> Result<Vec<i64>> {
        let mut args = c::PJRT_Buffer_Dimensions_Args::new();
        args.buffer = buffer.raw();
        call!(self, PJRT_Buffer_Dimensions, &mut args)?;
        Ok(copy_slice(args.dims, args.num_dims))
    }

    pub(crate) fn buffer_on_device_size(self, buffer: BufferHandle) -> Result<usize> {
        let mut args = c::PJRT_Buffer_OnDeviceSizeInBytes_Args::new();
        args.buffer = buffer.raw();
        call!(self, PJRT_Buffer_OnDeviceSizeInBytes, &mut args)?;
        Ok(args.on_device_size_in_bytes)
    }

    pub(crate) fn buffer_device(self, buffer: BufferHandle) -> Result<DeviceHandle> {
        let mut args = c::PJRT_Buffer_Device_Args::new();
        args.buffer = buffer.raw();
        call!(self, PJRT_Buffer_Device, &mut args)?;
        DeviceHandle::from_raw(args.device, "PJRT_Buffer_Device")
    }

    /// Copies the buffer to the host as dense row-major bytes (an explicit major-to-minor host layout,
    /// so a device with a tiled layout still yields plain row-major data).
    pub(crate) fn buffer_to_host(self, buffer: BufferHandle, rank: usize) -> Result<Vec<u8>> {
        self.buffer_to_host_start(buffer, rank)?.finish()
    }

    /// Starts [`Api::buffer_to_host`]'s copy and returns without waiting for it: the plugin schedules it behind
    /// whatever still writes the buffer, so a copy started right after a launch is done soon after the program.
    pub(crate) fn buffer_to_host_start(self, buffer: BufferHandle, rank: usize) -> Result<HostCopyInFlight> {
        let minor_to_major: Vec<i64> = (0..rank as i64).rev().collect();
        let mut layout = c::PJRT_Buffer_MemoryLayout::new();
        layout.type_ = c::MEMORY_LAYOUT_TILED;
        {
            // SAFETY: `tiled` is the union's only declared member; writing it initialises the union.
            let tiled = unsafe { &mut layout.layout.tiled };
            tiled.struct_size = c::PJRT_Buffer_MemoryLayout_Tiled::STRUCT_SIZE;
            tiled.minor_to_major = minor_to_major.as_ptr();
            tiled.minor_to_major_size = minor_to_major.len();
        }
        let mut args = c::PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = buffer.raw();
        args.host_layout = &mut layout;
        call!(self, PJRT_Buffer_ToHostBuffer, &mut args)?; // dst = null: asks for the size
        let mut copy =
            HostCopyInFlight { api: self, event: None, dst: vec![0u8; args.dst_size], _minor_to_major: minor_to_major };
        args.dst = copy.dst.as_mut_ptr().cast::<c_void>();
        args.dst_size = copy.dst.len();
        args.event = ptr::null_mut();
        call!(self, PJRT_Buffer_ToHostBuffer, &mut args)?;
        copy.event = NonNull::new(args.event).map(EventHandle);
        Ok(copy)
    }
}

/// A copy of a buffer to the host under way ([`Api::buffer_to_host_start`]). The plugin writes `dst` until the
/// copy's event fires, so the bytes stay here, neither moved (a `Vec`'s heap block does not move with it) nor
/// freed before then: dropping an unfinished copy waits for its event first.
pub(crate) struct HostCopyInFlight {
    api: Api,
    event: Option<EventHandle>,
    dst: Vec<u8>,
    /// The host layout's dimension order, which the call's layout pointed at.
    _minor_to_major: Vec<i64>,
}

impl HostCopyInFlight {
    /// Whether the copy has finished (without waiting).
    pub(crate) fn is_done(&self) -> bool {
        self.event.as_ref().is_none_or(|e| self.api.event_is_ready(e))
    }

    /// Waits for the copy (polling first, as every wait does) and returns the bytes.
    pub(crate) fn finish(mut self) -> Result<Vec<u8>> {
        if let Some(event) = self.event.take() {
            self.api.event_await(event, "PJRT_Buffer_ToHostBuffer")?;
        }
        Ok(std::mem::take(&mut self.dst))
    }
}

impl Drop for HostCopyInFlight {
    fn drop(&mut self) {
        if let Some(event) = self.event.take() {
            Api::ignore(self.api.event_await(event, "PJRT_Buffer_ToHostBuffer"));
        }
    }
}

impl Api {
    /// For a buffer in host memory (a CPU device's), copies its `len` bytes straight from where they lie, once
    /// the buffer is ready; `Ok(None)` for a buffer elsewhere. The plugin's own copy to the host hands the work to
    /// a worker thread and wakes the caller afterwards, which costs tens of microseconds for a loss value.
    /// The caller guarantees that the layout is row-major (`len` bytes of another on-device size are refused).
    pub(crate) fn buffer_read_in_place(self, buffer: BufferHandle, len: usize) -> Result<Option<Vec<u8>>> {
        let Some(address) = self.buffer_host_address(buffer, len)? else { return Ok(None) };
        let mut out = vec![0u8; len];
        // SAFETY: `address` is where this live buffer's `len` bytes lie in this process's memory, defined
        // (`buffer_host_address`). Nothing writes them while the caller holds the buffer: a buffer is overwritten
        // only when no `Buffer` wraps it (reused uploads), and donation needs the buffer's last owner.
        unsafe { ptr::copy_nonoverlapping(address as *const u8, out.as_mut_ptr(), len) };
        Ok(Some(out))
    }
}

impl Api {
    /// Whether the buffer was deleted (an execution it was donated to took its memory). Errors count as deleted.
    pub(crate) fn buffer_is_deleted(self, buffer: BufferHandle) -> bool {
        let mut args = c::PJRT_Buffer_IsDeleted_Args::new();
        args.buffer = buffer.raw();
        call!(self, PJRT_Buffer_IsDeleted, &mut args).map(|()| args.is_deleted).unwrap_or(true)
    }

    /// Where a buffer's `len` bytes lie in this process's memory, once it is defined; `None` if it is not in
    /// host memory or holds another size (padding, tiling).
    pub(crate) fn buffer_host_address(self, buffer: BufferHandle, len: usize) -> Result<Option<usize>> {
        let mut on_cpu = c::PJRT_Buffer_IsOnCpu_Args::new();
        on_cpu.buffer = buffer.raw();
        if call!(self, PJRT_Buffer_IsOnCpu, &mut on_cpu).is_err() || !on_cpu.is_on_cpu {
            return Ok(None);
        }
        if self.buffer_on_device_size(buffer).ok() != Some(len) {
            return Ok(None);
        }
        let mut ready = c::PJRT_Buffer_ReadyEvent_Args::new();
        ready.buffer = buffer.raw();
        call!(self, PJRT_Buffer_ReadyEvent, &mut ready)?;
        self.await_event(ready.event, "PJRT_Buffer_ReadyEvent")?;
        let mut at = c::PJRT_Buffer_UnsafePointer_Args::new();
        at.buffer = buffer.raw();
        call!(self, PJRT_Buffer_UnsafePointer, &mut at)?;
        Ok((at.buffer_pointer != 0).then_some(at.buffer_pointer))
    }

    /// Overwrite a buffer in host memory, at `address` from [`Api::buffer_host_address`], with `data` (as many
    /// bytes as it holds). The caller owns the buffer alone (no `Buffer` wraps it) and no launched program reads
    /// it any more.
    pub(crate) fn buffer_write_at(self, address: usize, data: &[u8]) {
        // SAFETY: `address` is where this live buffer's `data.len()` bytes lie in this process's memory
        // (`buffer_host_address` checked that it is in host memory, holds that many bytes and is defined; a
        // buffer's memory does not move). Nothing else reads or writes it now: the caller holds the only handle
        // and no launched program is running (the caller's guarantee).
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), address as *mut u8, data.len()) };
    }
}

fn rename_call(e: Error, call: &'static str) -> Error {
    match e {
        Error::Pjrt { code, message, .. } => Error::Pjrt { call, code, message },
        other => other,
    }
}

fn device_list(p: *const *mut c::PJRT_Device, n: usize, call: &'static str) -> Result<Vec<DeviceHandle>> {
    copy_slice(p, n).into_iter().map(|d| DeviceHandle::from_raw(d, call)).collect()
}

fn read_named_values(p: *const c::PJRT_NamedValue, n: usize) -> Vec<(String, AttrValue)> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the plugin returned `n` named values at `p`, alive for the life of the process.
        let v = unsafe { &*p.add(i) };
        let name = copy_str(v.name, v.name_size);
        // SAFETY: each union member is read only when `type_` says it is the active one.
        let value = unsafe {
            match v.type_ {
                c::NAMED_VALUE_STRING => AttrValue::String(copy_str(v.value.string_value, v.value_size)),
                c::NAMED_VALUE_INT64 => AttrValue::Int64(v.value.int64_value),
                c::NAMED_VALUE_INT64_LIST => AttrValue::Int64List(copy_slice(v.value.int64_array_value, v.value_size)),
                c::NAMED_VALUE_FLOAT => AttrValue::Float(v.value.float_value),
                c::NAMED_VALUE_BOOL => AttrValue::Bool(v.value.bool_value),
                other => AttrValue::Unknown(other),
            }
        };
        out.push((name, value));
    }
    out
}

impl Api {
    /// Identity of the function table (one per loaded library).
    pub(crate) fn address(self) -> usize {
        self.0.as_ptr() as usize
    }
}

extern "C" {
    /// The C library's exit-time callback registration.
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

static EXIT_HOOK: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

extern "C" fn run_exit_hook() {
    if let Some(hook) = EXIT_HOOK.get() {
        // A panic must not unwind into the C library.
        let _ = std::panic::catch_unwind(hook);
    }
}

/// Runs `hook` when the process exits normally (returning from `main` or `std::process::exit`). Exit-time
/// callbacks run in reverse order of registration, so a hook registered after a plugin was loaded runs before
/// the plugin's own teardown: the place to wait for programs still running on its threads. One hook per
/// process; returns whether this call registered it.
pub fn on_exit(hook: fn()) -> bool {
    if EXIT_HOOK.set(hook).is_err() {
        return false;
    }
    // SAFETY: `run_exit_hook` is a plain `extern "C" fn()` with no arguments that never unwinds, as atexit needs.
    unsafe { atexit(run_exit_hook) == 0 }
}
