//! Storages: runs of bytes that PyTorch aliases, each holding one value (an array of its native
//! element type, fixed by its first typed use).

use liveness::NodeOutput;
use ops::{DType, TensorType};

/// A storage handle; never reused within a process (so it can double as PyTorch's `data_ptr`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageId(pub u64);

/// What a storage currently holds.
#[derive(Clone, Debug)]
pub(crate) enum StorageValue<V> {
    /// Never written: reads as zeros.
    Uninit,
    /// A device value (possibly still being computed).
    Device { value: V, ty: TensorType },
    /// The output of a pending op (whose meta has its type).
    Pending { out: NodeOutput },
}

#[derive(Clone, Debug)]
pub(crate) struct Storage<V> {
    pub nbytes: u64,
    pub native: Option<DType>,
    pub value: StorageValue<V>,
    /// Bumped on every write, so a pending op that read the old value keeps reading it.
    pub version: u64,
}
