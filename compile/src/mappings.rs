//! The process's memory-mapping budget. Each executable a CPU compiler JIT-compiles maps its code
//! and data sections into this process, several mappings per kernel; Linux caps mappings per
//! process (`vm.max_map_count`, 65,530 by default), and LLVM aborts the process when a section
//! cannot be mapped. Tier 1 therefore also evicts when the mappings near that cap, whatever its
//! entry count says.

use std::sync::atomic::{AtomicU64, Ordering};

/// Insertions between two counts of the mappings: counting reads `/proc/self/maps` (a few
/// milliseconds at tens of thousands of mappings), and each insertion follows a compile or a
/// deserialization that costs at least as much.
const CHECK_EVERY: u64 = 32;

/// Share of `vm.max_map_count` above which tier 1 gives executables back. Half leaves room for
/// what else maps memory (threads, allocations, libraries) and for the compiles in flight.
const PRESSURE_SHARE: f64 = 0.5;

pub(crate) struct MappingBudget {
    /// Mappings above which to evict; `None` where the count cannot be read (not Linux).
    threshold: Option<u64>,
    insertions: AtomicU64,
}

impl MappingBudget {
    pub(crate) fn from_system() -> MappingBudget {
        let limit = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok());
        let readable = count_mappings().is_some();
        MappingBudget::with_threshold(
            limit
                .filter(|_| readable)
                .map(|limit| (limit as f64 * PRESSURE_SHARE) as u64),
        )
    }

    pub(crate) fn with_threshold(threshold: Option<u64>) -> MappingBudget {
        MappingBudget {
            threshold,
            insertions: AtomicU64::new(0),
        }
    }

    /// Called after each tier-1 insertion: true when this one is due for a count and the
    /// process holds more mappings than the budget allows.
    pub(crate) fn over_budget(&self) -> bool {
        let Some(threshold) = self.threshold else {
            return false;
        };
        let n = self.insertions.fetch_add(1, Ordering::Relaxed) + 1;
        n.is_multiple_of(CHECK_EVERY)
            && count_mappings().is_some_and(|mappings| mappings > threshold)
    }
}

/// The number of memory mappings of this process (lines of `/proc/self/maps`).
pub(crate) fn count_mappings() -> Option<u64> {
    let bytes = std::fs::read("/proc/self/maps").ok()?;
    Some(bytes.iter().filter(|&&b| b == b'\n').count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_taken_every_few_insertions_and_compared_with_the_threshold() {
        let Some(now) = count_mappings() else {
            return; // Not Linux: nothing to count.
        };
        assert!(now > 0);
        let tight = MappingBudget::with_threshold(Some(1));
        let verdicts: Vec<bool> = (0..CHECK_EVERY * 2).map(|_| tight.over_budget()).collect();
        assert_eq!(verdicts.iter().filter(|&&v| v).count(), 2);
        assert!(verdicts[CHECK_EVERY as usize - 1]);
        let roomy = MappingBudget::with_threshold(Some(u64::MAX));
        assert!((0..CHECK_EVERY * 2).all(|_| !roomy.over_budget()));
        let unknown = MappingBudget::with_threshold(None);
        assert!((0..CHECK_EVERY * 2).all(|_| !unknown.over_budget()));
    }
}
