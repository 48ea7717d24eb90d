//! `Client`: one PJRT client of a plugin, with its addressable devices.

use std::sync::{Arc, Mutex};

use crate::buffer::Buffer;
use crate::client_options::ClientOptions;
use crate::compile_options::CompileOptions;
use crate::element_type::ElementType;
use crate::error::{Error, Result};
use crate::executable::LoadedExecutable;
use crate::ffi::{Api, BufferHandle, ClientHandle, DeviceHandle};
use crate::plugin::Plugin;

pub(crate) struct ClientInner {
    pub(crate) plugin: Plugin,
    pub(crate) handle: ClientHandle,
    /// Addressable devices, queried once: they are fixed for the client's life.
    pub(crate) devices: Vec<DeviceData>,
    /// The ids of every device of the group (in a multi-process client, other processes' devices too).
    global_device_ids: Vec<i64>,
    /// Buffers of small uploads whose last `Buffer` was dropped, kept to be overwritten by the next upload of
    /// the same type and shape (`Client::buffer_from_host_reusing`).
    spares: Mutex<Vec<Spare>>,
    /// Launches whose completion nobody has seen yet: a spare one of them read is not overwritten.
    pub(crate) running: Mutex<Running>,
    /// The key-value store behind the client's callbacks: boxed, since its address is their `user_arg`, and
    /// dropped only after the client is destroyed.
    _store: Option<Box<Arc<dyn crate::key_value::KeyValueStore>>>,
}

/// The launches of a client that may still run, by number (`LoadedExecutable::launch_sharded` adds one, its
/// `Completion` removes it once it finished).
#[derive(Default)]
pub(crate) struct Running {
    next: u64,
    open: std::collections::BTreeSet<u64>,
}

impl Running {
    /// A new launch's number (never 0, which stands for "never read").
    pub(crate) fn start(&mut self) -> u64 {
        self.next += 1;
        self.open.insert(self.next);
        self.next
    }

    pub(crate) fn finish(&mut self, launch: u64) {
        self.open.remove(&launch);
    }

    /// Whether launch `n` (0: none) may still be running.
    fn may_run(&self, n: u64) -> bool {
        n != 0 && self.open.contains(&n)
    }
}

struct Spare {
    handle: BufferHandle,
    ty: ElementType,
    dims: Vec<i64>,
    device: DeviceHandle,
    /// Where its bytes lie in host memory.
    address: usize,
    /// The last launch that read it (0: none): it is overwritten only once that launch finished.
    last_read: u64,
}

/// Uploads at most this large are reused; at most this many spares are kept (at most 2 MiB in all).
const REUSE_MAX_BYTES: usize = 64 << 10;
const MAX_SPARES: usize = 32;

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

    /// Keep a dropped upload's buffer for reuse; `false` (the caller destroys it) if it was donated away, does
    /// not lie in host memory as dense bytes, or enough are kept.
    pub(crate) fn keep_spare(
        &self,
        handle: BufferHandle,
        ty: ElementType,
        dims: Vec<i64>,
        device: DeviceHandle,
        known_address: Option<usize>,
        last_read: u64,
    ) -> bool {
        let api = self.api();
        if self.spares.lock().unwrap_or_else(|e| e.into_inner()).len() >= MAX_SPARES || api.buffer_is_deleted(handle) {
            return false;
        }
        let address = match known_address {
            Some(a) => a,
            None => match byte_len(ty, &dims).map(|len| api.buffer_host_address(handle, len)) {
                Ok(Ok(Some(a))) => a,
                _ => return false,
            },
        };
        let spare = Spare { handle, ty, dims, device, address, last_read };
        self.spares.lock().unwrap_or_else(|e| e.into_inner()).push(spare);
        true
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let api = self.api();
        let spares = std::mem::take(self.spares.get_mut().unwrap_or_else(|e| e.into_inner()));
        spares.into_iter().for_each(|s| api.buffer_destroy(s.handle));
        api.client_destroy(self.handle);
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
        let store = opts.store.as_ref().map(|s| Box::new(Arc::clone(&s.0)));
        let handle = api.client_create(&options, store.as_deref())?;
        // From here on, dropping `inner` destroys the client, also on the error paths below.
        let mut inner = ClientInner {
            plugin: plugin.clone(),
            handle,
            devices: Vec::new(),
            spares: Mutex::new(Vec::new()),
            running: Mutex::new(Running::default()),
            _store: store,
            global_device_ids: Vec::new(),
        };
        for device in api.client_addressable_devices(handle)? {
            let (id, kind, local_hardware_id) = api.device_info(device)?;
            inner.devices.push(DeviceData { handle: device, id, kind, local_hardware_id });
        }
        inner.global_device_ids = match api.client_devices(handle) {
            Ok(all) => {
                all.into_iter().map(|d| api.device_info(d).map(|(id, _, _)| i64::from(id))).collect::<Result<_>>()?
            }
            Err(_) => inner.devices.iter().map(|d| i64::from(d.id)).collect(),
        };
        Ok(Client { inner: Arc::new(inner) })
    }

    /// "cpu", "cuda", "rocm", "tpu", …
    pub fn platform_name(&self) -> Result<String> {
        self.inner.api().client_platform_name(self.inner.handle)
    }

    /// This client's process index in a multi-process group (0 in a single process).
    pub fn process_index(&self) -> Result<i32> {
        self.inner.api().client_process_index(self.inner.handle)
    }

    /// The ids of every device of the group, in the plugin's order: the addressable ones and, in a
    /// multi-process client, the other processes' devices.
    pub fn global_device_ids(&self) -> &[i64] {
        &self.inner.global_device_ids
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

    /// Like [`Client::buffer_from_host`], for small arrays uploaded again and again (a training loop's batches):
    /// on a device in host memory, the buffer of an earlier such upload of the same type and shape, whose last
    /// `Buffer` was dropped, is overwritten instead of a new one made (no plugin call to create it, none to
    /// destroy it later). A buffer that a launch still running read is never overwritten: the client records
    /// which launch last read each such buffer, and a launch counts as running until its `Completion` finished.
    pub fn buffer_from_host_reusing(
        &self,
        data: &[u8],
        ty: ElementType,
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        if data.len() > REUSE_MAX_BYTES {
            return self.buffer_from_host(data, ty, dims, device);
        }
        self.check_device(device)?;
        if data.len() != byte_len(ty, dims)? {
            return self.buffer_from_host(data, ty, dims, device); // its error
        }
        let api = self.inner.api();
        let spare = {
            let mut spares = self.inner.spares.lock().unwrap_or_else(|e| e.into_inner());
            let running = self.inner.running.lock().unwrap_or_else(|e| e.into_inner());
            let idle = |s: &Spare| !running.may_run(s.last_read);
            let found =
                spares.iter().position(|s| s.ty == ty && s.dims == dims && s.device == device.handle() && idle(s));
            found.map(|i| spares.swap_remove(i))
        };
        if let Some(s) = spare {
            // Dense row-major bytes in a host buffer of their size: the plugin's copy would lay them out the same
            // way (checked against the plugin's own copy in the tests).
            api.buffer_write_at(s.address, data);
            let mut b = Buffer::new(Arc::clone(&self.inner), s.handle, ty, s.dims, s.device).reusable();
            b.host_address = Some(s.address);
            return Ok(b);
        }
        Ok(self.buffer_from_host(data, ty, dims, device)?.reusable())
    }

    /// Dropped uploads kept for reuse (for tests).
    #[doc(hidden)]
    pub fn spare_uploads(&self) -> usize {
        self.inner.spares.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Compiles StableHLO (MLIR text or bytecode; entry function `main`).
    pub fn compile(&self, mlir: &str, opts: &CompileOptions) -> Result<LoadedExecutable> {
        let options = opts.to_proto_bytes_for(&self.inner.global_device_ids)?;
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
    /// The plugin's attributes of this device, e.g. the CUDA plugin's `compute_capability` (`"9.0"`).
    pub fn attributes(&self) -> Result<Vec<(String, crate::AttrValue)>> {
        self.client.api().device_attributes(self.handle())
    }

    pub fn memory_stats(&self) -> Result<MemoryStats> {
        let (bytes_in_use, peak_bytes_in_use, bytes_limit) = self.client.api().device_memory_stats(self.handle())?;
        Ok(MemoryStats { bytes_in_use, peak_bytes_in_use, bytes_limit })
    }
}

/// A device allocator's statistics, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryStats {
    /// What the device's allocator holds now.
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
