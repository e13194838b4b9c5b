//! `PJRT_Buffer`: a device array; metadata, device→host copies, readiness.

use crate::api::{api_call, args};
use crate::client::ClientInner;
use crate::element_type::ElementType;
use crate::error::{Error, Result};
use crate::event::Event;
use pjrt_sys as sys;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// An owned device buffer; freed on drop. Keeps its client alive.
pub struct Buffer {
    client: Arc<ClientInner>,
    raw: *mut sys::PJRT_Buffer,
    /// On-device bytes, counted in the client's ledger while the buffer lives (zeroed once an
    /// execution consumed it by donation: its memory became that execution's result).
    bytes: AtomicU64,
}

// SAFETY: PJRT buffers are immutable device arrays whose methods are thread-safe; destruction is
// done once, by the owner.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("element_type", &self.element_type().ok())
            .field("dims", &self.dims().ok())
            .finish()
    }
}

impl Buffer {
    /// # Safety
    /// `raw` must be an owned buffer of `client`.
    pub(crate) unsafe fn from_raw(client: Arc<ClientInner>, raw: *mut sys::PJRT_Buffer) -> Buffer {
        let buffer = Buffer {
            client,
            raw,
            bytes: AtomicU64::new(0),
        };
        // A plugin that cannot tell the size leaves the buffer uncounted rather than failing.
        // A buffer the client makes for itself (`ledger::untracked`) is not counted at all.
        let bytes = if crate::ledger::tracking() {
            buffer.on_device_size().unwrap_or(0) as u64
        } else {
            0
        };
        buffer.bytes.store(bytes, Ordering::Relaxed);
        buffer.client.memory.allocate(bytes);
        buffer
    }

    /// Whether the buffer was deleted (an execution took it by donation).
    pub fn is_deleted(&self) -> Result<bool> {
        let mut args = args!(PJRT_Buffer_IsDeleted_Args { buffer: self.raw });
        api_call!(self.client.api(), PJRT_Buffer_IsDeleted, &mut args)?;
        Ok(args.is_deleted)
    }

    /// Takes the buffer out of the ledger if an execution consumed it (donation).
    pub(crate) fn settle_if_donated(&self) {
        if self.is_deleted().unwrap_or(false) {
            let bytes = self.bytes.swap(0, Ordering::Relaxed);
            self.client.memory.release(bytes);
        }
    }

    /// Takes the buffer out of the memory ledger: for a buffer the runtime keeps for its own
    /// reuse (a cached upload of a few scalars), which no tensor holds and which the user's
    /// live and peak bytes should not show.
    pub fn untrack(&self) {
        let bytes = self.bytes.swap(0, Ordering::Relaxed);
        self.client.memory.release(bytes);
    }

    pub(crate) fn raw(&self) -> *mut sys::PJRT_Buffer {
        self.raw
    }

    pub fn element_type(&self) -> Result<ElementType> {
        let mut args = args!(PJRT_Buffer_ElementType_Args { buffer: self.raw });
        api_call!(self.client.api(), PJRT_Buffer_ElementType, &mut args)?;
        ElementType::from_raw(args.type_).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "buffer has PJRT element type {} which this layer does not support",
                args.type_
            ))
        })
    }

    pub fn dims(&self) -> Result<Vec<i64>> {
        let mut args = args!(PJRT_Buffer_Dimensions_Args { buffer: self.raw });
        api_call!(self.client.api(), PJRT_Buffer_Dimensions, &mut args)?;
        if args.num_dims == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the buffer owns `num_dims` dimensions while it lives.
        Ok(unsafe { std::slice::from_raw_parts(args.dims, args.num_dims) }.to_vec())
    }

    /// Bytes the buffer occupies on the device.
    pub fn on_device_size(&self) -> Result<usize> {
        let mut args = args!(PJRT_Buffer_OnDeviceSizeInBytes_Args { buffer: self.raw });
        api_call!(
            self.client.api(),
            PJRT_Buffer_OnDeviceSizeInBytes,
            &mut args
        )?;
        Ok(args.on_device_size_in_bytes)
    }

    /// Bytes of the dense row-major host copy.
    pub fn host_size(&self) -> Result<usize> {
        let mut args = args!(PJRT_Buffer_ToHostBuffer_Args { src: self.raw });
        api_call!(self.client.api(), PJRT_Buffer_ToHostBuffer, &mut args)?;
        Ok(args.dst_size)
    }

    /// Copies the buffer to a new dense row-major host array, waiting for it.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let size = self.host_size()?;
        let mut out = vec![0u8; size];
        self.to_host_into(&mut out)?;
        Ok(out)
    }

    /// Copies the buffer into `dst` (exactly `host_size()` bytes), waiting for it.
    pub fn to_host_into(&self, dst: &mut [u8]) -> Result<()> {
        if self.read_in_place(dst)? {
            return Ok(());
        }
        let mut args = args!(PJRT_Buffer_ToHostBuffer_Args {
            src: self.raw,
            dst: dst.as_mut_ptr() as *mut std::ffi::c_void,
            dst_size: dst.len(),
        });
        api_call!(self.client.api(), PJRT_Buffer_ToHostBuffer, &mut args)?;
        if args.event.is_null() {
            return Ok(());
        }
        // SAFETY: an owned event of this plugin; awaited before `dst` is released.
        let event = unsafe { Event::from_raw(*self.client.api(), args.event) };
        event.wait()
    }

    /// Copies the buffer into `dst` straight from its device memory when that memory is the
    /// host's (the CPU plugin) and laid out densely in row-major order; returns `false`, having
    /// copied nothing, anywhere else (`to_host_into` then does the copy). Waits for the buffer.
    ///
    /// `ToHostBuffer` on the CPU plugin hands the copy to a worker thread and wakes the caller
    /// through an event, about 35 µs per read; a scalar that decides a Python branch every step
    /// (`.item()`, a stopping check) pays that on the caller's path.
    pub fn read_in_place(&self, dst: &mut [u8]) -> Result<bool> {
        if !self.client.host_memory {
            return Ok(false);
        }
        self.wait_ready()?;
        if self.on_device_size()? != dst.len() || !self.is_dense_row_major()? {
            return Ok(false);
        }
        let mut args = args!(PJRT_Buffer_UnsafePointer_Args { buffer: self.raw });
        if api_call!(self.client.api(), PJRT_Buffer_UnsafePointer, &mut args).is_err()
            || args.buffer_pointer == 0
        {
            return Ok(false);
        }
        // SAFETY: on the CPU plugin the pointer addresses the buffer's `on_device_size` bytes of
        // host memory; the contents are computed (awaited above) and immutable, and `self` keeps
        // the buffer alive (an execution donates only a value nothing else holds).
        unsafe {
            std::ptr::copy_nonoverlapping(
                args.buffer_pointer as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        Ok(true)
    }

    /// Whether the device layout is the dense row-major one of a host copy (no tiles, minor to
    /// major from the last dimension to the first). A plugin that cannot tell reads `false`.
    fn is_dense_row_major(&self) -> Result<bool> {
        let rank = self.dims()?.len();
        if rank <= 1 {
            return Ok(true);
        }
        let mut args = args!(PJRT_Buffer_GetMemoryLayout_Args { buffer: self.raw });
        if api_call!(self.client.api(), PJRT_Buffer_GetMemoryLayout, &mut args).is_err() {
            return Ok(false);
        }
        if args.layout.type_ != sys::PJRT_Buffer_MemoryLayout_Type_Tiled {
            return Ok(false);
        }
        // SAFETY: a tiled layout, owned by the buffer, whose `minor_to_major` holds
        // `minor_to_major_size` entries.
        let tiled = unsafe { args.layout.__bindgen_anon_1.tiled };
        if tiled.num_tiles != 0
            || tiled.minor_to_major_size != rank
            || tiled.minor_to_major.is_null()
        {
            return Ok(false);
        }
        let order = unsafe { std::slice::from_raw_parts(tiled.minor_to_major, rank) };
        Ok(order.iter().rev().copied().eq(0..rank as i64))
    }

    /// The addressable device that holds the buffer.
    pub fn device(&self) -> Result<crate::client::Device> {
        let mut args = args!(PJRT_Buffer_Device_Args { buffer: self.raw });
        api_call!(self.client.api(), PJRT_Buffer_Device, &mut args)?;
        self.client
            .devices
            .iter()
            .find(|device| device.raw == args.device)
            .cloned()
            .ok_or_else(|| {
                Error::InvalidArgument("a buffer is on a device its client does not address".into())
            })
    }

    /// Copies the buffer to another device of its client (`PJRT_Buffer_CopyToDevice`); the
    /// copy may still be in flight when this returns (its ready event tells when it is done).
    pub fn copy_to_device(&self, device: &crate::client::Device) -> Result<Buffer> {
        let mut args = args!(PJRT_Buffer_CopyToDevice_Args {
            buffer: self.raw,
            dst_device: device.raw,
        });
        api_call!(self.client.api(), PJRT_Buffer_CopyToDevice, &mut args)?;
        // SAFETY: a fresh, owned buffer of this client.
        Ok(unsafe { Buffer::from_raw(self.client.clone(), args.dst_buffer) })
    }

    /// An event that becomes ready when the buffer's contents are computed.
    pub fn ready_event(&self) -> Result<Event> {
        let mut args = args!(PJRT_Buffer_ReadyEvent_Args { buffer: self.raw });
        api_call!(self.client.api(), PJRT_Buffer_ReadyEvent, &mut args)?;
        // SAFETY: an owned event of this plugin.
        Ok(unsafe { Event::from_raw(*self.client.api(), args.event) })
    }

    /// Waits until the buffer is computed; returns the error of the computation that made it.
    pub fn wait_ready(&self) -> Result<()> {
        self.ready_event()?.wait()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.client.memory.release(*self.bytes.get_mut());
        let mut args = args!(PJRT_Buffer_Destroy_Args { buffer: self.raw });
        let _: Result<()> = api_call!(self.client.api(), PJRT_Buffer_Destroy, &mut args);
    }
}
