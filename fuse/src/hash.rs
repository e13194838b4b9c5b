//! A streaming hasher with a fixed algorithm (xxh3, explicit little-endian encoding) for keys that
//! may reach disk; `DefaultHasher` may change between Rust releases and must not be used there.

use ops::{DType, ScalarArg, ScalarValue};

/// Hashes values in a fixed byte encoding, so a digest is the same across builds and hosts.
/// The bytes are gathered on the stack and hashed once (xxh3 of the concatenation equals its
/// streaming form), which is several times cheaper than a streaming state for the short
/// inputs of per-op digests.
#[derive(Clone)]
pub struct StableHasher {
    /// The bytes while they fit here (the common case: a bounds check and a copy per write).
    inline: [u8; INLINE],
    len: usize,
    /// All the bytes once they no longer fit inline.
    spill: Vec<u8>,
}

const INLINE: usize = 256;

impl StableHasher {
    #[inline]
    fn put(&mut self, value: &[u8]) {
        if self.spill.is_empty() {
            let end = self.len + value.len();
            if let Some(dst) = self.inline.get_mut(self.len..end) {
                dst.copy_from_slice(value);
                self.len = end;
                return;
            }
            self.spill.reserve(end.max(2 * INLINE));
            self.spill.extend_from_slice(&self.inline[..self.len]);
        }
        self.spill.extend_from_slice(value);
    }

    #[inline]
    fn as_bytes(&self) -> &[u8] {
        if self.spill.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }
}

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher::new()
    }
}

impl StableHasher {
    pub fn new() -> Self {
        StableHasher {
            inline: [0; INLINE],
            len: 0,
            spill: Vec::new(),
        }
    }

    #[inline]
    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.put(&value.to_le_bytes());
        self
    }

    pub fn i64(&mut self, value: i64) -> &mut Self {
        self.u64(value as u64)
    }

    #[inline]
    pub fn u32(&mut self, value: u32) -> &mut Self {
        self.put(&value.to_le_bytes());
        self
    }

    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.u64(value.len() as u64);
        self.put(value);
        self
    }

    pub fn str(&mut self, value: &str) -> &mut Self {
        self.bytes(value.as_bytes())
    }

    /// A list of integers, length-prefixed so `[1, 2] + [3]` differs from `[1] + [2, 3]`.
    pub fn i64s(&mut self, values: &[i64]) -> &mut Self {
        self.u64(values.len() as u64);
        for &v in values {
            self.i64(v);
        }
        self
    }

    pub fn dtype(&mut self, dtype: DType) -> &mut Self {
        self.u32(dtype.code() as u32)
    }

    /// The part of a scalar argument that decides the compiled program: its kind (bool, int or
    /// float) and whether it came as a 0-d tensor of some dtype. Never its value.
    pub fn scalar_kind(&mut self, scalar: &ScalarArg) -> &mut Self {
        let kind = match scalar.value {
            ScalarValue::Bool(_) => 1,
            ScalarValue::Int(_) => 2,
            ScalarValue::Float(_) => 3,
        };
        self.u32(kind);
        self.u32(
            scalar
                .tensor_dtype
                .map(|d| d.code() as u32 + 1)
                .unwrap_or(0),
        )
    }

    pub fn finish(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(self.as_bytes())
    }
}

/// Lets fixed-encoding feeders (e.g. `views::hash_chain`, which writes explicit little-endian
/// integers) hash into the same stream.
impl std::hash::Hasher for StableHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.put(bytes);
    }

    fn finish(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(self.as_bytes())
    }
}

/// Chains a running digest with the next one (order matters).
pub fn combine(running: u64, next: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&running.to_le_bytes());
    bytes[8..].copy_from_slice(&next.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_fixed_forever() {
        // A changed digest here would orphan every tier-3 cache directory: never update it
        // without bumping the engine version.
        let mut h = StableHasher::new();
        h.u64(1).i64s(&[2, 3]).str("add").dtype(DType::F32);
        assert_eq!(h.finish(), 0xbf0c_197c_3cea_f5bd);
        assert_eq!(combine(1, 2), 0x07ee_86c2_8144_6bef);
        assert_ne!(combine(1, 2), combine(2, 1));
    }

    #[test]
    fn lists_are_length_prefixed() {
        let mut a = StableHasher::new();
        a.i64s(&[1, 2]).i64s(&[3]);
        let mut b = StableHasher::new();
        b.i64s(&[1]).i64s(&[2, 3]);
        assert_ne!(a.finish(), b.finish());
    }
}
