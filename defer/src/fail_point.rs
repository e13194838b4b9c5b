//! Named steps of a flush and its launch where a test can make the engine fail on purpose, to
//! show that no failure leaves a value that nothing will compute (a read that waits forever).
//!
//! A point is armed for the calling thread only and fires once: tests running side by side in
//! one process do not trip each other, and the call after the failure runs normally. Unarmed,
//! a point costs one thread-local read.

use crate::EngineError;
use std::cell::Cell;

/// Where a flush or its launch can be made to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailPoint {
    /// The region is planned; nothing has changed yet.
    FlushPlanned,
    /// The region's new values are in their storages; its ops are still pending.
    FlushInstalled,
    /// The region's ops have left the pending list; the flush has not returned.
    FlushDrained,
    /// The engine holds the flush; its job is not yet on the execution queue.
    LaunchEnqueue,
}

impl FailPoint {
    pub const ALL: [FailPoint; 4] = [
        FailPoint::FlushPlanned,
        FailPoint::FlushInstalled,
        FailPoint::FlushDrained,
        FailPoint::LaunchEnqueue,
    ];
}

/// What an armed point does when reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailAction {
    /// Returns an error, as a failed step would.
    Error,
    /// Panics, as a bug would.
    Panic,
}

thread_local! {
    static ARMED: Cell<Option<(FailPoint, FailAction)>> = const { Cell::new(None) };
}

/// Arms `point` on this thread: the next time this thread reaches it, `action` happens.
pub fn arm(point: FailPoint, action: FailAction) {
    ARMED.with(|armed| armed.set(Some((point, action))));
}

/// Disarms this thread's point, if it has not fired.
pub fn disarm() {
    ARMED.with(|armed| armed.set(None));
}

/// Whether this thread still has an armed point (it has not been reached).
pub fn is_armed() -> bool {
    ARMED.with(|armed| armed.get().is_some())
}

/// Called at `point`: fails as armed (once), or returns `Ok`.
pub fn reach(point: FailPoint) -> Result<(), EngineError> {
    let fire = ARMED.with(|armed| match armed.get() {
        Some((armed_at, action)) if armed_at == point => {
            armed.set(None);
            Some(action)
        }
        _ => None,
    });
    match fire {
        None => Ok(()),
        Some(FailAction::Error) => Err(EngineError::runtime(format!(
            "injected failure at {point:?}"
        ))),
        Some(FailAction::Panic) => panic!("injected panic at {point:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_fires_once_and_only_where_armed() {
        arm(FailPoint::FlushInstalled, FailAction::Error);
        assert!(reach(FailPoint::FlushPlanned).is_ok());
        assert!(is_armed());
        let error = reach(FailPoint::FlushInstalled).unwrap_err();
        assert!(
            error.message.contains("FlushInstalled"),
            "{}",
            error.message
        );
        assert!(!is_armed());
        assert!(reach(FailPoint::FlushInstalled).is_ok());
    }

    #[test]
    fn a_point_armed_on_one_thread_does_not_fire_on_another() {
        arm(FailPoint::LaunchEnqueue, FailAction::Panic);
        let elsewhere = std::thread::spawn(|| reach(FailPoint::LaunchEnqueue).is_ok())
            .join()
            .expect("the other thread must not panic");
        assert!(elsewhere);
        disarm();
        assert!(reach(FailPoint::LaunchEnqueue).is_ok());
    }

    #[test]
    fn an_armed_panic_panics() {
        arm(FailPoint::FlushDrained, FailAction::Panic);
        let caught = std::panic::catch_unwind(|| reach(FailPoint::FlushDrained));
        assert!(caught.is_err());
        assert!(!is_armed());
    }
}
