//! Storages: runs of bytes that PyTorch aliases, each holding one value (an array of its native
//! element type, fixed by its first typed use).

use liveness::NodeOutput;
use ops::{DType, TensorType};

/// A storage handle: a slot index and a generation (see `StorageSlots`); never reused within a
/// process.
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
    /// The device (an index among the process's devices) that holds the storage's value.
    pub device: u32,
    pub native: Option<DType>,
    pub value: StorageValue<V>,
    /// Bumped on every write, so a pending op that read the old value keeps reading it.
    pub version: u64,
    /// Set while the value is padded to a bucket along a growing extent (`crate::bucket`);
    /// every other write clears it.
    pub padding: Option<std::sync::Arc<crate::bucket::Padding>>,
    /// The elements the host knows the storage holds, valid while their version is the
    /// storage's (`crate::graph::known`).
    pub known: Option<Box<crate::graph::KnownValues>>,
}

/// The engine's storages, in slots addressed by their ids: a storage is looked up several
/// times per captured op, and an index is cheaper than a hash probe. A freed slot is reused
/// under a new generation, so an id is still never reused: a stale id finds nothing.
#[derive(Debug)]
pub(crate) struct StorageSlots<V> {
    slots: Vec<Slot<V>>,
    /// The empty slots: every slot not listed here holds a storage.
    free: Vec<u32>,
}

#[derive(Debug)]
struct Slot<V> {
    /// Starts at 1, so no id is 0 (the ABI's "no storage").
    generation: u32,
    storage: Option<Storage<V>>,
}

impl<V> Default for StorageSlots<V> {
    fn default() -> Self {
        StorageSlots {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<V> StorageSlots<V> {
    /// (slot index, generation) of an id.
    #[inline]
    fn split(id: StorageId) -> (usize, u32) {
        ((id.0 & 0xffff_ffff) as usize, (id.0 >> 32) as u32)
    }

    pub fn insert(&mut self, storage: Storage<V>) -> StorageId {
        match self.free.pop() {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                slot.generation = slot
                    .generation
                    .checked_add(1)
                    .expect("storage slot generations exhausted");
                slot.storage = Some(storage);
                StorageId(((slot.generation as u64) << 32) | index as u64)
            }
            None => {
                let index = u32::try_from(self.slots.len()).expect("too many live storages");
                self.slots.push(Slot {
                    generation: 1,
                    storage: Some(storage),
                });
                StorageId((1u64 << 32) | index as u64)
            }
        }
    }

    #[inline]
    pub fn get(&self, id: &StorageId) -> Option<&Storage<V>> {
        let (index, generation) = Self::split(*id);
        match self.slots.get(index) {
            Some(slot) if slot.generation == generation => slot.storage.as_ref(),
            _ => None,
        }
    }

    #[inline]
    pub fn get_mut(&mut self, id: &StorageId) -> Option<&mut Storage<V>> {
        let (index, generation) = Self::split(*id);
        match self.slots.get_mut(index) {
            Some(slot) if slot.generation == generation => slot.storage.as_mut(),
            _ => None,
        }
    }

    pub fn remove(&mut self, id: &StorageId) -> Option<Storage<V>> {
        let (index, generation) = Self::split(*id);
        let slot = self.slots.get_mut(index)?;
        if slot.generation != generation {
            return None;
        }
        let storage = slot.storage.take()?;
        self.free.push(index as u32);
        Some(storage)
    }

    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn storage(nbytes: u64) -> Storage<()> {
        Storage {
            nbytes,
            device: 0,
            native: None,
            value: StorageValue::Uninit,
            version: 0,
            padding: None,
            known: None,
        }
    }

    #[test]
    fn ids_are_never_reused_and_stale_ids_find_nothing() {
        let mut slots = StorageSlots::default();
        let a = slots.insert(storage(4));
        let b = slots.insert(storage(8));
        assert_ne!(a, b);
        assert_ne!(a.0, 0);
        assert_eq!(slots.len(), 2);
        assert_eq!(slots.remove(&a).map(|s| s.nbytes), Some(4));
        assert!(slots.get(&a).is_none());
        assert!(slots.remove(&a).is_none());
        // The freed slot comes back under a new id.
        let c = slots.insert(storage(16));
        assert_ne!(c, a);
        assert!(slots.get(&a).is_none());
        assert_eq!(slots.get(&c).map(|s| s.nbytes), Some(16));
        assert_eq!(slots.get(&b).map(|s| s.nbytes), Some(8));
        slots.get_mut(&b).unwrap().nbytes = 9;
        assert_eq!(slots.get(&b).map(|s| s.nbytes), Some(9));
        assert_eq!(slots.len(), 2);
        // Ids that were never handed out find nothing either.
        assert!(slots.get(&StorageId(0)).is_none());
        assert!(slots.get(&StorageId((7u64 << 32) | 1)).is_none());
        assert!(slots.get(&StorageId(1u64 << 40)).is_none());
    }
}
