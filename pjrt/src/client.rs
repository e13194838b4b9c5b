//! `PJRT_Client` and its devices: creation with options, platform info, compile, host→device
//! transfers and executable deserialization.

use crate::api::{api_call, args, Api};
use crate::buffer::Buffer;
use crate::compile_options::CompileOptions;
use crate::element_type::ElementType;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::executable::LoadedExecutable;
use crate::ledger::{MemoryLedger, MemoryUsage};
use crate::named_value::{NamedValue, RawNamedValues};
use crate::plugin::Plugin;
use pjrt_sys as sys;
use std::ffi::c_char;
use std::sync::Arc;

/// One addressable device of a client. Valid as long as its client.
#[derive(Clone, Debug)]
pub struct Device {
    pub(crate) raw: *mut sys::PJRT_Device,
    /// The device's global id.
    pub id: i32,
    /// The device kind, e.g. "cpu" or "NVIDIA H200".
    pub kind: String,
}

// SAFETY: a device handle is an immutable pointer owned by its client, usable from any thread.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

/// A device's allocator statistics (only plugins that implement them; the CPU plugin does not).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemoryStats {
    pub bytes_in_use: i64,
    pub peak_bytes_in_use: Option<i64>,
    pub bytes_limit: Option<i64>,
}

pub(crate) struct ClientInner {
    pub(crate) plugin: Plugin,
    pub(crate) raw: *mut sys::PJRT_Client,
    pub(crate) devices: Vec<Device>,
    platform_name: String,
    platform_version: String,
    pub(crate) memory: MemoryLedger,
    /// Whether device buffers live in host memory that the process can read directly (the CPU
    /// plugin): `Buffer::read_in_place` then skips `ToHostBuffer`'s worker thread.
    pub(crate) host_memory: bool,
}

// SAFETY: PJRT clients are thread-safe; every method may be called concurrently.
unsafe impl Send for ClientInner {}
unsafe impl Sync for ClientInner {}

impl ClientInner {
    pub(crate) fn api(&self) -> &Api {
        self.plugin.api()
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args = args!(PJRT_Client_Destroy_Args { client: self.raw });
        let _: Result<()> = api_call!(self.plugin.api(), PJRT_Client_Destroy, &mut args);
    }
}

/// A PJRT client. Cloning is cheap (shared); buffers and executables keep it alive.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("platform", &self.inner.platform_name)
            .field("version", &self.inner.platform_version)
            .field("devices", &self.inner.devices.len())
            .finish()
    }
}

impl Client {
    /// Whether `other` is this same client (a clone of it), not another one.
    pub fn same_as(&self, other: &Client) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Bytes of this client's live buffers and their peak (with executables' temporaries).
    pub fn memory_usage(&self) -> MemoryUsage {
        self.inner.memory.usage()
    }

    /// Starts a new peak from the bytes live now.
    pub fn reset_peak_memory(&self) {
        self.inner.memory.reset_peak()
    }

    /// Creates a client with the plugin's default options.
    pub fn new(plugin: &Plugin) -> Result<Client> {
        Client::with_options(plugin, &[])
    }

    /// Creates a client with creation options (e.g. `("cpu_device_count", Int64(4))` for the
    /// CPU plugin).
    pub fn with_options(plugin: &Plugin, options: &[(String, NamedValue)]) -> Result<Client> {
        let api = plugin.api();
        let raw_options = RawNamedValues::new(options);
        let mut args = args!(PJRT_Client_Create_Args {
            create_options: raw_options.raw.as_ptr(),
            num_options: raw_options.raw.len(),
        });
        api_call!(api, PJRT_Client_Create, &mut args)?;
        let raw = args.client;
        drop(raw_options);
        let mut inner = ClientInner {
            plugin: plugin.clone(),
            raw,
            devices: Vec::new(),
            platform_name: String::new(),
            platform_version: String::new(),
            memory: MemoryLedger::default(),
            host_memory: false,
        };
        inner.platform_name = platform_string(api, raw, true)?;
        inner.host_memory = inner.platform_name == "cpu";
        inner.platform_version = platform_string(api, raw, false)?;
        inner.devices = addressable_devices(api, raw)?;
        Ok(Client {
            inner: Arc::new(inner),
        })
    }

    pub fn plugin(&self) -> &Plugin {
        &self.inner.plugin
    }

    /// E.g. "cpu" or "cuda".
    pub fn platform_name(&self) -> &str {
        &self.inner.platform_name
    }

    pub fn platform_version(&self) -> &str {
        &self.inner.platform_version
    }

    /// The devices this process can address, in PJRT's order.
    pub fn addressable_devices(&self) -> &[Device] {
        &self.inner.devices
    }

    fn default_device(&self) -> Result<&Device> {
        self.inner.devices.first().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "the {} client has no addressable devices",
                self.inner.platform_name
            ))
        })
    }

    /// Compiles a StableHLO module (MLIR text) for one device.
    pub fn compile(&self, mlir: &str) -> Result<LoadedExecutable> {
        self.compile_with_options(mlir, &CompileOptions::default())
    }

    pub fn compile_with_options(
        &self,
        mlir: &str,
        options: &CompileOptions,
    ) -> Result<LoadedExecutable> {
        let format = "mlir";
        let program = sys::PJRT_Program {
            struct_size: sys::PJRT_Program_STRUCT_SIZE as usize,
            code: mlir.as_ptr() as *mut c_char,
            code_size: mlir.len(),
            format: format.as_ptr() as *const c_char,
            format_size: format.len(),
            ..Default::default()
        };
        let encoded = options.encode();
        let mut args = args!(PJRT_Client_Compile_Args {
            client: self.inner.raw,
            program: &program,
            compile_options: encoded.as_ptr() as *const c_char,
            compile_options_size: encoded.len(),
        });
        api_call!(self.inner.api(), PJRT_Client_Compile, &mut args)?;
        // SAFETY: `executable` is a fresh, owned loaded executable of this client.
        unsafe { LoadedExecutable::from_raw(self.inner.clone(), args.executable) }
    }

    /// Compiles and runs a 4×4 matrix product once, its buffers and run kept out of the memory
    /// ledger. Runtimes may set up their matrix-product machinery on the first product a
    /// process runs: XLA CPU spends about 30 ms there. A caller can pay that on a background
    /// thread, rather than in a user's first training step.
    pub fn warm_up(&self) -> Result<()> {
        const PRODUCT: &str = "module @warm_up {
  func.func public @main(%a: tensor<4x4xf32>) -> tensor<4x4xf32> {
    %p = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    return %p : tensor<4x4xf32>
  }
}";
        crate::ledger::untracked(|| {
            let executable = self.compile(PRODUCT)?;
            let ones: Vec<u8> = (0..16).flat_map(|_| 1f32.to_le_bytes()).collect();
            let a = self.buffer_from_host(&ones, ElementType::F32, &[4, 4])?;
            for product in executable.execute(&[&a])? {
                product.wait_ready()?;
            }
            Ok(())
        })
    }

    /// Loads an executable produced by `LoadedExecutable::serialize` (same plugin build).
    pub fn deserialize(&self, serialized: &[u8]) -> Result<LoadedExecutable> {
        let mut args = args!(PJRT_Executable_DeserializeAndLoad_Args {
            client: self.inner.raw,
            serialized_executable: serialized.as_ptr() as *const c_char,
            serialized_executable_size: serialized.len(),
        });
        api_call!(
            self.inner.api(),
            PJRT_Executable_DeserializeAndLoad,
            &mut args
        )?;
        // SAFETY: a fresh, owned loaded executable of this client.
        unsafe { LoadedExecutable::from_raw(self.inner.clone(), args.loaded_executable) }
    }

    /// Copies a dense row-major host array to the first addressable device.
    pub fn buffer_from_host(&self, data: &[u8], ty: ElementType, dims: &[i64]) -> Result<Buffer> {
        let device = self.default_device()?.clone();
        self.buffer_from_host_on(data, ty, dims, &device)
    }

    /// Copies a dense row-major host array to `device`. The host data may be reused as soon as
    /// this returns.
    pub fn buffer_from_host_on(
        &self,
        data: &[u8],
        ty: ElementType,
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        if let Some(bad) = dims.iter().find(|&&d| d < 0) {
            return Err(Error::InvalidArgument(format!(
                "buffer_from_host: dimensions must be non-negative, got {bad} in {dims:?}"
            )));
        }
        let elements: i64 = dims.iter().product();
        let expected = elements as usize * ty.size_bytes();
        if data.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "buffer_from_host: a {ty:?} array of shape {dims:?} needs {expected} bytes, got a \
                 host slice of {} bytes; pass exactly elements × element size",
                data.len()
            )));
        }
        let mut args = args!(PJRT_Client_BufferFromHostBuffer_Args {
            client: self.inner.raw,
            data: data.as_ptr() as *const std::ffi::c_void,
            type_: ty.to_raw(),
            dims: dims.as_ptr(),
            num_dims: dims.len(),
            host_buffer_semantics: sys::PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
            device: device.raw,
        });
        api_call!(
            self.inner.api(),
            PJRT_Client_BufferFromHostBuffer,
            &mut args
        )?;
        if !args.done_with_host_buffer.is_null() {
            // SAFETY: an owned event; with "only during call" semantics it is already done.
            drop(unsafe { Event::from_raw(*self.inner.api(), args.done_with_host_buffer) });
        }
        // SAFETY: a fresh, owned buffer of this client.
        Ok(unsafe { Buffer::from_raw(self.inner.clone(), args.buffer) })
    }

    /// The allocator statistics of a device; an `Unimplemented` error where the plugin has none.
    pub fn device_memory_stats(&self, device: &Device) -> Result<DeviceMemoryStats> {
        let mut args = args!(PJRT_Device_MemoryStats_Args { device: device.raw });
        api_call!(self.inner.api(), PJRT_Device_MemoryStats, &mut args)?;
        Ok(DeviceMemoryStats {
            bytes_in_use: args.bytes_in_use,
            peak_bytes_in_use: args
                .peak_bytes_in_use_is_set
                .then_some(args.peak_bytes_in_use),
            bytes_limit: args.bytes_limit_is_set.then_some(args.bytes_limit),
        })
    }
}

fn platform_string(api: &Api, client: *mut sys::PJRT_Client, name: bool) -> Result<String> {
    if name {
        let mut args = args!(PJRT_Client_PlatformName_Args { client: client });
        api_call!(api, PJRT_Client_PlatformName, &mut args)?;
        // SAFETY: the string is owned by the client and valid while it lives.
        Ok(unsafe { crate::api::lossy_string(args.platform_name, args.platform_name_size) })
    } else {
        let mut args = args!(PJRT_Client_PlatformVersion_Args { client: client });
        api_call!(api, PJRT_Client_PlatformVersion, &mut args)?;
        // SAFETY: as above.
        Ok(unsafe { crate::api::lossy_string(args.platform_version, args.platform_version_size) })
    }
}

fn addressable_devices(api: &Api, client: *mut sys::PJRT_Client) -> Result<Vec<Device>> {
    let mut args = args!(PJRT_Client_AddressableDevices_Args { client: client });
    api_call!(api, PJRT_Client_AddressableDevices, &mut args)?;
    let mut devices = Vec::with_capacity(args.num_addressable_devices);
    for i in 0..args.num_addressable_devices {
        // SAFETY: the client returned this many device pointers.
        let raw = unsafe { *args.addressable_devices.add(i) };
        let mut description = args!(PJRT_Device_GetDescription_Args { device: raw });
        api_call!(api, PJRT_Device_GetDescription, &mut description)?;
        let mut id_args = args!(PJRT_DeviceDescription_Id_Args {
            device_description: description.device_description,
        });
        api_call!(api, PJRT_DeviceDescription_Id, &mut id_args)?;
        let mut kind_args = args!(PJRT_DeviceDescription_Kind_Args {
            device_description: description.device_description,
        });
        api_call!(api, PJRT_DeviceDescription_Kind, &mut kind_args)?;
        // SAFETY: owned by the device description, which lives as long as the client.
        let kind =
            unsafe { crate::api::lossy_string(kind_args.device_kind, kind_args.device_kind_size) };
        devices.push(Device {
            raw,
            id: id_args.id,
            kind,
        });
    }
    Ok(devices)
}
