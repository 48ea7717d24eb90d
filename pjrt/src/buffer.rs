//! `Buffer`: an array on a device, owned by this process.

use std::sync::Arc;

use crate::client::{byte_len, ClientInner, Device};
use crate::element_type::ElementType;
use crate::error::{Error, Result};
use crate::ffi::{BufferHandle, DeviceHandle, HostCopyInFlight};

/// A device array. Element type and dimensions are fixed; dropping it frees the device memory.
pub struct Buffer {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) handle: BufferHandle,
    ty: ElementType,
    dims: Vec<i64>,
    /// Where it lives (known at creation; checked on every execution without asking the plugin).
    pub(crate) device: DeviceHandle,
    /// Made by `Client::buffer_from_host_reusing`: kept for reuse when dropped, not destroyed.
    reusable: bool,
    /// Where its bytes lie in host memory, once known (a reused buffer's).
    pub(crate) host_address: Option<usize>,
    /// The last launch that read it (a reusable buffer's; 0: none), so that it is not overwritten under it.
    pub(crate) last_read: std::sync::atomic::AtomicU64,
}

impl Buffer {
    pub(crate) fn new(
        client: Arc<ClientInner>,
        handle: BufferHandle,
        ty: ElementType,
        dims: Vec<i64>,
        device: DeviceHandle,
    ) -> Buffer {
        Buffer { client, handle, ty, dims, device, reusable: false, host_address: None, last_read: Default::default() }
    }

    /// Note that `launch` reads this buffer (only reusable buffers need it).
    pub(crate) fn read_by(&self, launch: u64) {
        if self.reusable {
            self.last_read.fetch_max(launch, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub(crate) fn reusable(mut self) -> Buffer {
        self.reusable = true;
        self
    }

    /// Takes ownership of a buffer the plugin produced (an execution output), reading its type and shape.
    /// The handle is destroyed if that fails.
    pub(crate) fn from_handle(client: Arc<ClientInner>, handle: BufferHandle, device: DeviceHandle) -> Result<Buffer> {
        let api = client.api();
        let described = api.buffer_element_type(handle).and_then(|raw| {
            let ty = ElementType::from_raw(raw).ok_or_else(|| {
                Error::invalid(format!(
                    "the program produced an element type lazuli does not support (PJRT type {raw})"
                ))
            })?;
            Ok((ty, api.buffer_dimensions(handle)?))
        });
        match described {
            Ok((ty, dims)) => Ok(Buffer::new(client, handle, ty, dims, device)),
            Err(e) => {
                api.buffer_destroy(handle);
                Err(e)
            }
        }
    }

    pub fn element_type(&self) -> ElementType {
        self.ty
    }

    pub fn dims(&self) -> Vec<i64> {
        self.dims.clone()
    }

    /// Number of elements.
    pub fn element_count(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }

    /// Copies the array to the host: dense, row-major, `element_count() * byte_size()` bytes.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let expected = byte_len(self.ty, &self.dims)?;
        // Scalars and vectors in host memory are read where they lie: one layout only, and no worker-thread
        // round trip (reading a loss on the 2-core CPU machine: about 1 µs instead of about 90).
        if self.dims.len() <= 1 {
            if let Some(bytes) = self.client.api().buffer_read_in_place(self.handle, expected)? {
                return Ok(bytes);
            }
        }
        let bytes = self.client.api().buffer_to_host(self.handle, self.dims.len())?;
        check_len(bytes, expected, self.ty, &self.dims)
    }

    /// Starts copying the array to the host, as [`Buffer::to_host`] copies it, and returns without waiting: the
    /// copy runs once whatever writes the buffer has run, so a copy started right after a launch is done soon
    /// after the program, and finishing it then costs no round trip to the plugin. (A buffer in host memory is
    /// read faster where it lies, by [`Buffer::to_host`], once it is ready.)
    pub fn start_to_host(&self) -> Result<HostCopy> {
        let copy = self.client.api().buffer_to_host_start(self.handle, self.dims.len())?;
        Ok(HostCopy { copy, ty: self.ty, dims: self.dims.clone(), _client: self.client.clone() })
    }

    /// The device holding the buffer.
    pub fn device(&self) -> Result<Device> {
        let handle = self.client.api().buffer_device(self.handle)?;
        self.client.device(handle).ok_or_else(|| Error::Pjrt {
            call: "PJRT_Buffer_Device",
            code: None,
            message: "the buffer's device is not an addressable device of its client".into(),
        })
    }

    /// Bytes the buffer occupies on the device (may include padding).
    pub fn on_device_size(&self) -> Result<usize> {
        self.client.api().buffer_on_device_size(self.handle)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let dims = std::mem::take(&mut self.dims);
        let last_read = *self.last_read.get_mut();
        let kept = self.reusable
            && self.client.keep_spare(self.handle, self.ty, dims, self.device, self.host_address, last_read);
        if !kept {
            self.client.api().buffer_destroy(self.handle);
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({:?} {:?})", self.ty, self.dims)
    }
}

/// A copy of a buffer to the host under way ([`Buffer::start_to_host`]). Dropping it unfinished waits for the
/// copy, which writes memory it holds.
pub struct HostCopy {
    copy: HostCopyInFlight,
    ty: ElementType,
    dims: Vec<i64>,
    /// The client, alive while the copy is.
    _client: Arc<ClientInner>,
}

impl HostCopy {
    /// Whether the copy has finished, without waiting: [`HostCopy::finish`] then returns at once.
    pub fn is_done(&self) -> bool {
        self.copy.is_done()
    }

    /// Waits for the copy and returns the bytes: dense, row-major, as [`Buffer::to_host`] returns them.
    pub fn finish(self) -> Result<Vec<u8>> {
        let expected = byte_len(self.ty, &self.dims)?;
        check_len(self.copy.finish()?, expected, self.ty, &self.dims)
    }
}

impl std::fmt::Debug for HostCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostCopy({:?} {:?})", self.ty, self.dims)
    }
}

/// `bytes` when it is the `expected` size of a `ty` array of `dims`, else the plugin's mistake as an error.
fn check_len(bytes: Vec<u8>, expected: usize, ty: ElementType, dims: &[i64]) -> Result<Vec<u8>> {
    if bytes.len() != expected {
        return Err(Error::Pjrt {
            call: "PJRT_Buffer_ToHostBuffer",
            code: None,
            message: format!("got {} bytes for {ty:?} {dims:?}, expected {expected}", bytes.len()),
        });
    }
    Ok(bytes)
}
