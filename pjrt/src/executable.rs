//! `PJRT_LoadedExecutable`: execution with N arguments and M results, serialization, compiled
//! memory statistics.

use crate::api::{api_call, args};
use crate::buffer::Buffer;
use crate::client::ClientInner;
use crate::error::{Error, Result};
use crate::event::Event;
use pjrt_sys as sys;
use std::sync::Arc;

/// An executable compiled or deserialized for one device; destroyed on drop.
pub struct LoadedExecutable {
    client: Arc<ClientInner>,
    raw: *mut sys::PJRT_LoadedExecutable,
    num_outputs: usize,
    /// Scratch bytes one execution needs besides its arguments and results (0 when the plugin
    /// does not say).
    temp_bytes: u64,
}

// SAFETY: PJRT loaded executables may be executed concurrently from several threads.
unsafe impl Send for LoadedExecutable {}
unsafe impl Sync for LoadedExecutable {}

impl std::fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedExecutable")
            .field("num_outputs", &self.num_outputs)
            .finish()
    }
}

/// What `GetCompiledMemoryStats` reports for one executable, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompiledMemoryStats {
    pub generated_code_bytes: i64,
    pub argument_bytes: i64,
    pub output_bytes: i64,
    pub alias_bytes: i64,
    pub temp_bytes: i64,
    pub peak_bytes: i64,
}

/// Per-call execution options.
#[derive(Clone, Debug, Default)]
pub struct ExecuteOptions {
    /// Argument indices that must not be donated even if the module aliases them to an output.
    pub non_donatable: Vec<i64>,
    /// The device to run on; needed by a portable executable, which has no device of its own
    /// (`None`: the device it was compiled for).
    pub device: Option<crate::client::Device>,
}

/// A borrowed `PJRT_Executable` (the unloaded view of a loaded one), destroyed on drop.
struct ExecutableView<'a> {
    owner: &'a LoadedExecutable,
    raw: *mut sys::PJRT_Executable,
}

impl Drop for ExecutableView<'_> {
    fn drop(&mut self) {
        let mut args = args!(PJRT_Executable_Destroy_Args {
            executable: self.raw
        });
        let _: Result<()> = api_call!(self.owner.client.api(), PJRT_Executable_Destroy, &mut args);
    }
}

impl LoadedExecutable {
    /// # Safety
    /// `raw` must be an owned loaded executable of `client`.
    pub(crate) unsafe fn from_raw(
        client: Arc<ClientInner>,
        raw: *mut sys::PJRT_LoadedExecutable,
    ) -> Result<LoadedExecutable> {
        let mut exe = LoadedExecutable {
            client,
            raw,
            num_outputs: 0,
            temp_bytes: 0,
        };
        let view = exe.view()?;
        let mut args = args!(PJRT_Executable_NumOutputs_Args {
            executable: view.raw
        });
        api_call!(exe.client.api(), PJRT_Executable_NumOutputs, &mut args)?;
        drop(view);
        exe.num_outputs = args.num_outputs;
        exe.temp_bytes = exe
            .compiled_memory_stats()
            .map_or(0, |stats| stats.temp_bytes.max(0) as u64);
        Ok(exe)
    }

    fn view(&self) -> Result<ExecutableView<'_>> {
        let mut args = args!(PJRT_LoadedExecutable_GetExecutable_Args {
            loaded_executable: self.raw
        });
        api_call!(
            self.client.api(),
            PJRT_LoadedExecutable_GetExecutable,
            &mut args
        )?;
        Ok(ExecutableView {
            owner: self,
            raw: args.executable,
        })
    }

    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Scratch bytes one execution needs besides its arguments and results.
    pub fn temp_bytes(&self) -> u64 {
        self.temp_bytes
    }

    /// Runs the executable; the results may still be computing when this returns (each result
    /// buffer's ready event, or `wait_ready`, tells when they are done).
    pub fn execute(&self, arguments: &[&Buffer]) -> Result<Vec<Buffer>> {
        Ok(self.execute_with(arguments, &ExecuteOptions::default())?.0)
    }

    /// Runs the executable; returns its results and an event for the whole execution.
    pub fn execute_with(
        &self,
        arguments: &[&Buffer],
        options: &ExecuteOptions,
    ) -> Result<(Vec<Buffer>, Option<Event>)> {
        let raw_arguments: Vec<*mut sys::PJRT_Buffer> = arguments.iter().map(|b| b.raw()).collect();
        let argument_lists: [*const *mut sys::PJRT_Buffer; 1] = [raw_arguments.as_ptr()];
        let mut outputs: Vec<*mut sys::PJRT_Buffer> = vec![std::ptr::null_mut(); self.num_outputs];
        let output_lists: [*mut *mut sys::PJRT_Buffer; 1] = [outputs.as_mut_ptr()];
        let mut complete_events: [*mut sys::PJRT_Event; 1] = [std::ptr::null_mut()];
        let mut execute_options = args!(PJRT_ExecuteOptions {
            non_donatable_input_indices: options.non_donatable.as_ptr(),
            num_non_donatable_input_indices: options.non_donatable.len(),
        });
        let mut args = args!(PJRT_LoadedExecutable_Execute_Args {
            executable: self.raw,
            options: &mut execute_options,
            argument_lists: argument_lists.as_ptr(),
            num_devices: 1,
            num_args: raw_arguments.len(),
            output_lists: output_lists.as_ptr(),
            device_complete_events: complete_events.as_mut_ptr(),
            execute_device: options
                .device
                .as_ref()
                .map_or(std::ptr::null_mut(), |device| device.raw),
        });
        api_call!(self.client.api(), PJRT_LoadedExecutable_Execute, &mut args)?;
        // Donated arguments became results: they leave the ledger before the results join it.
        for (index, argument) in arguments.iter().enumerate() {
            if !options.non_donatable.contains(&(index as i64)) {
                argument.settle_if_donated();
            }
        }
        let results = outputs
            .into_iter()
            // SAFETY: each is a fresh, owned buffer of this client.
            .map(|raw| unsafe { Buffer::from_raw(self.client.clone(), raw) })
            .collect();
        // Arguments and results are live now; the scratch joins them while the program runs.
        self.client.memory.note_execution(self.temp_bytes);
        let event = (!complete_events[0].is_null())
            // SAFETY: an owned event of this plugin.
            .then(|| unsafe { Event::from_raw(*self.client.api(), complete_events[0]) });
        Ok((results, event))
    }

    /// Runs a program compiled for `argument_lists.len()` replicas: list `i` holds replica `i`'s
    /// arguments, on the device that replica runs on. Returns each replica's results, ready
    /// (collectives make the replicas finish together, so waiting costs nothing extra).
    pub fn execute_replicated(&self, argument_lists: &[Vec<&Buffer>]) -> Result<Vec<Vec<Buffer>>> {
        let replicas = argument_lists.len();
        let num_args = argument_lists.first().map_or(0, Vec::len);
        if replicas == 0 || argument_lists.iter().any(|list| list.len() != num_args) {
            return Err(Error::InvalidArgument(format!(
                "execute_replicated: every replica needs the same number of arguments, got \
                 {:?}",
                argument_lists.iter().map(Vec::len).collect::<Vec<_>>()
            )));
        }
        let raw_lists: Vec<Vec<*mut sys::PJRT_Buffer>> = argument_lists
            .iter()
            .map(|list| list.iter().map(|b| b.raw()).collect())
            .collect();
        let raw_list_ptrs: Vec<*const *mut sys::PJRT_Buffer> =
            raw_lists.iter().map(|list| list.as_ptr()).collect();
        let mut outputs: Vec<Vec<*mut sys::PJRT_Buffer>> =
            vec![vec![std::ptr::null_mut(); self.num_outputs]; replicas];
        let output_ptrs: Vec<*mut *mut sys::PJRT_Buffer> =
            outputs.iter_mut().map(|list| list.as_mut_ptr()).collect();
        let mut complete_events: Vec<*mut sys::PJRT_Event> = vec![std::ptr::null_mut(); replicas];
        // Replicated arguments are never donated: each belongs to its caller.
        let non_donatable: Vec<i64> = (0..num_args as i64).collect();
        let mut execute_options = args!(PJRT_ExecuteOptions {
            non_donatable_input_indices: non_donatable.as_ptr(),
            num_non_donatable_input_indices: non_donatable.len(),
        });
        let mut args = args!(PJRT_LoadedExecutable_Execute_Args {
            executable: self.raw,
            options: &mut execute_options,
            argument_lists: raw_list_ptrs.as_ptr(),
            num_devices: replicas,
            num_args: num_args,
            output_lists: output_ptrs.as_ptr(),
            device_complete_events: complete_events.as_mut_ptr(),
        });
        api_call!(self.client.api(), PJRT_LoadedExecutable_Execute, &mut args)?;
        let results: Vec<Vec<Buffer>> = outputs
            .into_iter()
            .map(|list| {
                list.into_iter()
                    // SAFETY: each is a fresh, owned buffer of this client.
                    .map(|raw| unsafe { Buffer::from_raw(self.client.clone(), raw) })
                    .collect()
            })
            .collect();
        for raw in complete_events.into_iter().filter(|e| !e.is_null()) {
            // SAFETY: an owned event of this plugin.
            unsafe { Event::from_raw(*self.client.api(), raw) }.wait()?;
        }
        Ok(results)
    }

    /// Serializes the executable for `Client::deserialize` on the same plugin build.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let view = self.view()?;
        let mut args = args!(PJRT_Executable_Serialize_Args {
            executable: view.raw
        });
        api_call!(self.client.api(), PJRT_Executable_Serialize, &mut args)?;
        let bytes = if args.serialized_bytes.is_null() {
            Vec::new()
        } else {
            // SAFETY: valid until the deleter runs below.
            unsafe {
                std::slice::from_raw_parts(
                    args.serialized_bytes as *const u8,
                    args.serialized_bytes_size,
                )
            }
            .to_vec()
        };
        if let Some(deleter) = args.serialized_executable_deleter {
            // SAFETY: the plugin asks us to release its serialization with this deleter.
            unsafe { deleter(args.serialized_executable) };
        }
        if bytes.is_empty() {
            return Err(Error::InvalidArgument(
                "the plugin returned an empty serialized executable".to_string(),
            ));
        }
        Ok(bytes)
    }

    /// The compiled executable's memory needs (argument, output, temp, code bytes).
    pub fn compiled_memory_stats(&self) -> Result<CompiledMemoryStats> {
        let view = self.view()?;
        let mut args = args!(PJRT_Executable_GetCompiledMemoryStats_Args {
            executable: view.raw
        });
        api_call!(
            self.client.api(),
            PJRT_Executable_GetCompiledMemoryStats,
            &mut args
        )?;
        Ok(CompiledMemoryStats {
            generated_code_bytes: args.generated_code_size_in_bytes,
            argument_bytes: args.argument_size_in_bytes,
            output_bytes: args.output_size_in_bytes,
            alias_bytes: args.alias_size_in_bytes,
            temp_bytes: args.temp_size_in_bytes,
            peak_bytes: args.peak_memory_in_bytes,
        })
    }
}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let mut args = args!(PJRT_LoadedExecutable_Destroy_Args {
            executable: self.raw
        });
        let _: Result<()> = api_call!(self.client.api(), PJRT_LoadedExecutable_Destroy, &mut args);
    }
}
