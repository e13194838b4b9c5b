//! `CompileConfig`: pool size, tier-1 capacity and the tier-2/3 and dump directories, read from
//! the `TORCH_PJRT_*` environment variables or set directly.

use crate::cpu;
use crate::error::CompileError;
use std::path::PathBuf;

/// The tier-2 directory used when `TORCH_PJRT_SHARED_CACHE=1`.
pub const DEFAULT_SHARED_DIR: &str = "/dev/shm/torch-pjrt-cache";

/// The tier-1 capacity when none is given: enough for every op signature of a large model in
/// Strict mode, small enough that the executables' code stays a few hundred MB at most.
pub const DEFAULT_TIER1_CAPACITY: usize = 4096;

/// How a [`crate::Compiler`] compiles and where it caches.
#[derive(Clone, Debug)]
pub struct CompileConfig {
    /// Compile-pool threads (`TORCH_PJRT_COMPILE_THREADS`; default min(2, cores)). XLA
    /// parallelises inside one compile too, so more threads mostly help many small modules.
    pub threads: usize,
    /// Tier 1 (in-process, always on): at most this many executables, least recently used
    /// evicted first.
    pub tier1_capacity: usize,
    /// Tier 2: a machine-local directory shared by the processes of one host
    /// (`TORCH_PJRT_SHARED_CACHE=1` → [`DEFAULT_SHARED_DIR`], or an absolute path).
    pub shared_dir: Option<PathBuf>,
    /// Tier 3: a persistent directory (`TORCH_PJRT_CACHE_DIR`).
    pub persistent_dir: Option<PathBuf>,
    /// Where to write the StableHLO text and key of every compiled module
    /// (`TORCH_PJRT_DUMP_DIR`).
    pub dump_dir: Option<PathBuf>,
    /// `TORCH_PJRT_CACHE_ONLY=1`: a program found in no tier is an error instead of a compile.
    pub cache_only: bool,
    /// `TORCH_PJRT_CACHE_MAX_MB`: the persistent tier's bound; writing past it removes the
    /// least recently written entries.
    pub persistent_max_bytes: Option<u64>,
    /// Goes into the options fingerprint and the directory names: a new engine never loads
    /// an older engine's executables.
    pub engine_version: String,
    pub compile_options: pjrt::CompileOptions,
    /// Options added, for [`Effort::Fast`] compiles, on top of `compile_options` (which win
    /// where both name an option). Empty: fast compiles are full ones.
    pub fast_overrides: Vec<(String, pjrt::CompileOverride)>,
    /// Options added, for [`Effort::Quick`] compiles, on top of `compile_options` (which win
    /// where both name an option). Empty: quick compiles are full ones.
    pub quick_overrides: Vec<(String, pjrt::CompileOverride)>,
    /// Options added to the compile of a module whose reductions are all short (see
    /// [`longest_reduction`]), whatever its effort, under `compile_options` (which win where
    /// both name an option). Empty: such modules compile as any other.
    pub short_reduction_overrides: Vec<(String, pjrt::CompileOverride)>,
    /// Tiered compilation of [`Effort::Quick`] programs (`TORCH_PJRT_TIERED_COMPILE`): once tier 1
    /// has served a quick program this many times, it is compiled again with the full options
    /// on a background thread of low priority and the full program replaces it (RFC 0041).
    /// `None`: quick programs stay quick.
    pub upgrade_after_runs: Option<u64>,
    /// The host identity used for naming cache entries; leave it at
    /// [`cpu::host_cpu_features`] (it does not change what XLA compiles for).
    pub cpu_features: String,
}

impl Default for CompileConfig {
    /// No disk tiers, no dump, the default pool size.
    fn default() -> Self {
        CompileConfig {
            threads: default_threads(),
            tier1_capacity: DEFAULT_TIER1_CAPACITY,
            shared_dir: None,
            persistent_dir: None,
            dump_dir: None,
            cache_only: false,
            persistent_max_bytes: None,
            engine_version: env!("CARGO_PKG_VERSION").to_string(),
            compile_options: pjrt::CompileOptions::default(),
            fast_overrides: Vec::new(),
            quick_overrides: Vec::new(),
            short_reduction_overrides: Vec::new(),
            upgrade_after_runs: None,
            cpu_features: cpu::host_cpu_features().to_string(),
        }
    }
}

/// How hard a compile optimizes. Chosen per program by the caller; each has its own options
/// word in the [`crate::CacheKey`] (see [`crate::Compiler::options_fingerprint_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Effort {
    /// The plugin's default optimization: fused regions, whose run time matters.
    Full,
    /// A program of one or a few ops (Strict's and Debug's): options that compile faster and,
    /// measured per op kind, run no slower (RFC 0025).
    Fast,
    /// A fused region whose ops produce few elements (a small model's decoding step): its run
    /// time is the launch's, not the code's, so the backend's code generation is not worth
    /// optimizing (RFC 0039).
    Quick,
}

/// The fast-compile options for a plugin platform (`cpu`, `cuda`, ...). XLA CPU's fusion
/// emitters cost a third of a one-op program's compile and gain it nothing (RFC 0025).
pub fn fast_overrides_for(platform: &str) -> Vec<(String, pjrt::CompileOverride)> {
    match platform {
        "cpu" | "host" => vec![(
            "xla_cpu_use_fusion_emitters".to_string(),
            pjrt::CompileOverride::Bool(false),
        )],
        _ => Vec::new(),
    }
}

/// The options every compile gets on a plugin platform, under the user's
/// (`TORCH_PJRT_COMPILE_OPTIONS`, which win where both name an option). On XLA CPU: reductions
/// as YNNPACK fusions, which take the elementwise work around a row reduction into one pass
/// (softmax of 4096x1024 about a quarter faster, layer_norm about a tenth) and compile in half
/// the time; products and elementwise regions are unchanged (RFC 0040).
pub fn default_overrides_for(platform: &str) -> Vec<(String, pjrt::CompileOverride)> {
    match platform {
        "cpu" | "host" => vec![(
            "xla_cpu_experimental_ynn_fusion_type".to_string(),
            pjrt::CompileOverride::String("LIBRARY_FUSION_TYPE_REDUCE".to_string()),
        )],
        _ => Vec::new(),
    }
}

/// The quick-compile options for a plugin platform: on XLA CPU, LLVM's optimization level 0
/// and the fusion emitters off (XLA's own HLO passes, fusion included, still run): about 5x
/// less compile time for a decoding step's region of ~90 ops; the program runs until its full
/// upgrade replaces it (RFC 0039, RFC 0041).
pub fn quick_overrides_for(platform: &str) -> Vec<(String, pjrt::CompileOverride)> {
    match platform {
        "cpu" | "host" => vec![
            (
                "xla_backend_optimization_level".to_string(),
                pjrt::CompileOverride::Int(0),
            ),
            (
                "xla_cpu_use_fusion_emitters".to_string(),
                pjrt::CompileOverride::Bool(false),
            ),
        ],
        _ => Vec::new(),
    }
}

/// The module attribute in which the emitter states the longest dimension the module reduces
/// over or contracts (`ops::emitter::LONGEST_REDUCTION_ATTR`; the two crates share only the text).
pub const LONGEST_REDUCTION_ATTR: &str = "torch_pjrt.longest_reduction";

/// Modules whose every reduction runs over dimensions of at most this many elements get the
/// short-reduction options: a sum of up to a thousand floats in one pass is as exact as the
/// tests of every op ask, and longer float sums are already split by the emitter (RFC 0047).
pub const SHORT_REDUCTION_MAX: i64 = 1024;

/// The longest reduced dimension a module states in its header ([`LONGEST_REDUCTION_ATTR`]);
/// `None` for a module that states none (no reduction, or not written by the emitter).
pub fn longest_reduction(module: &str) -> Option<i64> {
    let header = module
        .lines()
        .find(|line| line.trim_start().starts_with("module"))?;
    let rest = &header[header.find(LONGEST_REDUCTION_ATTR)? + LONGEST_REDUCTION_ATTR.len()..];
    let digits = rest.trim_start().strip_prefix('=')?.trim_start();
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// The options for modules whose reductions are all short, on a plugin platform. On XLA CPU:
/// leave out the pass that splits every reduction of a dimension longer than 32 into a
/// `reduce-window` and a `reduce` (for the precision of long sums), which makes each short
/// reduction two kernels: a small model's decoding step, with a layer norm's two 64-element
/// reductions per layer, launches about a fifth fewer kernels and runs about 15% faster (RFC 0047).
pub fn short_reduction_overrides_for(platform: &str) -> Vec<(String, pjrt::CompileOverride)> {
    match platform {
        "cpu" | "host" => vec![(
            "xla_disable_hlo_passes".to_string(),
            pjrt::CompileOverride::String("tree_reduction_rewriter".to_string()),
        )],
        _ => Vec::new(),
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(2)
}

impl CompileConfig {
    /// Reads `TORCH_PJRT_COMPILE_THREADS`, `TORCH_PJRT_SHARED_CACHE`, `TORCH_PJRT_CACHE_DIR`
    /// and `TORCH_PJRT_DUMP_DIR`. A malformed value is an error naming the variable.
    pub fn from_env() -> Result<CompileConfig, CompileError> {
        CompileConfig::from_vars(|name| std::env::var(name).ok())
    }

    /// [`CompileConfig::from_env`] over any variable source (tests pass a map).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<CompileConfig, CompileError> {
        let mut config = CompileConfig::default();
        let set = |name: &str| {
            var(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if let Some(threads) = set("TORCH_PJRT_COMPILE_THREADS") {
            config.threads = match threads.parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(CompileError::Config(format!(
                        "TORCH_PJRT_COMPILE_THREADS must be a whole number of threads ≥ 1, got \
                         '{threads}'; unset it for the default ({})",
                        default_threads()
                    )))
                }
            };
        }
        if let Some(shared) = set("TORCH_PJRT_SHARED_CACHE") {
            config.shared_dir = match shared.to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Some(PathBuf::from(DEFAULT_SHARED_DIR)),
                "0" | "false" | "no" | "off" => None,
                _ if shared.starts_with('/') => Some(PathBuf::from(&shared)),
                _ => {
                    return Err(CompileError::Config(format!(
                        "TORCH_PJRT_SHARED_CACHE must be 1 (use {DEFAULT_SHARED_DIR}), 0, or an \
                         absolute directory path, got '{shared}'"
                    )))
                }
            };
        }
        config.persistent_dir = set("TORCH_PJRT_CACHE_DIR").map(PathBuf::from);
        config.dump_dir = set("TORCH_PJRT_DUMP_DIR").map(PathBuf::from);
        config.cache_only = matches!(set("TORCH_PJRT_CACHE_ONLY").as_deref(), Some(v) if v != "0");
        if let Some(max) = set("TORCH_PJRT_CACHE_MAX_MB") {
            config.persistent_max_bytes = match max.parse::<f64>() {
                Ok(mb) if mb > 0.0 && mb.is_finite() => Some((mb * (1u64 << 20) as f64) as u64),
                _ => {
                    return Err(CompileError::Config(format!(
                        "TORCH_PJRT_CACHE_MAX_MB must be a positive number of mebibytes, got \
                         '{max}'; unset it for no bound"
                    )))
                }
            };
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn only_xla_cpu_has_default_options_and_they_make_reductions_ynnpack_fusions() {
        let cpu = default_overrides_for("cpu");
        assert_eq!(cpu.len(), 1);
        assert_eq!(cpu[0].0, "xla_cpu_experimental_ynn_fusion_type");
        assert_eq!(
            cpu[0].1,
            pjrt::CompileOverride::String("LIBRARY_FUSION_TYPE_REDUCE".to_string())
        );
        assert!(default_overrides_for("cuda").is_empty());
    }

    fn from(pairs: &[(&str, &str)]) -> Result<CompileConfig, CompileError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CompileConfig::from_vars(|name| map.get(name).cloned())
    }

    #[test]
    fn unset_variables_give_the_defaults() {
        let config = from(&[]).unwrap();
        assert!(config.threads >= 1 && config.threads <= 2);
        assert_eq!(config.tier1_capacity, DEFAULT_TIER1_CAPACITY);
        assert!(config.shared_dir.is_none() && config.persistent_dir.is_none());
        assert!(config.dump_dir.is_none());
    }

    #[test]
    fn variables_are_read() {
        let config = from(&[
            ("TORCH_PJRT_COMPILE_THREADS", "5"),
            ("TORCH_PJRT_SHARED_CACHE", "1"),
            ("TORCH_PJRT_CACHE_DIR", "/tmp/c"),
            ("TORCH_PJRT_DUMP_DIR", "/tmp/d"),
        ])
        .unwrap();
        assert_eq!(config.threads, 5);
        assert_eq!(config.shared_dir, Some(PathBuf::from(DEFAULT_SHARED_DIR)));
        assert_eq!(config.persistent_dir, Some(PathBuf::from("/tmp/c")));
        assert_eq!(config.dump_dir, Some(PathBuf::from("/tmp/d")));
        let config = from(&[("TORCH_PJRT_SHARED_CACHE", "/var/tmp/x")]).unwrap();
        assert_eq!(config.shared_dir, Some(PathBuf::from("/var/tmp/x")));
        let config = from(&[("TORCH_PJRT_SHARED_CACHE", "0")]).unwrap();
        assert_eq!(config.shared_dir, None);
        assert!(!config.cache_only && config.persistent_max_bytes.is_none());
        let config = from(&[
            ("TORCH_PJRT_CACHE_ONLY", "1"),
            ("TORCH_PJRT_CACHE_MAX_MB", "0.5"),
        ])
        .unwrap();
        assert!(config.cache_only);
        assert_eq!(config.persistent_max_bytes, Some(1 << 19));
    }

    #[test]
    fn malformed_values_name_the_variable() {
        let err = from(&[("TORCH_PJRT_COMPILE_THREADS", "many")]).unwrap_err();
        assert!(
            err.to_string().contains("TORCH_PJRT_COMPILE_THREADS"),
            "{err}"
        );
        assert!(err.to_string().contains("'many'"), "{err}");
        let err = from(&[("TORCH_PJRT_COMPILE_THREADS", "0")]).unwrap_err();
        assert!(err.to_string().contains("≥ 1"), "{err}");
        let err = from(&[("TORCH_PJRT_CACHE_MAX_MB", "lots")]).unwrap_err();
        assert!(err.to_string().contains("TORCH_PJRT_CACHE_MAX_MB"), "{err}");
        let err = from(&[("TORCH_PJRT_SHARED_CACHE", "maybe")]).unwrap_err();
        assert!(err.to_string().contains("TORCH_PJRT_SHARED_CACHE"), "{err}");
    }
}
