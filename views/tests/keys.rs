//! Cache keys: the same view pattern keys the same, a different one differently.

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;

use views::{
    decompose, hash_chain, hash_chain_split, hash_write_program, hash_write_program_split, invert,
    Layout,
};

/// Records the bytes fed, so tests can compare key streams exactly.
#[derive(Default)]
struct Recorder(Vec<u8>);

impl Hasher for Recorder {
    fn finish(&self) -> u64 {
        let mut h = DefaultHasher::new();
        h.write(&self.0);
        h.finish()
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

fn chain_key(base_len: i64, view: &Layout) -> Vec<u8> {
    let mut recorder = Recorder::default();
    hash_chain(&decompose(base_len, 4, view).unwrap(), &mut recorder);
    recorder.0
}

fn write_key(base_len: i64, view: &Layout) -> Vec<u8> {
    let mut recorder = Recorder::default();
    hash_write_program(&invert(base_len, 4, view).unwrap(), &mut recorder);
    recorder.0
}

#[test]
fn same_pattern_same_key() {
    let view = Layout::new(4, &[512, 1024], &[2, 1024], 1);
    assert_eq!(chain_key(1 << 20, &view), chain_key(1 << 20, &view.clone()));
    assert_eq!(write_key(1 << 20, &view), write_key(1 << 20, &view));
}

#[test]
fn different_patterns_different_keys() {
    let odd = Layout::new(4, &[512, 1024], &[2, 1024], 1);
    let even = Layout::new(4, &[512, 1024], &[2, 1024], 0);
    let transposed = Layout::contiguous(4, &[1024, 1024]);
    assert_ne!(chain_key(1 << 20, &odd), chain_key(1 << 20, &even));
    assert_ne!(chain_key(1 << 20, &odd), chain_key(1 << 20, &transposed));
    assert_ne!(
        chain_key(1 << 20, &transposed),
        chain_key(1 << 21, &transposed)
    );
    assert_ne!(write_key(1 << 20, &odd), write_key(1 << 20, &even));
}

#[test]
fn key_stream_is_fixed() {
    // The stream is part of on-disk keys: it must not change with the compiler.
    let key = chain_key(8, &Layout::new(4, &[4], &[2], 1));
    let mut expected = Vec::new();
    let u64s = |v: &mut Vec<u8>, xs: &[u64]| xs.iter().for_each(|x| v.extend(x.to_le_bytes()));
    u64s(&mut expected, &[1, 8, 1]); // input [8], one op
    expected.push(4); // slice
    u64s(&mut expected, &[1, 1, 1, 8, 1, 2]); // start [1], limit [8], strides [2]
    assert_eq!(key, expected);
}

/// (structure, sizes) streams of a view's chain.
fn split_chain_key(base_len: i64, view: &Layout) -> (Vec<u8>, Vec<u8>) {
    let (mut structure, mut sizes) = (Recorder::default(), Recorder::default());
    hash_chain_split(
        &decompose(base_len, 4, view).unwrap(),
        &mut structure,
        &mut sizes,
    );
    (structure.0, sizes.0)
}

fn split_write_key(base_len: i64, view: &Layout) -> (Vec<u8>, Vec<u8>) {
    let (mut structure, mut sizes) = (Recorder::default(), Recorder::default());
    hash_write_program_split(
        &invert(base_len, 4, view).unwrap(),
        &mut structure,
        &mut sizes,
    );
    (structure.0, sizes.0)
}

#[test]
fn a_longer_sequence_keeps_the_structure_and_changes_the_sizes() {
    // A key cache's transposed read `[heads, len, dim] -> [heads, dim, len]` at two lengths.
    let transposed = |len: i64| Layout::new(4, &[2, 32, len], &[len * 32, 1, 32], 0);
    let (s9, d9) = split_chain_key(2 * 9 * 32, &transposed(9));
    let (s10, d10) = split_chain_key(2 * 10 * 32, &transposed(10));
    assert_eq!(s9, s10, "the same view pattern has one structure");
    assert_ne!(d9, d10, "its sizes differ");
    // A row written at two positions of one buffer: one structure, two sizes keys.
    let row = |at: i64| Layout::new(4, &[8], &[1], at * 8);
    let (ws3, wd3) = split_write_key(64, &row(3));
    let (ws4, wd4) = split_write_key(64, &row(4));
    assert_eq!(ws3, ws4);
    assert_ne!(wd3, wd4);
}

#[test]
fn the_split_keys_tell_what_the_whole_key_tells() {
    let odd = Layout::new(4, &[512, 1024], &[2, 1024], 1);
    let even = Layout::new(4, &[512, 1024], &[2, 1024], 0);
    let transposed = Layout::contiguous(4, &[1024, 1024]);
    let plain = Layout::new(4, &[1024, 1024], &[1, 1024], 0);
    assert_ne!(
        split_chain_key(1 << 20, &odd),
        split_chain_key(1 << 20, &even)
    );
    // Another permutation is another structure.
    assert_ne!(
        split_chain_key(1 << 20, &transposed).0,
        split_chain_key(1 << 20, &plain).0
    );
    assert_ne!(
        split_write_key(1 << 20, &odd),
        split_write_key(1 << 20, &even)
    );
}

#[test]
fn split_key_streams_are_fixed() {
    // The streams regions are keyed with on disk (RFC 0026): they must not change with the
    // compiler either.
    let (structure, sizes) = split_chain_key(8, &Layout::new(4, &[4], &[2], 1));
    let u64s = |v: &mut Vec<u8>, xs: &[u64]| xs.iter().for_each(|x| v.extend(x.to_le_bytes()));
    let mut expected_structure = Vec::new();
    u64s(&mut expected_structure, &[1, 1]); // input rank 1, one op
    expected_structure.push(4); // slice
    u64s(&mut expected_structure, &[1, 2]); // strides [2]
    let mut expected_sizes = Vec::new();
    u64s(&mut expected_sizes, &[1, 8]); // input [8]
    u64s(&mut expected_sizes, &[1, 1, 1, 8]); // start [1], limit [8]
    assert_eq!(structure, expected_structure);
    assert_eq!(sizes, expected_sizes);
}
