//! The engine's trace for a profiler: regions launched, programs compiled or loaded, executions
//! on the device and host transfers, each with its times. Off unless a profiler session turned
//! it on ([`start`]); while off, every recording site costs one relaxed atomic load ([`on`]).
//!
//! The trace is process-wide, as a profiler session is: the compile threads, the execution
//! thread and the callers' threads all record into it.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Where an event is shown: host rows are keyed by their OS thread id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Track {
    /// A caller's thread (a region's planning and launch).
    Host = 0,
    /// A compile-pool thread.
    Compile = 1,
    /// The device: an execution from its launch to its completion.
    Device = 2,
    /// The device's copies to and from the host.
    Transfer = 3,
}

/// One argument's value, written as JSON.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    Int(i64),
    Float(f64),
    Text(String),
}

impl Arg {
    /// The value as a JSON literal.
    pub fn to_json(&self) -> String {
        match self {
            Arg::Int(v) => v.to_string(),
            Arg::Float(v) if v.is_finite() => format!("{v}"),
            Arg::Float(_) => "null".to_string(),
            Arg::Text(s) => json_string(s),
        }
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One recorded interval.
#[derive(Clone, Debug)]
pub struct Event {
    pub track: Track,
    pub name: String,
    /// The OS thread of host and compile events (0 for device events).
    pub thread: i64,
    pub start: Instant,
    pub end: Instant,
    pub args: Vec<(&'static str, Arg)>,
}

impl Event {
    /// An event on `track` that ran on the calling thread from `start` until now.
    pub fn until_now(track: Track, name: impl Into<String>, start: Instant) -> Event {
        Event {
            track,
            name: name.into(),
            thread: thread_id(),
            start,
            end: Instant::now(),
            args: Vec::new(),
        }
    }

    pub fn arg(mut self, name: &'static str, value: Arg) -> Event {
        self.args.push((name, value));
        self
    }
}

static ON: AtomicBool = AtomicBool::new(false);
/// Events recorded since the process started, by any session.
static RECORDED: AtomicU64 = AtomicU64::new(0);
static NEXT_REGION: AtomicU64 = AtomicU64::new(1);
/// Executions launched while recording whose completion event has not been recorded yet.
static AWAITED: AtomicU64 = AtomicU64::new(0);

struct State {
    events: Vec<Event>,
    /// The wall clock at an instant, taken when recording started: events are reported in the
    /// wall clock a profiler's host events use.
    base: Option<(Instant, SystemTime)>,
}

static STATE: Mutex<State> = Mutex::new(State {
    events: Vec::new(),
    base: None,
});

/// Whether events are being recorded. The only cost of a recording site while no profiler runs.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Drops what an earlier session left and starts recording.
pub fn start() {
    let mut state = STATE.lock();
    state.events.clear();
    state.base = Some((Instant::now(), SystemTime::now()));
    ON.store(true, Ordering::Relaxed);
}

/// Stops recording; what was recorded stays until [`take`] or the next [`start`]. Events of
/// work launched while recording still arrive (an execution completing later).
pub fn stop() {
    ON.store(false, Ordering::Relaxed);
}

/// Adds an event. Callers check [`on`] first, so that nothing is built while no profiler runs;
/// an event arriving after [`stop`] (a completion) is still kept for its session.
pub fn record(event: Event) {
    RECORDED.fetch_add(1, Ordering::Relaxed);
    STATE.lock().events.push(event);
}

/// Notes an event that will be recorded later (an execution's completion), so that
/// [`settle`] can wait for it; each call is matched by one [`record_awaited`].
pub fn await_one() {
    AWAITED.fetch_add(1, Ordering::AcqRel);
}

/// Records an event announced by [`await_one`].
pub fn record_awaited(event: Event) {
    record(event);
    AWAITED.fetch_sub(1, Ordering::AcqRel);
}

/// Gives up an event announced by [`await_one`] that will never arrive (its callback was refused).
pub fn abandon_one() {
    AWAITED.fetch_sub(1, Ordering::AcqRel);
}

/// Waits, up to `limit`, until every announced event has been recorded: a completion callback
/// may run on a runtime thread just after the device reports the work done, and a session
/// reading its events then would miss the last execution. Returns whether all arrived.
pub fn settle(limit: std::time::Duration) -> bool {
    let deadline = Instant::now() + limit;
    while AWAITED.load(Ordering::Acquire) != 0 {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    true
}

/// Hands out and forgets the events recorded so far, oldest first.
pub fn take() -> Vec<Event> {
    let mut events = std::mem::take(&mut STATE.lock().events);
    events.sort_by_key(|e| e.start);
    events
}

/// Events recorded since the process started.
pub fn recorded_total() -> u64 {
    RECORDED.load(Ordering::Relaxed)
}

/// A number naming one launched region, so its host and device events can be matched.
pub fn next_region() -> u64 {
    NEXT_REGION.fetch_add(1, Ordering::Relaxed)
}

/// `instant` on the wall clock, in nanoseconds since the Unix epoch (the clock of a profiler's
/// host events), by the base taken at [`start`].
pub fn unix_nanos(instant: Instant) -> i64 {
    let (base_instant, base_wall) = STATE
        .lock()
        .base
        .unwrap_or_else(|| (Instant::now(), SystemTime::now()));
    let wall = base_wall
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    if instant >= base_instant {
        wall + (instant - base_instant).as_nanos() as i64
    } else {
        wall - (base_instant - instant).as_nanos() as i64
    }
}

/// The calling thread's OS id, which a profiler's host rows are keyed by.
pub fn thread_id() -> i64 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid takes no arguments and cannot fail.
        unsafe { libc::gettid() as i64 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}

/// The part of a region's label that lists its first ops ("add, mul, ..." of "region of 12 ops:
/// add, mul, ..."; a one-op region's label is the op).
pub fn first_ops(label: &str) -> &str {
    match label.split_once(": ") {
        Some((head, ops)) if head.starts_with("region of ") => ops,
        _ => label,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_json_literals() {
        assert_eq!(Arg::Int(-3).to_json(), "-3");
        assert_eq!(Arg::Float(0.5).to_json(), "0.5");
        assert_eq!(Arg::Float(f64::NAN).to_json(), "null");
        assert_eq!(Arg::Text("a \"b\"\n".into()).to_json(), r#""a \"b\"\n""#);
    }

    #[test]
    fn first_ops_come_from_the_label() {
        assert_eq!(first_ops("region of 3 ops: add, mul, sum"), "add, mul, sum");
        assert_eq!(first_ops("add"), "add");
    }

    #[test]
    fn instants_map_onto_the_wall_clock() {
        start();
        let now = Instant::now();
        let later = now + std::time::Duration::from_millis(5);
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        assert!((unix_nanos(now) - wall).abs() < 50_000_000);
        assert_eq!(unix_nanos(later) - unix_nanos(now), 5_000_000);
        stop();
    }
}
