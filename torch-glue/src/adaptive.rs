//! DeferAndFuse's fallback to one-op programs for code whose regions never repeat.
//!
//! A fused region pays a compile the first time its key is seen and repays it only when the
//! key comes back. Code that never repeats (a test suite, a notebook, a sweep of dtypes) makes
//! every region new, so DeferAndFuse compiles a program per region where Strict reuses one
//! program per op: a promotion sweep ran 5-10x slower fused than op by op. When the last
//! [`WINDOW`] regions were all compiled anew, the engine runs the next ops one by one, as
//! Strict does, then fuses again to see whether the code now repeats; each switch that finds
//! nothing repeating doubles the stretch run op by op (RFC 0042).

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Regions looked at: all of them new, and the next ops run one by one.
const WINDOW: u32 = 32;

/// Ops run one by one after the first switch; doubled after each switch that follows a probe
/// which found nothing repeating, up to [`MAX_STRETCH`].
const FIRST_STRETCH: u64 = 2048;
const MAX_STRETCH: u64 = 1 << 20;

#[derive(Debug)]
struct Window {
    /// Consecutive regions compiled anew, up to [`WINDOW`].
    new_in_a_row: u32,
    /// The stretch the next switch runs op by op.
    next_stretch: u64,
}

/// The switch's state: shared by the engine's threads, read on every op.
#[derive(Debug)]
pub struct Adaptive {
    enabled: bool,
    window: Mutex<Window>,
    /// Ops still to run one by one (0: fuse).
    remaining: AtomicU64,
    switches: AtomicU64,
    one_op_ops: AtomicU64,
}

impl Adaptive {
    /// `enabled` is `TORCH_PJRT_ADAPTIVE` (on unless `0`).
    pub fn new(enabled: bool) -> Adaptive {
        Adaptive {
            enabled,
            window: Mutex::new(Window {
                new_in_a_row: 0,
                next_stretch: FIRST_STRETCH,
            }),
            remaining: AtomicU64::new(0),
            switches: AtomicU64::new(0),
            one_op_ops: AtomicU64::new(0),
        }
    }

    /// Whether DeferAndFuse's ops run one by one now.
    #[inline]
    pub fn one_op(&self) -> bool {
        self.remaining.load(Ordering::Relaxed) > 0
    }

    /// Counts an op run one by one; the last one of the stretch lets fusion resume.
    pub fn note_one_op(&self) {
        self.one_op_ops.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .remaining
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Records a fused region's launch: `new` when its program had to be compiled.
    pub fn note_region(&self, new: bool) {
        if !self.enabled {
            return;
        }
        let mut window = self.window.lock();
        if !new {
            // The code repeats: fuse, and start any later switch from the first stretch.
            window.new_in_a_row = 0;
            window.next_stretch = FIRST_STRETCH;
            return;
        }
        window.new_in_a_row += 1;
        if window.new_in_a_row >= WINDOW {
            window.new_in_a_row = 0;
            let stretch = window.next_stretch;
            window.next_stretch = (stretch * 2).min(MAX_STRETCH);
            self.remaining.store(stretch, Ordering::Release);
            self.switches.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Forgets what was seen and fuses again (a new mode was pushed or popped: what ran before
    /// says nothing about the code that follows).
    pub fn reset(&self) {
        let mut window = self.window.lock();
        window.new_in_a_row = 0;
        window.next_stretch = FIRST_STRETCH;
        self.remaining.store(0, Ordering::Release);
    }

    /// Switches to one-op programs so far.
    pub fn switches(&self) -> u64 {
        self.switches.load(Ordering::Relaxed)
    }

    /// Ops run one by one because of a switch.
    pub fn one_op_ops(&self) -> u64 {
        self.one_op_ops.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_of_new_regions_switches_for_a_stretch_that_doubles_until_code_repeats() {
        let a = Adaptive::new(true);
        for _ in 0..WINDOW - 1 {
            a.note_region(true);
        }
        assert!(!a.one_op());
        a.note_region(false); // one repeat starts the count again
        for _ in 0..WINDOW - 1 {
            a.note_region(true);
        }
        assert!(!a.one_op());
        a.note_region(true);
        assert!(a.one_op());
        assert_eq!(a.switches(), 1);
        for _ in 0..FIRST_STRETCH {
            assert!(a.one_op());
            a.note_one_op();
        }
        assert!(!a.one_op(), "fusion resumes after the stretch");
        assert_eq!(a.one_op_ops(), FIRST_STRETCH);
        // Still nothing repeats: the next stretch is twice as long.
        for _ in 0..WINDOW {
            a.note_region(true);
        }
        for _ in 0..2 * FIRST_STRETCH {
            assert!(a.one_op());
            a.note_one_op();
        }
        assert!(!a.one_op());
        // A repeat brings the stretch back to the first length.
        a.note_region(false);
        for _ in 0..WINDOW {
            a.note_region(true);
        }
        for _ in 0..FIRST_STRETCH {
            a.note_one_op();
        }
        assert!(!a.one_op());
    }

    #[test]
    fn a_reset_fuses_again_and_off_never_switches() {
        let a = Adaptive::new(true);
        for _ in 0..WINDOW {
            a.note_region(true);
        }
        assert!(a.one_op());
        a.reset();
        assert!(!a.one_op());
        let off = Adaptive::new(false);
        for _ in 0..10 * WINDOW {
            off.note_region(true);
        }
        assert!(!off.one_op());
        assert_eq!(off.switches(), 0);
    }
}
