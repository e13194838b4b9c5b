//! `PJRT_Event`: completion of an asynchronous transfer or execution.

use crate::api::{api_call, args, Api};
use crate::error::{Error, Result};
use pjrt_sys as sys;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// An owned PJRT event; destroyed on drop.
pub struct Event {
    api: Api,
    raw: *mut sys::PJRT_Event,
}

// SAFETY: PJRT events may be awaited, queried and destroyed from any thread.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

type ReadyCallback = Box<dyn FnOnce(Result<()>) + Send + 'static>;

struct CallbackState {
    api: Api,
    callback: ReadyCallback,
}

unsafe extern "C" fn on_ready_trampoline(error: *mut sys::PJRT_Error, user_arg: *mut c_void) {
    // SAFETY: `user_arg` is the box leaked by `on_ready`, handed back exactly once.
    let state = unsafe { Box::from_raw(user_arg as *mut CallbackState) };
    let result = if error.is_null() {
        Ok(())
    } else {
        // The callback owns `error`; `take_error` destroys it.
        Err(state.api.take_error(error, "PJRT_Event_OnReady"))
    };
    let callback = state.callback;
    // A panic must not unwind into the plugin's thread.
    let _ = catch_unwind(AssertUnwindSafe(move || callback(result)));
}

impl Event {
    /// # Safety
    /// `raw` must be an owned event from the plugin behind `api`.
    pub(crate) unsafe fn from_raw(api: Api, raw: *mut sys::PJRT_Event) -> Event {
        Event { api, raw }
    }

    /// Blocks until the event is ready; returns its error, if any.
    pub fn wait(&self) -> Result<()> {
        let mut args = args!(PJRT_Event_Await_Args { event: self.raw });
        api_call!(&self.api, PJRT_Event_Await, &mut args)
    }

    /// Whether the event has completed (with or without error).
    pub fn is_ready(&self) -> Result<bool> {
        let mut args = args!(PJRT_Event_IsReady_Args { event: self.raw });
        api_call!(&self.api, PJRT_Event_IsReady, &mut args)?;
        Ok(args.is_ready)
    }

    /// Runs `callback` once the event is ready, possibly on a plugin thread, possibly at once.
    /// A panic inside the callback is caught, never crossing into the plugin.
    pub fn on_ready(&self, callback: impl FnOnce(Result<()>) + Send + 'static) -> Result<()> {
        let state = Box::into_raw(Box::new(CallbackState {
            api: self.api,
            callback: Box::new(callback),
        }));
        let mut args = args!(PJRT_Event_OnReady_Args {
            event: self.raw,
            callback: Some(on_ready_trampoline),
            user_arg: state as *mut c_void,
        });
        let result = api_call!(&self.api, PJRT_Event_OnReady, &mut args);
        if result.is_err() {
            // The plugin did not take the callback: reclaim it.
            // SAFETY: `state` was not handed to the plugin.
            drop(unsafe { Box::from_raw(state) });
        }
        result
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let mut args = args!(PJRT_Event_Destroy_Args { event: self.raw });
        let _: Result<(), Error> = api_call!(&self.api, PJRT_Event_Destroy, &mut args);
    }
}
