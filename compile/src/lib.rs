//! Compilation and execution services for the engine: an async compile thread pool in front of a
//! three-tier executable cache, and an ordered execution queue.
//!
//! * [`Compiler`] takes a [`CacheKey`] and a closure that builds the StableHLO text. Tier 1 is an
//!   in-process LRU map, tier 2 a host-local shared directory (`TORCH_PJRT_SHARED_CACHE`), tier 3
//!   a persistent directory (`TORCH_PJRT_CACHE_DIR`). The text is built only on a miss in every
//!   tier; concurrent requests for one key compile once.
//! * [`ExecQueue`] runs executions and closures in order on one worker thread; values flow
//!   between jobs as [`DeviceValue`] futures, and errors flow with them.
//! * [`trace`] records, while a profiler asks for it, what both of them did and when.
//!
//! This crate decides nothing about what to compile: keys and module text come from the caller.

mod compiler;
mod config;
mod cpu;
pub mod disk;
mod error;
mod exec;
mod handle;
mod key;
mod mappings;
mod tier1;
pub mod trace;

pub use compiler::{
    CompileHandle, CompileStats, CompiledProgram, Compiler, ProgramStats, RECENT_COMPILES_KEPT,
};
pub use config::{
    default_overrides_for, fast_overrides_for, longest_reduction, quick_overrides_for,
    short_reduction_overrides_for, CompileConfig, Effort, DEFAULT_SHARED_DIR,
    DEFAULT_TIER1_CAPACITY, LONGEST_REDUCTION_ATTR, SHORT_REDUCTION_MAX,
};
pub use cpu::{cpu_features_hash, host_cpu_features, host_cpu_features_hash};
pub use error::{CompileError, ExecError};
pub use exec::{
    wait_all_ready, DeviceValue, ExecJob, ExecQueue, ExecStats, HostArgument, QueueMark,
    WeakDeviceValue,
};
pub use key::{options_fingerprint, CacheKey, FingerprintInputs};

#[cfg(test)]
mod tests {
    fn shareable<T: Send + Sync>() {}

    #[test]
    fn public_types_are_shareable_between_threads() {
        shareable::<crate::Compiler>();
        shareable::<crate::CompileHandle>();
        shareable::<crate::ExecQueue>();
        shareable::<crate::DeviceValue>();
        shareable::<crate::ExecJob>();
        shareable::<crate::CompileError>();
        shareable::<crate::ExecError>();
    }
}
