//! The engine: one per process. Composes capture (`defer`), fusion (`fuse`), compilation and the
//! ordered execution queue (`compile`) and transfers (`pjrt`), under the process-wide eager mode.

use crate::chalf;
use crate::graph_lock::GraphLock;
use crate::metrics::{Counters, MetricsSnapshot};
use crate::recompile::{Budget, RecompileTracker, Verdict};
use compile::{
    CacheKey, CompileConfig, CompileError, CompileHandle, Compiler, DeviceValue, Effort, ExecError,
    ExecJob, ExecQueue, HostArgument, WeakDeviceValue,
};
use defer::{
    Captured, EngineError, ErrorKind, Flush, FlushRequest, Graph, HostGather, Mode, ModeStack,
    OpCall, ReadSource, RegionSize, Regrow, StorageId, TensorRef,
};
use ops::{DType, OpId, ScalarArg};
use parking_lot::Mutex;
use std::sync::Arc;

mod devices;
mod graphs;

pub use devices::{Collective, Reduction};

/// The values a flush produced: inline for the one or two results of an op-by-op flush.
type FlushedValues = smallvec::SmallVec<[DeviceValue; 2]>;

/// The engine version: part of every cache key and cache directory name.
pub const ENGINE_VERSION: &str = concat!("torch-pjrt-", env!("CARGO_PKG_VERSION"), "+hlo28");

/// Above this many pending ops DeferAndFuse flushes on its own. Compile time grows ~0.7 ms per op
/// past a hundred on the CPU plugin (0.5 s at 1,500 ops), so a cap near a thousand keeps any
/// single cold compile well under a second while leaving typical training steps in one region.
pub const DEFAULT_MAX_REGION_OPS: usize = 1000;

/// The smallest block a repeat cut runs on its own: fewer ops than this, or fewer result
/// elements, and a region's launch costs more than running it beside the capture saves (a loop
/// of tiny ops stays one region up to the size cap).
const REPEAT_MIN_OPS: usize = 32;
const REPEAT_MIN_WORK: u64 = 1 << 20;

/// Programs of at most this many ops (Strict's and Debug's op, with its index checks) compile
/// with [`Effort::Fast`]; larger regions get the plugin's full optimization (RFC 0025).
pub const FAST_COMPILE_MAX_OPS: usize = 3;

/// ... unless their ops produce more than this many elements: one op can be a whole row-wise
/// computation (softmax, layer_norm), which XLA CPU's fusion emitters run about twice as fast,
/// and at this size the run time, not the few milliseconds of compile, is what counts (RFC 0040).
const FAST_COMPILE_MAX_WORK: u64 = 1 << 18;

/// Fused regions whose ops produce at most this many elements compile with [`Effort::Quick`]:
/// a small model's decoding step (a few thousand elements per op, about 90 ops) runs in the
/// time of its launch whatever the code, while a training step's region of large tensors keeps
/// the full optimization (RFC 0039).
const QUICK_COMPILE_MAX_WORK: u64 = 1 << 18;

/// Runs after which a quick program is compiled again with the full options (RFC 0041): a
/// decoding loop's step reaches it within its first tokens, a one-off region never does.
const DEFAULT_UPGRADE_AFTER_RUNS: u64 = 8;

/// How many whole regions' digests isolation cuts remember (RFC 0027).
const WHOLE_REGIONS_KEPT: usize = 4096;

/// Everything the environment configures.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub plugin: String,
    pub default_mode: Mode,
    pub max_region_ops: usize,
    /// Donate the old value of a storage that a region overwrites to the storage's new value,
    /// when nothing else refers to it (in-place updates run in place; RFC 0012).
    /// `TORCH_PJRT_DONATE=0` turns it off.
    pub donate: bool,
    /// Options of PJRT client creation: `TORCH_PJRT_CLIENT_OPTIONS`, plus this engine's defaults
    /// for the plugin named (see [`client_options`]).
    pub client_options: Vec<(String, pjrt::NamedValue)>,
    pub compile: CompileConfig,
    /// Whether the process's engine warms the device runtime up in the background when it
    /// starts ([`Engine::start_warm_up`]); `TORCH_PJRT_WARM_UP=0` turns it off.
    pub warm_up: bool,
    /// Whether the process heap is set up to reuse large blocks when the plugin's device
    /// buffers live in it (the CPU plugin; [`crate::host_heap`]); `TORCH_PJRT_HOST_HEAP_REUSE=0`
    /// leaves the C allocator's settings alone.
    pub host_heap_reuse: bool,
    /// Whether DeferAndFuse cuts a pending loop between repetitions of its body so the device
    /// runs one while the host captures the next (`defer::Graph::repeat_cut`);
    /// `TORCH_PJRT_REPEAT_CUTS=0` leaves regions to the syncs and the size cap.
    pub repeat_cuts: bool,
    /// DeferAndFuse runs ops one by one for a while when its regions never repeat
    /// ([`crate::adaptive`], RFC 0042). `TORCH_PJRT_ADAPTIVE=0` always fuses.
    pub adaptive: bool,
    /// Whether DeferAndFuse runs a whole flush as several regions where one would allocate a
    /// late, large result while earlier scratch is live (`defer::Graph::memory_cuts`, RFC 0023);
    /// `TORCH_PJRT_MEMORY_CUTS=0` runs every flush as one region.
    pub memory_cuts: bool,
    /// The process's recompile budget (`TORCH_PJRT_RECOMPILE_LIMIT=<n>[:warn]`): past `n`
    /// recompiles a compile fails with its explanation (or warns).
    pub recompile_budget: Option<Budget>,
    /// `TORCH_PJRT_LOG_RECOMPILES=1`: every recompile's reason is printed as it happens.
    pub log_recompiles: bool,
    /// `TORCH_PJRT_TRACEBACKS=1`: record each op's Python line, so a check that fails at a
    /// later materialization names the line that queued it.
    pub tracebacks: bool,
    /// Whether DeferAndFuse runs the few ops whose shapes keep changing in a recurring region as
    /// regions of their own (RFC 0027); `TORCH_PJRT_ISOLATION_CUTS=0` turns it off.
    pub isolation_cuts: bool,
    /// Whether programs of a few ops compile with the plugin's fast-compile options
    /// ([`compile::fast_overrides_for`]); `TORCH_PJRT_FAST_COMPILE=0` compiles every program
    /// with the full ones.
    pub fast_compile: bool,
    /// Whether fused regions of little work compile with the plugin's quick-compile options
    /// ([`compile::quick_overrides_for`]); `TORCH_PJRT_QUICK_COMPILE=0` compiles them with the
    /// full ones.
    pub quick_compile: bool,
    /// Tiered compilation: a quick program that tier 1 has served this many times is compiled
    /// again with the full options in the background and swapped in (RFC 0041).
    /// `TORCH_PJRT_TIERED_COMPILE=0` keeps quick programs quick; `=N` sets the count.
    pub upgrade_after_runs: Option<u64>,
    /// Whether every compile gets the plugin's default options
    /// ([`compile::default_overrides_for`]) under the user's; `TORCH_PJRT_DEFAULT_COMPILE_OPTIONS=0`
    /// leaves them out.
    pub default_compile_options: bool,
}

/// Parses `key=value,key=value` client options: `true`/`false` are booleans, integers are
/// int64, other numbers are floats (PJRT's named values hold f32), anything else a string.
pub fn parse_client_options(text: &str) -> Result<Vec<(String, pjrt::NamedValue)>, String> {
    let options = parse_options(
        "TORCH_PJRT_CLIENT_OPTIONS",
        "preallocate=false,memory_fraction=0.5",
        text,
    )?;
    Ok(options
        .into_iter()
        .map(|(name, value)| {
            let value = match value {
                pjrt::CompileOverride::Bool(v) => pjrt::NamedValue::Bool(v),
                pjrt::CompileOverride::Int(v) => pjrt::NamedValue::Int64(v),
                pjrt::CompileOverride::Double(v) => pjrt::NamedValue::Float(v as f32),
                pjrt::CompileOverride::String(v) => pjrt::NamedValue::String(v),
            };
            (name, value)
        })
        .collect())
}

/// Parses `TORCH_PJRT_COMPILE_OPTIONS`: XLA debug options by name, typed as client options are
/// (e.g. `xla_cpu_enable_fast_math=false,xla_gpu_autotune_level=0`).
pub fn parse_compile_options(text: &str) -> Result<Vec<(String, pjrt::CompileOverride)>, String> {
    parse_options(
        "TORCH_PJRT_COMPILE_OPTIONS",
        "xla_cpu_enable_fast_math=false,xla_gpu_autotune_level=0",
        text,
    )
}

/// Refuses compile options known to give wrong results. XLA CPU's test-only
/// `XNN_GRAPH_FUSION_MODE_BYPASS_COST_MODEL` packs a product's right-hand operand once and
/// reuses the packing for as long as the operand's buffer has the same address. A weight
/// updated in place (donated) keeps its address, and a freed buffer's address comes back to
/// the next one, so later products read old weights.
pub fn check_compile_options(options: &[(String, pjrt::CompileOverride)]) -> Result<(), String> {
    for (name, value) in options {
        if name == "xla_cpu_experimental_xnn_graph_fusion_mode"
            && matches!(value, pjrt::CompileOverride::String(v)
                if v == "XNN_GRAPH_FUSION_MODE_BYPASS_COST_MODEL")
        {
            return Err(format!(
                "TORCH_PJRT_COMPILE_OPTIONS: {name}=XNN_GRAPH_FUSION_MODE_BYPASS_COST_MODEL \
                 reuses matrix products' packed weights while a buffer keeps its address, so \
                 weights updated in place would be read stale. Drop the option, or use \
                 XNN_GRAPH_FUSION_MODE_GREEDY."
            ));
        }
    }
    Ok(())
}

/// The `key=value,…` syntax both option variables share, typed at full (f64) precision.
fn parse_options(
    variable: &str,
    example: &str,
    text: &str,
) -> Result<Vec<(String, pjrt::CompileOverride)>, String> {
    let mut options = Vec::new();
    for item in text
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let (key, value) = item.split_once('=').ok_or_else(|| {
            format!(
                "{variable}: expected key=value, got '{item}'. Separate options with commas, \
                 e.g. {example}"
            )
        })?;
        let (key, value) = (key.trim(), value.trim());
        let value = match value {
            "true" | "True" => pjrt::CompileOverride::Bool(true),
            "false" | "False" => pjrt::CompileOverride::Bool(false),
            _ => {
                if let Ok(i) = value.parse::<i64>() {
                    pjrt::CompileOverride::Int(i)
                } else if let Ok(f) = value.parse::<f64>() {
                    pjrt::CompileOverride::Double(f)
                } else {
                    pjrt::CompileOverride::String(value.to_string())
                }
            }
        };
        options.push((key.to_string(), value));
    }
    Ok(options)
}

/// The client options for `plugin`: the user's, then defaults for options they left out. The
/// CUDA plugin otherwise reserves 75% of the GPU's memory up front; a PyTorch user expects
/// memory taken as tensors need it (as PyTorch's caching allocator does), and several engines
/// in one process (tests) each create a client.
pub fn client_options(
    plugin: &str,
    user: Vec<(String, pjrt::NamedValue)>,
) -> Vec<(String, pjrt::NamedValue)> {
    let mut options = user;
    if plugin == "cuda" && !options.iter().any(|(key, _)| key == "preallocate") {
        options.push(("preallocate".to_string(), pjrt::NamedValue::Bool(false)));
    }
    options
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl EngineConfig {
    /// Reads `TORCH_PJRT_PLUGIN`, `TORCH_PJRT_CLIENT_OPTIONS`, `TORCH_PJRT_COMPILE_OPTIONS`,
    /// `TORCH_PJRT_DEFER_AND_FUSE`, `TORCH_PJRT_LAUNCH_BLOCKING`, `TORCH_PJRT_MAX_REGION_OPS`
    /// and the compile/cache variables.
    pub fn from_env() -> Result<EngineConfig, EngineError> {
        let default_mode = Mode::from_env_values(
            env("TORCH_PJRT_DEFER_AND_FUSE").as_deref(),
            env("TORCH_PJRT_LAUNCH_BLOCKING").as_deref(),
        )
        .map_err(|m| EngineError::new(ErrorKind::Value, m))?;
        let max_region_ops = match env("TORCH_PJRT_MAX_REGION_OPS") {
            None => DEFAULT_MAX_REGION_OPS,
            Some(v) => v.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| {
                EngineError::new(
                    ErrorKind::Value,
                    format!("TORCH_PJRT_MAX_REGION_OPS={v}: expected a positive integer"),
                )
            })?,
        };
        let mut compile = CompileConfig::from_env()
            .map_err(|e| EngineError::new(ErrorKind::Value, e.to_string()))?;
        compile.compile_options.overrides =
            parse_compile_options(&env("TORCH_PJRT_COMPILE_OPTIONS").unwrap_or_default())
                .map_err(|m| EngineError::new(ErrorKind::Value, m))?;
        check_compile_options(&compile.compile_options.overrides)
            .map_err(|m| EngineError::new(ErrorKind::Value, m))?;
        let plugin = pjrt::configured_plugin_name();
        let user_options =
            parse_client_options(&env("TORCH_PJRT_CLIENT_OPTIONS").unwrap_or_default())
                .map_err(|m| EngineError::new(ErrorKind::Value, m))?;
        Ok(EngineConfig {
            client_options: client_options(&plugin, user_options),
            plugin,
            default_mode,
            max_region_ops,
            donate: !matches!(env("TORCH_PJRT_DONATE").as_deref(), Some("0")),
            compile,
            warm_up: !matches!(env("TORCH_PJRT_WARM_UP").as_deref(), Some("0")),
            host_heap_reuse: !matches!(env("TORCH_PJRT_HOST_HEAP_REUSE").as_deref(), Some("0")),
            repeat_cuts: !matches!(env("TORCH_PJRT_REPEAT_CUTS").as_deref(), Some("0")),
            adaptive: !matches!(env("TORCH_PJRT_ADAPTIVE").as_deref(), Some("0")),
            memory_cuts: !matches!(env("TORCH_PJRT_MEMORY_CUTS").as_deref(), Some("0")),
            recompile_budget: env("TORCH_PJRT_RECOMPILE_LIMIT")
                .filter(|v| !v.trim().is_empty())
                .map(|v| Budget::parse_env(&v))
                .transpose()
                .map_err(|m| EngineError::new(ErrorKind::Value, m))?,
            fast_compile: !matches!(env("TORCH_PJRT_FAST_COMPILE").as_deref(), Some("0")),
            quick_compile: !matches!(env("TORCH_PJRT_QUICK_COMPILE").as_deref(), Some("0")),
            upgrade_after_runs: match env("TORCH_PJRT_TIERED_COMPILE").as_deref().map(str::trim) {
                None | Some("") | Some("1") => Some(DEFAULT_UPGRADE_AFTER_RUNS),
                Some("0") => None,
                Some(text) => {
                    Some(text.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
                        EngineError::new(
                            ErrorKind::Value,
                            format!(
                                "TORCH_PJRT_TIERED_COMPILE must be 0 (off), 1 (on) or a count of \
                             runs after which a quick program is compiled again in full; got \
                             {text:?}"
                            ),
                        )
                    })?)
                }
            },
            default_compile_options: !matches!(
                env("TORCH_PJRT_DEFAULT_COMPILE_OPTIONS").as_deref(),
                Some("0")
            ),
            isolation_cuts: !matches!(env("TORCH_PJRT_ISOLATION_CUTS").as_deref(), Some("0")),
            log_recompiles: matches!(
                env("TORCH_PJRT_LOG_RECOMPILES").as_deref(),
                Some(v) if !v.is_empty() && v != "0"
            ),
            tracebacks: matches!(
                env("TORCH_PJRT_TRACEBACKS").as_deref(),
                Some(v) if !v.is_empty() && v != "0"
            ),
        })
    }
}

/// `ops::DType` → the PJRT element type of its buffers.
pub fn element_type(dtype: DType) -> pjrt::ElementType {
    use pjrt::ElementType as E;
    match dtype {
        DType::Bool => E::Pred,
        DType::U8 => E::U8,
        DType::U16 => E::U16,
        DType::U32 => E::U32,
        DType::U64 => E::U64,
        DType::I8 => E::S8,
        DType::I16 => E::S16,
        DType::I32 => E::S32,
        DType::I64 => E::S64,
        DType::F16 => E::F16,
        DType::BF16 => E::BF16,
        DType::F32 => E::F32,
        DType::F64 => E::F64,
        // complex32 is complex64 on the device (converted at the host boundary).
        DType::C32 | DType::C64 => E::C64,
        DType::C128 => E::C128,
    }
}

/// Output types of an op without capturing it (PyTorch's `out=` resizes with this); needs no
/// running engine.
pub fn op_meta(
    op: OpId,
    inputs: &[TensorRef],
    scalars: &[ScalarArg],
    params: &[i64],
) -> Result<ops::Meta, EngineError> {
    let types: Vec<ops::TensorType> = inputs
        .iter()
        .map(|t| ops::TensorType::new(t.dtype, &t.sizes))
        .collect();
    Ok(ops::meta(op, &types, scalars, params)?)
}

/// Records a host transfer of `bytes` bytes, from `start` until now, on the device's transfer row.
fn trace_transfer(direction: &str, start: std::time::Instant, bytes: usize) {
    use compile::trace::{self, Arg, Event, Track};
    trace::record(
        Event::until_now(Track::Transfer, format!("pjrt copy {direction}"), start)
            .arg("direction", Arg::Text(direction.to_string()))
            .arg("bytes", Arg::Int(bytes as i64)),
    );
}

fn runtime_error(context: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::runtime(format!("{context}: {e}"))
}

/// The engine.
pub struct Engine {
    client: pjrt::Client,
    /// The process's devices, in PJRT's order: `pjrt:i` is `devices[i]`.
    devices: Vec<pjrt::Device>,
    /// Whether programs are compiled portable (several devices): one executable runs on
    /// whichever device each execution names, so no cache needs the device in its key.
    portable: bool,
    compiler: Arc<Compiler>,
    /// The process that made the engine, its threads and its warm-up; a forked child has none
    /// of those threads to wait for.
    started_by: u32,
    queue: ExecQueue,
    /// The options words of full, fast and quick compiles' keys ([`Engine::options_for`]).
    options_key: u64,
    fast_options_key: u64,
    quick_options_key: u64,
    graph: GraphLock<DeviceValue>,
    modes: ModeStack,
    adaptive: crate::adaptive::Adaptive,
    counters: Counters,
    max_region_ops: usize,
    repeat_cuts: bool,
    memory_cuts: bool,
    isolation_cuts: bool,
    /// How many compiled-mode graphs are open ([`Engine::graph_begin`]): while any is, every op
    /// is deferred into one region, without the size cap, repeat or isolation cuts.
    open_graphs: std::sync::atomic::AtomicUsize,
    /// Recorded device events (`torch.Event` on pjrt), by id.
    events: Mutex<std::collections::HashMap<u64, Arc<compile::QueueMark>>>,
    next_event: std::sync::atomic::AtomicU64,
    /// Compiled-mode graphs recorded as programs ([`Engine::graph_end_record`]), by handle - 1.
    graph_programs: Mutex<Vec<Arc<graphs::GraphProgram>>>,
    /// The ops left pending by the graph being recorded, which its program computes first
    /// (RFC 0033).
    graph_prologue: Mutex<Option<defer::Prologue>>,
    /// Set when a compiled-mode graph ran: Strict then keeps ops that only make new values
    /// (autograd's `ones_like` seed) pending, so the next graph's replay computes them as its
    /// prologue instead of launching them alone; cleared by an op that reads a device value.
    hold_sources: std::sync::atomic::AtomicBool,
    /// `TORCH_PJRT_LOG_RECOMPILES`: also each op's line is recorded ([`Engine::op_at`]).
    log_recompiles: bool,
    /// `TORCH_PJRT_TRACEBACKS`: each op's line is recorded, and a check that fails later names
    /// the line that queued it.
    tracebacks: bool,
    /// The outputs of the newest launched region, awaited by `sync` (weakly: holding them would
    /// keep them from being donated; released work is awaited through the queue's events).
    last_outputs: Mutex<Vec<WeakDeviceValue>>,
    /// Verdicts of launched `_assert_async` checks, verified at the next materialization point.
    pending_checks: Mutex<Vec<(DeviceValue, defer::CheckSite)>>,
    /// Which compiles rebuild a structure, why, and the recompile budgets.
    recompiles: Mutex<RecompileTracker>,
    /// The [`Flush::prefix`] digests of the large regions compiled whole, which isolation cuts
    /// leave whole (cleared when full).
    whole_regions: Mutex<std::collections::HashSet<(u64, u64)>>,
    /// Signalled when the runtime's warm-up (started by [`Engine::start_warm_up`] in the process
    /// that made the engine) ends.
    warm_up: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    /// How long the warm-up took, in nanoseconds, once it has succeeded (0 before).
    warm_up_nanos: Arc<std::sync::atomic::AtomicU64>,
    /// The execution queue's cumulative times at the last `reset_metrics`.
    exec_baseline: Mutex<compile::ExecStats>,
    /// The replicated programs of collectives across the process's devices, compiled once
    /// each (`devices.rs`).
    collective_programs:
        Mutex<std::collections::HashMap<devices::CollectiveKey, Arc<pjrt::LoadedExecutable>>>,
}

/// The values a flush makes for its outputs, kept so that a flush failing before its job is on
/// the queue can fail them ([`Engine::flush_atomically`]).
#[derive(Default)]
struct MadeValues(std::cell::RefCell<smallvec::SmallVec<[DeviceValue; 4]>>);

impl MadeValues {
    fn pending(&self) -> DeviceValue {
        let value = DeviceValue::pending();
        self.0.borrow_mut().push(value.clone());
        value
    }

    fn any(&self) -> bool {
        !self.0.borrow().is_empty()
    }

    fn fail_all(&self, message: &str) {
        for value in self.0.borrow_mut().drain(..) {
            value.fail_if_pending(ExecError::Task {
                label: "flush".into(),
                message: message.to_string(),
            });
        }
    }
}

impl Engine {
    pub fn new(config: EngineConfig) -> Result<Engine, EngineError> {
        let plugin = pjrt::Plugin::load(&config.plugin)
            .map_err(|e| EngineError::runtime(format!("cannot start the pjrt device: {e}")))?;
        let client = pjrt::Client::with_options(&plugin, &config.client_options)
            .map_err(|e| EngineError::runtime(format!("cannot create a PJRT client: {e}")))?;
        if config.host_heap_reuse
            && crate::host_heap::buffers_live_in_host_heap(client.platform_name())
        {
            crate::host_heap::configure_for_device_buffers();
        }
        let mut compile_config = config.compile.clone();
        compile_config.engine_version = ENGINE_VERSION.to_string();
        let devices = client.addressable_devices().to_vec();
        // With several devices, one portable executable serves them all (RFC 0046); the flag is
        // part of the options words, so such programs never meet single-device ones in a cache.
        let portable = devices.len() > 1;
        compile_config.compile_options.portable = portable;
        if config.default_compile_options {
            // The platform's defaults first: a user's option of the same name, later, wins.
            let mut overrides = compile::default_overrides_for(client.platform_name());
            overrides.append(&mut compile_config.compile_options.overrides);
            compile_config.compile_options.overrides = overrides;
            compile_config.short_reduction_overrides =
                compile::short_reduction_overrides_for(client.platform_name());
        }
        if config.fast_compile {
            compile_config.fast_overrides = compile::fast_overrides_for(client.platform_name());
        }
        if config.quick_compile {
            compile_config.quick_overrides = compile::quick_overrides_for(client.platform_name());
            compile_config.upgrade_after_runs = config.upgrade_after_runs;
        }
        let compiler = Compiler::new(client.clone(), compile_config)
            .map_err(|e| runtime_error("cannot start the compiler", e))?;
        let options_key = compiler.options_fingerprint();
        let fast_options_key = compiler.options_fingerprint_for(Effort::Fast);
        let quick_options_key = compiler.options_fingerprint_for(Effort::Quick);
        Ok(Engine {
            client,
            devices,
            portable,
            compiler: Arc::new(compiler),
            started_by: std::process::id(),
            queue: ExecQueue::new()
                .map_err(|e| runtime_error("cannot start the execution thread", e))?,
            options_key,
            fast_options_key,
            quick_options_key,
            graph: GraphLock::new({
                let mut graph = Graph::new();
                graph.set_donation(config.donate);
                graph
            }),
            modes: ModeStack::new(config.default_mode),
            adaptive: crate::adaptive::Adaptive::new(config.adaptive),
            counters: Counters::default(),
            max_region_ops: config.max_region_ops,
            repeat_cuts: config.repeat_cuts,
            memory_cuts: config.memory_cuts,
            isolation_cuts: config.isolation_cuts,
            open_graphs: Default::default(),
            graph_programs: Mutex::new(Vec::new()),
            graph_prologue: Mutex::new(None),
            hold_sources: Default::default(),
            events: Mutex::new(Default::default()),
            next_event: std::sync::atomic::AtomicU64::new(1),
            log_recompiles: config.log_recompiles,
            tracebacks: config.tracebacks,
            last_outputs: Mutex::new(Vec::new()),
            pending_checks: Mutex::new(Vec::new()),
            whole_regions: Mutex::new(Default::default()),
            recompiles: Mutex::new(RecompileTracker::new(config.recompile_budget)),
            warm_up: Mutex::new(None),
            warm_up_nanos: Default::default(),
            exec_baseline: Mutex::new(Default::default()),
            collective_programs: Mutex::new(Default::default()),
        })
    }

    /// Starts the device runtime's warm-up ([`pjrt::Client::warm_up`]) on a background thread,
    /// once: the runtime's one-time set-up of matrix products then overlaps the user's imports
    /// and model building instead of landing in the first step. It leaves no trace in the
    /// metrics or the memory figures; a failure only forgoes the gain. The process that made
    /// the engine calls it (`global.rs`, right after making it): only that one waits for it.
    pub fn start_warm_up(&self) {
        let mut slot = self.warm_up.lock();
        if slot.is_some() {
            return;
        }
        let (done, finished) = std::sync::mpsc::channel();
        let client = self.client.clone();
        let took = self.warm_up_nanos.clone();
        let spawned = std::thread::Builder::new()
            .name("tpjrt-warm-up".into())
            .spawn(move || {
                let start = std::time::Instant::now();
                let ran =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| client.warm_up()));
                if matches!(ran, Ok(Ok(()))) {
                    let nanos = start.elapsed().as_nanos().max(1) as u64;
                    took.store(nanos, std::sync::atomic::Ordering::Relaxed);
                }
                let _ = done.send(());
            });
        if spawned.is_ok() {
            *slot = Some(finished);
        }
    }

    /// Readies the process that made the engine to exit: waits, at most `limit` each, for the
    /// warm-up and for the compiles running now; requests not yet compiled are refused (their
    /// values fail; nothing can read them any more). The runtime's global state is torn down
    /// after this, and a compile running then crashes the process. A forked child, which has
    /// no compile threads, returns at once.
    pub fn prepare_exit(&self, limit: std::time::Duration) {
        if self.started_by != std::process::id() {
            return;
        }
        self.wait_warm_up(limit);
        self.compiler.close_for_exit(limit);
    }

    /// Queues the background upgrade of every quick program not upgraded yet, however often it
    /// has run (RFC 0041); returns how many were queued.
    pub fn upgrade_all_now(&self) -> usize {
        self.compiler.upgrade_all_now()
    }

    /// Waits, at most `limit`, until no background upgrade of a quick program is queued or
    /// running (RFC 0041); returns whether none is.
    pub fn wait_for_upgrades(&self, limit: std::time::Duration) -> bool {
        self.compiler.wait_for_upgrades(limit)
    }

    /// Waits, at most `limit`, for a warm-up in progress. The process calls it before exiting,
    /// so that the runtime is not torn down under a running compile.
    /// A child forked from the starting process has no warm-up thread: it does not wait.
    pub fn wait_warm_up(&self, limit: std::time::Duration) {
        if self.started_by != std::process::id() {
            return;
        }
        let finished = self.warm_up.lock().take();
        if let Some(finished) = finished {
            let _ = finished.recv_timeout(limit);
        }
    }

    pub fn client(&self) -> &pjrt::Client {
        &self.client
    }

    pub fn modes(&self) -> &ModeStack {
        &self.modes
    }

    pub fn device_count(&self) -> usize {
        self.client.addressable_devices().len()
    }

    // ----- storages -----

    /// A new storage. Once the engine has stopped (see [`Engine::stopped`]) the id is still
    /// given out, but every use of it fails.
    pub fn new_storage(&self, nbytes: u64) -> StorageId {
        self.graph.lock_even_if_stopped().new_storage(nbytes)
    }

    /// A new storage on device `device` (`pjrt:device`).
    pub fn new_storage_on(&self, nbytes: u64, device: i32) -> Result<StorageId, EngineError> {
        let device = self.device_index(device)?;
        Ok(self
            .graph
            .lock_even_if_stopped()
            .new_storage_on(nbytes, device))
    }

    /// `device` checked against the process's devices.
    fn device_index(&self, device: i32) -> Result<u32, EngineError> {
        if device < 0 || device as usize >= self.devices.len() {
            return Err(EngineError::runtime(format!(
                "Invalid device pjrt:{device}: this process has {} pjrt device(s) (set \
                 TORCH_PJRT_CLIENT_OPTIONS=cpu_device_count=N for more XLA CPU devices)",
                self.devices.len()
            )));
        }
        Ok(device as u32)
    }

    /// The device an execution names: only portable programs need one.
    fn execution_device(&self, device: u32) -> Option<pjrt::Device> {
        self.portable
            .then(|| self.devices.get(device as usize).cloned())
            .flatten()
    }

    /// Copies a dense host array to device `device`.
    fn upload_to(
        &self,
        bytes: &[u8],
        dtype: DType,
        sizes: &[i64],
        device: u32,
    ) -> Result<pjrt::Buffer, pjrt::Error> {
        let widened;
        let bytes = if dtype == DType::C32 {
            widened = chalf::widen(bytes);
            widened.as_slice()
        } else {
            bytes
        };
        match self.devices.get(device as usize) {
            Some(target) => {
                self.client
                    .buffer_from_host_on(bytes, element_type(dtype), sizes, target)
            }
            None => self
                .client
                .buffer_from_host(bytes, element_type(dtype), sizes),
        }
    }

    /// Makes `device` the one the graph's ops run on: an op whose tensors are on another
    /// device raises PyTorch's error, and the ops pending on another device are launched
    /// first, so a region never mixes devices.
    fn enter_device(
        &self,
        graph: &mut Graph<DeviceValue>,
        device: u32,
        tensors: &[&[TensorRef]],
    ) -> Result<(), EngineError> {
        if self.devices.len() == 1 {
            return Ok(()); // every storage, and the graph, is on the one device
        }
        for group in tensors {
            if let Some(other) = graph.other_device(group, device)? {
                return Err(EngineError::runtime(format!(
                    "Expected all tensors to be on the same device, but found at least two \
                     devices, pjrt:{device} and pjrt:{other}!"
                )));
            }
        }
        if graph.device() == device {
            return Ok(());
        }
        if graph.pending_len() > 0 {
            if self.in_graph() {
                return Err(EngineError::runtime(format!(
                    "a compiled graph runs on one pjrt device: it has ops on pjrt:{} and \
                     pjrt:{device}",
                    graph.device()
                )));
            }
            self.flush_locked(graph, FlushRequest::All)?;
            Counters::bump(&self.counters.device_switch_cuts, 1);
        }
        graph.set_device(device)
    }

    /// The PJRT device id of the buffer that holds a storage's value, once computed (`None`: a
    /// storage never written). Launches what is pending first.
    pub fn storage_device(&self, id: StorageId) -> Result<Option<i32>, EngineError> {
        let _hold = self.queue.hold_worker();
        match self.materialized_source(|graph| graph.storage_source(id))? {
            ReadSource::Zeros => Ok(None),
            ReadSource::Device(value, _) => {
                let buffer = self.wait_device(&value)?;
                // A value copied from another device may still be arriving.
                buffer
                    .wait_ready()
                    .map_err(|e| runtime_error("waiting for a pjrt buffer", e))?;
                let device = buffer
                    .device()
                    .map_err(|e| runtime_error("asking a pjrt buffer for its device", e))?;
                Ok(Some(device.id))
            }
        }
    }

    /// Releases a storage; once the engine has stopped, does nothing (its state is not to be
    /// trusted, and nothing can run any more).
    pub fn release_storage(&self, id: StorageId) -> Result<(), EngineError> {
        if self.graph.stopped().is_some() {
            return Ok(());
        }
        self.graph.lock()?.release_storage(id)
    }

    pub fn resize_storage(&self, id: StorageId, nbytes: u64) -> Result<(), EngineError> {
        self.graph.lock()?.resize_storage(id, nbytes)
    }

    pub fn storage_nbytes(&self, id: StorageId) -> Result<u64, EngineError> {
        self.graph.lock()?.storage_nbytes(id)
    }

    /// Why the engine stopped, if it has: a panic or a failed flush left its graph
    /// half-updated, and every later call that needs the graph fails with that reason.
    pub fn stopped(&self) -> Option<&str> {
        self.graph.stopped()
    }

    // ----- ops -----

    /// Whether ops should be told the user's line that runs them ([`Engine::op_at`]): when
    /// recompiles are logged, so that a fused region's explanation names the changed op's line.
    pub fn records_op_lines(&self) -> bool {
        self.log_recompiles || self.tracebacks
    }

    /// Runs (Strict, Debug) or defers (DeferAndFuse) one op.
    pub fn op(
        &self,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        outs: &[TensorRef],
    ) -> Result<Captured, EngineError> {
        self.op_at(None, 0, op, inputs, scalars, params, outs)
    }

    /// [`Engine::op`], its nodes marked as captured at the user's line `location` (`None`:
    /// unknown). The line is set and cleared under the one graph lock the op holds, so no other
    /// thread's capture takes it.
    #[allow(clippy::too_many_arguments)]
    pub fn op_at(
        &self,
        location: Option<Arc<str>>,
        device: i32,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        outs: &[TensorRef],
    ) -> Result<Captured, EngineError> {
        let start = std::time::Instant::now();
        Counters::bump(&self.counters.ops, 1);
        let device = self.device_index(device)?;
        let mut graph = self.graph.lock()?;
        self.enter_device(&mut graph, device, &[inputs, outs])?;
        let located = location.is_some();
        if located {
            graph.set_capture_location(location);
        }
        let captured = self.op_locked(&mut graph, op, inputs, scalars, params, outs);
        if located {
            graph.set_capture_location(None);
        }
        drop(graph);
        Counters::add_time(&self.counters.op_nanos, start);
        captured
    }

    fn op_locked(
        &self,
        graph: &mut Graph<DeviceValue>,
        op: OpId,
        inputs: &[TensorRef],
        scalars: &[ScalarArg],
        params: &[i64],
        outs: &[TensorRef],
    ) -> Result<Captured, EngineError> {
        // After a compiled graph, Strict holds ops that only make new values for the next
        // graph's prologue (`hold_sources`): this one is held too, or what is held runs first,
        // on its own, and this op keeps Strict's one-op program.
        let mut held_for_prologue = false;
        if self.hold_sources.load(std::sync::atomic::Ordering::Relaxed)
            && self.flush_mode() == Mode::Strict
        {
            held_for_prologue = !(graph.reads_device_value(inputs)
                || graph.reads_device_value(outs)
                || op.is_side_effecting()
                || op.family() == ops::Family::Random);
            if !held_for_prologue {
                self.hold_sources
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                if graph.pending_len() > 0 {
                    self.flush_locked(graph, FlushRequest::All)?;
                }
            }
        }
        if op == OpId::Cat {
            // Read at each append, as the plugin's capacities read it, so a program can turn
            // bounded shapes off for a while.
            graph.set_bounded(!matches!(env("TORCH_PJRT_DYNAMIC").as_deref(), Some("off")));
            if let Some(regrow) = graph.append_regrow(inputs, params) {
                self.regrow(graph, &regrow)?;
            }
        }
        // Indices whose values the host knows (uploads, fills) are checked now, so PyTorch's
        // error comes at the op; the others are checked on the device (RFC 0012).
        let mut device_checks: smallvec::SmallVec<[ops::checks::IndexCheck; 1]> =
            smallvec::SmallVec::new();
        if op.has_index_checks() {
            let in_graph = self.in_graph();
            let shapes: smallvec::SmallVec<[&[i64]; 4]> =
                inputs.iter().map(|t| t.sizes.as_slice()).collect();
            for check in ops::checks::index_checks(op, &shapes, params) {
                let Some(values) = graph.known_elements(&inputs[check.input]) else {
                    device_checks.push(check);
                    continue;
                };
                Counters::bump(&self.counters.host_index_checks, 1);
                let verdict = ops::checks::host_index_verdict(&check.params(), &values)?;
                if let Some(e) = ops::checks::index_check_error(&verdict) {
                    // PyTorch checks the op's arguments before it reads an index.
                    op_meta(op, inputs, scalars, params)?;
                    return Err(e.into());
                }
                if in_graph {
                    // A compiled graph's program is recorded and replayed with other index
                    // values, which no host check sees: it keeps its device check.
                    device_checks.push(check);
                }
            }
        }
        if self.flush_mode() == Mode::Strict && device_checks.is_empty() && !held_for_prologue {
            // A warm Strict op on device values skips the pending graph: same key, same
            // program, same results (see `Graph::run_if_compiled`).
            let call = OpCall {
                op,
                inputs,
                scalars,
                params,
                outs,
            };
            let mut created: smallvec::SmallVec<[StorageId; 2]> = smallvec::SmallVec::new();
            let began = compile::trace::on().then(std::time::Instant::now);
            let ran = self.flush_atomically(|made, planned| {
                let mut cached = None;
                let run = graph.run_if_compiled(
                    call,
                    |_| made.pending(),
                    |shapeless, dims, size| {
                        cached = self.lookup_program(shapeless, dims, size);
                        cached.is_some()
                    },
                )?;
                let Some((captured, flush)) = run else {
                    return Ok(None);
                };
                planned.set(true);
                if outs.is_empty() {
                    created.extend(captured.outputs.iter().map(|(storage, _)| *storage));
                }
                self.launch(flush, cached, began)?;
                Ok(Some(captured))
            });
            match ran {
                Ok(Some(captured)) => return Ok(captured),
                Ok(None) => {}
                Err(e) => {
                    // The caller never learns the ids of the storages made for the op.
                    for storage in created {
                        let _ = graph.release_storage(storage);
                    }
                    return Err(e);
                }
            }
        }
        let captured = graph.capture(op, inputs, scalars, params, outs)?;
        if !device_checks.is_empty() {
            // Captured before the flush policy runs, so Strict runs op and check as one region.
            // Indices into a padded extent are checked against its true length at run time
            // (the param holds the bucket), so the check's program is the bucket's.
            let extent = inputs.first().and_then(|t| graph.padded_extent_of(t));
            Counters::bump(
                &self.counters.device_index_checks,
                device_checks.len() as u64,
            );
            for check in device_checks {
                let mut bounds = check.bounds;
                let mut check_scalars: smallvec::SmallVec<[ScalarArg; 1]> =
                    smallvec::SmallVec::new();
                if let Some((len, bucket)) = extent.filter(|&(len, _)| bounds.size == len) {
                    bounds.size = bucket;
                    check_scalars.push(ScalarArg::int(len));
                }
                let call = ops::typed::IndexCheck.encode(bounds);
                graph.capture(
                    call.op,
                    std::slice::from_ref(&inputs[check.input]),
                    &check_scalars,
                    &call.params,
                    &[],
                )?;
            }
        }
        if let Err(e) = self.after_capture(graph) {
            // The caller never learns the ids of storages created for a failed op: release
            // them, so they don't stay live (and counted) forever.
            if outs.is_empty() {
                for (storage, _) in &captured.outputs {
                    let _ = graph.release_storage(*storage);
                }
            }
            return Err(e);
        }
        Ok(captured)
    }

    /// Gives a padded device value the next bucket before an append outgrows it (RFC 0029),
    /// through the host: it compiles nothing, waits only at the step that crosses a bucket,
    /// and copies each growing value about twice its final size in all (the buckets double).
    fn regrow(
        &self,
        graph: &mut Graph<DeviceValue>,
        regrow: &Regrow<DeviceValue>,
    ) -> Result<(), EngineError> {
        let buffer = self.wait_device(&regrow.value)?;
        let held_shape = &regrow.held.shape;
        let mut held = vec![0u8; regrow.held.nbytes() as usize];
        chalf::buffer_to_host(&buffer, regrow.held.dtype, &mut held)
            .map_err(|e| runtime_error("copying a padded pjrt value to the host", e))?;
        let sizes = regrow.grown_sizes();
        let itemsize = regrow.held.dtype.size_bytes();
        let outer: i64 = held_shape[..regrow.dim].iter().product();
        let held_row = held_shape[regrow.dim..].iter().product::<i64>() as usize * itemsize;
        let grown_row = sizes[regrow.dim..].iter().product::<i64>() as usize * itemsize;
        let mut grown = vec![0u8; outer as usize * grown_row];
        for (dst, src) in grown
            .chunks_exact_mut(grown_row)
            .zip(held.chunks_exact(held_row))
        {
            dst[..held_row].copy_from_slice(src);
        }
        let buffer = self
            .upload_to(&grown, regrow.held.dtype, &sizes, graph.device())
            .map_err(|e| runtime_error("copying a regrown padded value to pjrt", e))?;
        Counters::bump(&self.counters.device_to_host, 1);
        Counters::bump(&self.counters.device_to_host_bytes, held.len() as u64);
        Counters::bump(&self.counters.host_to_device, 1);
        Counters::bump(&self.counters.host_to_device_bytes, grown.len() as u64);
        graph.install_regrown(regrow, DeviceValue::ready(Arc::new(buffer)))
    }

    /// The flush policy of the current mode, applied after each capture: Strict and Debug run
    /// the op at once (Debug also waits for it), DeferAndFuse only at the region-size cap.
    fn after_capture(&self, graph: &mut Graph<DeviceValue>) -> Result<(), EngineError> {
        let mode = self.flush_mode();
        if mode != self.modes.current() {
            self.adaptive.note_one_op();
        }
        match mode {
            Mode::DeferAndFuse => {
                graph.note_deferred();
                if self.in_graph() {
                    // A compiled graph is one region whatever its size: the graph is fixed, so
                    // its program compiles once, and a cut would only add launches and copies.
                } else if graph.pending_len() >= self.max_region_ops {
                    self.flush_locked(graph, FlushRequest::All)?;
                } else if self.repeat_cuts {
                    // A loop without syncs: run one stretch of it while the next is captured.
                    // The cut that finds a loop leaves one block of it pending, which the
                    // next turn cuts at once.
                    while let Some(len) = graph.repeat_cut(REPEAT_MIN_OPS, REPEAT_MIN_WORK) {
                        Counters::bump(&self.counters.repeat_cuts, 1);
                        let before = graph.pending_len();
                        self.flush_locked(graph, FlushRequest::Prefix(len))?;
                        if graph.pending_len() >= before {
                            break; // nothing was cut: never ask again for the same ops
                        }
                    }
                }
            }
            Mode::Strict => {
                if self.hold_sources.load(std::sync::atomic::Ordering::Relaxed)
                    && graph.pending_could_be_prologue()
                {
                    return Ok(());
                }
                self.hold_sources
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                self.flush_locked(graph, FlushRequest::All)?;
            }
            Mode::Debug => {
                for value in self.flush_locked(graph, FlushRequest::All)? {
                    self.wait_device(&value)?;
                }
                self.verify_checks()?;
            }
        }
        Ok(())
    }

    /// Plans and launches a flush; returns the launched outputs. Runs under the graph lock so
    /// regions reach the ordered queue in capture order. In DeferAndFuse a whole flush may run
    /// as several regions, cut where one would need more memory (RFC 0023).
    fn flush_locked(
        &self,
        graph: &mut Graph<DeviceValue>,
        request: FlushRequest<'_>,
    ) -> Result<FlushedValues, EngineError> {
        let start = std::time::Instant::now();
        let flushed = self.flush_locked_untimed(graph, request);
        Counters::add_time(&self.counters.flush_nanos, start);
        flushed
    }

    fn flush_locked_untimed(
        &self,
        graph: &mut Graph<DeviceValue>,
        request: FlushRequest<'_>,
    ) -> Result<FlushedValues, EngineError> {
        if self.isolation_cuts
            && !self.in_graph()
            && self.flush_mode() == Mode::DeferAndFuse
            && !matches!(request, FlushRequest::Prefix(_))
        {
            self.isolate_varying_ops(graph, request)?;
        }
        if self.memory_cuts
            && matches!(request, FlushRequest::All)
            && self.flush_mode() == Mode::DeferAndFuse
        {
            let mut done = 0;
            for cut in graph.memory_cuts() {
                let before = graph.pending_len();
                self.flush_region(graph, FlushRequest::Prefix(cut - done))?;
                if before - graph.pending_len() != cut - done {
                    break; // the prefix was not cut as planned: run the rest as one region
                }
                done = cut;
                Counters::bump(&self.counters.memory_cuts, 1);
            }
        }
        self.flush_region(graph, request)
    }

    /// Isolation cuts (RFC 0027): when the region this flush would run is an op sequence whose
    /// rebuilds changed only a few ops' shapes, runs the region up to each of those ops, and each
    /// of them, as regions of their own; the rest keeps one program whatever those shapes are.
    fn isolate_varying_ops(
        &self,
        graph: &mut Graph<DeviceValue>,
        request: FlushRequest<'_>,
    ) -> Result<(), EngineError> {
        if !self.recompiles.lock().has_isolations() {
            return Ok(());
        }
        let Some(planned) = graph.planned_region(request)? else {
            return Ok(());
        };
        if self.whole_regions.lock().contains(&planned.prefix) {
            // These very ops were compiled as one program (before the cut was known): run it,
            // rather than compile the pieces, so a repeated request compiles nothing.
            return Ok(());
        }
        let Some(isolated) = self
            .recompiles
            .lock()
            .isolated_ops(planned.skeleton)
            .map(<[usize]>::to_vec)
        else {
            return Ok(());
        };
        let mut done = 0;
        for cut in defer::isolation_cuts(&planned.positions, &isolated) {
            let before = graph.pending_len();
            self.flush_region(graph, FlushRequest::Prefix(cut - done))?;
            if before - graph.pending_len() != cut - done {
                break; // not cut as planned: the rest runs as the flush asked
            }
            done = cut;
            Counters::bump(&self.counters.isolation_cuts, 1);
        }
        Ok(())
    }

    /// Plans and launches one region.
    fn flush_region(
        &self,
        graph: &mut Graph<DeviceValue>,
        request: FlushRequest<'_>,
    ) -> Result<FlushedValues, EngineError> {
        let began = compile::trace::on().then(std::time::Instant::now);
        self.flush_atomically(|made, planned| {
            // Tier 1 is asked as soon as the key is known: on a hit the region's source is never
            // assembled.
            let mut cached = None;
            let has_program = |shapeless, dims, size| {
                cached = self.lookup_program(shapeless, dims, size);
                cached.is_some()
            };
            let Some(flush) = graph.flush_with(request, |_| made.pending(), has_program)? else {
                return Ok(FlushedValues::new());
            };
            planned.set(true);
            self.launch(flush, cached, began)
        })
    }

    /// Runs a flush and its launch (`attempt`, which makes its output values with `made` and
    /// sets `planned` once the graph has returned its flush) so that no failure leaves a
    /// storage holding a value nothing will compute: on an error or a panic before the job is
    /// on the queue, every value made fails with it, so a read raises instead of waiting
    /// forever. A graph left half-updated (a panic, or an error after it began installing
    /// values) stops the engine.
    fn flush_atomically<T>(
        &self,
        attempt: impl FnOnce(&MadeValues, &std::cell::Cell<bool>) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let made = MadeValues::default();
        let planned = std::cell::Cell::new(false);
        let attempted =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| attempt(&made, &planned)));
        match attempted {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if made.any() {
                    made.fail_all(&e.message);
                    if !planned.get() {
                        self.graph
                            .stop(format!("a flush failed while installing values: {e}"));
                    }
                }
                Err(e)
            }
            Err(panic) => {
                made.fail_all("internal error: the engine panicked while launching this value");
                self.graph.stop("a panic during a flush");
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// Tier 1's program for a region key from the graph (this engine's options added).
    fn lookup_program(
        &self,
        shapeless: u64,
        dims: u64,
        size: RegionSize,
    ) -> Option<Arc<pjrt::LoadedExecutable>> {
        self.compiler.lookup(&CacheKey {
            shapeless,
            dims,
            options: self.options_for(size),
        })
    }

    /// The options word of a region: fast compiles for the few-op programs of little work (the
    /// op-by-op modes' ops, mostly), quick ones for fused regions of little work, full
    /// optimization for the rest.
    fn options_for(&self, size: RegionSize) -> u64 {
        if size.ops <= FAST_COMPILE_MAX_OPS && size.work <= FAST_COMPILE_MAX_WORK {
            self.fast_options_key
        } else if size.work <= QUICK_COMPILE_MAX_WORK {
            self.quick_options_key
        } else {
            self.options_key
        }
    }

    /// Launches a planned flush; `began` is when its planning began, when a profiler is recording.
    fn launch(
        &self,
        flush: Flush<DeviceValue>,
        cached: Option<Arc<pjrt::LoadedExecutable>>,
        began: Option<std::time::Instant>,
    ) -> Result<FlushedValues, EngineError> {
        if flush.ops == 0 && flush.outputs.is_empty() && flush.checks.is_empty() {
            // Every op of the region was dead (dropped): there is nothing to compile or run.
            return Ok(FlushedValues::new());
        }
        let key = CacheKey {
            shapeless: flush.shapeless,
            dims: flush.dims,
            options: self.options_for(RegionSize {
                ops: flush.ops,
                work: flush.work,
            }),
        };
        Counters::bump(&self.counters.donated_buffers, flush.aliases.len() as u64);
        let donated = flush.aliases.iter().map(|&(arg, _)| arg as usize);
        let program = if cached.is_some() {
            "tier1"
        } else {
            "requested"
        };
        if self.flush_mode() == Mode::DeferAndFuse && !self.in_graph() {
            self.adaptive.note_region(cached.is_none());
        }
        let handle: CompileHandle = match (cached, flush.region) {
            (Some(exe), _) => CompileHandle::ready(key, exe),
            (None, Some(source)) => {
                if self.isolation_cuts && flush.ops >= crate::recompile::ISOLATE_MIN_OPS {
                    let mut whole = self.whole_regions.lock();
                    if whole.len() >= WHOLE_REGIONS_KEPT {
                        whole.clear();
                    }
                    whole.insert(flush.prefix);
                }
                let verdict = self.recompiles.lock().on_compile(
                    source.signature(),
                    &flush.label,
                    self.modes.current(),
                    (key.shapeless, key.dims),
                );
                match verdict {
                    Verdict::Refuse(e) => {
                        // The region's values fail with the explanation, as a failed compile's
                        // do: the materialization that needs them raises it.
                        CompileHandle::failed(
                            key,
                            CompileError::Refused {
                                key,
                                message: e.message,
                            },
                        )
                    }
                    verdict => {
                        if let Verdict::Warn(text) = verdict {
                            eprintln!("torch-pjrt: warning: {text}");
                        }
                        // The region is built on the compile thread, from the captured ops.
                        self.compiler
                            .request_named(key, flush.label.clone(), move || {
                                fuse::build_module(&source.build()).map_err(|e| e.message)
                            })
                    }
                }
            }
            (None, None) => {
                return Err(EngineError::runtime(format!(
                    "internal error: {}: no program and no source to build one",
                    flush.label
                )))
            }
        };
        let mut job = ExecJob::new(flush.label, handle, flush.args, &flush.outputs)
            .donate(donated)
            .on_device(self.execution_device(flush.device));
        for pack in flush.scalar_packs {
            // Uploaded by the execution thread as part of the job: in order, off the caller's
            // path, and without a queue item of its own.
            job = job.upload(HostArgument {
                client: self.client.clone(),
                bytes: pack.bytes,
                element_type: element_type(pack.dtype),
                dims: smallvec::smallvec![pack.count as i64],
                what: "lifted scalars",
            });
            Counters::bump(&self.counters.host_to_device, 1);
        }
        defer::fail_point::reach(defer::fail_point::FailPoint::LaunchEnqueue)?;
        Counters::bump(&self.counters.executions, 1);
        if !flush.checks.is_empty() {
            self.pending_checks.lock().extend(flush.checks);
        }
        if let Some(began) = began {
            job = self.trace_launch(job, began, flush.ops, program);
        }
        self.queue.enqueue(job);
        {
            // Refilled in place: no allocation per op.
            let mut last = self.last_outputs.lock();
            last.clear();
            last.extend(flush.outputs.iter().map(|v| v.downgrade()));
        }
        Ok(flush.outputs)
    }

    /// Records a region's planning and launch, from `began`, in the trace, and marks its job so
    /// that its execution on the device is recorded under the same region number. `program`
    /// says where the program came from: "tier1" (found in memory when the region was keyed),
    /// "requested" (the compile thread's event says from which tier or compile).
    fn trace_launch(
        &self,
        job: ExecJob,
        began: std::time::Instant,
        ops: usize,
        program: &'static str,
    ) -> ExecJob {
        use compile::trace::{self, Arg, Event, Track};
        let region = trace::next_region();
        let label = job.label.to_string();
        let first_ops = trace::first_ops(&label).to_string();
        trace::record(
            Event::until_now(Track::Host, format!("pjrt {label}"), began)
                .arg("region", Arg::Int(region as i64))
                .arg("key", Arg::Text(job.executable.key().to_string()))
                .arg("ops", Arg::Int(ops as i64))
                .arg("first_ops", Arg::Text(first_ops))
                .arg("program", Arg::Text(program.to_string()))
                .arg("mode", Arg::Text(self.modes.current().name().to_string())),
        );
        job.traced(region)
    }

    /// Gives the recompiles this thread recorded the user's line, from `locate` (called with no
    /// engine lock held: it may take Python's interpreter lock), and logs them when asked to.
    pub fn locate_recompiles(&self, locate: impl FnOnce() -> Option<String>) {
        let location = locate();
        let mut tracker = self.recompiles.lock();
        let messages = tracker.locate(location);
        if self.log_recompiles {
            for message in messages {
                eprintln!("torch-pjrt: {message}");
            }
        }
    }

    /// Enters a recompile budget (`torch_pjrt.recompile_limit`): while it is active, a compile
    /// past `budget.limit` recompiles fails with its explanation (or warns).
    pub fn push_recompile_limit(&self, budget: Budget) {
        self.recompiles.lock().push_budget(budget);
    }

    pub fn pop_recompile_limit(&self) -> Result<(), EngineError> {
        self.recompiles.lock().pop_budget()
    }

    /// Waits until a value is computed on the device; returns the error of what produced it.
    fn wait_device(&self, value: &DeviceValue) -> Result<Arc<pjrt::Buffer>, EngineError> {
        let start = std::time::Instant::now();
        if !value.is_resolved() {
            // Launched from this thread when the worker is idle: no hand-off to the worker and
            // back on the way to a read (it wakes the worker for what it leaves).
            self.queue.run_here();
        }
        let ready = value
            .wait_ready()
            .map_err(|e| EngineError::runtime(e.to_string()));
        Counters::add_time(&self.counters.wait_nanos, start);
        ready
    }

    // ----- materialization and transfers -----

    /// Materializes everything pending and waits for the device (`torch_pjrt.sync()`,
    /// `torch.pjrt.synchronize()`).
    /// Launches everything pending as regions, without waiting for the device.
    pub fn flush_pending(&self) -> Result<(), EngineError> {
        let mut graph = self.graph.lock()?;
        if graph.pending_len() == 0 {
            return Ok(());
        }
        self.flush_locked(&mut graph, FlushRequest::All).map(|_| ())
    }

    /// DeferAndFuse's fallback to one-op programs ([`crate::adaptive`]).
    pub fn adaptive(&self) -> &crate::adaptive::Adaptive {
        &self.adaptive
    }

    /// The mode whose flush policy applies to the next op: the current one, except that
    /// DeferAndFuse runs ops as Strict does while its regions never repeat (RFC 0042). A
    /// compiled-mode graph always fuses.
    fn flush_mode(&self) -> Mode {
        let mode = self.modes.current();
        if mode == Mode::DeferAndFuse && self.adaptive.one_op() && !self.in_graph() {
            Mode::Strict
        } else {
            mode
        }
    }

    /// A compiled-mode graph ran: what Strict captures next that only makes new values is
    /// held for the next graph's prologue (see `hold_sources`).
    pub(crate) fn note_graph_ran(&self) {
        self.hold_sources
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn in_graph(&self) -> bool {
        self.open_graphs.load(std::sync::atomic::Ordering::Acquire) > 0
    }

    /// Opens a compiled-mode graph (RFC 0033): what is pending is launched first, so the
    /// graph's program is the same whatever ran before it, and its ops are deferred into one
    /// region until [`Engine::graph_end`].
    pub fn graph_begin(&self) -> Result<(), EngineError> {
        self.flush_pending()?;
        self.open_graph()
    }

    /// Opens a compiled-mode graph that [`Engine::graph_end_record`] will record, over the
    /// storages `inputs` of the graph's inputs. What is pending is launched first, as
    /// [`Engine::graph_begin`] does, unless it is a prologue of the graph: a few ops that read
    /// no device value and whose held results are all inputs' (autograd's `ones_like` seed of a
    /// backward graph). Those stay pending, join the graph's region, and the recorded program
    /// computes them: a replay drops the same ops pending then instead of launching them.
    pub fn graph_begin_record(&self, inputs: &[StorageId]) -> Result<(), EngineError> {
        let prologue = self.graph.lock()?.pending_prologue(inputs);
        if prologue.is_none() {
            self.flush_pending()?;
        }
        *self.graph_prologue.lock() = prologue;
        self.open_graph()
    }

    fn open_graph(&self) -> Result<(), EngineError> {
        self.graph.lock()?.take_zero_filled();
        self.modes.push(Mode::DeferAndFuse);
        self.open_graphs
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    /// Closes the graph [`Engine::graph_begin`] opened: launches its region, without waiting.
    /// The mode and the graph count are restored even when the launch fails.
    pub fn graph_end(&self) -> Result<(), EngineError> {
        let launched = self.flush_pending();
        let open = self.open_graphs.load(std::sync::atomic::Ordering::Acquire);
        if open == 0 {
            return Err(EngineError::runtime(
                "graph_end without an open graph: each graph_end closes one graph_begin",
            ));
        }
        self.open_graphs
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        self.modes.pop().map_err(EngineError::runtime)?;
        self.note_graph_ran();
        launched
    }

    /// Launches what the execution queue holds and waits (at most half a minute) until every
    /// traced execution has recorded its completion: a profiler's session reads the trace
    /// right after it stops recording, and must not miss the last programs still running.
    pub fn settle_trace(&self) {
        self.queue.flush();
        let _ = compile::trace::settle(std::time::Duration::from_secs(30));
    }

    pub fn sync(&self) -> Result<(), EngineError> {
        {
            let mut graph = self.graph.lock()?;
            self.flush_locked(&mut graph, FlushRequest::All)?;
        }
        self.queue.flush();
        let last = std::mem::take(&mut *self.last_outputs.lock());
        let mut first_error = None;
        for value in last.iter().filter_map(|v| v.upgrade()) {
            if let Err(e) = self.wait_device(&value) {
                first_error.get_or_insert(e);
            }
        }
        // Work whose results were all released still runs on the device: wait for it too, even
        // after an error, so one sync raises the pending failures once and the next is clean.
        if let Err(e) = self.queue.wait_launched() {
            first_error.get_or_insert(runtime_error("waiting for the device", e));
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        self.verify_checks()
    }

    /// Reads the verdicts of every launched assertion; the first false one is the error.
    fn verify_checks(&self) -> Result<(), EngineError> {
        let checks = std::mem::take(&mut *self.pending_checks.lock());
        let mut first_error = None;
        for (value, site) in checks {
            let op = site.op;
            let result = self.wait_device(&value).and_then(|buffer| {
                let bytes = buffer
                    .to_host()
                    .map_err(|e| runtime_error("reading an assertion's verdict", e))?;
                if op == OpId::IndexCheck.name() || op == OpId::RepeatsCheck.name() {
                    let verdict: Vec<i64> = bytes
                        .chunks_exact(8)
                        .map(|w| i64::from_ne_bytes(w.try_into().expect("8 bytes")))
                        .collect();
                    return ops::checks::index_check_error(&verdict).map_or(Ok(()), |e| {
                        let e: EngineError = e.into();
                        Err(EngineError::new(e.kind, site.locate(&e.message)))
                    });
                }
                if bytes.first().copied().unwrap_or(0) == 0 {
                    return Err(EngineError::runtime(site.locate(&format!(
                        "{op}: Expected Tensor with single nonzero value, but got zero"
                    ))));
                }
                Ok(())
            });
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Copies tensor `t` to host memory `dst` (exactly `t.numel() * itemsize` bytes),
    /// materializing its storage first if needed.
    pub fn read_host(&self, t: &TensorRef, dst: &mut [u8]) -> Result<(), EngineError> {
        let expected = t.numel() as usize * t.dtype.size_bytes();
        if dst.len() != expected {
            return Err(EngineError::runtime(format!(
                "reading a pjrt tensor of {} {} elements needs a {expected}-byte buffer, got {} bytes",
                t.numel(),
                t.dtype.name(),
                dst.len()
            )));
        }
        if expected == 0 {
            return Ok(());
        }
        // A view of a small storage is cut out on the host: a device copy would compile a
        // program per view shape (a growing sequence read at each length).
        let gather = self.graph.lock()?.host_gather(t, HOST_GATHER_BYTES)?;
        if let Some(gather) = gather {
            return self.read_host_gathered(t, &gather, dst);
        }
        let whole = {
            let mut graph = self.graph.lock()?;
            let device = graph.storage_device(t.storage)?;
            self.enter_device(&mut graph, device, &[])?;
            graph.make_exact(t.storage)?;
            graph.is_whole(t)?
        };
        if !whole {
            // A strided tensor: copy it into a contiguous temporary on the device, read that.
            let temp = self.graph.lock()?.new_storage(expected as u64);
            let result = (|| {
                let temp_ref = TensorRef::contiguous(temp, t.dtype, &t.sizes);
                {
                    let mut graph = self.graph.lock()?;
                    graph.capture(
                        OpId::Clone,
                        std::slice::from_ref(t),
                        &[],
                        &[],
                        std::slice::from_ref(&temp_ref),
                    )?;
                    self.after_capture(&mut graph)?;
                    if !graph.is_whole(&temp_ref)? {
                        // A copy that is not whole would be copied again without end.
                        return Err(EngineError::runtime(
                            "internal error: a pjrt tensor's contiguous copy is not whole",
                        ));
                    }
                }
                self.read_host(&temp_ref, dst)
            })();
            self.graph.lock()?.release_storage(temp)?;
            return result;
        }
        // This thread runs the flush's region itself when it waits (`wait_device`).
        let _hold = self.queue.hold_worker();
        match self.materialized_source(|graph| graph.read_source(t))? {
            ReadSource::Zeros => dst.fill(0),
            ReadSource::Device(value, ty) => self.copy_to_host(&value, ty.dtype, dst)?,
        }
        Counters::bump(&self.counters.device_to_host, 1);
        Counters::bump(&self.counters.device_to_host_bytes, dst.len() as u64);
        Ok(())
    }

    /// What a read finds with `find` (`None`: still pending), everything pending flushed first
    /// when it must be, with the launched assertions' verdicts checked.
    fn materialized_source(
        &self,
        find: impl Fn(&mut Graph<DeviceValue>) -> Result<Option<ReadSource<DeviceValue>>, EngineError>,
    ) -> Result<ReadSource<DeviceValue>, EngineError> {
        let source = {
            let mut graph = self.graph.lock()?;
            match find(&mut graph)? {
                Some(source) => source,
                None => {
                    // Everything pending runs, not only what the read needs (RFC 0012): a
                    // training step read through its loss then runs as one region, whose
                    // activations live and die inside it, instead of leaving its backward pass
                    // to run with the next step's forward (both steps' activations held at once).
                    self.flush_locked(&mut graph, FlushRequest::All)?;
                    find(&mut graph)?.ok_or_else(|| {
                        EngineError::runtime("internal error: a flushed storage is still pending")
                    })?
                }
            }
        };
        self.verify_checks()?;
        Ok(source)
    }

    /// Waits for `value` (of `dtype`) and copies all of it into `dst`.
    fn copy_to_host(
        &self,
        value: &DeviceValue,
        dtype: DType,
        dst: &mut [u8],
    ) -> Result<(), EngineError> {
        let buffer = self.wait_device(value)?;
        let start = std::time::Instant::now();
        chalf::buffer_to_host(&buffer, dtype, dst)
            .map_err(|e| runtime_error("copying a pjrt tensor to the host", e))?;
        Counters::add_time(&self.counters.transfer_nanos, start);
        if compile::trace::on() {
            trace_transfer("device to host", start, dst.len());
        }
        Ok(())
    }

    /// `read_host` of view `t` by `gather`: the storage's whole value is read, the view's
    /// elements are copied out of it on the host.
    fn read_host_gathered(
        &self,
        t: &TensorRef,
        gather: &HostGather,
        dst: &mut [u8],
    ) -> Result<(), EngineError> {
        // This thread runs the flush's region itself when it waits (`wait_device`).
        let _hold = self.queue.hold_worker();
        let element = t.dtype.size_bytes();
        match self.materialized_source(|graph| graph.storage_source(t.storage))? {
            ReadSource::Zeros => dst.fill(0),
            ReadSource::Device(value, ty) => {
                let mut whole = vec![0u8; ty.numel() as usize * ty.dtype.size_bytes()];
                self.copy_to_host(&value, ty.dtype, &mut whole)?;
                if ty.dtype != t.dtype || !gather.copy(&whole, element, dst) {
                    return Err(EngineError::runtime(format!(
                        "internal error: a view of {:?} at offset {} does not fit its storage's \
                         value of {} {} elements",
                        gather.sizes.as_slice(),
                        gather.offset,
                        ty.numel(),
                        ty.dtype.name()
                    )));
                }
                Counters::bump(&self.counters.device_to_host_bytes, whole.len() as u64);
            }
        }
        Counters::bump(&self.counters.device_to_host, 1);
        Ok(())
    }

    /// Copies host memory `src` into tensor `t` (a new value for its storage).
    pub fn write_host(&self, t: &TensorRef, src: &[u8]) -> Result<(), EngineError> {
        let expected = t.numel() as usize * t.dtype.size_bytes();
        if src.len() != expected {
            return Err(EngineError::runtime(format!(
                "writing a pjrt tensor of {} {} elements needs {expected} bytes, got {} bytes",
                t.numel(),
                t.dtype.name(),
                src.len()
            )));
        }
        // A batch whose length keeps changing is uploaded padded to a bucket (bounded shapes):
        // the programs that read it are then one per bucket, not one per length.
        let padding = {
            let mut graph = self.graph.lock()?;
            let device = graph.storage_device(t.storage)?;
            self.enter_device(&mut graph, device, &[])?;
            // Read at each upload too, as at each append.
            graph.set_bounded(!matches!(env("TORCH_PJRT_DYNAMIC").as_deref(), Some("off")));
            let padding = if graph.is_whole(t)? {
                graph.upload_padding(t)
            } else {
                None
            };
            // A padded upload is a new batch: what is pending (the last step's backward and
            // optimizer update, at the last batch's bucket) is launched first, so a region
            // never joins two steps' buckets. Without a host read between steps, such regions
            // were keyed by each pair of consecutive buckets and kept compiling.
            if padding.is_some() && graph.pending_len() > 0 && !self.in_graph() {
                self.flush_locked(&mut graph, FlushRequest::All)?;
            }
            padding
        };
        // The bytes laid out padded on the host, or as they are.
        let padded = padding.and_then(|p| Some((p.pad_host(src, t.dtype.size_bytes())?, p)));
        let (bytes, sizes) = match &padded {
            Some((bytes, p)) => (bytes.as_slice(), p.padded_sizes()),
            None => (src, t.sizes.clone()),
        };
        let start = std::time::Instant::now();
        let device = if self.devices.len() > 1 {
            self.graph.lock()?.storage_device(t.storage)?
        } else {
            0
        };
        let buffer = self
            .upload_to(bytes, t.dtype, &sizes, device)
            .map_err(|e| runtime_error("copying a host tensor to pjrt", e))?;
        Counters::add_time(&self.counters.transfer_nanos, start);
        if compile::trace::on() {
            trace_transfer("host to device", start, bytes.len());
        }
        Counters::bump(&self.counters.host_to_device, 1);
        Counters::bump(&self.counters.host_to_device_bytes, bytes.len() as u64);
        let value = DeviceValue::ready(Arc::new(buffer));
        // Small integer uploads are remembered on the host (`Graph::note_uploaded`): index
        // lists uploaded from host memory get their range checked at the op.
        if let Some((_, padding)) = padded {
            let mut graph = self.graph.lock()?;
            graph.write_device_padded(t, value, padding)?;
            graph.note_uploaded(t, src);
            return Ok(());
        }
        let mut graph = self.graph.lock()?;
        if graph.is_whole(t)? {
            graph.write_device(t, value)?;
            graph.note_uploaded(t, src);
            return Ok(());
        }
        // A strided destination: the upload becomes a temporary, copied in through the view.
        let temp = graph.new_storage(expected as u64);
        let temp_ref = TensorRef::contiguous(temp, t.dtype, &t.sizes);
        let result = graph.write_device(&temp_ref, value).and_then(|()| {
            graph.note_uploaded(&temp_ref, src);
            graph.capture(OpId::Clone, &[temp_ref], &[], &[], std::slice::from_ref(t))?;
            self.after_capture(&mut graph)
        });
        graph.release_storage(temp)?;
        result
    }

    /// A sequence growing in a buffer with room (RFC 0028) is now `length` long (RFC 0029).
    pub fn note_sequence_length(&self, length: i64) -> Result<(), EngineError> {
        self.graph.lock()?.note_sequence_length(length);
        Ok(())
    }

    /// `torch_pjrt.mark_dynamic(t, dim, max)` on an inner dimension: `t`'s length along `dim`
    /// changes from batch to batch, up to `bound`. Uploads like `t` (its dtype, its other
    /// sizes) are padded along `dim` from now on, and `t` itself is made padded (through the
    /// host, once) unless it already is or is a view of a larger storage.
    pub fn mark_dynamic(&self, t: &TensorRef, dim: usize, bound: i64) -> Result<(), EngineError> {
        let rank = t.sizes.len();
        if dim >= rank {
            return Err(EngineError::new(
                ErrorKind::Index,
                format!(
                "mark_dynamic: dimension {dim} is out of range for a tensor of {rank} dimensions"
            ),
            ));
        }
        let repad = {
            let mut graph = self.graph.lock()?;
            graph.mark_upload_site(t, dim, bound);
            t.sizes[dim] >= 2 && graph.is_whole(t)? && !graph.storage_is_padded(t.storage)
        };
        if !repad {
            return Ok(());
        }
        let mut bytes = vec![0u8; t.numel() as usize * t.dtype.size_bytes()];
        self.read_host(t, &mut bytes)?;
        self.write_host(t, &bytes)
    }

    // ----- metrics -----

    pub fn note_fallback(&self, op: &str) {
        let mut table = self
            .counters
            .fallback_ops
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *table.entry(op.to_string()).or_insert(0) += 1;
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        let (graph, pending_ops) = {
            let graph = self.graph.lock_even_if_stopped();
            (graph.stats(), graph.pending_len())
        };
        let compile = self.compiler.stats();
        let mut s = MetricsSnapshot::default();
        let c = &self.counters;
        let v = &mut s.values;
        v.insert("compilations", compile.compilations as f64);
        v.insert(
            "cache_hits",
            (compile.tier1_hits + compile.tier2_hits + compile.tier3_hits) as f64,
        );
        v.insert("cache_hits_tier1", compile.tier1_hits as f64);
        v.insert("cache_hits_tier2", compile.tier2_hits as f64);
        v.insert("cache_hits_tier3", compile.tier3_hits as f64);
        v.insert("compile_failures", compile.failures as f64);
        v.insert("compile_seconds", compile.compile_time_total.as_secs_f64());
        v.insert(
            "compile_seconds_max",
            compile
                .slowest
                .as_ref()
                .map_or(0.0, |p| p.time.as_secs_f64()),
        );
        v.insert("heap_trims", compile.heap_trims as f64);
        v.insert("compile_upgrades", compile.upgrades as f64);
        v.insert(
            "compile_upgrade_seconds",
            compile.upgrade_time_total.as_secs_f64(),
        );
        v.insert(
            "host_heap_reuse",
            f64::from(u8::from(crate::host_heap::configured())),
        );
        v.insert(
            "warm_up_seconds",
            self.warm_up_nanos
                .load(std::sync::atomic::Ordering::Relaxed) as f64
                / 1e9,
        );
        v.insert(
            "deserialize_seconds",
            compile.deserialize_time_total.as_secs_f64(),
        );
        let (recompile_count, recompile_reasons) = {
            let tracker = self.recompiles.lock();
            (
                tracker.count(),
                tracker.reasons().cloned().collect::<Vec<_>>(),
            )
        };
        v.insert("recompiles", recompile_count as f64);
        // Where the time went (RFC 0032): the host's stages, the execution thread's launches
        // and compile waits, the device's time from launch to completion.
        let seconds = |nanos: u64| nanos as f64 / 1e9;
        v.insert("host_op_seconds", seconds(Counters::get(&c.op_nanos)));
        v.insert("host_flush_seconds", seconds(Counters::get(&c.flush_nanos)));
        v.insert("host_wait_seconds", seconds(Counters::get(&c.wait_nanos)));
        v.insert(
            "host_transfer_seconds",
            seconds(Counters::get(&c.transfer_nanos)),
        );
        let exec = self.queue.stats().since(&self.exec_baseline.lock());
        v.insert("exec_launch_seconds", seconds(exec.launch_nanos));
        v.insert(
            "exec_compile_wait_seconds",
            seconds(exec.compile_wait_nanos),
        );
        v.insert("exec_queue_seconds", seconds(exec.queue_nanos));
        v.insert("reader_launches", exec.caller_launches as f64);
        v.insert("exec_worker_wakes", exec.worker_wakes as f64);
        v.insert("upload_reuses", exec.upload_reuses as f64);
        v.insert("device_seconds", seconds(exec.device_nanos));
        v.insert("executions", Counters::get(&c.executions) as f64);
        // Since the process started (reset_metrics leaves it): 0 unless a profiler asked.
        v.insert("profiler_events", compile::trace::recorded_total() as f64);
        v.insert("donated_buffers", Counters::get(&c.donated_buffers) as f64);
        v.insert("repeat_cuts", Counters::get(&c.repeat_cuts) as f64);
        v.insert("adaptive_switches", self.adaptive.switches() as f64);
        v.insert("adaptive_one_op_ops", self.adaptive.one_op_ops() as f64);
        v.insert("memory_cuts", Counters::get(&c.memory_cuts) as f64);
        v.insert("isolation_cuts", Counters::get(&c.isolation_cuts) as f64);
        v.insert("graph_replays", Counters::get(&c.graph_replays) as f64);
        v.insert(
            "host_index_checks",
            Counters::get(&c.host_index_checks) as f64,
        );
        v.insert(
            "device_index_checks",
            Counters::get(&c.device_index_checks) as f64,
        );
        for (name, counter) in [
            ("device_switch_cuts", &c.device_switch_cuts),
            ("device_to_device", &c.device_to_device),
            ("device_to_device_bytes", &c.device_to_device_bytes),
            ("device_collectives", &c.collectives),
            ("device_collective_compiles", &c.collective_compiles),
        ] {
            v.insert(name, Counters::get(counter) as f64);
        }
        v.insert("ops", Counters::get(&c.ops) as f64);
        v.insert("deferred_ops", graph.deferred_ops as f64);
        v.insert("pending_ops", pending_ops as f64);
        v.insert("materializations", graph.materializations as f64);
        v.insert("regions", graph.regions as f64);
        v.insert("region_ops", graph.region_ops as f64);
        v.insert("dropped_ops", graph.dropped_ops as f64);
        v.insert("largest_region", graph.largest_region as f64);
        v.insert("direct_ops", graph.direct_ops as f64);
        v.insert("padded_ops", graph.padded_ops as f64);
        v.insert("unpadded_values", graph.unpadded_values as f64);
        v.insert("regrown_values", graph.regrown_values as f64);
        v.insert("padded_uploads", graph.padded_uploads as f64);
        v.insert("live_storages", graph.live_storages as f64);
        // Transfers made: a lifted-scalar pack the queue served from its cache of recent
        // uploads (`upload_reuses`) was counted when queued but never crossed.
        v.insert(
            "host_to_device",
            Counters::get(&c.host_to_device).saturating_sub(exec.upload_reuses) as f64,
        );
        v.insert("device_to_host", Counters::get(&c.device_to_host) as f64);
        v.insert(
            "host_to_device_bytes",
            Counters::get(&c.host_to_device_bytes) as f64,
        );
        v.insert(
            "device_to_host_bytes",
            Counters::get(&c.device_to_host_bytes) as f64,
        );
        // The engine's own accounting (plugins' allocator statistics are optional): bytes of
        // live device buffers, and their peak counting each execution's scratch.
        let memory = self.client.memory_usage();
        v.insert("live_device_bytes", memory.live_bytes as f64);
        v.insert("peak_device_bytes", memory.peak_bytes as f64);
        s.fallback_ops = c
            .fallback_ops
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.compiled_programs = compile.recent.clone();
        s.last_recompile_reason = recompile_reasons.last().map(|r| r.message());
        s.recompile_reasons = recompile_reasons;
        s
    }

    /// Records a device event (`torch.Event.record`): what is pending is launched, and the
    /// event completes when everything launched before it has finished on the device. One
    /// ordered queue serves every stream, so an event orders all streams' earlier work.
    pub fn record_event(&self) -> Result<u64, EngineError> {
        self.flush_pending()?;
        let mark = self.queue.mark();
        let id = self
            .next_event
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.events.lock().insert(id, mark);
        Ok(id)
    }

    fn event(&self, id: u64) -> Result<Arc<compile::QueueMark>, EngineError> {
        self.events.lock().get(&id).cloned().ok_or_else(|| {
            EngineError::runtime(format!(
                "pjrt event {id} was never recorded or was destroyed"
            ))
        })
    }

    /// Whether the event's work has finished.
    pub fn query_event(&self, id: u64) -> Result<bool, EngineError> {
        Ok(self.event(id)?.done_at().is_some())
    }

    /// Waits for the event's work to finish.
    pub fn synchronize_event(&self, id: u64) -> Result<(), EngineError> {
        let mark = self.event(id)?;
        let start = std::time::Instant::now();
        mark.wait();
        Counters::add_time(&self.counters.wait_nanos, start);
        Ok(())
    }

    /// Milliseconds between two events' completions on the device (waits for both).
    pub fn event_elapsed_ms(&self, start: u64, end: u64) -> Result<f64, EngineError> {
        let (a, b) = (self.event(start)?, self.event(end)?);
        let (a, b) = (a.wait(), b.wait());
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        Ok(if b >= a { ms(b - a) } else { -ms(a - b) })
    }

    pub fn destroy_event(&self, id: u64) {
        self.events.lock().remove(&id);
    }

    /// `torch.pjrt.empty_cache()`: drops the in-process executables (a later use finds them
    /// on disk, or compiles them again; a recorded graph program runs its graph's ops until
    /// its executable is back); returns how many executables went.
    pub fn empty_cache(&self) -> u64 {
        self.compiler.clear_tier1()
    }

    /// `torch_pjrt.cache_stats()`: the programs of the in-process cache, as JSON.
    pub fn cache_stats_json(&self) -> String {
        crate::metrics::programs_json(&self.compiler.program_stats())
    }

    /// `torch.pjrt.reset_peak_memory_stats()`: the peak of live device bytes starts again from
    /// the live bytes now.
    pub fn reset_peak_memory(&self) {
        self.client.reset_peak_memory();
    }

    pub fn reset_metrics(&self) {
        self.counters.reset();
        *self.exec_baseline.lock() = self.queue.stats();
        self.graph.lock_even_if_stopped().reset_stats();
        self.compiler.reset_stats();
        self.recompiles.lock().reset();
        self.client.reset_peak_memory();
    }
}

/// Storages up to this size are read whole when a view of them is read on the host
/// (`Graph::host_gather`); a larger one only when the view is most of it.
const HOST_GATHER_BYTES: u64 = 64 * 1024;

#[cfg(test)]
mod client_option_tests {
    use super::*;
    use pjrt::NamedValue;

    #[test]
    fn options_are_typed_by_their_text() {
        let options =
            parse_client_options(" preallocate=false, memory_fraction=0.5,allocator=bfc,n=3 ,")
                .unwrap();
        assert_eq!(
            options,
            vec![
                ("preallocate".to_string(), NamedValue::Bool(false)),
                ("memory_fraction".to_string(), NamedValue::Float(0.5)),
                (
                    "allocator".to_string(),
                    NamedValue::String("bfc".to_string())
                ),
                ("n".to_string(), NamedValue::Int64(3)),
            ]
        );
        assert!(parse_client_options("").unwrap().is_empty());
        let err = parse_client_options("preallocate").unwrap_err();
        assert!(
            err.contains("expected key=value, got 'preallocate'"),
            "{err}"
        );
    }

    #[test]
    fn compile_options_become_typed_overrides() {
        use pjrt::CompileOverride as O;
        let options =
            parse_compile_options("xla_cpu_enable_fast_math=false,xla_gpu_autotune_level=0")
                .unwrap();
        assert_eq!(
            options,
            vec![
                ("xla_cpu_enable_fast_math".to_string(), O::Bool(false)),
                ("xla_gpu_autotune_level".to_string(), O::Int(0)),
            ]
        );
        // Compile options carry doubles: no detour through PJRT's f32 named values.
        assert_eq!(
            parse_compile_options("xla_fraction=0.1").unwrap(),
            vec![("xla_fraction".to_string(), O::Double(0.1))]
        );
        let err = parse_compile_options("fast").unwrap_err();
        assert!(
            err.starts_with("TORCH_PJRT_COMPILE_OPTIONS: expected key=value"),
            "{err}"
        );
    }

    #[test]
    fn compile_options_that_read_stale_weights_are_refused() {
        let bypass = parse_compile_options(
            "xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_BYPASS_COST_MODEL",
        )
        .unwrap();
        let err = check_compile_options(&bypass).unwrap_err();
        assert!(err.contains("XNN_GRAPH_FUSION_MODE_GREEDY"), "{err}");
        let greedy = parse_compile_options(
            "xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
        )
        .unwrap();
        assert_eq!(check_compile_options(&greedy), Ok(()));
    }

    #[test]
    fn cuda_takes_memory_on_demand_unless_told_otherwise() {
        let defaults = client_options("cuda", Vec::new());
        assert_eq!(
            defaults,
            vec![("preallocate".to_string(), NamedValue::Bool(false))]
        );
        let user = vec![("preallocate".to_string(), NamedValue::Bool(true))];
        assert_eq!(client_options("cuda", user.clone()), user);
        assert!(client_options("cpu", Vec::new()).is_empty());
    }
}
