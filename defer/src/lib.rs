//! Capture: storages (PyTorch's unit of aliasing), the graph of deferred ops, the process-wide
//! eager mode, and the planning of each materialization into a fused region.
//!
//! The crate never calls PJRT: a storage's device value is an opaque `V` (the engine's future of
//! a device buffer), so every rule here is testable with plain values.

pub mod bucket;
pub mod fail_point;
mod graph;
mod memory_cut;
mod mode;
pub mod signature;
mod storage;

pub use graph::{
    isolation_cuts, Captured, CapturedOutputs, CheckSite, EngineError, ErrorKind, ExternalValue,
    Flush, FlushRequest, Graph, GraphStats, HostGather, OpCall, PlannedRegion, Prologue,
    ReadSource, RegionSize, RegionSource, Regrow, TensorRef,
};
pub use mode::{Mode, ModeStack};
pub use signature::{Change, RegionSignature};
pub use storage::StorageId;
