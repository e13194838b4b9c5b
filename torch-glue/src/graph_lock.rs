//! The engine's capture graph behind a lock that remembers a failure in the middle of a change:
//! after a panic while the graph was locked, or a flush that failed once it had started to
//! install values, the graph may be half-updated, so the engine stops with a clear error
//! instead of running on (and perhaps waiting forever for a value nothing will compute).

use defer::{EngineError, Graph};
use parking_lot::{Mutex, MutexGuard};
use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;

pub(crate) struct GraphLock<V> {
    graph: Mutex<Graph<V>>,
    /// Why the engine stopped, once it has.
    stopped: OnceLock<String>,
}

pub(crate) struct GraphGuard<'a, V> {
    graph: MutexGuard<'a, Graph<V>>,
    stopped: &'a OnceLock<String>,
}

impl<V> GraphLock<V> {
    pub(crate) fn new(graph: Graph<V>) -> GraphLock<V> {
        GraphLock {
            graph: Mutex::new(graph),
            stopped: OnceLock::new(),
        }
    }

    /// Locks the graph; fails once the engine has stopped.
    pub(crate) fn lock(&self) -> Result<GraphGuard<'_, V>, EngineError> {
        if let Some(why) = self.stopped.get() {
            return Err(stopped_error(why));
        }
        Ok(self.lock_even_if_stopped())
    }

    /// Locks the graph whether or not the engine has stopped: for reading its statistics.
    pub(crate) fn lock_even_if_stopped(&self) -> GraphGuard<'_, V> {
        GraphGuard {
            graph: self.graph.lock(),
            stopped: &self.stopped,
        }
    }

    /// Stops the engine: the graph is no longer consistent (`why` says what failed). The first
    /// reason is kept.
    pub(crate) fn stop(&self, why: impl Into<String>) {
        let _ = self.stopped.set(why.into());
    }

    /// Why the engine stopped, if it has.
    pub(crate) fn stopped(&self) -> Option<&str> {
        self.stopped.get().map(String::as_str)
    }
}

/// The error every call returns once the engine has stopped.
pub(crate) fn stopped_error(why: &str) -> EngineError {
    EngineError::runtime(format!(
        "the pjrt engine stopped after an internal error left its state half-updated ({why}); \
         pjrt tensors can no longer be used in this process. Restart the process, and please \
         report the code that triggered the first error"
    ))
}

impl<V> Deref for GraphGuard<'_, V> {
    type Target = Graph<V>;
    fn deref(&self) -> &Graph<V> {
        &self.graph
    }
}

impl<V> DerefMut for GraphGuard<'_, V> {
    fn deref_mut(&mut self) -> &mut Graph<V> {
        &mut self.graph
    }
}

impl<V> Drop for GraphGuard<'_, V> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self
                .stopped
                .set("a panic while the graph was being changed".into());
        }
    }
}
