//! The loaded plugin's function table: checked function lookup, argument-struct construction and
//! `PJRT_Error` conversion.

use crate::error::{Error, ErrorCode, Result};
use pjrt_sys as sys;
use std::ffi::c_char;

/// The `PJRT_Api` table of a loaded plugin. The table lives in the plugin's static data, and the
/// plugin is never unloaded (see `plugin.rs`), so the pointer stays valid for the process.
#[derive(Copy, Clone)]
pub(crate) struct Api {
    raw: *const sys::PJRT_Api,
    /// The plugin file, for error messages. Leaked once per loaded plugin (plugins are never
    /// unloaded either).
    label: &'static str,
}

// SAFETY: the table is immutable after `GetPjrtApi` returns, and the PJRT C API requires its
// functions to be callable from any thread.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

impl Api {
    /// # Safety
    /// `raw` must point to a `PJRT_Api` that stays valid for the rest of the process.
    pub(crate) unsafe fn from_raw(raw: *const sys::PJRT_Api, label: &'static str) -> Api {
        Api { raw, label }
    }

    pub(crate) fn raw(&self) -> *const sys::PJRT_Api {
        self.raw
    }

    pub(crate) fn struct_size(&self) -> usize {
        // SAFETY: `struct_size` is the first field; every table has it.
        unsafe { (*self.raw).struct_size }
    }

    pub(crate) fn version(&self) -> (i32, i32) {
        // SAFETY: `pjrt_api_version` precedes every function pointer and is part of every version.
        let v = unsafe { (*self.raw).pjrt_api_version };
        (v.major_version, v.minor_version)
    }

    /// Whether the plugin's table is long enough to hold the function pointer at `offset`.
    pub(crate) fn covers(&self, offset: usize) -> bool {
        offset + std::mem::size_of::<usize>() <= self.struct_size()
    }

    pub(crate) fn unimplemented(&self, function: &'static str) -> Error {
        let (major, minor) = self.version();
        Error::Unimplemented {
            function,
            plugin: self.label.to_string(),
            major,
            minor,
        }
    }

    /// Converts a returned `PJRT_Error*` into a `Result`, destroying the error.
    pub(crate) fn check(&self, error: *mut sys::PJRT_Error, function: &'static str) -> Result<()> {
        if error.is_null() {
            return Ok(());
        }
        Err(self.take_error(error, function))
    }

    /// Reads code and message out of a non-null `PJRT_Error` and destroys it.
    pub(crate) fn take_error(&self, error: *mut sys::PJRT_Error, function: &'static str) -> Error {
        let mut message_args = sys::PJRT_Error_Message_Args {
            struct_size: sys::PJRT_Error_Message_Args_STRUCT_SIZE as usize,
            error,
            ..Default::default()
        };
        let mut code_args = sys::PJRT_Error_GetCode_Args {
            struct_size: sys::PJRT_Error_GetCode_Args_STRUCT_SIZE as usize,
            error,
            ..Default::default()
        };
        // SAFETY: these three are checked present when the plugin is loaded; `error` is a live
        // error owned by us until the destroy call.
        let (message, code) = unsafe {
            let table = &*self.raw;
            (table.PJRT_Error_Message.unwrap())(&mut message_args);
            let message = lossy_string(message_args.message, message_args.message_size);
            let code_error = (table.PJRT_Error_GetCode.unwrap())(&mut code_args);
            let code = if code_error.is_null() {
                ErrorCode::from_raw(code_args.code)
            } else {
                self.destroy_error(code_error);
                ErrorCode::Unknown
            };
            self.destroy_error(error);
            (message, code)
        };
        Error::Pjrt {
            function,
            code,
            message,
        }
    }

    pub(crate) fn destroy_error(&self, error: *mut sys::PJRT_Error) {
        if error.is_null() {
            return;
        }
        let mut args = sys::PJRT_Error_Destroy_Args {
            struct_size: sys::PJRT_Error_Destroy_Args_STRUCT_SIZE as usize,
            error,
            ..Default::default()
        };
        // SAFETY: checked present at load; `error` is owned by us.
        unsafe { ((*self.raw).PJRT_Error_Destroy.unwrap())(&mut args) };
    }
}

/// Copies a (pointer, length) string out of PJRT memory.
///
/// # Safety
/// `ptr` must point to `len` readable bytes, or be null.
pub(crate) unsafe fn lossy_string(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    let bytes = std::slice::from_raw_parts(ptr as *const u8, len);
    String::from_utf8_lossy(bytes).into_owned()
}

/// Looks up a function in the plugin's table, refusing (instead of reading past the table) when
/// the plugin's `struct_size` does not cover it.
macro_rules! api_fn {
    ($api:expr, $name:ident) => {{
        let api: &$crate::api::Api = $api;
        let offset = ::std::mem::offset_of!(::pjrt_sys::PJRT_Api, $name);
        if api.covers(offset) {
            // SAFETY: the plugin's table is at least `offset + 8` bytes long.
            unsafe { (*api.raw()).$name }.ok_or_else(|| api.unimplemented(stringify!($name)))
        } else {
            Err(api.unimplemented(stringify!($name)))
        }
    }};
}

/// Calls a PJRT function with an argument struct, converting its error. The argument struct must
/// already carry its `struct_size`.
macro_rules! api_call {
    ($api:expr, $name:ident, $args:expr) => {{
        let api: &$crate::api::Api = $api;
        match $crate::api::api_fn!(api, $name) {
            Ok(function) => {
                // SAFETY: the argument struct is fully initialised with the size this build knows;
                // the callee reads only what that size covers.
                let error = unsafe { function($args) };
                api.check(error, stringify!($name))
            }
            Err(e) => Err(e),
        }
    }};
}

/// Builds a zeroed PJRT argument struct with its `struct_size` set from the header.
macro_rules! args {
    ($ty:ident { $($field:ident : $value:expr),* $(,)? }) => {
        ::pjrt_sys::$ty {
            struct_size: ::paste::paste!(::pjrt_sys::[<$ty _STRUCT_SIZE>]) as usize,
            $($field: $value,)*
            ..Default::default()
        }
    };
}

pub(crate) use {api_call, api_fn, args};
