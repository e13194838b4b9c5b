//! A streaming hasher with a fixed algorithm (64-bit words, explicit little-endian encoding) for
//! keys that may reach disk; `DefaultHasher` may change between Rust releases and must not be used
//! there.

use ops::{DType, ScalarArg, ScalarValue};

/// Hashes values in a fixed encoding, so a digest is the same across builds and hosts.
///
/// Every value is absorbed as 64-bit words: the state is xored with the word and folded through a
/// 64×64→128-bit multiply (the high and low halves xored), a few instructions per word with no
/// buffer to fill. Digests run once per captured op (twice, for structure and sizes), where a
/// byte-buffered hash spent more on gathering bytes than on hashing. `finish` adds the word count
/// and a full avalanche, so prefixes and extensions of a stream differ.
#[derive(Clone)]
pub struct StableHasher {
    state: u64,
    words: u64,
}

/// Odd 64-bit constants (fractional digits of π and e): fixed forever, as digests reach disk.
const MULTIPLIER: u64 = 0x243f_6a88_85a3_08d3;
const SEED: u64 = 0xb7e1_5162_8aed_2a6b;
const LENGTH_MULTIPLIER: u64 = 0x1319_8a2e_0370_7345;

/// The 128-bit product of `a` and `b`, its halves xored.
#[inline(always)]
fn folded_multiply(a: u64, b: u64) -> u64 {
    let full = (a as u128).wrapping_mul(b as u128);
    (full as u64) ^ ((full >> 64) as u64)
}

/// A bijective avalanche of 64 bits (MurmurHash3's finalizer).
#[inline(always)]
fn avalanche(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

impl StableHasher {
    #[inline(always)]
    fn word(&mut self, value: u64) {
        // The added constant keeps a zero state from absorbing a zero word into zero.
        self.state = folded_multiply(self.state ^ value, MULTIPLIER).wrapping_add(SEED);
        self.words += 1;
    }
}

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher::new()
    }
}

impl StableHasher {
    #[inline]
    pub fn new() -> Self {
        StableHasher {
            state: SEED,
            words: 0,
        }
    }

    #[inline]
    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.word(value);
        self
    }

    #[inline]
    pub fn i64(&mut self, value: i64) -> &mut Self {
        self.u64(value as u64)
    }

    /// A 32-bit value takes a whole word (callers' encodings are fixed, so widths never mix at
    /// one position).
    #[inline]
    pub fn u32(&mut self, value: u32) -> &mut Self {
        self.word(value as u64);
        self
    }

    /// Length-prefixed bytes, as little-endian words (the last one zero-padded).
    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.u64(value.len() as u64);
        self.raw_bytes(value);
        self
    }

    fn raw_bytes(&mut self, value: &[u8]) {
        let mut chunks = value.chunks_exact(8);
        for chunk in &mut chunks {
            self.word(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(last));
        }
    }

    pub fn str(&mut self, value: &str) -> &mut Self {
        self.bytes(value.as_bytes())
    }

    /// A list of integers, length-prefixed so `[1, 2] + [3]` differs from `[1] + [2, 3]`.
    #[inline]
    pub fn i64s(&mut self, values: &[i64]) -> &mut Self {
        self.u64(values.len() as u64);
        for &v in values {
            self.i64(v);
        }
        self
    }

    #[inline]
    pub fn dtype(&mut self, dtype: DType) -> &mut Self {
        self.u32(dtype.code() as u32)
    }

    /// The part of a scalar argument that decides the compiled program: its kind (bool, int or
    /// float) and whether it came as a 0-d tensor of some dtype. Never its value.
    pub fn scalar_kind(&mut self, scalar: &ScalarArg) -> &mut Self {
        let kind: u64 = match scalar.value {
            ScalarValue::Bool(_) => 1,
            ScalarValue::Int(_) => 2,
            ScalarValue::Float(_) => 3,
        };
        let tensor_dtype = scalar
            .tensor_dtype
            .map(|d| d.code() as u64 + 1)
            .unwrap_or(0);
        self.u64(kind | tensor_dtype << 8)
    }

    #[inline]
    pub fn finish(&self) -> u64 {
        avalanche(self.state ^ self.words.wrapping_mul(LENGTH_MULTIPLIER))
    }
}

/// Lets fixed-encoding feeders (e.g. `views::hash_chain`, which writes explicit little-endian
/// integers) hash into the same stream.
impl std::hash::Hasher for StableHasher {
    /// Feeders write whole fixed-width integers; a write is its bytes as zero-padded words.
    fn write(&mut self, bytes: &[u8]) {
        self.raw_bytes(bytes);
    }

    fn write_u64(&mut self, value: u64) {
        self.word(value);
    }

    fn finish(&self) -> u64 {
        StableHasher::finish(self)
    }
}

/// Chains a running digest with the next one (order matters).
#[inline]
pub fn combine(running: u64, next: u64) -> u64 {
    // Asymmetric in its arguments: the two words enter through different constants.
    avalanche(folded_multiply(running ^ SEED, next ^ MULTIPLIER).wrapping_add(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_fixed_forever() {
        // A changed digest here would orphan every tier-3 cache directory: never update it
        // without changing the engine version's key scheme.
        let mut h = StableHasher::new();
        h.u64(1).i64s(&[2, 3]).str("add").dtype(DType::F32);
        let (digest, combined) = (h.finish(), combine(1, 2));
        assert_eq!(digest, DIGEST, "got {digest:#x}");
        assert_eq!(combined, COMBINED, "got {combined:#x}");
        assert_ne!(combine(1, 2), combine(2, 1));
    }

    const DIGEST: u64 = 0x5786_3cf4_3c7b_d0e0;
    const COMBINED: u64 = 0x0805_29a5_95af_4ab7;

    /// Structured streams of the kind keys are made of (small integers, shapes, zeros), which a
    /// weak mix would collide: every one gets its own digest.
    #[test]
    fn structured_streams_do_not_collide() {
        let mut seen = std::collections::HashSet::new();
        let mut count = 0;
        for a in 0..40u64 {
            for b in 0..40u64 {
                for len in 0..4usize {
                    if len == 0 && b > 0 {
                        continue; // the same stream as b = 0
                    }
                    let mut h = StableHasher::new();
                    h.u64(a).i64s(&vec![b as i64; len]);
                    assert!(seen.insert(h.finish()), "collision at {a} {b} {len}");
                    let mut h = StableHasher::new();
                    h.u64(u64::MAX).u32(a as u32).u32(b as u32).u64(len as u64);
                    assert!(seen.insert(h.finish()), "collision at u32 {a} {b} {len}");
                    count += 2;
                }
            }
        }
        for a in 0..300u64 {
            for b in 0..300u64 {
                assert!(seen.insert(combine(a, b)), "combine collision at {a} {b}");
                count += 1;
            }
        }
        assert_eq!(seen.len(), count);
    }

    /// Flipping any one input bit flips about half of the digest's bits.
    #[test]
    fn one_bit_changes_half_the_digest() {
        let digest = |words: [u64; 3]| {
            let mut h = StableHasher::new();
            h.u64(words[0]).u64(words[1]).u64(words[2]);
            h.finish()
        };
        let base = [7u64, 1 << 20, 3];
        let reference = digest(base);
        let mut total = 0u32;
        for word in 0..3 {
            for bit in 0..64 {
                let mut flipped = base;
                flipped[word] ^= 1 << bit;
                let changed = (digest(flipped) ^ reference).count_ones();
                assert!(
                    (12..=52).contains(&changed),
                    "word {word} bit {bit}: {changed}"
                );
                total += changed;
            }
        }
        let mean = total as f64 / 192.0;
        assert!((28.0..=36.0).contains(&mean), "mean {mean}");
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
