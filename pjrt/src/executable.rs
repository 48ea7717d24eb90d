//! `LoadedExecutable`: a compiled program loaded on its devices, and running it.

use std::sync::Arc;

use crate::buffer::Buffer;
use crate::client::{ClientInner, Device};
use crate::element_type::ElementType;
use crate::error::{Error, Result};
use crate::ffi::{EventHandle, ExecHandle};

/// An output's element type and dimensions.
type OutputType = (ElementType, Vec<i64>);

/// What a compiled program needs on its device, in bytes, as XLA's buffer assignment planned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompiledMemoryStats {
    /// The program's inputs.
    pub argument_bytes: i64,
    /// Its outputs.
    pub output_bytes: i64,
    /// Outputs written into donated inputs' buffers (counted in both of the above).
    pub alias_bytes: i64,
    /// Intermediate values live at once at the program's high-water mark (activations, gradients, scratch).
    pub temp_bytes: i64,
    /// The compiled code.
    pub generated_code_bytes: i64,
    /// XLA's own peak estimate, where the plugin reports one (PJRT API 0.6x and later).
    pub reported_peak_bytes: Option<i64>,
}

impl CompiledMemoryStats {
    /// The most the program holds at once while it runs: XLA's peak estimate where reported, else the sum of its
    /// inputs, the outputs not written in place and its temporaries (an upper bound).
    pub fn peak_bytes(&self) -> i64 {
        let sum = self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes;
        self.reported_peak_bytes.unwrap_or(sum)
    }
}

/// A compiled program. Dropping it frees the executable; it keeps its client alive.
pub struct LoadedExecutable {
    client: Arc<ClientInner>,
    handle: ExecHandle,
    devices: Vec<Device>,
    num_outputs: usize,
    /// Element type and dimensions of every output on every device, read from the first execution's buffers
    /// (fixed for a compiled program), so later executions ask the plugin nothing per output.
    output_types: std::sync::OnceLock<Vec<Vec<OutputType>>>,
}

impl LoadedExecutable {
    pub(crate) fn new(client: Arc<ClientInner>, handle: ExecHandle) -> Result<LoadedExecutable> {
        // Owned from here on: an error below drops `exe`, which destroys the handle.
        let mut exe = LoadedExecutable {
            client,
            handle,
            devices: Vec::new(),
            num_outputs: 0,
            output_types: std::sync::OnceLock::new(),
        };
        let api = exe.client.api();
        for device in api.executable_addressable_devices(handle)? {
            let device = exe.client.device(device).ok_or_else(|| Error::Pjrt {
                call: "PJRT_LoadedExecutable_AddressableDevices",
                code: None,
                message: "the executable names a device its client does not address".into(),
            })?;
            exe.devices.push(device);
        }
        exe.num_outputs = api.executable_num_outputs(handle)?;
        Ok(exe)
    }

    /// XLA's estimate of the memory the program needs on its device, from its buffer assignment.
    pub fn compiled_memory_stats(&self) -> Result<CompiledMemoryStats> {
        self.client.api().executable_compiled_memory_stats(self.handle)
    }

    /// Outputs per device.
    pub fn num_outputs(&self) -> Result<usize> {
        Ok(self.num_outputs)
    }

    /// Devices the program runs on, one per (replica, partition), in execution order.
    pub fn addressable_devices(&self) -> Vec<Device> {
        self.devices.clone()
    }

    /// Runs a single-device program on the device it was compiled for; `args` must live there.
    pub fn execute(&self, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        if self.devices.len() != 1 {
            return Err(Error::invalid(format!(
                "execute runs single-device programs; this one spans {} devices, use execute_sharded",
                self.devices.len()
            )));
        }
        let mut outputs = self.execute_sharded(&[args.to_vec()])?;
        Ok(outputs.pop().unwrap_or_default())
    }

    /// Runs on every addressable device: `args[i]` are the arguments for `addressable_devices()[i]`.
    /// Returns one output list per device, after all devices finished.
    pub fn execute_sharded(&self, args: &[Vec<&Buffer>]) -> Result<Vec<Vec<Buffer>>> {
        let (outputs, done) = self.launch_sharded(args)?;
        done.wait()?;
        Ok(outputs)
    }

    /// Like `execute_sharded`, but returns once the program is enqueued: the outputs can be read, donated or
    /// passed to further executions right away (each of those waits for them by itself); `Completion::wait`
    /// waits for the devices and reports an error the program hit while running.
    pub fn launch_sharded(&self, args: &[Vec<&Buffer>]) -> Result<(Vec<Vec<Buffer>>, Completion)> {
        self.check_args(args)?;
        let handles: Vec<Vec<_>> = args.iter().map(|list| list.iter().map(|b| b.handle).collect()).collect();
        let launch = self.client.running.lock().unwrap_or_else(|e| e.into_inner()).start();
        args.iter().flatten().for_each(|b| b.read_by(launch));
        let (outputs, events) = match self.client.api().execute(self.handle, &handles, self.num_outputs) {
            Ok(launched) => launched,
            Err(e) => {
                self.client.running.lock().unwrap_or_else(|e| e.into_inner()).finish(launch);
                return Err(e);
            }
        };
        let done = Completion { client: Arc::clone(&self.client), events, launch };
        if let Some(types) = self.output_types.get() {
            let outputs = outputs
                .into_iter()
                .zip(types)
                .zip(&self.devices)
                .map(|((list, types), device)| {
                    list.into_iter()
                        .zip(types)
                        .map(|(h, (ty, dims))| {
                            Buffer::new(Arc::clone(&self.client), h, *ty, dims.clone(), device.handle())
                        })
                        .collect()
                })
                .collect();
            return Ok((outputs, done));
        }
        // Wrap every output before reporting any error, so none leaks.
        let wrapped: Vec<Vec<Result<Buffer>>> = outputs
            .into_iter()
            .zip(&self.devices)
            .map(|(list, device)| {
                list.into_iter().map(|h| Buffer::from_handle(Arc::clone(&self.client), h, device.handle())).collect()
            })
            .collect();
        let outputs: Vec<Vec<Buffer>> =
            wrapped.into_iter().map(|list| list.into_iter().collect()).collect::<Result<_>>()?;
        let types = outputs.iter().map(|list| list.iter().map(|b| (b.element_type(), b.dims())).collect()).collect();
        let _ = self.output_types.set(types);
        Ok((outputs, done))
    }

    fn check_args(&self, args: &[Vec<&Buffer>]) -> Result<()> {
        if args.len() != self.devices.len() {
            return Err(Error::invalid(format!(
                "{} argument lists given, the executable runs on {} devices",
                args.len(),
                self.devices.len()
            )));
        }
        let num_args = args.first().map_or(0, Vec::len);
        if args.iter().any(|list| list.len() != num_args) {
            return Err(Error::invalid("every device needs the same number of arguments"));
        }
        for (i, (list, device)) in args.iter().zip(&self.devices).enumerate() {
            for (j, buffer) in list.iter().enumerate() {
                if !Arc::ptr_eq(&buffer.client, &self.client) {
                    return Err(Error::invalid(format!("argument {j} for device {i} belongs to another client")));
                }
                if buffer.device != device.handle() {
                    return Err(Error::invalid(format!(
                        "argument {j} for device list {i} is on {:?}, the program runs there on {device:?}",
                        buffer.device()?
                    )));
                }
            }
        }
        Ok(())
    }

    /// A plugin-specific serialization, for [`crate::Client::deserialize_executable`] with the same
    /// plugin build on a host with the same CPU features.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        self.client.api().executable_serialize(self.handle)
    }
}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        self.client.api().executable_destroy(self.handle);
    }
}

impl std::fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedExecutable")
            .field("devices", &self.devices)
            .field("num_outputs", &self.num_outputs)
            .finish()
    }
}

/// The completion of a launched program on each of its devices.
pub struct Completion {
    client: Arc<ClientInner>,
    events: Vec<EventHandle>,
    /// Its number among the client's launches (see `client::Running`).
    launch: u64,
}

impl Completion {
    /// Waits until every device finished; the first error any of them reported.
    pub fn wait(mut self) -> Result<()> {
        self.wait_all()
    }

    /// Whether every device has finished (without waiting).
    pub fn is_done(&self) -> bool {
        let api = self.client.api();
        self.events.iter().all(|e| api.event_is_ready(e))
    }

    fn wait_all(&mut self) -> Result<()> {
        let api = self.client.api();
        let mut status = Ok(());
        for event in self.events.drain(..) {
            // Polls before it sleeps (`crate::wait`): waking a sleeping waiter costs more than many small
            // programs run.
            let done = api.event_await(event, "PJRT_LoadedExecutable_Execute");
            if status.is_ok() {
                status = done;
            }
        }
        self.client.running.lock().unwrap_or_else(|e| e.into_inner()).finish(self.launch);
        status
    }
}

impl Drop for Completion {
    /// An unawaited completion is still awaited (its events must be destroyed, and only once they fired).
    fn drop(&mut self) {
        let _ = self.wait_all();
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Completion({} device(s) pending)", self.events.len())
    }
}
