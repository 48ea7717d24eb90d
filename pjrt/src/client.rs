//! `Client`: one PJRT client of a plugin, with its addressable devices.

use std::sync::Arc;

use crate::buffer::Buffer;
use crate::client_options::ClientOptions;
use crate::compile_options::CompileOptions;
use crate::element_type::ElementType;
use crate::error::{Error, Result};
use crate::executable::LoadedExecutable;
use crate::ffi::{Api, ClientHandle, DeviceHandle};
use crate::plugin::Plugin;

pub(crate) struct ClientInner {
    pub(crate) plugin: Plugin,
    pub(crate) handle: ClientHandle,
    /// Addressable devices, queried once: they are fixed for the client's life.
    pub(crate) devices: Vec<DeviceData>,
}

pub(crate) struct DeviceData {
    pub(crate) handle: DeviceHandle,
    id: i32,
    kind: String,
    local_hardware_id: i32,
}

impl ClientInner {
    pub(crate) fn api(&self) -> Api {
        self.plugin.api()
    }

    /// The `Device` for a handle the plugin returned; `None` if it is not one of this client's
    /// addressable devices.
    pub(crate) fn device(self: &Arc<Self>, handle: DeviceHandle) -> Option<Device> {
        let index = self.devices.iter().position(|d| d.handle == handle)?;
        Some(Device { client: Arc::clone(self), index })
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        self.api().client_destroy(self.handle);
    }
}

/// A PJRT client. Cheap to clone; buffers and executables keep it alive.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("plugin", &self.inner.plugin.path())
            .field("devices", &self.inner.devices.len())
            .finish()
    }
}

impl Client {
    pub fn new(plugin: &Plugin, opts: &ClientOptions) -> Result<Client> {
        let options = opts.validated()?;
        let api = plugin.api();
        let handle = api.client_create(&options)?;
        // From here on, dropping `inner` destroys the client, also on the error paths below.
        let mut inner = ClientInner { plugin: plugin.clone(), handle, devices: Vec::new() };
        for device in api.client_addressable_devices(handle)? {
            let (id, kind, local_hardware_id) = api.device_info(device)?;
            inner.devices.push(DeviceData { handle: device, id, kind, local_hardware_id });
        }
        Ok(Client { inner: Arc::new(inner) })
    }

    /// "cpu", "cuda", "rocm", "tpu", …
    pub fn platform_name(&self) -> Result<String> {
        self.inner.api().client_platform_name(self.inner.handle)
    }

    pub fn plugin(&self) -> &Plugin {
        &self.inner.plugin
    }

    /// Addressable devices, in the plugin's order.
    pub fn devices(&self) -> Vec<Device> {
        (0..self.inner.devices.len()).map(|index| Device { client: Arc::clone(&self.inner), index }).collect()
    }

    /// Copies dense row-major host data to `device`. `data.len()` must be the product of `dims` times
    /// the element size. Returns once `data` is no longer needed.
    pub fn buffer_from_host(&self, data: &[u8], ty: ElementType, dims: &[i64], device: &Device) -> Result<Buffer> {
        self.check_device(device)?;
        let expected = byte_len(ty, dims)?;
        if data.len() != expected {
            return Err(Error::invalid(format!(
                "buffer_from_host: {} bytes given, but {ty:?} {dims:?} needs {expected}",
                data.len()
            )));
        }
        let api = self.inner.api();
        let handle = api.buffer_from_host(self.inner.handle, data, ty.to_raw(), dims, device.handle())?;
        Ok(Buffer::new(Arc::clone(&self.inner), handle, ty, dims.to_vec(), device.handle()))
    }

    /// Compiles StableHLO (MLIR text or bytecode; entry function `main`).
    pub fn compile(&self, mlir: &str, opts: &CompileOptions) -> Result<LoadedExecutable> {
        let device_ids: Vec<i64> = self.inner.devices.iter().map(|d| i64::from(d.id)).collect();
        let options = opts.to_proto_bytes_for(&device_ids)?;
        let handle = self.inner.api().client_compile(self.inner.handle, mlir, "mlir", &options)?;
        LoadedExecutable::new(Arc::clone(&self.inner), handle)
    }

    /// Loads an executable produced by [`LoadedExecutable::serialize`] with the same plugin build.
    pub fn deserialize_executable(&self, bytes: &[u8]) -> Result<LoadedExecutable> {
        if bytes.is_empty() {
            return Err(Error::invalid("deserialize_executable: empty input"));
        }
        let handle = self.inner.api().executable_deserialize(self.inner.handle, bytes)?;
        LoadedExecutable::new(Arc::clone(&self.inner), handle)
    }

    fn check_device(&self, device: &Device) -> Result<()> {
        if Arc::ptr_eq(&device.client, &self.inner) {
            Ok(())
        } else {
            Err(Error::invalid(format!("{device:?} belongs to another client")))
        }
    }
}

/// Bytes of a dense array, refusing negative dimensions and overflow.
pub(crate) fn byte_len(ty: ElementType, dims: &[i64]) -> Result<usize> {
    dims.iter()
        .try_fold(ty.byte_size(), |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
        .ok_or_else(|| Error::invalid(format!("invalid dimensions {dims:?}")))
}

/// An addressable device of a client. Cheap to clone; keeps the client alive.
#[derive(Clone)]
pub struct Device {
    client: Arc<ClientInner>,
    index: usize,
}

impl Device {
    fn data(&self) -> &DeviceData {
        &self.client.devices[self.index]
    }

    /// Global device id (as used in device assignments).
    pub fn id(&self) -> i32 {
        self.data().id
    }

    /// "cpu", or e.g. "NVIDIA H200".
    pub fn kind(&self) -> String {
        self.data().kind.clone()
    }

    pub fn local_hardware_id(&self) -> i32 {
        self.data().local_hardware_id
    }

    pub(crate) fn handle(&self) -> DeviceHandle {
        self.data().handle
    }

    /// What the device's allocator holds now and at most so far. An error where the plugin keeps no such
    /// statistics (the CPU plugins allocate from the host heap).
    pub fn memory_stats(&self) -> Result<MemoryStats> {
        let (bytes_in_use, peak_bytes_in_use, bytes_limit) = self.client.api().device_memory_stats(self.handle())?;
        Ok(MemoryStats { bytes_in_use, peak_bytes_in_use, bytes_limit })
    }
}

/// A device allocator's statistics, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryStats {
    pub bytes_in_use: i64,
    /// The most ever held at once, where the plugin tracks it.
    pub peak_bytes_in_use: Option<i64>,
    /// What the allocator may use in all, where the plugin says.
    pub bytes_limit: Option<i64>,
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.client, &other.client) && self.index == other.index
    }
}
impl Eq for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({} id={} local_hardware_id={})", self.data().kind, self.id(), self.local_hardware_id())
    }
}
