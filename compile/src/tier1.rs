//! Tier 1: the in-process map key → loaded executable, bounded, least recently used evicted.
//!
//! Lookups run on every op in Strict mode, so they take only a read lock and stamp the entry
//! with an atomic clock; the O(n) search for the oldest entry happens on insertion, which follows
//! a compile or a deserialization that costs milliseconds anyway.

use crate::key::CacheKey;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Keys are already uniformly distributed hashes: mixing their words is enough (in memory only).
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(23) ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(crate) type KeyMap<V> = HashMap<CacheKey, V, BuildHasherDefault<KeyHasher>>;

struct Slot<V> {
    value: V,
    last_used: AtomicU64,
    /// Lookups that found this entry.
    hits: AtomicU64,
}

pub(crate) struct Tier1<V> {
    map: RwLock<KeyMap<Slot<V>>>,
    capacity: usize,
    clock: AtomicU64,
}

impl<V: Clone> Tier1<V> {
    pub(crate) fn new(capacity: usize) -> Tier1<V> {
        Tier1 {
            map: RwLock::new(KeyMap::default()),
            capacity: capacity.max(1),
            clock: AtomicU64::new(0),
        }
    }

    pub(crate) fn get(&self, key: &CacheKey) -> Option<V> {
        self.get_counted(key).map(|(value, _)| value)
    }

    /// [`Tier1::get`], with how many lookups (this one included) have found the entry.
    pub(crate) fn get_counted(&self, key: &CacheKey) -> Option<(V, u64)> {
        let map = self.map.read();
        let slot = map.get(key)?;
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        slot.last_used.store(now, Ordering::Relaxed);
        let hits = slot.hits.fetch_add(1, Ordering::Relaxed) + 1;
        Some((slot.value.clone(), hits))
    }

    /// Inserts or replaces; returns how many entries were evicted to make room.
    pub(crate) fn insert(&self, key: CacheKey, value: V) -> u64 {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut map = self.map.write();
        let mut evicted = 0;
        if !map.contains_key(&key) {
            while map.len() >= self.capacity {
                let oldest = map
                    .iter()
                    .min_by_key(|(_, slot)| slot.last_used.load(Ordering::Relaxed))
                    .map(|(k, _)| *k);
                match oldest {
                    Some(oldest) => {
                        map.remove(&oldest);
                        evicted += 1;
                    }
                    None => break,
                }
            }
        }
        map.insert(
            key,
            Slot {
                value,
                last_used: AtomicU64::new(now),
                hits: AtomicU64::new(0),
            },
        );
        evicted
    }

    /// Evicts the least recently used entries until `keep` remain; returns how many went.
    pub(crate) fn shrink_to(&self, keep: usize) -> u64 {
        let mut map = self.map.write();
        if map.len() <= keep {
            return 0;
        }
        let mut by_age: Vec<(u64, CacheKey)> = map
            .iter()
            .map(|(k, slot)| (slot.last_used.load(Ordering::Relaxed), *k))
            .collect();
        by_age.sort_unstable_by_key(|(age, _)| *age);
        let excess = map.len() - keep;
        for (_, key) in by_age.into_iter().take(excess) {
            map.remove(&key);
        }
        excess as u64
    }

    /// Every entry's key and how many lookups found it.
    pub(crate) fn hits(&self) -> Vec<(CacheKey, u64)> {
        self.map
            .read()
            .iter()
            .map(|(k, slot)| (*k, slot.hits.load(Ordering::Relaxed)))
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.read().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> CacheKey {
        CacheKey::new(i, 0, 0)
    }

    #[test]
    fn least_recently_used_is_evicted() {
        let cache = Tier1::new(2);
        assert_eq!(cache.insert(key(1), 10), 0);
        assert_eq!(cache.insert(key(2), 20), 0);
        assert_eq!(cache.get(&key(1)), Some(10)); // 2 is now the oldest
        assert_eq!(cache.insert(key(3), 30), 1);
        assert_eq!(cache.get(&key(2)), None);
        assert_eq!(cache.get(&key(1)), Some(10));
        assert_eq!(cache.get(&key(3)), Some(30));
        assert_eq!(cache.len(), 2);
        // Replacing an entry evicts nothing.
        assert_eq!(cache.insert(key(3), 31), 0);
        assert_eq!(cache.get(&key(3)), Some(31));
    }

    #[test]
    fn shrinking_keeps_the_most_recently_used() {
        let cache = Tier1::new(10);
        for i in 0..6 {
            cache.insert(key(i), i);
        }
        cache.get(&key(0));
        assert_eq!(cache.shrink_to(8), 0);
        assert_eq!(cache.shrink_to(3), 3);
        assert_eq!(cache.get(&key(0)), Some(0));
        assert_eq!(cache.get(&key(5)), Some(5));
        assert_eq!(cache.get(&key(4)), Some(4));
        assert_eq!(cache.get(&key(1)), None);
    }
}
