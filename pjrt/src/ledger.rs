//! The client's own accounting of device memory: bytes held by live buffers, and the peak of
//! those plus each running executable's temporary bytes. Plugins' allocator statistics are
//! optional (the CPU plugin has none), so this is what a peak-memory figure can always rest on.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live and peak bytes of one client's buffers.
#[derive(Debug, Default)]
pub(crate) struct MemoryLedger {
    live: AtomicU64,
    peak: AtomicU64,
}

/// A reading of the ledger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bytes of the buffers alive now.
    pub live_bytes: u64,
    /// The most bytes live at once since the client started (or the last reset), counting an
    /// executable's temporary buffers while it runs.
    pub peak_bytes: u64,
}

impl MemoryLedger {
    pub(crate) fn allocate(&self, bytes: u64) {
        let live = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(live, Ordering::Relaxed);
    }

    pub(crate) fn release(&self, bytes: u64) {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// An execution that needs `temp_bytes` of scratch on top of what is live (its arguments
    /// and, by now, its results).
    pub(crate) fn note_execution(&self, temp_bytes: u64) {
        let live = self.live.load(Ordering::Relaxed);
        self.peak.fetch_max(live + temp_bytes, Ordering::Relaxed);
    }

    pub(crate) fn usage(&self) -> MemoryUsage {
        MemoryUsage {
            live_bytes: self.live.load(Ordering::Relaxed),
            peak_bytes: self.peak.load(Ordering::Relaxed),
        }
    }

    /// Starts a new peak from what is live now.
    pub(crate) fn reset_peak(&self) {
        self.peak
            .store(self.live.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_follows_live_and_temporaries() {
        let ledger = MemoryLedger::default();
        ledger.allocate(100);
        ledger.allocate(50);
        ledger.release(100);
        assert_eq!(
            ledger.usage(),
            MemoryUsage {
                live_bytes: 50,
                peak_bytes: 150
            }
        );
        ledger.note_execution(200);
        assert_eq!(ledger.usage().peak_bytes, 250);
        ledger.reset_peak();
        assert_eq!(
            ledger.usage(),
            MemoryUsage {
                live_bytes: 50,
                peak_bytes: 50
            }
        );
    }
}
