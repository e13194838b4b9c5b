//! `Compiler`: the compile thread pool in front of the three cache tiers, with in-flight
//! deduplication, and the `CompileHandle` every request returns.

use crate::config::{CompileConfig, Effort};
use crate::cpu::cpu_features_hash;
use crate::disk::{DiskTier, EntryRead, KeyLock};
use crate::error::{panic_message, CompileError};
use crate::handle::Slot;
use crate::key::{CacheKey, FingerprintInputs};
use crate::mappings::MappingBudget;
use crate::tier1::{KeyMap, Tier1};
use crate::trace;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use pjrt::LoadedExecutable;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type CompileResult = Result<Arc<LoadedExecutable>, CompileError>;
type BuildFn = Box<dyn FnOnce() -> Result<String, String> + Send + 'static>;

/// The future executable of one key. Cloning is cheap; every clone sees the same outcome.
#[derive(Clone)]
pub struct CompileHandle {
    key: CacheKey,
    outcome: Outcome,
}

#[derive(Clone)]
enum Outcome {
    /// Known when the handle was made (a tier-1 hit, the common case): no slot to allocate.
    Ready(Arc<LoadedExecutable>),
    /// Filled by whoever compiles (or already filled with a failure).
    Slot(Arc<Slot<CompileResult>>),
}

impl std::fmt::Debug for CompileHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileHandle")
            .field("key", &format_args!("{}", self.key))
            .field("ready", &self.is_ready())
            .finish()
    }
}

impl CompileHandle {
    /// A handle that already holds `executable` (e.g. one obtained outside any cache).
    pub fn ready(key: CacheKey, executable: Arc<LoadedExecutable>) -> CompileHandle {
        CompileHandle {
            key,
            outcome: Outcome::Ready(executable),
        }
    }

    /// A handle that already holds a failure.
    pub fn failed(key: CacheKey, error: CompileError) -> CompileHandle {
        CompileHandle {
            key,
            outcome: Outcome::Slot(Arc::new(Slot::filled(Err(error)))),
        }
    }

    fn pending(key: CacheKey) -> CompileHandle {
        CompileHandle {
            key,
            outcome: Outcome::Slot(Arc::new(Slot::empty())),
        }
    }

    pub fn key(&self) -> CacheKey {
        self.key
    }

    /// Blocks until the executable is available or the compile has failed.
    pub fn wait(&self) -> CompileResult {
        match &self.outcome {
            Outcome::Ready(executable) => Ok(executable.clone()),
            Outcome::Slot(slot) => slot.wait(),
        }
    }

    /// [`CompileHandle::wait`] for at most `timeout`; `None` if still compiling.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<CompileResult> {
        match &self.outcome {
            Outcome::Ready(executable) => Some(Ok(executable.clone())),
            Outcome::Slot(slot) => slot.wait_timeout(timeout),
        }
    }

    /// The outcome if there is one yet; never blocks.
    pub fn try_get(&self) -> Option<CompileResult> {
        match &self.outcome {
            Outcome::Ready(executable) => Some(Ok(executable.clone())),
            Outcome::Slot(slot) => slot.get(),
        }
    }

    pub fn is_ready(&self) -> bool {
        match &self.outcome {
            Outcome::Ready(_) => true,
            Outcome::Slot(slot) => slot.is_filled(),
        }
    }

    /// Settles a pending handle (a ready one has nothing to settle).
    fn fill(&self, result: CompileResult) {
        if let Outcome::Slot(slot) = &self.outcome {
            slot.fill(result);
        }
    }

    /// Whether two handles wait on the same compile (or hold the same executable).
    pub fn same_request(&self, other: &CompileHandle) -> bool {
        match (&self.outcome, &other.outcome) {
            (Outcome::Ready(a), Outcome::Ready(b)) => Arc::ptr_eq(a, b),
            (Outcome::Slot(a), Outcome::Slot(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// Counters of a [`Compiler`] since it was made or last reset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Successful compiles (from MLIR text).
    pub compilations: u64,
    /// `lookup`s and `request`s answered from memory.
    pub tier1_hits: u64,
    pub tier2_hits: u64,
    pub tier3_hits: u64,
    /// Requests no tier could serve: the module text was built and compiled.
    pub misses: u64,
    /// Requests that joined a compile already in flight for their key.
    pub inflight_dedups: u64,
    pub compile_time_total: Duration,
    /// Time spent deserializing and loading tier-2/3 entries.
    pub deserialize_time_total: Duration,
    pub bytes_written_tier2: u64,
    pub bytes_written_tier3: u64,
    /// Builds and compiles that failed (including panics).
    pub failures: u64,
    /// Executables in tier 1 now.
    pub tier1_entries: u64,
    /// Tier-1 entries dropped to stay within capacity.
    pub evictions: u64,
    /// Tier-2/3 entries found corrupt, truncated, foreign, unreadable or undeserializable
    /// (each then treated as a miss and rewritten).
    pub invalid_entries: u64,
    /// Cache or dump files that could not be written, locks that could not be taken.
    pub disk_errors: u64,
    /// Times a compile thread, idle after compiling, handed freed heap pages back to the system.
    pub heap_trims: u64,
    /// Quick programs compiled again with the full options in the background and swapped in
    /// (tiered compilation). Not counted in `compilations`: nothing waited for them.
    pub upgrades: u64,
    /// Time the background thread spent compiling those.
    pub upgrade_time_total: Duration,
    /// The latest compiles, oldest first (at most [`RECENT_COMPILES_KEPT`]).
    pub recent: Vec<CompiledProgram>,
    /// The longest compile.
    pub slowest: Option<CompiledProgram>,
}

#[derive(Default)]
struct Counters {
    compilations: AtomicU64,
    tier1_hits: AtomicU64,
    tier2_hits: AtomicU64,
    tier3_hits: AtomicU64,
    misses: AtomicU64,
    inflight_dedups: AtomicU64,
    compile_nanos: AtomicU64,
    deserialize_nanos: AtomicU64,
    bytes_written_tier2: AtomicU64,
    bytes_written_tier3: AtomicU64,
    failures: AtomicU64,
    evictions: AtomicU64,
    invalid_entries: AtomicU64,
    disk_errors: AtomicU64,
    heap_trims: AtomicU64,
    upgrades: AtomicU64,
    upgrade_nanos: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn add_time(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

#[derive(Clone, Copy)]
enum Tier {
    Shared,
    Persistent,
}

struct Job {
    key: CacheKey,
    label: Arc<str>,
    build: BuildFn,
    handle: CompileHandle,
}

/// How many recent compiles [`CompileStats::recent`] lists.
pub const RECENT_COMPILES_KEPT: usize = 32;

/// One program compiled from its module text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledProgram {
    /// What the caller named it (a region's label), empty when unnamed.
    pub label: Arc<str>,
    pub key: CacheKey,
    pub time: Duration,
    /// Compiled with the fast-compile options ([`crate::Effort::Fast`]).
    pub fast: bool,
    /// Compiled with the quick-compile options ([`crate::Effort::Quick`]).
    pub quick: bool,
}

/// Where a program in tier 1 came from, for [`Compiler::program_stats`].
#[derive(Clone, Debug)]
struct ProgramOrigin {
    label: Arc<str>,
    source: &'static str,
    compile_time: Duration,
}

/// One program in tier 1: what it is, where it came from, how often it was found there.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramStats {
    pub key: CacheKey,
    pub label: Arc<str>,
    /// `"compiled"`, `"tier2"` or `"tier3"` (loaded from that disk tier), or `"inserted"`.
    pub source: &'static str,
    /// Compiling it, when this process compiled it.
    pub compile_time: Duration,
    /// Tier-1 lookups that found it.
    pub hits: u64,
}

/// Adds the `overrides` that `options` does not name already, ahead of its own: a later entry
/// for a name wins, so the options already there (the user's) keep their values.
fn put_under(options: &mut pjrt::CompileOptions, overrides: &[(String, pjrt::CompileOverride)]) {
    let added: Vec<_> = overrides
        .iter()
        .filter(|(name, _)| !options.overrides.iter().any(|(n, _)| n == name))
        .cloned()
        .collect();
    options.overrides.splice(0..0, added);
}

struct Shared {
    client: pjrt::Client,
    /// `TORCH_PJRT_CACHE_ONLY`: refuse to compile.
    cache_only: bool,
    /// `TORCH_PJRT_CACHE_MAX_MB`: tier 3's bound in bytes.
    persistent_max_bytes: Option<u64>,
    /// Where each program obtained by this compiler came from.
    origins: Mutex<KeyMap<ProgramOrigin>>,
    compile_options: pjrt::CompileOptions,
    /// `compile_options` plus the fast-compile overrides, and the options word of its keys.
    fast_options: Option<(u64, pjrt::CompileOptions)>,
    /// `compile_options` plus the quick-compile overrides, and the options word of its keys.
    quick_options: Option<(u64, pjrt::CompileOptions)>,
    /// Added to the options of a module whose reductions are all short.
    short_reduction_overrides: Vec<(String, pjrt::CompileOverride)>,
    dump_dir: Option<PathBuf>,
    tier1: Tier1<Arc<LoadedExecutable>>,
    /// Tier 1 also shrinks when the process's memory mappings near the kernel's cap.
    mappings: MappingBudget,
    tier2: Option<DiskTier>,
    tier3: Option<DiskTier>,
    inflight: Mutex<KeyMap<CompileHandle>>,
    counters: Counters,
    /// The latest compiles and the slowest one, since the stats were reset.
    compiled: Mutex<(
        std::collections::VecDeque<CompiledProgram>,
        Option<CompiledProgram>,
    )>,
    last_disk_problem: Mutex<Option<String>>,
    /// Whether the pool still takes jobs, and how many it is running now.
    exit: Mutex<ExitState>,
    /// Signalled whenever a running job ends.
    job_ended: Condvar,
    /// Tiered compilation of quick programs, when on.
    upgrades: Option<UpgradePlan>,
}

/// What tiered compilation keeps: when a quick program is due for its full compile, and how to
/// build its module again.
struct UpgradePlan {
    /// The options word of quick programs' keys: only those are upgraded.
    quick_word: u64,
    /// The options word of full compiles: an upgraded program is stored on disk under its
    /// region's key with this word, which is exactly what a full compile of it would be.
    full_word: u64,
    /// Tier-1 hits after which a quick program is compiled again.
    after_runs: u64,
    /// How to build each quick program's module again, until it is upgraded; bounded by
    /// [`UPGRADE_SOURCES_KEPT`] (a program past the bound stays quick).
    sources: Mutex<KeyMap<(Arc<str>, BuildFn)>>,
    /// Upgrades handed to the background thread and not finished (or dropped) yet.
    outstanding: AtomicU64,
}

/// Quick programs whose module source is kept for an upgrade at most.
const UPGRADE_SOURCES_KEPT: usize = 256;

/// A quick program due for its full compile.
struct Upgrade {
    key: CacheKey,
    label: Arc<str>,
    build: BuildFn,
}

/// The pool's progress toward a process exit.
#[derive(Default)]
struct ExitState {
    /// Set by [`Compiler::close_for_exit`]: later jobs are answered with `ShutDown`.
    closing: bool,
    running: usize,
    /// Upgrades being compiled now (also counted in `running`).
    upgrading: usize,
    /// When the pool's latest job ended: upgrades wait for a quiet spell after it.
    last_job_end: Option<Instant>,
}

/// Compiles StableHLO modules on a thread pool and caches the executables in three tiers:
/// memory (tier 1), a host-local shared directory (tier 2) and a persistent directory (tier 3).
/// Share it through an `Arc`; every method takes `&self`.
pub struct Compiler {
    shared: Arc<Shared>,
    sender: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    /// The background thread of tiered compilation and its queue, when on.
    upgrader: Option<(Sender<Upgrade>, JoinHandle<()>)>,
    options_fingerprint: u64,
    fast_options_fingerprint: u64,
    quick_options_fingerprint: u64,
    cpu_features: String,
    cache_dir_name: String,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler")
            .field("threads", &self.threads.len())
            .field("tier2", &self.tier2_dir())
            .field("tier3", &self.tier3_dir())
            .field(
                "options_fingerprint",
                &format_args!("{:016x}", self.options_fingerprint),
            )
            .finish()
    }
}

/// Keeps a directory-name component to characters every filesystem accepts.
fn path_safe(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Compiler {
    /// Starts the pool and opens (creating) the configured directories. Tiers 2 and 3 live in a
    /// subdirectory named after the engine version, the plugin build and the CPU features, so
    /// another engine, plugin or CPU never even sees this one's entries.
    pub fn new(client: pjrt::Client, config: CompileConfig) -> Result<Compiler, CompileError> {
        let mut inputs = FingerprintInputs::gather(
            client.plugin(),
            &client,
            &config.compile_options,
            &config.engine_version,
        );
        inputs.cpu_features = config.cpu_features.clone();
        let with_overrides = |overrides: &[(String, pjrt::CompileOverride)]| {
            (!overrides.is_empty()).then(|| {
                let mut options = config.compile_options.clone();
                put_under(&mut options, overrides);
                let mut inputs = FingerprintInputs::gather(
                    client.plugin(),
                    &client,
                    &options,
                    &config.engine_version,
                );
                inputs.cpu_features = config.cpu_features.clone();
                (inputs.fingerprint(), options)
            })
        };
        let fast_options = with_overrides(&config.fast_overrides);
        let quick_options = with_overrides(&config.quick_overrides);
        let cache_dir_name = format!(
            "torch-pjrt-{}-{}-plugin{:016x}-cpu{:016x}",
            path_safe(&config.engine_version),
            path_safe(client.platform_name()),
            inputs.plugin_fingerprint(),
            cpu_features_hash(&config.cpu_features),
        );
        let open = |root: &Option<PathBuf>, variable: &str| -> Result<_, CompileError> {
            root.as_ref()
                .map(|root| {
                    DiskTier::open(root.join(&cache_dir_name)).map_err(|e| {
                        CompileError::Config(format!(
                            "cannot create the compilation cache directory {} ({e}); make it \
                             writable or change {variable}",
                            root.display()
                        ))
                    })
                })
                .transpose()
        };
        let tier2 = open(&config.shared_dir, "TORCH_PJRT_SHARED_CACHE")?;
        let tier3 = open(&config.persistent_dir, "TORCH_PJRT_CACHE_DIR")?;
        if let Some(dump) = &config.dump_dir {
            std::fs::create_dir_all(dump).map_err(|e| {
                CompileError::Config(format!(
                    "cannot create the dump directory {} ({e}); make it writable or change \
                     TORCH_PJRT_DUMP_DIR",
                    dump.display()
                ))
            })?;
        }
        let shared = Arc::new(Shared {
            client,
            cache_only: config.cache_only,
            persistent_max_bytes: config.persistent_max_bytes,
            origins: Mutex::new(KeyMap::default()),
            compile_options: config.compile_options.clone(),
            fast_options: fast_options.clone(),
            quick_options: quick_options.clone(),
            short_reduction_overrides: config.short_reduction_overrides.clone(),
            dump_dir: config.dump_dir.clone(),
            tier1: Tier1::new(config.tier1_capacity),
            mappings: MappingBudget::from_system(),
            tier2,
            tier3,
            inflight: Mutex::new(KeyMap::default()),
            counters: Counters::default(),
            compiled: Mutex::new(Default::default()),
            last_disk_problem: Mutex::new(None),
            exit: Mutex::new(ExitState::default()),
            job_ended: Condvar::new(),
            upgrades: config
                .upgrade_after_runs
                .filter(|_| quick_options.is_some())
                .map(|after_runs| UpgradePlan {
                    quick_word: quick_options.as_ref().map_or(0, |(word, _)| *word),
                    full_word: inputs.fingerprint(),
                    after_runs: after_runs.max(1),
                    sources: Mutex::new(KeyMap::default()),
                    outstanding: AtomicU64::new(0),
                }),
        });
        let upgrader = match shared.upgrades {
            Some(_) => {
                let (sender, receiver) = crossbeam_channel::unbounded::<Upgrade>();
                let shared = shared.clone();
                let thread = std::thread::Builder::new()
                    .name("torch-pjrt-upgrade".to_string())
                    .spawn(move || serve_upgrades(&shared, &receiver))
                    .map_err(|e| {
                        CompileError::Config(format!("cannot start the upgrade thread: {e}"))
                    })?;
                Some((sender, thread))
            }
            None => None,
        };
        let (sender, receiver) = crossbeam_channel::unbounded::<Job>();
        let mut threads = Vec::new();
        for index in 0..config.threads.max(1) {
            let shared = shared.clone();
            let receiver = receiver.clone();
            let thread = std::thread::Builder::new()
                .name(format!("torch-pjrt-compile-{index}"))
                .spawn(move || serve(&shared, &receiver))
                .map_err(|e| CompileError::Config(format!("cannot start a compile thread: {e}")))?;
            threads.push(thread);
        }
        Ok(Compiler {
            shared,
            sender: Some(sender),
            threads,
            upgrader,
            options_fingerprint: inputs.fingerprint(),
            fast_options_fingerprint: fast_options
                .as_ref()
                .map_or_else(|| inputs.fingerprint(), |(word, _)| *word),
            quick_options_fingerprint: quick_options
                .as_ref()
                .map_or_else(|| inputs.fingerprint(), |(word, _)| *word),
            cpu_features: config.cpu_features,
            cache_dir_name,
        })
    }

    /// The `options` word to put in every [`CacheKey`] of a [`Effort::Full`] compile.
    pub fn options_fingerprint(&self) -> u64 {
        self.options_fingerprint
    }

    /// The `options` word of keys compiled with `effort`; the key's word picks the options a
    /// compile uses, so the two efforts never share an entry in any tier.
    pub fn options_fingerprint_for(&self, effort: Effort) -> u64 {
        match effort {
            Effort::Full => self.options_fingerprint,
            Effort::Fast => self.fast_options_fingerprint,
            Effort::Quick => self.quick_options_fingerprint,
        }
    }

    /// The CPU features string this compiler names its entries with.
    pub fn cpu_features(&self) -> &str {
        &self.cpu_features
    }

    pub fn client(&self) -> &pjrt::Client {
        &self.shared.client
    }

    /// The versioned subdirectory name used under both disk tiers.
    pub fn cache_dir_name(&self) -> &str {
        &self.cache_dir_name
    }

    pub fn tier2_dir(&self) -> Option<&Path> {
        self.shared.tier2.as_ref().map(|t| t.dir())
    }

    pub fn tier3_dir(&self) -> Option<&Path> {
        self.shared.tier3.as_ref().map(|t| t.dir())
    }

    /// Where `key`'s tier-2 entry lives (whether or not it exists).
    pub fn tier2_entry_path(&self, key: &CacheKey) -> Option<PathBuf> {
        self.shared.tier2.as_ref().map(|t| t.entry_path(key))
    }

    /// Where `key`'s tier-3 entry lives (whether or not it exists).
    pub fn tier3_entry_path(&self, key: &CacheKey) -> Option<PathBuf> {
        self.shared.tier3.as_ref().map(|t| t.entry_path(key))
    }

    /// Tier 1 only: never blocks on a compile, never touches disk.
    pub fn lookup(&self, key: &CacheKey) -> Option<Arc<LoadedExecutable>> {
        let (found, hits) = self.shared.tier1.get_counted(key)?;
        bump(&self.shared.counters.tier1_hits);
        self.maybe_upgrade(key, hits);
        Some(found)
    }

    /// Hands a quick program to the background thread when tier 1 has just served it for the
    /// `after_runs`-th time: it has shown it runs often enough for a full compile to pay.
    fn maybe_upgrade(&self, key: &CacheKey, hits: u64) {
        let (Some(plan), Some((sender, _))) = (&self.shared.upgrades, &self.upgrader) else {
            return;
        };
        if key.options != plan.quick_word || hits != plan.after_runs {
            return;
        }
        let Some((label, build)) = plan.sources.lock().remove(key) else {
            return;
        };
        plan.outstanding.fetch_add(1, Ordering::AcqRel);
        if sender
            .send(Upgrade {
                key: *key,
                label,
                build,
            })
            .is_err()
        {
            plan.outstanding.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Hands every quick program whose module is still kept to the background thread at once,
    /// however often it has run; returns how many. A loop reaches the same programs once each
    /// has run `after_runs` times; a benchmark that must time that settled state asks for it
    /// after warm-up (a prefill that runs once per request would otherwise stay quick until
    /// the eighth request).
    pub fn upgrade_all_now(&self) -> usize {
        let (Some(plan), Some((sender, _))) = (&self.shared.upgrades, &self.upgrader) else {
            return 0;
        };
        let due: Vec<(CacheKey, (Arc<str>, BuildFn))> = plan.sources.lock().drain().collect();
        let mut queued = 0;
        for (key, (label, build)) in due {
            plan.outstanding.fetch_add(1, Ordering::AcqRel);
            if sender.send(Upgrade { key, label, build }).is_err() {
                plan.outstanding.fetch_sub(1, Ordering::AcqRel);
            } else {
                queued += 1;
            }
        }
        queued
    }

    /// Waits, at most `limit`, until no upgrade is queued or running; returns whether so.
    /// For tests and benchmarks that must see the programs a loop settles on.
    pub fn wait_for_upgrades(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let Some(plan) = &self.shared.upgrades else {
            return true;
        };
        loop {
            if plan.outstanding.load(Ordering::Acquire) == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Drops every executable of tier 1 (the disk tiers keep theirs); returns how many went.
    /// Compiles in flight still land in tier 1 when they finish.
    pub fn clear_tier1(&self) -> u64 {
        self.shared.tier1.shrink_to(0)
    }

    /// Every program in tier 1, with where it came from and how often it was found there.
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        let origins = self.shared.origins.lock();
        let mut stats: Vec<ProgramStats> = self
            .shared
            .tier1
            .hits()
            .into_iter()
            .map(|(key, hits)| {
                let origin = origins.get(&key);
                ProgramStats {
                    key,
                    label: origin.map_or_else(|| Arc::from(""), |o| o.label.clone()),
                    source: origin.map_or("inserted", |o| o.source),
                    compile_time: origin.map_or(Duration::ZERO, |o| o.compile_time),
                    hits,
                }
            })
            .collect();
        stats.sort_by(|a, b| b.hits.cmp(&a.hits).then(a.label.cmp(&b.label)));
        stats
    }

    /// Puts an executable obtained elsewhere into tier 1.
    pub fn insert(&self, key: CacheKey, executable: Arc<LoadedExecutable>) {
        self.shared.insert_tier1(key, executable);
    }

    /// Returns at once. A tier-1 hit gives a ready handle; otherwise a pool thread tries tier 2,
    /// then tier 3, and only then calls `build` for the module text and compiles it. Concurrent
    /// requests for one key share one handle and one compile. `build`'s error string (and the
    /// plugin's diagnostic, if compiling fails) reaches every waiter.
    pub fn request<F>(&self, key: CacheKey, build: F) -> CompileHandle
    where
        F: FnOnce() -> Result<String, String> + Send + 'static,
    {
        self.request_named(key, Arc::from(""), build)
    }

    /// [`Compiler::request`], naming the program (a region's label) in [`CompileStats::recent`].
    pub fn request_named<F>(&self, key: CacheKey, label: Arc<str>, build: F) -> CompileHandle
    where
        F: FnOnce() -> Result<String, String> + Send + 'static,
    {
        let counters = &self.shared.counters;
        if let Some((executable, hits)) = self.shared.tier1.get_counted(&key) {
            bump(&counters.tier1_hits);
            self.maybe_upgrade(&key, hits);
            return CompileHandle::ready(key, executable);
        }
        let mut inflight = self.shared.inflight.lock();
        if let Some(handle) = inflight.get(&key) {
            bump(&counters.inflight_dedups);
            return handle.clone();
        }
        // A pool thread inserts into tier 1 before it leaves the in-flight map: checking again
        // under the map's lock closes the window between the first lookup and the lock.
        if let Some(executable) = self.shared.tier1.get(&key) {
            bump(&counters.tier1_hits);
            return CompileHandle::ready(key, executable);
        }
        let handle = CompileHandle::pending(key);
        inflight.insert(key, handle.clone());
        drop(inflight);
        let job = Job {
            key,
            label,
            build: Box::new(build),
            handle: handle.clone(),
        };
        let refused = match &self.sender {
            Some(sender) => sender.send(job).err().map(|e| e.into_inner()),
            None => Some(job),
        };
        if let Some(job) = refused {
            self.shared.inflight.lock().remove(&key);
            job.handle.fill(Err(CompileError::ShutDown { key }));
        }
        handle
    }

    /// The most recent invalid entry or disk error (they are counted in [`CompileStats`] and
    /// otherwise silent: the cache degrades to compiling).
    pub fn last_disk_problem(&self) -> Option<String> {
        self.shared.last_disk_problem.lock().clone()
    }

    pub fn stats(&self) -> CompileStats {
        let c = &self.shared.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let (recent, slowest) = {
            let compiled = self.shared.compiled.lock();
            (compiled.0.iter().cloned().collect(), compiled.1.clone())
        };
        CompileStats {
            compilations: load(&c.compilations),
            tier1_hits: load(&c.tier1_hits),
            tier2_hits: load(&c.tier2_hits),
            tier3_hits: load(&c.tier3_hits),
            misses: load(&c.misses),
            inflight_dedups: load(&c.inflight_dedups),
            compile_time_total: Duration::from_nanos(load(&c.compile_nanos)),
            deserialize_time_total: Duration::from_nanos(load(&c.deserialize_nanos)),
            bytes_written_tier2: load(&c.bytes_written_tier2),
            bytes_written_tier3: load(&c.bytes_written_tier3),
            failures: load(&c.failures),
            tier1_entries: self.shared.tier1.len() as u64,
            evictions: load(&c.evictions),
            invalid_entries: load(&c.invalid_entries),
            disk_errors: load(&c.disk_errors),
            heap_trims: load(&c.heap_trims),
            upgrades: load(&c.upgrades),
            upgrade_time_total: Duration::from_nanos(load(&c.upgrade_nanos)),
            recent,
            slowest,
        }
    }

    /// Readies the process to exit: requests not yet started are answered with
    /// [`CompileError::ShutDown`] instead of compiled, and the compiles running now are waited
    /// for, at most `limit`. A compile must not be running while the process tears down the
    /// runtime's (LLVM's) global state: that crashes it. Returns whether the pool is idle.
    /// Call it only in the process that made the compiler (a forked child has no pool threads).
    pub fn close_for_exit(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut exit = self.shared.exit.lock();
        exit.closing = true;
        while exit.running > 0 {
            if self
                .shared
                .job_ended
                .wait_until(&mut exit, deadline)
                .timed_out()
            {
                return exit.running == 0;
            }
        }
        true
    }

    /// Zeroes every counter (`tier1_entries` reports the live count and is not a counter).
    pub fn reset_stats(&self) {
        let c = &self.shared.counters;
        for counter in [
            &c.compilations,
            &c.tier1_hits,
            &c.tier2_hits,
            &c.tier3_hits,
            &c.misses,
            &c.inflight_dedups,
            &c.compile_nanos,
            &c.deserialize_nanos,
            &c.bytes_written_tier2,
            &c.bytes_written_tier3,
            &c.failures,
            &c.evictions,
            &c.invalid_entries,
            &c.disk_errors,
            &c.heap_trims,
            &c.upgrades,
            &c.upgrade_nanos,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
        *self.shared.compiled.lock() = Default::default();
    }
}

impl Drop for Compiler {
    /// Lets the pool finish every queued request (their waiters get an answer), then joins it.
    fn drop(&mut self) {
        drop(self.sender.take());
        let current = std::thread::current().id();
        if let Some((sender, thread)) = self.upgrader.take() {
            drop(sender);
            if thread.thread().id() != current {
                let _ = thread.join();
            }
        }
        for thread in self.threads.drain(..) {
            // The last reference may be dropped by a build closure on a pool thread.
            if thread.thread().id() != current {
                let _ = thread.join();
            }
        }
    }
}

fn serve(shared: &Shared, jobs: &Receiver<Job>) {
    let mut busy_since_trim = Duration::ZERO;
    for job in jobs.iter() {
        {
            let mut exit = shared.exit.lock();
            if exit.closing {
                drop(exit);
                shared.refuse(job);
                continue;
            }
            exit.running += 1;
        }
        let started = Instant::now();
        shared.run(job);
        busy_since_trim += started.elapsed();
        {
            let mut exit = shared.exit.lock();
            exit.running -= 1;
            exit.last_job_end = Some(Instant::now());
        }
        shared.job_ended.notify_all();
        // XLA frees what a compile allocated, but the allocator keeps the pages: a large
        // module's compile left about 1 GB resident for good. Handing them back takes a walk
        // over the heap, so it is done only once the queue is empty, and only after enough
        // compiling to have left garbage worth the walk.
        if busy_since_trim >= TRIM_AFTER_BUSY && jobs.is_empty() {
            busy_since_trim = Duration::ZERO;
            if release_free_heap() {
                bump(&shared.counters.heap_trims);
            }
        }
    }
}

/// The upgrade thread: compiles quick programs again with the full options, one at a time, at
/// the lowest scheduling priority, so that it takes only CPU time nothing else wants (a
/// request's own compiles and the loop it runs come first).
fn serve_upgrades(shared: &Shared, upgrades: &Receiver<Upgrade>) {
    lower_this_thread_priority();
    for upgrade in upgrades.iter() {
        // XLA compiles on its own worker threads too, which keep their priority: an upgrade
        // waits until the pool has been idle for a while, so that it does not slow the
        // compiles a new request is waiting for.
        loop {
            let exit = shared.exit.lock();
            let pool_running = exit.running - exit.upgrading;
            let quiet = exit
                .last_job_end
                .is_none_or(|end| end.elapsed() >= UPGRADE_QUIET_SPELL);
            if exit.closing || (pool_running == 0 && quiet) {
                break;
            }
            drop(exit);
            std::thread::sleep(UPGRADE_QUIET_SPELL / 8);
        }
        let finished = || {
            if let Some(plan) = &shared.upgrades {
                plan.outstanding.fetch_sub(1, Ordering::AcqRel);
            }
        };
        {
            let mut exit = shared.exit.lock();
            if exit.closing {
                drop(exit);
                finished();
                continue;
            }
            exit.running += 1;
            exit.upgrading += 1;
        }
        let _ = catch_unwind(AssertUnwindSafe(|| shared.upgrade(upgrade)));
        {
            let mut exit = shared.exit.lock();
            exit.running -= 1;
            exit.upgrading -= 1;
        }
        finished();
        shared.job_ended.notify_all();
        if upgrades.is_empty() && release_free_heap() {
            bump(&shared.counters.heap_trims);
        }
    }
}

/// How long the compile pool must have been idle before an upgrade starts.
const UPGRADE_QUIET_SPELL: Duration = Duration::from_millis(500);

/// Gives the calling thread (and the threads it starts) the lowest scheduling priority.
fn lower_this_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take plain integers; on Linux a thread id names one
        // thread for PRIO_PROCESS, so only this thread's nice value changes.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, 19);
        }
    }
}

/// Compile-thread time after which freed heap pages are handed back to the system.
const TRIM_AFTER_BUSY: Duration = Duration::from_millis(200);

/// Returns the allocator's free pages to the system; false where the allocator has no such call.
fn release_free_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes no pointers and only walks glibc's own arenas, under their
        // locks; any thread may call it at any time.
        unsafe {
            libc::malloc_trim(0);
        }
        true
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Writes `<dir>/<key>.mlir`: the key as comments, then the module text (still valid MLIR).
fn write_module(
    dir: &Path,
    key: &CacheKey,
    text: &str,
) -> Result<PathBuf, (PathBuf, std::io::Error)> {
    let contents = format!(
        "// torch-pjrt cache key {key}\n// shapeless={:016x} dims={:016x} options={:016x}\n{text}\n",
        key.shapeless, key.dims, key.options
    );
    let path = dir.join(format!("{key}.mlir"));
    match std::fs::write(&path, contents) {
        Ok(()) => Ok(path),
        Err(e) => Err((path, e)),
    }
}

impl Shared {
    /// Inserts into tier 1, evicting by count and, past the mapping budget, a quarter of the
    /// entries (their executables unmap once no queued job holds them).
    fn insert_tier1(&self, key: CacheKey, executable: Arc<LoadedExecutable>) {
        let mut evicted = self.tier1.insert(key, executable);
        if self.mappings.over_budget() {
            let len = self.tier1.len();
            evicted += self.tier1.shrink_to(len - len / 4);
        }
        self.counters
            .evictions
            .fetch_add(evicted, Ordering::Relaxed);
    }

    fn run(&self, job: Job) {
        let Job {
            key,
            label,
            build,
            handle,
        } = job;
        let started = Instant::now();
        let traced_label = trace::on().then(|| label.clone());
        let result = catch_unwind(AssertUnwindSafe(|| self.obtain(key, label, build)))
            .unwrap_or_else(|payload| {
                Err(CompileError::Panicked {
                    key,
                    message: panic_message(payload.as_ref()),
                })
            });
        if let Some(label) = traced_label {
            self.trace_compile(key, &label, started, &result);
        }
        match &result {
            Ok(executable) => self.insert_tier1(key, executable.clone()),
            Err(_) => bump(&self.counters.failures),
        }
        self.inflight.lock().remove(&key);
        handle.fill(result);
    }

    /// Records a compile-pool job in the trace: where its program came from (compiled, or
    /// loaded from tier 2 or 3) and how long that took, or why it failed.
    fn trace_compile(&self, key: CacheKey, label: &str, started: Instant, result: &CompileResult) {
        let tier = match result {
            Ok(_) => self
                .origins
                .lock()
                .get(&key)
                .map_or("compiled", |o| o.source),
            Err(_) => "failed",
        };
        let mut event = trace::Event::until_now(
            trace::Track::Compile,
            format!(
                "compile {}",
                if label.is_empty() { "program" } else { label }
            ),
            started,
        )
        .arg("key", trace::Arg::Text(key.to_string()))
        .arg("label", trace::Arg::Text(label.to_string()))
        .arg("tier", trace::Arg::Text(tier.to_string()));
        let seconds = (event.end - event.start).as_secs_f64();
        event = event.arg("seconds", trace::Arg::Float(seconds));
        if let Err(e) = result {
            event = event.arg("error", trace::Arg::Text(e.to_string()));
        }
        trace::record(event);
    }

    /// Answers a job the closing pool will not run.
    fn refuse(&self, job: Job) {
        let Job { key, handle, .. } = job;
        self.inflight.lock().remove(&key);
        handle.fill(Err(CompileError::ShutDown { key }));
    }

    fn obtain(&self, key: CacheKey, label: Arc<str>, build: BuildFn) -> CompileResult {
        // The tier-2 lock makes a second process on this host wait for the first one's compile
        // and then load its entry, instead of compiling the same key at the same time.
        let _lock: Option<KeyLock> = self.tier2.as_ref().and_then(|tier2| {
            tier2
                .lock(&key)
                .map_err(|e| {
                    self.disk_error(format!(
                        "locking key {key} in {}: {e}",
                        tier2.dir().display()
                    ))
                })
                .ok()
        });
        let origin = |source| ProgramOrigin {
            label: label.clone(),
            source,
            compile_time: Duration::ZERO,
        };
        // A quick program upgraded in an earlier run is on disk under its full-options key:
        // that one is taken first, and needs no upgrade.
        let upgraded_key = self
            .upgrades
            .as_ref()
            .filter(|plan| plan.quick_word == key.options)
            .map(|plan| CacheKey {
                options: plan.full_word,
                ..key
            });
        if let Some(upgraded_key) = upgraded_key {
            if let Some((executable, _)) = self.load(Tier::Shared, &upgraded_key) {
                bump(&self.counters.tier2_hits);
                self.origins.lock().insert(key, origin("tier2"));
                return Ok(executable);
            }
            if let Some((executable, bytes)) = self.load(Tier::Persistent, &upgraded_key) {
                bump(&self.counters.tier3_hits);
                self.origins.lock().insert(key, origin("tier3"));
                self.store(Tier::Shared, &upgraded_key, &bytes);
                return Ok(executable);
            }
        }
        if let Some((executable, _)) = self.load(Tier::Shared, &key) {
            bump(&self.counters.tier2_hits);
            self.origins.lock().insert(key, origin("tier2"));
            self.keep_upgrade_source(key, &label, build);
            return Ok(executable);
        }
        if let Some((executable, bytes)) = self.load(Tier::Persistent, &key) {
            bump(&self.counters.tier3_hits);
            self.origins.lock().insert(key, origin("tier3"));
            self.store(Tier::Shared, &key, &bytes);
            self.keep_upgrade_source(key, &label, build);
            return Ok(executable);
        }
        if self.cache_only {
            return Err(CompileError::Refused {
                key,
                message: format!(
                    "TORCH_PJRT_CACHE_ONLY is set and no cache tier holds the program of {}                      (key {key}): run once without TORCH_PJRT_CACHE_ONLY, with the same                      TORCH_PJRT_CACHE_DIR, to fill the cache",
                    if label.is_empty() { "this region" } else { &label }
                ),
            });
        }
        self.compile_and_store(key, label, build)
    }

    fn tier(&self, tier: Tier) -> Option<&DiskTier> {
        match tier {
            Tier::Shared => self.tier2.as_ref(),
            Tier::Persistent => self.tier3.as_ref(),
        }
    }

    /// A valid entry, deserialized and loaded; anything else is a miss.
    fn load(&self, tier: Tier, key: &CacheKey) -> Option<(Arc<LoadedExecutable>, Vec<u8>)> {
        let bytes = match self.tier(tier)?.read(key) {
            EntryRead::Missing => return None,
            EntryRead::Invalid(reason) => {
                self.invalid_entry(reason);
                return None;
            }
            EntryRead::Found(bytes) => bytes,
        };
        let start = Instant::now();
        let loaded = self.client.deserialize(&bytes);
        add_time(&self.counters.deserialize_nanos, start);
        match loaded {
            Ok(executable) => Some((Arc::new(executable), bytes)),
            Err(e) => {
                self.invalid_entry(format!("entry for key {key} does not load: {e}"));
                None
            }
        }
    }

    fn store(&self, tier: Tier, key: &CacheKey, payload: &[u8]) {
        let Some(disk) = self.tier(tier) else { return };
        match disk.write(key, payload) {
            Ok(written) => {
                let counter = match tier {
                    Tier::Shared => &self.counters.bytes_written_tier2,
                    Tier::Persistent => &self.counters.bytes_written_tier3,
                };
                counter.fetch_add(written, Ordering::Relaxed);
                if let (Tier::Persistent, Some(max)) = (tier, self.persistent_max_bytes) {
                    if let Err(e) = disk.trim_to(max) {
                        self.disk_error(format!("trimming {}: {e}", disk.dir().display()));
                    }
                }
            }
            Err(e) => self.disk_error(format!("writing {}: {e}", disk.entry_path(key).display())),
        }
    }

    fn invalid_entry(&self, reason: String) {
        bump(&self.counters.invalid_entries);
        *self.last_disk_problem.lock() = Some(reason);
    }

    fn disk_error(&self, message: String) {
        bump(&self.counters.disk_errors);
        *self.last_disk_problem.lock() = Some(message);
    }

    /// `base` plus what the module's own header asks for: the short-reduction options when it
    /// states that all its reductions are short. Options `base` names already win.
    fn module_options<'a>(
        &self,
        text: &str,
        base: &'a pjrt::CompileOptions,
    ) -> std::borrow::Cow<'a, pjrt::CompileOptions> {
        let short = crate::config::longest_reduction(text)
            .is_some_and(|longest| longest <= crate::config::SHORT_REDUCTION_MAX);
        if !short || self.short_reduction_overrides.is_empty() {
            return std::borrow::Cow::Borrowed(base);
        }
        let mut options = base.clone();
        put_under(&mut options, &self.short_reduction_overrides);
        std::borrow::Cow::Owned(options)
    }

    fn compile_and_store(&self, key: CacheKey, label: Arc<str>, build: BuildFn) -> CompileResult {
        bump(&self.counters.misses);
        let source_label = label.clone();
        let text = build().map_err(|message| CompileError::Build { key, message })?;
        self.dump(&key, &text);
        let (options, fast, quick) = match (&self.fast_options, &self.quick_options) {
            (Some((word, fast)), _) if *word == key.options => (fast, true, false),
            (_, Some((word, quick))) if *word == key.options => (quick, false, true),
            _ => (&self.compile_options, false, false),
        };
        let options = self.module_options(&text, options);
        let start = Instant::now();
        let compiled = self.client.compile_with_options(&text, &options);
        add_time(&self.counters.compile_nanos, start);
        let program = CompiledProgram {
            label,
            key,
            time: start.elapsed(),
            fast,
            quick,
        };
        self.origins.lock().insert(
            key,
            ProgramOrigin {
                label: program.label.clone(),
                source: "compiled",
                compile_time: program.time,
            },
        );
        {
            let mut compiled = self.compiled.lock();
            let (recent, slowest) = &mut *compiled;
            if slowest.as_ref().is_none_or(|s| s.time < program.time) {
                *slowest = Some(program.clone());
            }
            if recent.len() == RECENT_COMPILES_KEPT {
                recent.pop_front();
            }
            recent.push_back(program);
        }
        let executable = compiled.map_err(|e| {
            let message = e.to_string();
            self.dump_error(&key, &message);
            let kept = self.keep_failed_module(&key, &text);
            CompileError::Compile {
                key,
                message: format!("{message}\n{kept}"),
            }
        })?;
        bump(&self.counters.compilations);
        self.store_everywhere(&key, &executable);
        if quick {
            self.keep_upgrade_source(key, &source_label, Box::new(move || Ok(text)));
        }
        Ok(Arc::new(executable))
    }

    /// Serializes an executable into tiers 2 and 3, where configured.
    fn store_everywhere(&self, key: &CacheKey, executable: &LoadedExecutable) {
        if self.tier2.is_some() || self.tier3.is_some() {
            match executable.serialize() {
                Ok(bytes) => {
                    self.store(Tier::Persistent, key, &bytes);
                    self.store(Tier::Shared, key, &bytes);
                }
                Err(e) => self.disk_error(format!("serializing key {key}: {e}")),
            }
        }
    }

    /// Keeps how to build a quick program's module, for its upgrade (tiered compilation).
    fn keep_upgrade_source(&self, key: CacheKey, label: &Arc<str>, build: BuildFn) {
        let Some(plan) = &self.upgrades else { return };
        if plan.quick_word != key.options {
            return;
        }
        let mut sources = plan.sources.lock();
        if sources.len() < UPGRADE_SOURCES_KEPT {
            sources.insert(key, (label.clone(), build));
        }
    }

    /// Compiles a quick program again with the full options and puts the result in its place,
    /// in tier 1 under the same key (regions that look it up get the full program from their
    /// next launch on) and on disk under the full-options key. A failure leaves the quick
    /// program in place: it was correct, only slower.
    fn upgrade(&self, upgrade: Upgrade) {
        let Some(plan) = &self.upgrades else { return };
        let Upgrade { key, label, build } = upgrade;
        let started = Instant::now();
        let Ok(text) = build() else { return };
        let options = self.module_options(&text, &self.compile_options);
        let compiled = self.client.compile_with_options(&text, &options);
        add_time(&self.counters.upgrade_nanos, started);
        if trace::on() {
            let event = trace::Event::until_now(
                trace::Track::Compile,
                format!(
                    "upgrade {}",
                    if label.is_empty() { "program" } else { &label }
                ),
                started,
            )
            .arg("key", trace::Arg::Text(key.to_string()))
            .arg("label", trace::Arg::Text(label.to_string()))
            .arg("tier", trace::Arg::Text("upgraded".to_string()));
            trace::record(event);
        }
        let Ok(executable) = compiled else { return };
        self.store_everywhere(
            &CacheKey {
                options: plan.full_word,
                ..key
            },
            &executable,
        );
        self.insert_tier1(key, Arc::new(executable));
        if let Some(origin) = self.origins.lock().get_mut(&key) {
            origin.source = "upgraded";
            origin.compile_time += started.elapsed();
        }
        bump(&self.counters.upgrades);
    }

    /// `<dump>/<key>.mlir`: the key as comments, then the module text (still valid MLIR).
    fn dump(&self, key: &CacheKey, text: &str) {
        let Some(dir) = &self.dump_dir else { return };
        if let Err((path, e)) = write_module(dir, key, text) {
            self.disk_error(format!("writing {}: {e}", path.display()));
        }
    }

    /// Writes the module of a failed compile where the user can read it, and says where: the
    /// dump directory when there is one (already written), else `torch-pjrt-<uid>/failed` in
    /// the system's temporary directory, so the module is at hand without a rerun.
    fn keep_failed_module(&self, key: &CacheKey, text: &str) -> String {
        let written = match &self.dump_dir {
            Some(dir) => Ok(dir.join(format!("{key}.mlir"))),
            None => {
                // SAFETY: getuid takes no arguments and cannot fail.
                let uid = unsafe { libc::getuid() };
                let dir = std::env::temp_dir()
                    .join(format!("torch-pjrt-{uid}"))
                    .join("failed");
                std::fs::create_dir_all(&dir)
                    .map_err(|e| (dir.clone(), e))
                    .and_then(|()| write_module(&dir, key, text))
            }
        };
        match written {
            Ok(path) => format!(
                "The StableHLO module that failed to compile is in {} \
                 (TORCH_PJRT_DUMP_DIR=<dir> keeps every compiled module).",
                path.display()
            ),
            Err((path, e)) => format!(
                "The StableHLO module that failed to compile could not be written to {}: {e}; \
                 set TORCH_PJRT_DUMP_DIR=<dir> to keep every compiled module.",
                path.display()
            ),
        }
    }

    fn dump_error(&self, key: &CacheKey, message: &str) {
        let Some(dir) = &self.dump_dir else { return };
        let path = dir.join(format!("{key}.error.txt"));
        if let Err(e) = std::fs::write(&path, message) {
            self.disk_error(format!("writing {}: {e}", path.display()));
        }
    }
}
