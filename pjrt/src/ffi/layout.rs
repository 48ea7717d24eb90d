//! `#[repr(C)]` mirrors of the PJRT C API structs this crate uses, written from `pjrt_c_api.h` 0.81.
//!
//! Every argument struct starts with `struct_size` and `extension_start`; `pjrt_args!` adds those two
//! fields and computes `STRUCT_SIZE` the way the header's `PJRT_STRUCT_SIZE` does (end of the last field,
//! without trailing padding). A plugin rejects a struct whose `struct_size` is smaller than its own.
#![allow(non_snake_case, non_camel_case_types)]

use std::ffi::{c_char, c_void};

/// Opaque handles owned by the plugin.
macro_rules! opaque {
    ($($name:ident),* $(,)?) => { $( #[repr(C)] pub(crate) struct $name { _private: [u8; 0] } )* };
}
opaque!(
    PJRT_Error,
    PJRT_Event,
    PJRT_Client,
    PJRT_Device,
    PJRT_DeviceDescription,
    PJRT_Executable,
    PJRT_LoadedExecutable,
    PJRT_Buffer,
    PJRT_SerializedExecutable,
);

macro_rules! pjrt_args {
    ($name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        #[repr(C)]
        pub(crate) struct $name {
            pub struct_size: usize,
            pub extension_start: *mut c_void,
            $(pub $field: $ty,)*
        }
        impl $name {
            /// `PJRT_STRUCT_SIZE(struct, last_field)`: offset of the last field plus its size.
            pub const STRUCT_SIZE: usize = {
                #[allow(unused_mut)]
                let mut end = std::mem::offset_of!($name, extension_start) + std::mem::size_of::<*mut c_void>();
                $(
                    let e = std::mem::offset_of!($name, $field) + std::mem::size_of::<$ty>();
                    if e > end { end = e; }
                )*
                end
            };
            #[allow(dead_code)]
            pub fn new() -> Self {
                // SAFETY: every field is an integer, bool, raw pointer, `Option` of a function pointer or a
                // union of those; the all-zero bit pattern is valid (null / 0 / false / None) for each.
                let mut s: Self = unsafe { std::mem::zeroed() };
                s.struct_size = Self::STRUCT_SIZE;
                s
            }
        }
    };
}

// C enums are `int` on every ABI PJRT supports; keep them as i32 so an unknown value from a newer
// plugin can never be an invalid Rust enum.
pub(crate) type CEnum = i32;

pub(crate) const NAMED_VALUE_STRING: CEnum = 0;
pub(crate) const NAMED_VALUE_INT64: CEnum = 1;
pub(crate) const NAMED_VALUE_INT64_LIST: CEnum = 2;
pub(crate) const NAMED_VALUE_FLOAT: CEnum = 3;
pub(crate) const NAMED_VALUE_BOOL: CEnum = 4;

pub(crate) const HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL: CEnum = 0;
pub(crate) const HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES: CEnum = 1;
pub(crate) const MEMORY_LAYOUT_TILED: CEnum = 0;

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union NamedValueUnion {
    pub string_value: *const c_char,
    pub int64_value: i64,
    pub int64_array_value: *const i64,
    pub float_value: f32,
    pub bool_value: bool,
}

pjrt_args!(PJRT_NamedValue {
    name: *const c_char,
    name_size: usize,
    type_: CEnum,
    value: NamedValueUnion,
    value_size: usize,
});

#[repr(C)]
pub(crate) struct PJRT_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub major_version: i32,
    pub minor_version: i32,
}

pjrt_args!(PJRT_Error_Destroy_Args { error: *mut PJRT_Error });
pjrt_args!(PJRT_Error_Message_Args { error: *const PJRT_Error, message: *const c_char, message_size: usize });
pjrt_args!(PJRT_Error_GetCode_Args { error: *const PJRT_Error, code: CEnum });

pjrt_args!(PJRT_Plugin_Initialize_Args {});
pjrt_args!(PJRT_Plugin_Attributes_Args { attributes: *const PJRT_NamedValue, num_attributes: usize });

pjrt_args!(PJRT_Event_Destroy_Args { event: *mut PJRT_Event });
pjrt_args!(PJRT_Event_Await_Args { event: *mut PJRT_Event });
pjrt_args!(PJRT_Event_IsReady_Args { event: *mut PJRT_Event, is_ready: bool });

pjrt_args!(PJRT_Client_Create_Args {
    create_options: *const PJRT_NamedValue,
    num_options: usize,
    kv_get_callback: *const c_void,
    kv_get_user_arg: *mut c_void,
    kv_put_callback: *const c_void,
    kv_put_user_arg: *mut c_void,
    client: *mut PJRT_Client,
    kv_try_get_callback: *const c_void,
    kv_try_get_user_arg: *mut c_void,
});
pjrt_args!(PJRT_Client_Destroy_Args { client: *mut PJRT_Client });

/// The plugin's constructor of an error, for a callback to return (`PJRT_CallbackError`).
pub(crate) type PJRT_CallbackError =
    Option<unsafe extern "C" fn(code: CEnum, message: *const c_char, message_size: usize) -> *mut PJRT_Error>;
/// Frees a value a key-value callback returned.
pub(crate) type KeyValueValueDeleter = Option<extern "C" fn(value: *mut c_char)>;
pjrt_args!(PJRT_KeyValueGetCallback_Args {
    key: *const c_char,
    key_size: usize,
    timeout_in_ms: std::ffi::c_int,
    callback_error: *const PJRT_CallbackError,
    user_arg: *mut c_void,
    value: *mut c_char,
    value_size: usize,
    value_deleter_callback: KeyValueValueDeleter,
});
pjrt_args!(PJRT_KeyValueTryGetCallback_Args {
    key: *const c_char,
    key_size: usize,
    callback_error: *const PJRT_CallbackError,
    user_arg: *mut c_void,
    value: *mut c_char,
    value_size: usize,
    value_deleter_callback: KeyValueValueDeleter,
});
pjrt_args!(PJRT_KeyValuePutCallback_Args {
    key: *const c_char,
    key_size: usize,
    value: *const c_char,
    value_size: usize,
    callback_error: *const PJRT_CallbackError,
    user_arg: *mut c_void,
});
pub(crate) type KeyValueGetCallback = extern "C" fn(*mut PJRT_KeyValueGetCallback_Args) -> *mut PJRT_Error;
pub(crate) type KeyValueTryGetCallback = extern "C" fn(*mut PJRT_KeyValueTryGetCallback_Args) -> *mut PJRT_Error;
pub(crate) type KeyValuePutCallback = extern "C" fn(*mut PJRT_KeyValuePutCallback_Args) -> *mut PJRT_Error;
pjrt_args!(PJRT_Client_PlatformName_Args {
    client: *mut PJRT_Client,
    platform_name: *const c_char,
    platform_name_size: usize,
});
pjrt_args!(PJRT_Client_ProcessIndex_Args { client: *mut PJRT_Client, process_index: std::ffi::c_int });
pjrt_args!(PJRT_Client_Devices_Args {
    client: *mut PJRT_Client,
    devices: *const *mut PJRT_Device,
    num_devices: usize,
});
pjrt_args!(PJRT_Client_AddressableDevices_Args {
    client: *mut PJRT_Client,
    addressable_devices: *const *mut PJRT_Device,
    num_addressable_devices: usize,
});
pjrt_args!(PJRT_Program { code: *mut c_char, code_size: usize, format: *const c_char, format_size: usize });
pjrt_args!(PJRT_Client_Compile_Args {
    client: *mut PJRT_Client,
    program: *const PJRT_Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    executable: *mut PJRT_LoadedExecutable,
});
pjrt_args!(PJRT_Client_BufferFromHostBuffer_Args {
    client: *mut PJRT_Client,
    data: *const c_void,
    type_: CEnum,
    dims: *const i64,
    num_dims: usize,
    byte_strides: *const i64,
    num_byte_strides: usize,
    host_buffer_semantics: CEnum,
    device: *mut PJRT_Device,
    memory: *mut c_void,
    device_layout: *mut PJRT_Buffer_MemoryLayout,
    done_with_host_buffer: *mut PJRT_Event,
    buffer: *mut PJRT_Buffer,
});

pjrt_args!(PJRT_DeviceDescription_Id_Args { device_description: *mut PJRT_DeviceDescription, id: i32 });
pjrt_args!(PJRT_DeviceDescription_Attributes_Args {
    device_description: *mut PJRT_DeviceDescription,
    num_attributes: usize,
    attributes: *const PJRT_NamedValue,
});
pjrt_args!(PJRT_DeviceDescription_Kind_Args {
    device_description: *mut PJRT_DeviceDescription,
    device_kind: *const c_char,
    device_kind_size: usize,
});
pjrt_args!(PJRT_Device_GetDescription_Args {
    device: *mut PJRT_Device,
    device_description: *mut PJRT_DeviceDescription,
});
pjrt_args!(PJRT_Device_LocalHardwareId_Args { device: *mut PJRT_Device, local_hardware_id: i32 });
// Each optional statistic is a value and an `_is_set` flag; the plugin fills what its allocator knows.
pjrt_args!(PJRT_Device_MemoryStats_Args {
    device: *mut PJRT_Device,
    bytes_in_use: i64,
    peak_bytes_in_use: i64,
    peak_bytes_in_use_is_set: bool,
    num_allocs: i64,
    num_allocs_is_set: bool,
    largest_alloc_size: i64,
    largest_alloc_size_is_set: bool,
    bytes_limit: i64,
    bytes_limit_is_set: bool,
    bytes_reserved: i64,
    bytes_reserved_is_set: bool,
    peak_bytes_reserved: i64,
    peak_bytes_reserved_is_set: bool,
    bytes_reservable_limit: i64,
    bytes_reservable_limit_is_set: bool,
    largest_free_block_bytes: i64,
    largest_free_block_bytes_is_set: bool,
    pool_bytes: i64,
    pool_bytes_is_set: bool,
    peak_pool_bytes: i64,
    peak_pool_bytes_is_set: bool,
});

pjrt_args!(PJRT_Executable_Destroy_Args { executable: *mut PJRT_Executable });
pjrt_args!(PJRT_Executable_NumOutputs_Args { executable: *mut PJRT_Executable, num_outputs: usize });
// With the two fields later headers appended: a plugin refuses a struct smaller than its own (0.115's ends at
// `peak_memory_in_bytes`) and leaves fields it does not know at zero.
pjrt_args!(PJRT_Executable_GetCompiledMemoryStats_Args {
    executable: *mut PJRT_Executable,
    generated_code_size_in_bytes: i64,
    argument_size_in_bytes: i64,
    output_size_in_bytes: i64,
    alias_size_in_bytes: i64,
    temp_size_in_bytes: i64,
    host_generated_code_size_in_bytes: i64,
    host_argument_size_in_bytes: i64,
    host_output_size_in_bytes: i64,
    host_alias_size_in_bytes: i64,
    host_temp_size_in_bytes: i64,
    peak_memory_in_bytes: i64,
    total_size_in_bytes: i64,
});
pjrt_args!(PJRT_Executable_Serialize_Args {
    executable: *const PJRT_Executable,
    serialized_bytes: *const c_char,
    serialized_bytes_size: usize,
    serialized_executable: *mut PJRT_SerializedExecutable,
    serialized_executable_deleter: Option<unsafe extern "C" fn(*mut PJRT_SerializedExecutable)>,
});
pjrt_args!(PJRT_Executable_DeserializeAndLoad_Args {
    client: *mut PJRT_Client,
    serialized_executable: *const c_char,
    serialized_executable_size: usize,
    loaded_executable: *mut PJRT_LoadedExecutable,
    overridden_serialized_compile_options: *const c_char,
    overridden_serialized_compile_options_size: usize,
});

pjrt_args!(PJRT_LoadedExecutable_Destroy_Args { executable: *mut PJRT_LoadedExecutable });
pjrt_args!(PJRT_LoadedExecutable_GetExecutable_Args {
    loaded_executable: *mut PJRT_LoadedExecutable,
    executable: *mut PJRT_Executable,
});
pjrt_args!(PJRT_LoadedExecutable_AddressableDevices_Args {
    executable: *mut PJRT_LoadedExecutable,
    addressable_devices: *const *mut PJRT_Device,
    num_addressable_devices: usize,
});
pjrt_args!(PJRT_ExecuteOptions {
    send_callbacks: *mut *mut c_void,
    recv_callbacks: *mut *mut c_void,
    num_send_ops: usize,
    num_recv_ops: usize,
    launch_id: i32,
    non_donatable_input_indices: *const i64,
    num_non_donatable_input_indices: usize,
    context: *mut c_void,
    call_location: *const c_char,
    num_tasks: usize,
    task_ids: *mut i32,
    incarnation_ids: *mut i64,
});
pjrt_args!(PJRT_LoadedExecutable_Execute_Args {
    executable: *mut PJRT_LoadedExecutable,
    options: *mut PJRT_ExecuteOptions,
    argument_lists: *const *const *mut PJRT_Buffer,
    num_devices: usize,
    num_args: usize,
    output_lists: *const *mut *mut PJRT_Buffer,
    device_complete_events: *mut *mut PJRT_Event,
    execute_device: *mut PJRT_Device,
});

pjrt_args!(PJRT_Buffer_Destroy_Args { buffer: *mut PJRT_Buffer });
pjrt_args!(PJRT_Buffer_ElementType_Args { buffer: *mut PJRT_Buffer, type_: CEnum });
pjrt_args!(PJRT_Buffer_Dimensions_Args { buffer: *mut PJRT_Buffer, dims: *const i64, num_dims: usize });
pjrt_args!(PJRT_Buffer_OnDeviceSizeInBytes_Args { buffer: *mut PJRT_Buffer, on_device_size_in_bytes: usize });
pjrt_args!(PJRT_Buffer_Device_Args { buffer: *mut PJRT_Buffer, device: *mut PJRT_Device });
pjrt_args!(PJRT_Buffer_MemoryLayout_Tiled {
    minor_to_major: *const i64,
    minor_to_major_size: usize,
    tile_dims: *const i64,
    tile_dim_sizes: *const usize,
    num_tiles: usize,
});
/// The header's anonymous union of `tiled` and `strides`; `strides` (smaller) is never used here.
#[repr(C)]
pub(crate) union MemoryLayoutUnion {
    pub tiled: std::mem::ManuallyDrop<PJRT_Buffer_MemoryLayout_Tiled>,
}
pjrt_args!(PJRT_Buffer_MemoryLayout { layout: MemoryLayoutUnion, type_: CEnum });
pjrt_args!(PJRT_Buffer_IsDeleted_Args { buffer: *mut PJRT_Buffer, is_deleted: bool });
pjrt_args!(PJRT_Buffer_IsOnCpu_Args { buffer: *mut PJRT_Buffer, is_on_cpu: bool });
pjrt_args!(PJRT_Buffer_ReadyEvent_Args { buffer: *mut PJRT_Buffer, event: *mut PJRT_Event });
pjrt_args!(PJRT_Buffer_UnsafePointer_Args { buffer: *mut PJRT_Buffer, buffer_pointer: usize });
pjrt_args!(PJRT_Buffer_ToHostBuffer_Args {
    src: *mut PJRT_Buffer,
    host_layout: *mut PJRT_Buffer_MemoryLayout,
    dst: *mut c_void,
    dst_size: usize,
    event: *mut PJRT_Event,
});

/// A function-table entry: every PJRT entry point takes one argument struct and returns an error or null.
pub(crate) type Entry<A> = Option<unsafe extern "C" fn(*mut A) -> *mut PJRT_Error>;
/// A table entry this crate never calls: only its place in the table matters.
type Unused = *const c_void;

/// `PJRT_Api`, declared up to the last entry this crate calls. Its order was last rearranged in 0.57 and
/// only grows at the end since, which is why [`super::MIN_API_VERSION`] is 0.57.
#[repr(C)]
pub(crate) struct PJRT_Api {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub pjrt_api_version: PJRT_Api_Version,

    pub PJRT_Error_Destroy: Option<unsafe extern "C" fn(*mut PJRT_Error_Destroy_Args)>,
    pub PJRT_Error_Message: Option<unsafe extern "C" fn(*mut PJRT_Error_Message_Args)>,
    pub PJRT_Error_GetCode: Entry<PJRT_Error_GetCode_Args>,

    pub PJRT_Plugin_Initialize: Entry<PJRT_Plugin_Initialize_Args>,
    pub PJRT_Plugin_Attributes: Entry<PJRT_Plugin_Attributes_Args>,

    pub PJRT_Event_Destroy: Entry<PJRT_Event_Destroy_Args>,
    pub PJRT_Event_IsReady: Entry<PJRT_Event_IsReady_Args>,
    _PJRT_Event_Error: Unused,
    pub PJRT_Event_Await: Entry<PJRT_Event_Await_Args>,
    _PJRT_Event_OnReady: Unused,

    pub PJRT_Client_Create: Entry<PJRT_Client_Create_Args>,
    pub PJRT_Client_Destroy: Entry<PJRT_Client_Destroy_Args>,
    pub PJRT_Client_PlatformName: Entry<PJRT_Client_PlatformName_Args>,
    pub PJRT_Client_ProcessIndex: Entry<PJRT_Client_ProcessIndex_Args>,
    _PJRT_Client_PlatformVersion: Unused,
    pub PJRT_Client_Devices: Entry<PJRT_Client_Devices_Args>,
    pub PJRT_Client_AddressableDevices: Entry<PJRT_Client_AddressableDevices_Args>,
    _PJRT_Client_LookupDevice: Unused,
    _PJRT_Client_LookupAddressableDevice: Unused,
    _PJRT_Client_AddressableMemories: Unused,
    pub PJRT_Client_Compile: Entry<PJRT_Client_Compile_Args>,
    _PJRT_Client_DefaultDeviceAssignment: Unused,
    pub PJRT_Client_BufferFromHostBuffer: Entry<PJRT_Client_BufferFromHostBuffer_Args>,

    pub PJRT_DeviceDescription_Id: Entry<PJRT_DeviceDescription_Id_Args>,
    _PJRT_DeviceDescription_ProcessIndex: Unused,
    pub PJRT_DeviceDescription_Attributes: Entry<PJRT_DeviceDescription_Attributes_Args>,
    pub PJRT_DeviceDescription_Kind: Entry<PJRT_DeviceDescription_Kind_Args>,
    _PJRT_DeviceDescription_DebugString: Unused,
    _PJRT_DeviceDescription_ToString: Unused,

    pub PJRT_Device_GetDescription: Entry<PJRT_Device_GetDescription_Args>,
    _PJRT_Device_IsAddressable: Unused,
    pub PJRT_Device_LocalHardwareId: Entry<PJRT_Device_LocalHardwareId_Args>,
    _PJRT_Device_AddressableMemories: Unused,
    _PJRT_Device_DefaultMemory: Unused,
    pub PJRT_Device_MemoryStats: Entry<PJRT_Device_MemoryStats_Args>,

    _PJRT_Memory_Id: Unused,
    _PJRT_Memory_Kind: Unused,
    _PJRT_Memory_DebugString: Unused,
    _PJRT_Memory_ToString: Unused,
    _PJRT_Memory_AddressableByDevices: Unused,

    pub PJRT_Executable_Destroy: Entry<PJRT_Executable_Destroy_Args>,
    _PJRT_Executable_Name: Unused,
    _PJRT_Executable_NumReplicas: Unused,
    _PJRT_Executable_NumPartitions: Unused,
    pub PJRT_Executable_NumOutputs: Entry<PJRT_Executable_NumOutputs_Args>,
    _PJRT_Executable_SizeOfGeneratedCodeInBytes: Unused,
    _PJRT_Executable_GetCostAnalysis: Unused,
    _PJRT_Executable_OutputMemoryKinds: Unused,
    _PJRT_Executable_OptimizedProgram: Unused,
    pub PJRT_Executable_Serialize: Entry<PJRT_Executable_Serialize_Args>,

    pub PJRT_LoadedExecutable_Destroy: Entry<PJRT_LoadedExecutable_Destroy_Args>,
    pub PJRT_LoadedExecutable_GetExecutable: Entry<PJRT_LoadedExecutable_GetExecutable_Args>,
    pub PJRT_LoadedExecutable_AddressableDevices: Entry<PJRT_LoadedExecutable_AddressableDevices_Args>,
    _PJRT_LoadedExecutable_Delete: Unused,
    _PJRT_LoadedExecutable_IsDeleted: Unused,
    pub PJRT_LoadedExecutable_Execute: Entry<PJRT_LoadedExecutable_Execute_Args>,
    pub PJRT_Executable_DeserializeAndLoad: Entry<PJRT_Executable_DeserializeAndLoad_Args>,
    _PJRT_LoadedExecutable_Fingerprint: Unused,

    pub PJRT_Buffer_Destroy: Entry<PJRT_Buffer_Destroy_Args>,
    pub PJRT_Buffer_ElementType: Entry<PJRT_Buffer_ElementType_Args>,
    pub PJRT_Buffer_Dimensions: Entry<PJRT_Buffer_Dimensions_Args>,
    _PJRT_Buffer_UnpaddedDimensions: Unused,
    _PJRT_Buffer_DynamicDimensionIndices: Unused,
    _PJRT_Buffer_GetMemoryLayout: Unused,
    pub PJRT_Buffer_OnDeviceSizeInBytes: Entry<PJRT_Buffer_OnDeviceSizeInBytes_Args>,
    pub PJRT_Buffer_Device: Entry<PJRT_Buffer_Device_Args>,
    _PJRT_Buffer_Memory: Unused,
    _PJRT_Buffer_Delete: Unused,
    pub PJRT_Buffer_IsDeleted: Entry<PJRT_Buffer_IsDeleted_Args>,
    _PJRT_Buffer_CopyToDevice: Unused,
    pub PJRT_Buffer_ToHostBuffer: Entry<PJRT_Buffer_ToHostBuffer_Args>,
    pub PJRT_Buffer_IsOnCpu: Entry<PJRT_Buffer_IsOnCpu_Args>,
    pub PJRT_Buffer_ReadyEvent: Entry<PJRT_Buffer_ReadyEvent_Args>,
    pub PJRT_Buffer_UnsafePointer: Entry<PJRT_Buffer_UnsafePointer_Args>,
    _PJRT_Buffer_IncreaseExternalReferenceCount: Unused,
    _PJRT_Buffer_DecreaseExternalReferenceCount: Unused,
    _PJRT_Buffer_OpaqueDeviceMemoryDataPointer: Unused,

    _PJRT_CopyToDeviceStream_Destroy: Unused,
    _PJRT_CopyToDeviceStream_AddChunk: Unused,
    _PJRT_CopyToDeviceStream_TotalBytes: Unused,
    _PJRT_CopyToDeviceStream_GranuleSize: Unused,
    _PJRT_CopyToDeviceStream_CurrentBytes: Unused,

    _PJRT_TopologyDescription_Create: Unused,
    _PJRT_TopologyDescription_Destroy: Unused,
    _PJRT_TopologyDescription_PlatformName: Unused,
    _PJRT_TopologyDescription_PlatformVersion: Unused,
    _PJRT_TopologyDescription_GetDeviceDescriptions: Unused,
    _PJRT_TopologyDescription_Serialize: Unused,
    _PJRT_TopologyDescription_Attributes: Unused,

    _PJRT_Compile: Unused,

    // Appended after 0.57 in this order.
    _PJRT_Executable_OutputElementTypes: Unused,
    _PJRT_Executable_OutputDimensions: Unused,
    _PJRT_Buffer_CopyToMemory: Unused,
    _PJRT_Client_CreateViewOfDeviceBuffer: Unused,
    _PJRT_Executable_Fingerprint: Unused,
    _PJRT_Client_TopologyDescription: Unused,
    pub PJRT_Executable_GetCompiledMemoryStats: Entry<PJRT_Executable_GetCompiledMemoryStats_Args>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// Sizes and offsets printed by a C program compiled against pjrt_c_api.h 0.81 (`*_STRUCT_SIZE`,
    /// `offsetof(PJRT_Api, …)`), so a typo in a declaration above fails here, not inside the plugin.
    #[test]
    fn layouts_match_header_0_81() {
        let sizes = [
            (PJRT_Error_Destroy_Args::STRUCT_SIZE, 24),
            (PJRT_Error_Message_Args::STRUCT_SIZE, 40),
            (PJRT_Error_GetCode_Args::STRUCT_SIZE, 28),
            (PJRT_NamedValue::STRUCT_SIZE, 56),
            (PJRT_Plugin_Initialize_Args::STRUCT_SIZE, 16),
            (PJRT_Plugin_Attributes_Args::STRUCT_SIZE, 32),
            (PJRT_Event_Destroy_Args::STRUCT_SIZE, 24),
            (PJRT_Event_Await_Args::STRUCT_SIZE, 24),
            (PJRT_Event_IsReady_Args::STRUCT_SIZE, 25),
            (PJRT_Client_Create_Args::STRUCT_SIZE, 88),
            (PJRT_Client_Destroy_Args::STRUCT_SIZE, 24),
            (PJRT_KeyValueGetCallback_Args::STRUCT_SIZE, 80),
            (PJRT_KeyValueTryGetCallback_Args::STRUCT_SIZE, 72),
            (PJRT_KeyValuePutCallback_Args::STRUCT_SIZE, 64),
            (PJRT_Client_ProcessIndex_Args::STRUCT_SIZE, 28),
            (PJRT_Client_Devices_Args::STRUCT_SIZE, 40),
            (PJRT_Client_PlatformName_Args::STRUCT_SIZE, 40),
            (PJRT_Client_AddressableDevices_Args::STRUCT_SIZE, 40),
            (PJRT_Program::STRUCT_SIZE, 48),
            (PJRT_Client_Compile_Args::STRUCT_SIZE, 56),
            (PJRT_Client_BufferFromHostBuffer_Args::STRUCT_SIZE, 120),
            (PJRT_DeviceDescription_Id_Args::STRUCT_SIZE, 28),
            (PJRT_DeviceDescription_Kind_Args::STRUCT_SIZE, 40),
            (PJRT_Device_GetDescription_Args::STRUCT_SIZE, 32),
            (PJRT_Device_LocalHardwareId_Args::STRUCT_SIZE, 28),
            // Newer than 0.81 (the pool fields came later): ten (value, flag) pairs after `bytes_in_use`.
            (PJRT_Device_MemoryStats_Args::STRUCT_SIZE, 185),
            (PJRT_Executable_Destroy_Args::STRUCT_SIZE, 24),
            (PJRT_Executable_NumOutputs_Args::STRUCT_SIZE, 32),
            (PJRT_Executable_GetCompiledMemoryStats_Args::STRUCT_SIZE, 120),
            (PJRT_Executable_Serialize_Args::STRUCT_SIZE, 56),
            (PJRT_Executable_DeserializeAndLoad_Args::STRUCT_SIZE, 64),
            (PJRT_LoadedExecutable_Destroy_Args::STRUCT_SIZE, 24),
            (PJRT_LoadedExecutable_GetExecutable_Args::STRUCT_SIZE, 32),
            (PJRT_LoadedExecutable_AddressableDevices_Args::STRUCT_SIZE, 40),
            (PJRT_ExecuteOptions::STRUCT_SIZE, 112),
            (PJRT_LoadedExecutable_Execute_Args::STRUCT_SIZE, 80),
            (PJRT_Buffer_Destroy_Args::STRUCT_SIZE, 24),
            (PJRT_Buffer_ElementType_Args::STRUCT_SIZE, 28),
            (PJRT_Buffer_Dimensions_Args::STRUCT_SIZE, 40),
            (PJRT_Buffer_OnDeviceSizeInBytes_Args::STRUCT_SIZE, 32),
            (PJRT_Buffer_Device_Args::STRUCT_SIZE, 32),
            (PJRT_Buffer_MemoryLayout_Tiled::STRUCT_SIZE, 56),
            (PJRT_Buffer_MemoryLayout::STRUCT_SIZE, 76),
            (PJRT_Buffer_ToHostBuffer_Args::STRUCT_SIZE, 56),
            (PJRT_Buffer_IsDeleted_Args::STRUCT_SIZE, 25),
            (PJRT_Buffer_IsOnCpu_Args::STRUCT_SIZE, 25),
            (PJRT_Buffer_ReadyEvent_Args::STRUCT_SIZE, 32),
            (PJRT_Buffer_UnsafePointer_Args::STRUCT_SIZE, 32),
        ];
        for (i, (ours, header)) in sizes.iter().enumerate() {
            assert_eq!(ours, header, "entry {i}");
        }
        assert_eq!(offset_of!(PJRT_Api, pjrt_api_version), 16);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Error_Destroy), 40);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Plugin_Initialize), 64);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Client_Create), 120);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Client_ProcessIndex), 144);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Client_Devices), 160);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Client_BufferFromHostBuffer), 216);
        assert_eq!(offset_of!(PJRT_Api, PJRT_DeviceDescription_Id), 224);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Executable_Destroy), 360);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Executable_Serialize), 432);
        assert_eq!(offset_of!(PJRT_Api, PJRT_LoadedExecutable_Destroy), 440);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Executable_DeserializeAndLoad), 488);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Buffer_Destroy), 504);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Buffer_IsDeleted), 584);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Buffer_ToHostBuffer), 600);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Buffer_UnsafePointer), 624);
        assert_eq!(offset_of!(PJRT_Api, PJRT_Executable_GetCompiledMemoryStats), 808);
    }
}
