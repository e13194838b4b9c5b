//! A write-once, many-reader slot with blocking waits: the shared core of `CompileHandle` and
//! `DeviceValue`.

use parking_lot::{Condvar, Mutex};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub(crate) struct Slot<T> {
    value: OnceLock<T>,
    waiters: Mutex<()>,
    filled: Condvar,
}

impl<T: Clone> Slot<T> {
    pub(crate) fn empty() -> Slot<T> {
        Slot {
            value: OnceLock::new(),
            waiters: Mutex::new(()),
            filled: Condvar::new(),
        }
    }

    pub(crate) fn filled(value: T) -> Slot<T> {
        let slot = Slot::empty();
        let _ = slot.value.set(value);
        slot
    }

    /// Sets the value unless one is already there; wakes every waiter. Returns whether it was set.
    pub(crate) fn fill(&self, value: T) -> bool {
        let set = self.value.set(value).is_ok();
        if set {
            // Taking the lock orders this wake-up after any waiter's check of `value`.
            let _guard = self.waiters.lock();
            self.filled.notify_all();
        }
        set
    }

    pub(crate) fn get(&self) -> Option<T> {
        self.value.get().cloned()
    }

    pub(crate) fn is_filled(&self) -> bool {
        self.value.get().is_some()
    }

    pub(crate) fn wait(&self) -> T {
        if let Some(value) = self.value.get() {
            return value.clone();
        }
        let mut guard = self.waiters.lock();
        loop {
            if let Some(value) = self.value.get() {
                return value.clone();
            }
            self.filled.wait(&mut guard);
        }
    }

    pub(crate) fn wait_timeout(&self, timeout: Duration) -> Option<T> {
        if let Some(value) = self.value.get() {
            return Some(value.clone());
        }
        let deadline = Instant::now() + timeout;
        let mut guard = self.waiters.lock();
        loop {
            if let Some(value) = self.value.get() {
                return Some(value.clone());
            }
            if self.filled.wait_until(&mut guard, deadline).timed_out() {
                return self.value.get().cloned();
            }
        }
    }
}
