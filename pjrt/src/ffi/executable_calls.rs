//! Wrappers for loaded executables: addressable devices, outputs, (de)serialization and execution.

use std::ptr::{self, NonNull};

use super::{c, copy_slice, device_list, Api, BufferHandle, ClientHandle, DeviceHandle, EventHandle, ExecHandle};
use crate::error::{Error, Result};
use crate::executable::CompiledMemoryStats;

impl Api {
    pub(crate) fn executable_destroy(self, exe: ExecHandle) {
        let mut args = c::PJRT_LoadedExecutable_Destroy_Args::new();
        args.executable = exe.raw();
        Self::ignore(call!(self, PJRT_LoadedExecutable_Destroy, &mut args));
    }

    pub(crate) fn executable_addressable_devices(self, exe: ExecHandle) -> Result<Vec<DeviceHandle>> {
        let mut args = c::PJRT_LoadedExecutable_AddressableDevices_Args::new();
        args.executable = exe.raw();
        call!(self, PJRT_LoadedExecutable_AddressableDevices, &mut args)?;
        device_list(args.addressable_devices, args.num_addressable_devices, "PJRT_LoadedExecutable_AddressableDevices")
    }

    /// Runs `f` on the (unloaded) `PJRT_Executable` behind `exe`, destroying it afterwards.
    fn with_executable<R>(self, exe: ExecHandle, f: impl FnOnce(*mut c::PJRT_Executable) -> Result<R>) -> Result<R> {
        let mut args = c::PJRT_LoadedExecutable_GetExecutable_Args::new();
        args.loaded_executable = exe.raw();
        call!(self, PJRT_LoadedExecutable_GetExecutable, &mut args)?;
        if args.executable.is_null() {
            return Err(Error::Pjrt {
                call: "PJRT_LoadedExecutable_GetExecutable",
                code: None,
                message: "the plugin returned a null executable".into(),
            });
        }
        let result = f(args.executable);
        let mut destroy = c::PJRT_Executable_Destroy_Args::new();
        destroy.executable = args.executable;
        Self::ignore(call!(self, PJRT_Executable_Destroy, &mut destroy));
        result
    }

    pub(crate) fn executable_num_outputs(self, exe: ExecHandle) -> Result<usize> {
        self.with_executable(exe, |e| {
            let mut args = c::PJRT_Executable_NumOutputs_Args::new();
            args.executable = e;
            call!(self, PJRT_Executable_NumOutputs, &mut args)?;
            Ok(args.num_outputs)
        })
    }

    /// XLA's estimate of what the compiled program needs on its device (`xla::CompiledMemoryStats`).
    pub(crate) fn executable_compiled_memory_stats(self, exe: ExecHandle) -> Result<CompiledMemoryStats> {
        self.with_executable(exe, |e| {
            let mut args = c::PJRT_Executable_GetCompiledMemoryStats_Args::new();
            args.executable = e;
            call!(self, PJRT_Executable_GetCompiledMemoryStats, &mut args)?;
            Ok(CompiledMemoryStats {
                argument_bytes: args.argument_size_in_bytes,
                output_bytes: args.output_size_in_bytes,
                alias_bytes: args.alias_size_in_bytes,
                temp_bytes: args.temp_size_in_bytes,
                generated_code_bytes: args.generated_code_size_in_bytes,
                reported_peak_bytes: (args.peak_memory_in_bytes > 0).then_some(args.peak_memory_in_bytes),
            })
        })
    }

    pub(crate) fn executable_serialize(self, exe: ExecHandle) -> Result<Vec<u8>> {
        self.with_executable(exe, |e| {
            let mut args = c::PJRT_Executable_Serialize_Args::new();
            args.executable = e;
            call!(self, PJRT_Executable_Serialize, &mut args)?;
            let bytes = copy_slice(args.serialized_bytes.cast::<u8>(), args.serialized_bytes_size);
            if let (Some(deleter), false) = (args.serialized_executable_deleter, args.serialized_executable.is_null()) {
                // SAFETY: frees the backing store exactly once, after the copy above.
                unsafe { deleter(args.serialized_executable) };
            }
            Ok(bytes)
        })
    }

    pub(crate) fn executable_deserialize(self, client: ClientHandle, bytes: &[u8]) -> Result<ExecHandle> {
        let mut args = c::PJRT_Executable_DeserializeAndLoad_Args::new();
        args.client = client.raw();
        args.serialized_executable = bytes.as_ptr().cast();
        args.serialized_executable_size = bytes.len();
        call!(self, PJRT_Executable_DeserializeAndLoad, &mut args)?;
        ExecHandle::from_raw(args.loaded_executable, "PJRT_Executable_DeserializeAndLoad")
    }

    /// Launches with one argument list per addressable device and returns without waiting: the outputs (which
    /// later reads and executions wait for by themselves) and one completion event per device, which the caller
    /// must await (`event_await`). On a launch error no output is leaked: outputs already produced are destroyed.
    pub(crate) fn execute(
        self,
        exe: ExecHandle,
        args_per_device: &[Vec<BufferHandle>],
        num_outputs: usize,
    ) -> Result<(Vec<Vec<BufferHandle>>, Vec<EventHandle>)> {
        let num_devices = args_per_device.len();
        let num_args = args_per_device.first().map_or(0, Vec::len);
        let arg_lists: Vec<Vec<*mut c::PJRT_Buffer>> =
            args_per_device.iter().map(|list| list.iter().map(|b| b.raw()).collect()).collect();
        let arg_ptrs: Vec<*const *mut c::PJRT_Buffer> = arg_lists.iter().map(|l| l.as_ptr()).collect();
        let mut out_lists: Vec<Vec<*mut c::PJRT_Buffer>> = vec![vec![ptr::null_mut(); num_outputs]; num_devices];
        let out_ptrs: Vec<*mut *mut c::PJRT_Buffer> = out_lists.iter_mut().map(|l| l.as_mut_ptr()).collect();
        let mut events: Vec<*mut c::PJRT_Event> = vec![ptr::null_mut(); num_devices];

        let mut options = c::PJRT_ExecuteOptions::new();
        let mut args = c::PJRT_LoadedExecutable_Execute_Args::new();
        args.executable = exe.raw();
        args.options = &mut options;
        args.argument_lists = arg_ptrs.as_ptr();
        args.num_devices = num_devices;
        args.num_args = num_args;
        args.output_lists = out_ptrs.as_ptr();
        args.device_complete_events = events.as_mut_ptr();
        call!(self, PJRT_LoadedExecutable_Execute, &mut args)?;

        let events: Vec<EventHandle> = events.into_iter().filter_map(|e| NonNull::new(e).map(EventHandle)).collect();
        let mut status = Ok(());
        let mut outputs = Vec::with_capacity(num_devices);
        for list in &out_lists {
            let handles: Vec<Option<BufferHandle>> = list.iter().map(|p| NonNull::new(*p).map(BufferHandle)).collect();
            if handles.iter().any(Option::is_none) && status.is_ok() {
                status = Err(Error::Pjrt {
                    call: "PJRT_LoadedExecutable_Execute",
                    code: None,
                    message: "the plugin left an output buffer null".into(),
                });
            }
            outputs.push(handles.into_iter().flatten().collect::<Vec<_>>());
        }
        if let Err(e) = status {
            for event in events {
                let _ = self.event_await(event, "PJRT_LoadedExecutable_Execute");
            }
            outputs.into_iter().flatten().for_each(|b| self.buffer_destroy(b));
            return Err(e);
        }
        Ok((outputs, events))
    }
}
