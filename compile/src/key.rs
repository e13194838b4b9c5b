//! Cache keys and the options fingerprint: what names a compiled executable on disk and in memory.
//!
//! Everything here that can reach disk is hashed with xxh3-64 over a length-prefixed encoding.
//! The algorithm and the encoding are fixed forever: changing either silently invalidates every
//! cache directory, and `std`'s `DefaultHasher` may change between Rust releases.

use crate::cpu;
use std::fmt;
use xxhash_rust::xxh3::Xxh3;

/// Identifies one compiled executable: three 64-bit fingerprints computed by the caller.
///
/// * `shapeless`: the program without its sizes (ops, static parameters, edges, dtypes, …);
/// * `dims`: every size, stride and offset;
/// * `options`: how it is compiled and for which host ([`options_fingerprint`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey {
    pub shapeless: u64,
    pub dims: u64,
    pub options: u64,
}

impl CacheKey {
    pub const fn new(shapeless: u64, dims: u64, options: u64) -> CacheKey {
        CacheKey {
            shapeless,
            dims,
            options,
        }
    }

    /// Parses the 48-hex-digit form written by `Display`.
    pub fn from_hex(text: &str) -> Option<CacheKey> {
        if text.len() != 48 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let part = |i: usize| u64::from_str_radix(&text[i * 16..(i + 1) * 16], 16).ok();
        Some(CacheKey::new(part(0)?, part(1)?, part(2)?))
    }
}

impl fmt::Display for CacheKey {
    /// 48 lowercase hex digits: shapeless, dims, options.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:016x}{:016x}{:016x}",
            self.shapeless, self.dims, self.options
        )
    }
}

/// A fixed, length-prefixed xxh3 stream: no two different field sequences hash the same bytes.
pub(crate) struct StableHasher(Xxh3);

impl StableHasher {
    pub(crate) fn new(domain: &str) -> StableHasher {
        let mut hasher = StableHasher(Xxh3::new());
        hasher.field(domain.as_bytes());
        hasher
    }

    pub(crate) fn field(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0.digest()
    }
}

/// Everything that decides whether an executable compiled elsewhere may be loaded here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FingerprintInputs {
    /// The serialized `CompileOptionsProto`.
    pub compile_options: Vec<u8>,
    /// The `XLA_FLAGS` environment variable (empty when unset).
    pub xla_flags: String,
    pub engine_version: String,
    /// The plugin's file name (not its directory: one plugin may sit in different venvs).
    pub plugin_file_name: String,
    /// [`pjrt::Plugin::version_fingerprint`].
    pub plugin_version: String,
    pub api_version: (i32, i32),
    pub platform_name: String,
    pub platform_version: String,
    /// [`cpu::host_cpu_features`] unless overridden.
    pub cpu_features: String,
}

impl FingerprintInputs {
    /// Reads every input from the plugin, the client, the environment and the host CPU.
    pub fn gather(
        plugin: &pjrt::Plugin,
        client: &pjrt::Client,
        compile_options: &pjrt::CompileOptions,
        engine_version: &str,
    ) -> FingerprintInputs {
        FingerprintInputs {
            compile_options: compile_options.encode(),
            xla_flags: std::env::var("XLA_FLAGS").unwrap_or_default(),
            engine_version: engine_version.to_string(),
            plugin_file_name: plugin
                .path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            plugin_version: plugin.version_fingerprint(),
            api_version: plugin.api_version(),
            platform_name: client.platform_name().to_string(),
            platform_version: client.platform_version().to_string(),
            cpu_features: cpu::host_cpu_features().to_string(),
        }
    }

    /// The `options` part of a [`CacheKey`].
    pub fn fingerprint(&self) -> u64 {
        let mut hasher = StableHasher::new("torch-pjrt/options/v1");
        hasher
            .field(&self.compile_options)
            .field(self.xla_flags.as_bytes())
            .field(self.engine_version.as_bytes());
        self.hash_plugin(&mut hasher);
        hasher.field(self.cpu_features.as_bytes());
        hasher.finish()
    }

    /// The plugin build and platform alone: part of the cache directory names.
    pub fn plugin_fingerprint(&self) -> u64 {
        let mut hasher = StableHasher::new("torch-pjrt/plugin/v1");
        self.hash_plugin(&mut hasher);
        hasher.finish()
    }

    fn hash_plugin(&self, hasher: &mut StableHasher) {
        hasher
            .field(self.plugin_file_name.as_bytes())
            .field(self.plugin_version.as_bytes())
            .field(&self.api_version.0.to_le_bytes())
            .field(&self.api_version.1.to_le_bytes())
            .field(self.platform_name.as_bytes())
            .field(self.platform_version.as_bytes());
    }
}

/// The `options` fingerprint of a [`CacheKey`]: compile options, `XLA_FLAGS`, the engine
/// version, the plugin (file name and [`pjrt::Plugin::version_fingerprint`]), the PJRT API
/// version, the platform name and version, and the host CPU's features.
pub fn options_fingerprint(
    plugin: &pjrt::Plugin,
    client: &pjrt::Client,
    compile_options: &pjrt::CompileOptions,
    engine_version: &str,
) -> u64 {
    FingerprintInputs::gather(plugin, client, compile_options, engine_version).fingerprint()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_48_hex_digits_and_parses_back() {
        let key = CacheKey::new(1, 0xdead_beef, u64::MAX);
        let text = key.to_string();
        assert_eq!(text.len(), 48);
        assert_eq!(text, "000000000000000100000000deadbeefffffffffffffffff");
        assert_eq!(CacheKey::from_hex(&text), Some(key));
        assert_eq!(CacheKey::from_hex("xyz"), None);
    }

    #[test]
    fn length_prefixes_separate_fields() {
        let a = StableHasher::new("d").field(b"ab").field(b"c").finish();
        let b = StableHasher::new("d").field(b"a").field(b"bc").finish();
        assert_ne!(a, b);
    }
}
