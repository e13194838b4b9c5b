//! The client's own accounting of device memory: bytes held by live buffers, and the peak of
//! those plus each running executable's temporary bytes. Plugins' allocator statistics are
//! optional (the CPU plugin has none), so this is what a peak-memory figure can always rest on.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    /// Set while this thread does the client's own work (a warm-up), which is not the user's
    /// memory: buffers made and programs run meanwhile stay out of the ledger.
    static UNTRACKED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's buffers and executions kept out of the ledger.
pub(crate) fn untracked<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            UNTRACKED.with(|u| u.set(self.0));
        }
    }
    let _restore = Restore(UNTRACKED.with(|u| u.replace(true)));
    f()
}

/// Whether this thread's buffers and executions count in the ledger now.
pub(crate) fn tracking() -> bool {
    !UNTRACKED.with(|u| u.get())
}

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
        if !tracking() {
            return;
        }
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
        untracked(|| {
            assert!(!tracking());
            ledger.note_execution(1000);
        });
        assert!(tracking());
        assert_eq!(
            ledger.usage(),
            MemoryUsage {
                live_bytes: 50,
                peak_bytes: 50
            }
        );
    }
}
