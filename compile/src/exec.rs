//! The ordered execution queue: callers enqueue executions (and host↔device transfers or reads
//! as closures) and return at once; one worker thread runs them in enqueue order. Values flow
//! between jobs as `DeviceValue`s, futures of device buffers, so a failure travels to every
//! dependent job as an error value naming the job that failed.

use crate::compiler::CompileHandle;
use crate::error::{panic_message, ExecError};
use crate::handle::Slot;
use crate::trace;
use crossbeam_channel::Sender;
use pjrt::{Buffer, ExecuteOptions};
use smallvec::SmallVec;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

type ValueResult = Result<Arc<Buffer>, ExecError>;

/// What a value's slot holds once resolved: the buffer and the label of the job that produced
/// it (device errors surface later, when the buffer is awaited, and should name that job).
type Outcome = Result<(Arc<Buffer>, Option<Arc<str>>), ExecError>;

/// A device buffer that may not exist yet: ready, pending (a queued job will produce it) or
/// failed. Cloning is cheap; every clone sees the same outcome.
#[derive(Clone)]
pub struct DeviceValue {
    slot: Arc<Slot<Outcome>>,
}

impl std::fmt::Debug for DeviceValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.slot.get() {
            None => "pending",
            Some(Ok(_)) => "ready",
            Some(Err(_)) => "failed",
        };
        f.debug_struct("DeviceValue")
            .field("state", &state)
            .finish()
    }
}

impl DeviceValue {
    /// A value that exists now (e.g. a host→device transfer's result).
    pub fn ready(buffer: impl Into<Arc<Buffer>>) -> DeviceValue {
        DeviceValue {
            slot: Arc::new(Slot::filled(Ok((buffer.into(), None)))),
        }
    }

    /// An output slot for a job about to be enqueued.
    pub fn pending() -> DeviceValue {
        DeviceValue {
            slot: Arc::new(Slot::empty()),
        }
    }

    /// A value that will never exist, for an error found before anything was enqueued.
    pub fn failed(error: ExecError) -> DeviceValue {
        DeviceValue {
            slot: Arc::new(Slot::filled(Err(error))),
        }
    }

    /// Blocks until the producing job has run; the buffer may still be computing on the device
    /// (see [`DeviceValue::wait_ready`]).
    pub fn wait(&self) -> ValueResult {
        self.slot.wait().map(|(buffer, _)| buffer)
    }

    /// [`DeviceValue::wait`] for at most `timeout`; `None` if the job has not run yet.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<ValueResult> {
        self.slot
            .wait_timeout(timeout)
            .map(|outcome| outcome.map(|(buffer, _)| buffer))
    }

    /// Blocks until the buffer's contents are computed on the device.
    pub fn wait_ready(&self) -> ValueResult {
        let (buffer, producer) = self.slot.wait()?;
        buffer.wait_ready().map_err(|e| ExecError::Device {
            label: producer,
            message: e.to_string(),
        })?;
        Ok(buffer)
    }

    /// The outcome if the producing job has run; never blocks.
    pub fn try_get(&self) -> Option<ValueResult> {
        self.slot
            .get()
            .map(|outcome| outcome.map(|(buffer, _)| buffer))
    }

    /// Whether the producing job has run (successfully or not).
    pub fn is_resolved(&self) -> bool {
        self.slot.is_filled()
    }

    /// Whether two handles refer to the same value.
    pub fn same_value(&self, other: &DeviceValue) -> bool {
        Arc::ptr_eq(&self.slot, &other.slot)
    }

    /// Whether this handle is the only one: no storage, queued job or other holder refers to
    /// the value, so its buffer may be donated to an execution.
    /// Whether `other` is a handle of this same value.
    pub fn same(&self, other: &DeviceValue) -> bool {
        Arc::ptr_eq(&self.slot, &other.slot)
    }

    pub fn is_unique(&self) -> bool {
        Arc::strong_count(&self.slot) == 1
    }

    /// A handle that does not keep the value alive.
    pub fn downgrade(&self) -> WeakDeviceValue {
        WeakDeviceValue {
            slot: Arc::downgrade(&self.slot),
        }
    }

    /// Fails a value that is still pending: its job will never run (the flush that made it
    /// failed before the job reached the queue). A resolved value is left as it is.
    pub fn fail_if_pending(&self, error: ExecError) {
        self.resolve(Err(error));
    }

    /// Only the first outcome counts: a value is resolved once.
    fn resolve(&self, result: Outcome) {
        self.slot.fill(result);
    }
}

/// Waits until every value is computed on the device; the first error wins.
/// A [`DeviceValue`] handle that does not keep the value alive.
#[derive(Clone, Debug)]
pub struct WeakDeviceValue {
    slot: std::sync::Weak<Slot<Outcome>>,
}

impl WeakDeviceValue {
    /// The value, if something still holds it.
    pub fn upgrade(&self) -> Option<DeviceValue> {
        self.slot.upgrade().map(|slot| DeviceValue { slot })
    }
}

pub fn wait_all_ready(values: &[DeviceValue]) -> Result<(), ExecError> {
    for value in values {
        value.wait_ready()?;
    }
    Ok(())
}

/// One execution: run `executable` on `arguments`, resolve `outputs` with its results.
pub struct ExecJob {
    /// Names the job in errors (an op name, or "region of 12 ops: add, mul, ...").
    pub label: Arc<str>,
    pub executable: CompileHandle,
    /// Each ready, or produced by work enqueued earlier: the worker waits for them in order, so
    /// a value produced by later work on the same queue would be waited for forever.
    pub arguments: JobValues,
    /// Created with [`DeviceValue::pending`] by the caller, one per executable result. Held
    /// weakly: a queued job must not keep its results alive (a result nobody holds any more is
    /// dropped when it arrives), or the value a later job overwrites in place could never be
    /// donated while this job waits in the queue.
    pub outputs: SmallVec<[WeakDeviceValue; 2]>,
    /// Argument indices the executable may donate (reuse for an output); all others are passed
    /// as non-donatable. A donated argument's buffer must not be read afterwards.
    pub donatable: SmallVec<[usize; 2]>,
    /// Host arrays the worker uploads right before the execution and passes after `arguments`
    /// (e.g. a region's packed lifted scalars): one queue item per job instead of one more per
    /// upload.
    pub uploads: SmallVec<[HostArgument; 1]>,
    /// When the job was made: its time waiting in the queue is counted from here.
    pub made_at: std::time::Instant,
    /// The number [`crate::trace`] gave the region this job runs, when a profiler was recording
    /// as it was launched (0: none, and the execution is not recorded).
    pub traced_region: u64,
    /// The device the execution runs on, and its uploads go to: needed by a portable
    /// executable (`None`: the device the executable was compiled for, uploads to the first).
    pub device: Option<pjrt::Device>,
}

/// A job's argument list: inline for the few arguments of one op, so an op-by-op job allocates
/// no list on the caller's thread (and frees none on the worker's).
pub type JobValues = SmallVec<[DeviceValue; 4]>;

/// A dense row-major host array that becomes an execution argument on the worker thread.
pub struct HostArgument {
    pub client: pjrt::Client,
    /// Inline up to 16 bytes: a region's few lifted scalars.
    pub bytes: SmallVec<[u8; 16]>,
    pub element_type: pjrt::ElementType,
    pub dims: SmallVec<[i64; 1]>,
    /// Names the upload in errors ("uploading {what}: ...").
    pub what: &'static str,
}

impl ExecJob {
    pub fn new(
        label: impl Into<Arc<str>>,
        executable: CompileHandle,
        arguments: impl Into<JobValues>,
        outputs: impl AsRef<[DeviceValue]>,
    ) -> ExecJob {
        ExecJob {
            label: label.into(),
            executable,
            arguments: arguments.into(),
            outputs: outputs
                .as_ref()
                .iter()
                .map(DeviceValue::downgrade)
                .collect(),
            donatable: SmallVec::new(),
            uploads: SmallVec::new(),
            made_at: std::time::Instant::now(),
            traced_region: 0,
            device: None,
        }
    }

    /// Runs the job on `device` (a portable executable, several devices in the process).
    pub fn on_device(mut self, device: Option<pjrt::Device>) -> ExecJob {
        self.device = device;
        self
    }

    /// Records the job's execution in the trace as region `region` ([`crate::trace`]).
    pub fn traced(mut self, region: u64) -> ExecJob {
        self.traced_region = region;
        self
    }

    /// Appends a host array to upload as the next argument after the existing ones.
    pub fn upload(mut self, argument: HostArgument) -> ExecJob {
        self.uploads.push(argument);
        self
    }

    /// Marks argument indices as donatable.
    pub fn donate(mut self, indices: impl IntoIterator<Item = usize>) -> ExecJob {
        self.donatable.extend(indices);
        self
    }
}

type TaskFn = Box<dyn FnOnce() -> Result<Vec<Arc<Buffer>>, String> + Send + 'static>;

// Work moves through reused deques: boxing the large variant would allocate for every job.
#[allow(clippy::large_enum_variant)]
enum Work {
    Execute(ExecJob),
    Task {
        label: Arc<str>,
        outputs: Vec<WeakDeviceValue>,
        task: TaskFn,
    },
    Marker(Sender<()>),
}

/// Counters of an [`ExecQueue`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecStats {
    /// Jobs and closures enqueued.
    pub enqueued: u64,
    /// Executables launched successfully.
    pub executions: u64,
    /// Closures run (successfully or not).
    pub tasks: u64,
    /// Jobs and closures whose outputs were failed.
    pub failed: u64,
    /// Enqueued but not yet run.
    pub pending: u64,
    /// Time the worker spent launching executions (arguments, uploads, the plugin's execute
    /// call), compile waits excluded, in nanoseconds.
    pub launch_nanos: u64,
    /// Time the worker waited for executables still compiling, in nanoseconds.
    pub compile_wait_nanos: u64,
    /// Time the device was busy, in nanoseconds: the union of the intervals from each launch to
    /// its completion event (executions queued behind one another are not counted twice).
    pub device_nanos: u64,
    /// Time executions waited in the queue before they were taken, in nanoseconds.
    pub queue_nanos: u64,
    /// Executions launched by a caller waiting for them ([`ExecQueue::run_here`]).
    pub caller_launches: u64,
    /// Times the worker had to be woken from sleep to take work.
    pub worker_wakes: u64,
    /// Uploads served by a buffer uploaded before with the same value.
    pub upload_reuses: u64,
}

/// A point in an [`ExecQueue`]'s order ([`ExecQueue::mark`]): done once the executions
/// launched before it have finished on the device.
#[derive(Default, Debug)]
pub struct QueueMark {
    remaining: parking_lot::Mutex<usize>,
    done_at: parking_lot::Mutex<Option<std::time::Instant>>,
    done: parking_lot::Condvar,
}

impl QueueMark {
    fn finish_one(&self) {
        let mut remaining = self.remaining.lock();
        *remaining = remaining.saturating_sub(1);
        if *remaining == 0 {
            self.done_at
                .lock()
                .get_or_insert_with(std::time::Instant::now);
            self.done.notify_all();
        }
    }

    /// When the executions before the mark had all finished, if they have.
    pub fn done_at(&self) -> Option<std::time::Instant> {
        *self.done_at.lock()
    }

    /// Blocks until the mark is done; returns when that was.
    pub fn wait(&self) -> std::time::Instant {
        let mut remaining = self.remaining.lock();
        while *remaining > 0 {
            self.done.wait(&mut remaining);
        }
        drop(remaining);
        self.done_at().expect("a finished mark has its time")
    }
}

/// Buffers of recent uploads (a region's lifted scalars), by value: the same few scalars (an
/// epsilon, a scale, a fill value) go with every launch of a program, and on the CPU plugin each
/// upload costs an allocation, a copy and an event on the launch path. Buffers passed as
/// arguments are only read (uploads are never donated), so one serves every launch.
#[derive(Default)]
struct UploadCache {
    entries: Vec<CachedUpload>,
    /// Counts lookups: an entry's `used` is the count at its last hit, the least recent goes
    /// first.
    clock: u64,
    hits: u64,
}

struct CachedUpload {
    client: pjrt::Client,
    device: Option<i32>,
    element_type: pjrt::ElementType,
    dims: SmallVec<[i64; 1]>,
    bytes: SmallVec<[u8; 16]>,
    buffer: Arc<Buffer>,
    used: u64,
}

/// Enough for every scalar a small model's programs lift, with room for values that change.
const UPLOAD_CACHE_ENTRIES: usize = 128;

impl UploadCache {
    fn get(&mut self, upload: &HostArgument, device: Option<&pjrt::Device>) -> Option<Arc<Buffer>> {
        self.clock += 1;
        let device = device.map(|d| d.id);
        let entry = self.entries.iter_mut().find(|e| {
            e.bytes == upload.bytes
                && e.element_type == upload.element_type
                && e.dims == upload.dims
                && e.device == device
                && e.client.same_as(&upload.client)
        })?;
        entry.used = self.clock;
        self.hits += 1;
        Some(entry.buffer.clone())
    }

    fn insert(
        &mut self,
        upload: &HostArgument,
        device: Option<&pjrt::Device>,
        buffer: Arc<Buffer>,
    ) {
        if upload.bytes.len() > 64 {
            return;
        }
        // Held by the queue, not by a tensor: not part of the user's device memory.
        buffer.untrack();
        if self.entries.len() >= UPLOAD_CACHE_ENTRIES {
            if let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used) {
                self.entries.swap_remove(oldest);
            }
        }
        self.entries.push(CachedUpload {
            client: upload.client.clone(),
            device: device.map(|d| d.id),
            element_type: upload.element_type,
            dims: upload.dims.clone(),
            bytes: upload.bytes.clone(),
            buffer,
            used: self.clock,
        });
    }
}

#[derive(Default)]
struct QueueShared {
    enqueued: AtomicU64,
    completed: AtomicU64,
    executions: AtomicU64,
    tasks: AtomicU64,
    failed: AtomicU64,
    launch_nanos: AtomicU64,
    compile_wait_nanos: AtomicU64,
    queue_nanos: AtomicU64,
    caller_launches: AtomicU64,
    uploads: parking_lot::Mutex<UploadCache>,
    /// Shared with the completion callbacks, which may outlive a borrow of the queue.
    device_busy: Arc<parking_lot::Mutex<DeviceBusy>>,
    worker: OnceLock<ThreadId>,
    /// Completion events of launched executions that may still be running, oldest first: what
    /// `wait_launched` waits for, since a job no longer holds its results (they may all have
    /// been released, and the device still be computing them).
    launched: parking_lot::Mutex<std::collections::VecDeque<(Arc<str>, pjrt::Event)>>,
}

/// The device's busy time so far: the union of launch-to-completion intervals.
#[derive(Default)]
struct DeviceBusy {
    nanos: u64,
    /// Where the union ends so far.
    until: Option<std::time::Instant>,
}

impl DeviceBusy {
    /// Adds the part of `started..done` that no earlier interval covers: completions arrive
    /// about in launch order, and the covered part is the device working through its queue.
    fn complete(&mut self, started: std::time::Instant, done: std::time::Instant) {
        let from = self.until.map_or(started, |u| u.max(started));
        if done > from {
            self.nanos += u64::try_from((done - from).as_nanos()).unwrap_or(u64::MAX);
            self.until = Some(done);
        }
    }
}

/// The worker's inbox: a deque under a lock. The worker takes everything queued at once by
/// swapping deques, so both buffers circulate and a steady stream of work allocates nothing
/// (a linked-block channel allocates and zeroes a block every few dozen items, on the caller's
/// thread, and frees it on the worker's).
struct Inbox {
    state: parking_lot::Mutex<InboxState>,
    ready: parking_lot::Condvar,
    /// Counts pushes, so the worker can watch for work without the lock while it spins.
    pushes: AtomicU64,
    /// Times a push or a caller woke the sleeping worker.
    wakes: AtomicU64,
    /// How long the worker watches for new work before it sleeps ([`WORKER_SPIN_ENV`]).
    spin: Duration,
}

/// How long (in microseconds) the execution worker keeps watching for work after it runs out,
/// before it sleeps. Op-by-op execution queues a program every few tens of microseconds: a
/// worker that went to sleep in between must be woken by a system call on the path of every
/// op (measured: about a tenth of Strict's host time per op), while a watching one sees the
/// work at once. The watch yields the core on every turn, so a runnable thread loses nothing.
pub const WORKER_SPIN_ENV: &str = "TORCH_PJRT_WORKER_SPIN_US";
pub const DEFAULT_WORKER_SPIN: Duration = Duration::from_micros(50);

impl Inbox {
    fn new(spin: Duration) -> Inbox {
        Inbox {
            state: parking_lot::Mutex::default(),
            ready: parking_lot::Condvar::new(),
            pushes: AtomicU64::new(0),
            wakes: AtomicU64::new(0),
            spin,
        }
    }

    fn notify_worker(&self) {
        self.wakes.fetch_add(1, Ordering::Relaxed);
        self.ready.notify_one();
    }
}

#[derive(Default)]
struct InboxState {
    items: std::collections::VecDeque<Work>,
    /// No more work is accepted; the worker stops once it has run what is queued.
    closed: bool,
    /// The worker sleeps on `ready`: only then does a push need to wake it.
    worker_asleep: bool,
    /// The worker is running a batch it took.
    worker_busy: bool,
    /// A caller is running a batch it took ([`ExecQueue::run_here`]): the worker leaves what
    /// is queued meanwhile until the caller is done, so work still runs in enqueue order.
    caller_running: bool,
    /// Callers that will run what they queue themselves ([`ExecQueue::hold_worker`]): while
    /// any does, a push does not wake the worker.
    holds: usize,
    /// A caller needs the worker to take what is queued, holds notwithstanding (it declined to
    /// run the work itself and is about to block): a watching worker must not leave that work
    /// to the holder. Cleared when the worker takes a batch.
    wanted: bool,
}

impl Inbox {
    /// Queues `work`, or gives it back when the inbox is closed.
    fn push(&self, work: Work) -> Option<Work> {
        let mut state = self.state.lock();
        if state.closed {
            return Some(work);
        }
        state.items.push_back(work);
        self.pushes.fetch_add(1, Ordering::Release);
        let wake = state.worker_asleep && state.holds == 0;
        drop(state);
        if wake {
            self.notify_worker();
        }
        None
    }

    /// Takes everything queued for the calling thread to run, when the worker is idle and
    /// everything queued is an execution (a closure may expect the worker's thread).
    fn take_for_caller(&self) -> Option<std::collections::VecDeque<Work>> {
        let mut state = self.state.lock();
        if state.worker_busy
            || state.caller_running
            || state.closed
            || state.items.is_empty()
            || !state.items.iter().all(|w| matches!(w, Work::Execute(_)))
        {
            // The caller blocks next: the worker must run what it declined.
            self.wake_if_needed(state, true);
            return None;
        }
        state.caller_running = true;
        Some(std::mem::take(&mut state.items))
    }

    /// The caller's batch is done: the worker may take what was queued meanwhile.
    fn caller_done(&self) {
        let mut state = self.state.lock();
        state.caller_running = false;
        self.wake_if_needed(state, true);
    }

    /// Wakes a sleeping worker that has work (or must stop). A caller about to block passes
    /// `despite_holds`: whatever it waits for may sit in the queue behind its own hold.
    fn wake_if_needed(
        &self,
        mut state: parking_lot::MutexGuard<'_, InboxState>,
        despite_holds: bool,
    ) {
        if despite_holds {
            // A worker that is watching rather than asleep must take the work too.
            state.wanted = true;
        }
        let wake = state.worker_asleep
            && (state.holds == 0 || despite_holds)
            && !state.caller_running
            && (!state.items.is_empty() || state.closed);
        drop(state);
        if wake {
            self.notify_worker();
        }
    }

    fn release_hold(&self) {
        let mut state = self.state.lock();
        state.holds -= 1;
        self.wake_if_needed(state, false);
    }

    fn close(&self) {
        self.state.lock().closed = true;
        // A watching worker looks again on any push; closing counts as one.
        self.pushes.fetch_add(1, Ordering::Release);
        self.notify_worker();
    }

    /// Moves everything queued into `batch` (which must be empty), waiting while nothing is;
    /// `false` once the inbox is closed and drained.
    fn take_all(&self, batch: &mut std::collections::VecDeque<Work>) -> bool {
        debug_assert!(batch.is_empty());
        let mut state = self.state.lock();
        state.worker_busy = false;
        let mut spun = Duration::ZERO;
        // Whether the worker ran out of work and has been watching for more: it then stands
        // for a sleeping worker, so it leaves work queued under a hold to the caller who holds
        // it, as a sleeping one would not have been woken for it.
        let mut watching = false;
        loop {
            let left_to_holder = watching && state.holds > 0 && !state.wanted;
            if !state.items.is_empty() && !state.caller_running && !left_to_holder {
                std::mem::swap(&mut state.items, batch);
                state.worker_busy = true;
                state.wanted = false;
                return true;
            }
            if state.closed && !state.caller_running {
                return false;
            }
            if spun < self.spin && state.holds == 0 {
                // Watch for a push without the lock (so pushes and callers are not slowed),
                // then look again; only a watch that sees nothing ends in sleep.
                let seen = self.pushes.load(Ordering::Acquire);
                let started = std::time::Instant::now();
                parking_lot::MutexGuard::unlocked(&mut state, || {
                    while self.pushes.load(Ordering::Acquire) == seen
                        && spun + started.elapsed() < self.spin
                    {
                        std::thread::yield_now();
                    }
                });
                spun += started.elapsed();
                watching = true;
                continue;
            }
            state.worker_asleep = true;
            self.ready.wait(&mut state);
            state.worker_asleep = false;
            watching = false;
        }
    }
}

/// See [`ExecQueue::hold_worker`].
pub struct WorkerHold<'a> {
    inbox: &'a Inbox,
}

impl Drop for WorkerHold<'_> {
    fn drop(&mut self) {
        self.inbox.release_hold();
    }
}

/// An ordered execution queue with one worker thread. Work runs in enqueue order; a job waits for
/// its executable and its arguments (which must come from earlier work or be ready) and launches
/// the execution without waiting for the device.
pub struct ExecQueue {
    inbox: Arc<Inbox>,
    worker: Option<JoinHandle<()>>,
    shared: Arc<QueueShared>,
}

impl std::fmt::Debug for ExecQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecQueue")
            .field("stats", &self.stats())
            .finish()
    }
}

impl ExecStats {
    /// The counts and times accumulated since `earlier` (a snapshot of the same queue); the
    /// pending count is this snapshot's.
    pub fn since(&self, earlier: &ExecStats) -> ExecStats {
        ExecStats {
            enqueued: self.enqueued.saturating_sub(earlier.enqueued),
            executions: self.executions.saturating_sub(earlier.executions),
            tasks: self.tasks.saturating_sub(earlier.tasks),
            failed: self.failed.saturating_sub(earlier.failed),
            pending: self.pending,
            launch_nanos: self.launch_nanos.saturating_sub(earlier.launch_nanos),
            compile_wait_nanos: self
                .compile_wait_nanos
                .saturating_sub(earlier.compile_wait_nanos),
            device_nanos: self.device_nanos.saturating_sub(earlier.device_nanos),
            queue_nanos: self.queue_nanos.saturating_sub(earlier.queue_nanos),
            caller_launches: self.caller_launches.saturating_sub(earlier.caller_launches),
            worker_wakes: self.worker_wakes.saturating_sub(earlier.worker_wakes),
            upload_reuses: self.upload_reuses.saturating_sub(earlier.upload_reuses),
        }
    }
}

impl ExecQueue {
    /// A queue whose worker watches for work for [`WORKER_SPIN_ENV`] microseconds (default
    /// [`DEFAULT_WORKER_SPIN`]) before it sleeps.
    pub fn new() -> std::io::Result<ExecQueue> {
        let spin = std::env::var(WORKER_SPIN_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(DEFAULT_WORKER_SPIN, Duration::from_micros);
        ExecQueue::with_worker_spin(spin)
    }

    /// A queue whose worker watches for work for `spin` before it sleeps (zero: at once).
    pub fn with_worker_spin(spin: Duration) -> std::io::Result<ExecQueue> {
        let inbox = Arc::new(Inbox::new(spin));
        let shared = Arc::new(QueueShared::default());
        let worker_shared = shared.clone();
        let worker_inbox = inbox.clone();
        let worker = std::thread::Builder::new()
            .name("torch-pjrt-exec".to_string())
            .spawn(move || serve(&worker_shared, &worker_inbox))?;
        let _ = shared.worker.set(worker.thread().id());
        Ok(ExecQueue {
            inbox,
            worker: Some(worker),
            shared,
        })
    }

    /// Queues an execution and returns at once.
    pub fn enqueue(&self, job: ExecJob) {
        self.send(Work::Execute(job));
    }

    /// Queues a closure (a host→device transfer, a device→host read, a callback) to run in
    /// order with the executions. Its buffers resolve `outputs`, in order; its error (or a panic)
    /// fails them.
    pub fn enqueue_fn<F>(&self, label: impl Into<Arc<str>>, outputs: Vec<DeviceValue>, task: F)
    where
        F: FnOnce() -> Result<Vec<Arc<Buffer>>, String> + Send + 'static,
    {
        self.send(Work::Task {
            label: label.into(),
            outputs: outputs.iter().map(DeviceValue::downgrade).collect(),
            task: Box::new(task),
        });
    }

    fn send(&self, work: Work) {
        self.shared.enqueued.fetch_add(1, Ordering::Relaxed);
        if let Some(work) = self.inbox.push(work) {
            self.shared.completed.fetch_add(1, Ordering::Release);
            let (label, outputs) = match work {
                Work::Execute(job) => (job.label, job.outputs.into_vec()),
                Work::Task { label, outputs, .. } => (label, outputs),
                Work::Marker(_) => return,
            };
            fail_all(&self.shared, &outputs, ExecError::ShutDown { label });
        }
    }

    /// Lets the worker sleep through pushes while the guard lives: the caller is about to wait
    /// for what it queues and runs it itself with [`ExecQueue::run_here`], so waking the worker
    /// would only start a race for the work. Anything that blocks on the queue wakes the worker
    /// anyway (`run_here` declining, `flush`), and work still queued when the guard goes wakes
    /// it then, so a hold never leaves work stranded.
    pub fn hold_worker(&self) -> WorkerHold<'_> {
        self.inbox.state.lock().holds += 1;
        WorkerHold { inbox: &self.inbox }
    }

    /// Runs the queued executions on the calling thread, in order, when the worker is idle:
    /// a caller about to wait for a result launches it itself instead of waking the worker
    /// and then being woken by it (two thread hand-offs on the path of every read). Returns
    /// whether it ran anything; otherwise the worker runs the work as usual.
    pub fn run_here(&self) -> bool {
        let Some(batch) = self.inbox.take_for_caller() else {
            return false;
        };
        struct Done<'a>(&'a Inbox);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.caller_done();
            }
        }
        let _done = Done(&self.inbox);
        for item in batch {
            self.shared.caller_launches.fetch_add(1, Ordering::Relaxed);
            run(&self.shared, item);
        }
        true
    }

    /// Blocks until everything enqueued before this call has run (executions launched, closures
    /// returned). Called from inside a queued closure it returns at once: the queue cannot wait
    /// for itself.
    pub fn flush(&self) {
        if self.shared.worker.get() == Some(&std::thread::current().id()) {
            return;
        }
        if self.shared.enqueued.load(Ordering::Acquire)
            == self.shared.completed.load(Ordering::Acquire)
        {
            return; // everything enqueued has run: no marker, no hand-off
        }
        let (done, finished) = crossbeam_channel::bounded(1);
        self.send(Work::Marker(done));
        self.inbox.wake_if_needed(self.inbox.state.lock(), true);
        let _ = finished.recv();
    }

    /// [`ExecQueue::flush`], then wait until every launched execution has finished on the
    /// device, whether or not anything still holds its results. Returns the first device error.
    pub fn wait_launched(&self) -> Result<(), ExecError> {
        self.flush();
        let events = std::mem::take(&mut *self.shared.launched.lock());
        let mut first_error = None;
        for (label, event) in events {
            if let Err(e) = event.wait() {
                first_error.get_or_insert(ExecError::Device {
                    label: Some(label),
                    message: e.to_string(),
                });
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// A point in the queue's order (`torch.Event.record`): [`ExecQueue::flush`], then a mark
    /// that completes when every execution launched so far has finished on the device, and
    /// keeps when that was.
    pub fn mark(&self) -> Arc<QueueMark> {
        self.flush();
        let mark = Arc::new(QueueMark::default());
        let launched = self.shared.launched.lock();
        // One count per running execution, plus one released below, so the mark cannot
        // complete while callbacks are still being registered.
        let running: Vec<&pjrt::Event> = launched
            .iter()
            .map(|(_, e)| e)
            .filter(|e| !e.is_ready().unwrap_or(true))
            .collect();
        *mark.remaining.lock() = running.len() + 1;
        for event in running {
            let done = mark.clone();
            if event.on_ready(move |_| done.finish_one()).is_err() {
                mark.finish_one(); // the plugin took no callback: do not wait for it
            }
        }
        drop(launched);
        mark.finish_one();
        mark
    }

    /// [`ExecQueue::flush`], then wait until `values` are computed on the device.
    pub fn synchronize(&self, values: &[DeviceValue]) -> Result<(), ExecError> {
        self.flush();
        wait_all_ready(values)
    }

    pub fn stats(&self) -> ExecStats {
        let s = &self.shared;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let enqueued = load(&s.enqueued);
        ExecStats {
            enqueued,
            executions: load(&s.executions),
            tasks: load(&s.tasks),
            failed: load(&s.failed),
            pending: enqueued.saturating_sub(load(&s.completed)),
            launch_nanos: load(&s.launch_nanos),
            compile_wait_nanos: load(&s.compile_wait_nanos),
            device_nanos: s.device_busy.lock().nanos,
            queue_nanos: load(&s.queue_nanos),
            caller_launches: load(&s.caller_launches),
            worker_wakes: load(&self.inbox.wakes),
            upload_reuses: s.uploads.lock().hits,
        }
    }
}

impl Drop for ExecQueue {
    /// Runs everything already enqueued, then stops the worker.
    fn drop(&mut self) {
        self.inbox.close();
        if let Some(worker) = self.worker.take() {
            if worker.thread().id() != std::thread::current().id() {
                let _ = worker.join();
            }
        }
    }
}

fn fail_all(shared: &QueueShared, outputs: &[WeakDeviceValue], error: ExecError) {
    shared.failed.fetch_add(1, Ordering::Relaxed);
    for output in outputs.iter().filter_map(WeakDeviceValue::upgrade) {
        output.resolve(Err(error.clone()));
    }
}

fn resolve_all(
    shared: &QueueShared,
    label: &Arc<str>,
    outputs: &[WeakDeviceValue],
    results: Vec<Arc<Buffer>>,
) {
    if results.len() != outputs.len() {
        let error = ExecError::OutputCount {
            label: label.clone(),
            expected: outputs.len(),
            got: results.len(),
        };
        return fail_all(shared, outputs, error);
    }
    for (output, buffer) in outputs.iter().zip(results) {
        // Upgraded one at a time and let go at once, so a reader woken by this result sees
        // the value held by its own handles only.
        if let Some(output) = output.upgrade() {
            output.resolve(Ok((buffer, Some(label.clone()))));
        }
    }
}

fn serve(shared: &QueueShared, inbox: &Inbox) {
    let mut batch = std::collections::VecDeque::new();
    while inbox.take_all(&mut batch) {
        while let Some(item) = batch.pop_front() {
            run(shared, item);
        }
    }
}

fn run(shared: &QueueShared, item: Work) {
    match item {
        Work::Execute(job) => {
            add_nanos(&shared.queue_nanos, job.made_at.elapsed());
            let outcome = catch_unwind(AssertUnwindSafe(|| execute(shared, &job))).unwrap_or_else(
                |payload| {
                    Err(ExecError::Task {
                        label: job.label.clone(),
                        message: format!("panicked: {}", panic_message(payload.as_ref())),
                    })
                },
            );
            // Let go of the arguments before resolving, and of each output right after: a
            // reader woken by the result then sees the queue no longer holding the values,
            // so they can be donated to the next execution.
            let ExecJob {
                label,
                arguments,
                outputs,
                ..
            } = job;
            // The buffers themselves are let go of only after the results are out: the plugin's
            // destruction of an argument waits for the execution reading it (measured: about
            // the execution's whole time), which must not delay the reader.
            let buffers: SmallVec<[Arc<Buffer>; 8]> = arguments
                .iter()
                .filter_map(|v| v.try_get().and_then(Result::ok))
                .collect();
            drop(arguments);
            match outcome {
                Ok(results) => resolve_all(shared, &label, &outputs, results),
                Err(error) => fail_all(shared, &outputs, error),
            }
            drop(buffers);
        }
        Work::Task {
            label,
            outputs,
            task,
        } => {
            shared.tasks.fetch_add(1, Ordering::Relaxed);
            let outcome = catch_unwind(AssertUnwindSafe(task)).unwrap_or_else(|payload| {
                Err(format!("panicked: {}", panic_message(payload.as_ref())))
            });
            match outcome {
                Ok(results) => resolve_all(shared, &label, &outputs, results),
                Err(message) => fail_all(shared, &outputs, ExecError::Task { label, message }),
            }
        }
        Work::Marker(done) => {
            // Counted before the flusher wakes, so it sees no pending work of its own.
            shared.completed.fetch_add(1, Ordering::Release);
            let _ = done.send(());
            return;
        }
    }
    shared.completed.fetch_add(1, Ordering::Release);
}

fn add_nanos(counter: &AtomicU64, elapsed: Duration) {
    counter.fetch_add(
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

fn execute(shared: &QueueShared, job: &ExecJob) -> Result<Vec<Arc<Buffer>>, ExecError> {
    let label = &job.label;
    let waited = std::time::Instant::now();
    let executable = job.executable.wait().map_err(|source| ExecError::Compile {
        label: label.clone(),
        source,
    })?;
    let started = std::time::Instant::now();
    add_nanos(&shared.compile_wait_nanos, started - waited);
    let mut arguments = Vec::with_capacity(job.arguments.len() + job.uploads.len());
    for (index, argument) in job.arguments.iter().enumerate() {
        let buffer = argument.wait().map_err(|error| ExecError::Argument {
            label: label.clone(),
            index,
            cause: Arc::new(error.root_cause().clone()),
        })?;
        arguments.push(buffer);
    }
    for upload in &job.uploads {
        // Locked twice on a miss (look up, then insert) rather than across the upload: the
        // PJRT call must not hold the cache other launches read.
        if let Some(buffer) = shared.uploads.lock().get(upload, job.device.as_ref()) {
            arguments.push(buffer);
            continue;
        }
        // A failed upload reads as a failed argument, as if it had been a queued transfer.
        let uploaded = match &job.device {
            Some(device) => upload.client.buffer_from_host_on(
                &upload.bytes,
                upload.element_type,
                &upload.dims,
                device,
            ),
            None => {
                upload
                    .client
                    .buffer_from_host(&upload.bytes, upload.element_type, &upload.dims)
            }
        };
        let buffer = uploaded.map_err(|e| ExecError::Argument {
            label: label.clone(),
            index: arguments.len(),
            cause: Arc::new(ExecError::Task {
                label: upload.what.into(),
                message: format!("uploading {}: {e}", upload.what),
            }),
        })?;
        let buffer = Arc::new(buffer);
        shared
            .uploads
            .lock()
            .insert(upload, job.device.as_ref(), buffer.clone());
        arguments.push(buffer);
    }
    let borrowed: Vec<&Buffer> = arguments.iter().map(|b| b.as_ref()).collect();
    // A donatable argument that something besides this job still holds (a read in flight on
    // another thread) is copied rather than consumed: the executable is the same either way.
    let options = ExecuteOptions {
        non_donatable: (0..arguments.len())
            .filter(|&i| {
                // Uploads are never donated: the upload cache may hand the buffer out again.
                i >= job.arguments.len()
                    || !job.donatable.contains(&i)
                    || !job.arguments[i].is_unique()
            })
            .map(|i| i as i64)
            .collect(),
        device: job.device.clone(),
    };
    let (results, completion) =
        executable
            .execute_with(&borrowed, &options)
            .map_err(|e| ExecError::Execute {
                label: label.clone(),
                message: e.to_string(),
            })?;
    shared.executions.fetch_add(1, Ordering::Relaxed);
    add_nanos(&shared.launch_nanos, started.elapsed());
    let traced = (job.traced_region != 0).then(|| {
        trace::Event {
            track: trace::Track::Device,
            name: label.to_string(),
            thread: 0,
            start: started,
            end: started,
            args: Vec::new(),
        }
        .arg("region", trace::Arg::Int(job.traced_region as i64))
        .arg("key", trace::Arg::Text(job.executable.key().to_string()))
        .arg("arguments", trace::Arg::Int(arguments.len() as i64))
        .arg("outputs", trace::Arg::Int(results.len() as i64))
    });
    let Some(completion) = completion else {
        if let Some(mut event) = traced {
            event.end = std::time::Instant::now();
            trace::record(event);
        }
        return Ok(results.into_iter().map(Arc::new).collect());
    };
    {
        let busy = shared.device_busy.clone();
        let awaited = traced.is_some();
        if awaited {
            trace::await_one();
        }
        // Timed from the launch: a program the plugin ran inside its execute call is ready here.
        let registered = completion.on_ready(move |_| {
            let done = std::time::Instant::now();
            busy.lock().complete(started, done);
            if let Some(mut event) = traced {
                event.end = done;
                trace::record_awaited(event);
            }
        });
        if registered.is_err() && awaited {
            trace::abandon_one();
        }
        let mut launched = shared.launched.lock();
        // Executions finish about in launch order: dropping the finished ones from the front
        // keeps the list short without scanning it.
        while launched
            .front()
            .is_some_and(|(_, e)| e.is_ready().unwrap_or(true))
        {
            launched.pop_front();
        }
        launched.push_back((label.clone(), completion));
    }
    Ok(results.into_iter().map(Arc::new).collect())
}
