//! Runs one view decomposition many times, for profilers (callgrind counts instructions per call).
//!
//! `cargo run --release -p views --example decompose_cost -- CASE [ITERATIONS]`, CASE one of
//! `contiguous`, `diagonal`, `odd_columns_transposed`, `sub_box`.

use std::hint::black_box;

use views::{decompose, Layout};

const SIDE: i64 = 1024;

fn case(name: &str) -> (Layout, i64) {
    match name {
        "contiguous" => (Layout::contiguous(4, &[SIDE, SIDE]), SIDE * SIDE),
        "diagonal" => (Layout::new(4, &[SIDE], &[SIDE + 1], 0), SIDE * SIDE),
        "odd_columns_transposed" => (
            Layout::new(4, &[SIDE / 2, SIDE], &[2, SIDE], 1),
            SIDE * SIDE,
        ),
        "sub_box" => (
            Layout::new(4, &[3, 2, 64], &[16 * 64, 64, 1], 2 * 16 * 64 + 64),
            8 * 16 * 64,
        ),
        other => panic!("unknown case {other}"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "sub_box".into());
    let iterations: usize = args.next().map_or(100_000, |n| n.parse().expect("a count"));
    let (view, base_len) = case(&name);
    let mut ops = 0;
    for _ in 0..iterations {
        let chain = decompose(black_box(base_len), 4, black_box(&view)).expect("a valid view");
        ops += black_box(&chain).len();
    }
    println!("{name}: {} ops per chain", ops / iterations);
}
