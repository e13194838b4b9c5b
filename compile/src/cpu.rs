//! The host CPU's identity as far as compiled code cares: its instruction-set features.
//!
//! An XLA CPU executable holds machine code generated for the host that compiled it. A cache
//! directory shared between hosts (a network home, a container image) must therefore miss on a
//! CPU lacking one of those instructions instead of dying there with SIGILL. The string built here
//! goes into the options fingerprint and the cache directory names.
//!
//! What it contains:
//! * x86-64: the `model name` line of `/proc/cpuinfo` (XLA tunes for the host model), the names
//!   of a fixed list of features found by `is_x86_feature_detected!` (readable), and the raw
//!   CPUID feature words of leaves 1, 7.0, 7.1, 0xD.1 and 0x8000_0001 (complete: they also cover
//!   features newer than the list, such as AMX or AVX-VNNI).
//! * aarch64: the `AT_HWCAP`/`AT_HWCAP2` auxiliary-vector words and the CPU implementer/part.
//! * elsewhere: the `flags`/`Features` line of `/proc/cpuinfo`.
//!
//! Two hosts with the same string may share executables; any difference is a miss.

use crate::key::StableHasher;
use std::sync::OnceLock;

/// The host's CPU features string, computed once per process.
pub fn host_cpu_features() -> &'static str {
    static FEATURES: OnceLock<String> = OnceLock::new();
    FEATURES.get_or_init(describe_host)
}

/// The xxh3 fingerprint of a CPU features string (as used in cache directory names).
pub fn cpu_features_hash(features: &str) -> u64 {
    StableHasher::new("torch-pjrt/cpu/v1")
        .field(features.as_bytes())
        .finish()
}

/// [`cpu_features_hash`] of [`host_cpu_features`].
pub fn host_cpu_features_hash() -> u64 {
    static HASH: OnceLock<u64> = OnceLock::new();
    *HASH.get_or_init(|| cpu_features_hash(host_cpu_features()))
}

/// The value of the first `/proc/cpuinfo` line whose key is one of `keys`.
fn cpuinfo_field(keys: &[&str]) -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        keys.contains(&key.trim())
            .then(|| value.split_whitespace().collect::<Vec<_>>().join(" "))
    })
}

#[cfg(target_arch = "x86_64")]
fn describe_host() -> String {
    use std::arch::x86_64::{__cpuid, __cpuid_count};

    macro_rules! detected {
        ($($name:tt),* $(,)?) => {{
            let mut names: Vec<&str> = Vec::new();
            $( if std::arch::is_x86_feature_detected!($name) { names.push($name); } )*
            names
        }};
    }
    let names = detected!(
        "sse",
        "sse2",
        "sse3",
        "ssse3",
        "sse4.1",
        "sse4.2",
        "sse4a",
        "popcnt",
        "aes",
        "pclmulqdq",
        "rdrand",
        "rdseed",
        "sha",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "bmi1",
        "bmi2",
        "lzcnt",
        "adx",
        "tbm",
        "xsave",
        "xsaveopt",
        "xsavec",
        "xsaves",
        "avx512f",
        "avx512cd",
        "avx512bw",
        "avx512dq",
        "avx512vl",
        "avx512ifma",
        "avx512vbmi",
        "avx512vpopcntdq",
    );

    // SAFETY: CPUID exists on every x86-64 CPU, and only leaves up to the reported maxima are
    // read. (`__cpuid` is a safe function in newer Rust releases, an unsafe one in older ones.)
    #[allow(unused_unsafe)]
    let words = unsafe {
        let max_basic = __cpuid(0).eax;
        let max_extended = __cpuid(0x8000_0000).eax;
        let leaf1 = __cpuid(1);
        let mut words = vec![leaf1.ecx, leaf1.edx];
        if max_basic >= 7 {
            let leaf7 = __cpuid_count(7, 0);
            let leaf7_1 = __cpuid_count(7, 1);
            words.extend([leaf7.ebx, leaf7.ecx, leaf7.edx, leaf7_1.eax]);
        }
        if max_basic >= 0xD {
            words.push(__cpuid_count(0xD, 1).eax);
        }
        if max_extended >= 0x8000_0001 {
            let extended = __cpuid(0x8000_0001);
            words.extend([extended.ecx, extended.edx]);
        }
        words
    };
    let words: Vec<String> = words.iter().map(|w| format!("{w:08x}")).collect();
    let model = cpuinfo_field(&["model name"]).unwrap_or_default();
    format!(
        "x86_64;model={model};features={};cpuid={}",
        names.join(","),
        words.join(".")
    )
}

#[cfg(all(target_arch = "aarch64", target_os = "linux"))]
fn describe_host() -> String {
    // SAFETY: getauxval only reads the process's auxiliary vector.
    let (hwcap, hwcap2) = unsafe {
        (
            libc::getauxval(libc::AT_HWCAP),
            libc::getauxval(libc::AT_HWCAP2),
        )
    };
    let implementer = cpuinfo_field(&["CPU implementer"]).unwrap_or_default();
    let part = cpuinfo_field(&["CPU part"]).unwrap_or_default();
    format!("aarch64;implementer={implementer};part={part};hwcap={hwcap:x};hwcap2={hwcap2:x}")
}

#[cfg(not(any(
    target_arch = "x86_64",
    all(target_arch = "aarch64", target_os = "linux")
)))]
fn describe_host() -> String {
    let flags = cpuinfo_field(&["flags", "Features", "isa"]).unwrap_or_default();
    format!("{};flags={flags}", std::env::consts::ARCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_features_are_stable_within_a_process() {
        let features = host_cpu_features();
        assert!(features.starts_with(std::env::consts::ARCH), "{features}");
        assert_eq!(describe_host(), features);
        assert_eq!(host_cpu_features_hash(), cpu_features_hash(features));
        assert_ne!(cpu_features_hash("a"), cpu_features_hash("b"));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x86_features_name_the_baseline() {
        assert!(host_cpu_features().contains("sse2"));
        assert!(host_cpu_features().contains(";cpuid="));
    }
}
