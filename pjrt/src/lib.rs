//! Safe wrapper over the PJRT C API: plugin loading, client, devices, buffers, executables, events.
//!
//! Every call checks that the plugin's function table is long enough to hold the function
//! (an older plugin gives an `Unimplemented` error instead of a read past its table), every
//! `PJRT_Error` is converted and destroyed, and no panic crosses into the plugin.

mod api;
mod buffer;
mod client;
mod compile_options;
mod element_type;
mod error;
mod event;
mod executable;
mod ledger;
mod named_value;
mod plugin;

pub use buffer::Buffer;
pub use client::{Client, Device, DeviceMemoryStats};
pub use compile_options::{CompileOptions, CompileOverride};
pub use element_type::ElementType;
pub use error::{Error, ErrorCode, Result};
pub use event::Event;
pub use executable::{CompiledMemoryStats, ExecuteOptions, LoadedExecutable};
pub use ledger::MemoryUsage;
pub use named_value::NamedValue;
pub use plugin::{configured_plugin_name, resolve_plugin_path, site_package_dirs, Plugin};

/// The PJRT C API version these bindings were generated from, as (major, minor).
pub const BUILT_API_VERSION: (i32, i32) = (
    pjrt_sys::PJRT_API_MAJOR as i32,
    pjrt_sys::PJRT_API_MINOR as i32,
);
