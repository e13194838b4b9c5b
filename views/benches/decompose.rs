//! Timing of view decomposition and inversion for typical layouts.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use views::{decompose, invert, Layout};

const SIDE: i64 = 1024;
const BASE_LEN: i64 = SIDE * SIDE;

/// `x[:, 1::2].t()` of a contiguous 1024×1024 f32 tensor.
fn odd_columns_transposed() -> Layout {
    Layout::new(4, &[SIDE / 2, SIDE], &[2, SIDE], 1)
}

/// `x.diagonal()` of a contiguous 1024×1024 f32 tensor.
fn diagonal() -> Layout {
    Layout::new(4, &[SIDE], &[SIDE + 1], 0)
}

/// `x[2:5, 1:3, :]` of a contiguous 8×16×64 tensor.
fn sub_box() -> Layout {
    Layout::new(4, &[3, 2, 64], &[16 * 64, 64, 1], 2 * 16 * 64 + 64)
}

fn bench(c: &mut Criterion) {
    let cases = [
        ("odd_columns_transposed", odd_columns_transposed(), BASE_LEN),
        ("diagonal", diagonal(), BASE_LEN),
        ("sub_box", sub_box(), 8 * 16 * 64),
        ("contiguous", Layout::contiguous(4, &[SIDE, SIDE]), BASE_LEN),
    ];
    for (name, view, base_len) in &cases {
        c.bench_function(&format!("decompose/{name}"), |b| {
            b.iter(|| decompose(black_box(*base_len), 4, black_box(view)))
        });
    }
    for (name, view, base_len) in &cases {
        c.bench_function(&format!("invert/{name}"), |b| {
            b.iter(|| invert(black_box(*base_len), 4, black_box(view)))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
