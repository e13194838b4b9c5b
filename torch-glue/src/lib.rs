//! The torch-pjrt engine: composes capture (`defer`), liveness, fusion (`fuse`), compilation and
//! execution (`compile`, `pjrt`) behind one C ABI used by the PyTorch plugin.

/// The engine allocates and frees small objects on every op, on the caller's thread and on the
/// execution thread (which drops what the caller made); mimalloc's per-thread heaps and free
/// lists keep both cheap and uncontended where glibc's arenas take a lock. Only the engine's
/// own Rust allocations use it: PyTorch and the PJRT plugin keep their allocators.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod abi;
pub mod adaptive;
mod chalf;
pub mod engine;
pub mod global;
mod graph_lock;
pub mod host_heap;
pub mod metrics;
pub mod recompile;

pub use engine::{element_type, Engine, EngineConfig, ENGINE_VERSION};
pub use metrics::MetricsSnapshot;
