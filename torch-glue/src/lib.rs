//! The torch-pjrt engine: composes capture (`defer`), liveness, fusion (`fuse`), compilation and
//! execution (`compile`, `pjrt`) behind one C ABI used by the PyTorch plugin.

pub mod abi;
pub mod engine;
pub mod global;
pub mod metrics;

pub use engine::{element_type, Engine, EngineConfig, ENGINE_VERSION};
pub use metrics::MetricsSnapshot;
