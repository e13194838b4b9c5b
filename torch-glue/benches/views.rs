//! Writes through views, fused or not: a chain of 20 in-place ops (`mul_`, `add_`) through 20
//! different row, column, strided-slice, diagonal and transposed views of a 1024×1024 f32 base,
//! then a read of the whole base, in DeferAndFuse (one region) and in Strict (one region per
//! write), with a warm cache. Prints the median of each and their ratio.

#[path = "../tests/engine_support/mod.rs"]
mod engine_support;

use criterion::{criterion_group, criterion_main, Criterion};
use defer::{Mode, TensorRef};
use engine_support::{engine, f32_values, upload_f32, view};
use ops::{OpId, ScalarArg};
use std::time::{Duration, Instant};
use torch_glue::Engine;

const N: i64 = 1024;

/// (PyTorch expression, sizes, strides, offset) of each view written.
const VIEWS: [(&str, &[i64], &[i64], i64); 20] = [
    ("x[0]", &[N], &[1], 0),
    ("x[:, 5]", &[N], &[N], 5),
    ("x[::2]", &[N / 2, N], &[2 * N, 1], 0),
    ("x[:, 1::2]", &[N, N / 2], &[N, 2], 1),
    ("x[100:300, 200:600]", &[200, 400], &[N, 1], 100 * N + 200),
    ("x.diagonal()", &[N], &[N + 1], 0),
    ("x.t()[3:700:7]", &[100, N], &[7, N], 3),
    ("x[512:]", &[N / 2, N], &[N, 1], 512 * N),
    ("x[::4, ::4]", &[256, 256], &[4 * N, 4], 0),
    ("x[10]", &[N], &[1], 10 * N),
    ("x[:, 1000]", &[N], &[N], 1000),
    ("x[1::3, 2::5]", &[341, 205], &[3 * N, 5], N + 2),
    ("x.view(1024, 32, 32)[:, 3]", &[N, 32], &[N, 1], 96),
    ("x.view(32, 32, 1024)[:, 5]", &[32, N], &[32 * N, 1], 5 * N),
    ("x.t()[::2, ::2]", &[N / 2, N / 2], &[2, 2 * N], 0),
    ("x[700:800].t()", &[N, 100], &[1, N], 700 * N),
    ("x.diagonal(7)", &[N - 7], &[N + 1], 7),
    ("x[:, 300:301]", &[N, 1], &[N, 1], 300),
    ("x.view(-1)[123::1000]", &[1049], &[1000], 123),
    (
        "x[900:1000:3, 10:1000:9]",
        &[34, 110],
        &[3 * N, 9],
        900 * N + 10,
    ),
];

/// The chain, then a read of the base into `out`; returns the time spent capturing (or, in
/// Strict, launching) the writes.
fn chain(e: &Engine, x: &TensorRef, out: &mut [u8]) -> Duration {
    let start = Instant::now();
    for (i, (name, sizes, strides, offset)) in VIEWS.iter().enumerate() {
        let v = view(x, sizes, strides, *offset);
        let (op, scalar) = if i % 2 == 0 {
            (OpId::Mul, -1.0)
        } else {
            (OpId::Add, 1.0)
        };
        e.op(
            op,
            std::slice::from_ref(&v),
            &[ScalarArg::float(scalar)],
            &[],
            std::slice::from_ref(&v),
        )
        .unwrap_or_else(|err| panic!("{name}: {}", err.message));
    }
    let captured = start.elapsed();
    e.read_host(x, out).expect("read the base");
    captured
}

fn initial() -> Vec<f32> {
    (0..N * N).map(|i| (i % 251) as f32 - 125.0).collect()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn bench_views(c: &mut Criterion) {
    let modes = [Mode::DeferAndFuse, Mode::Strict];
    let engines: Vec<(Mode, Engine, TensorRef)> = modes
        .iter()
        .map(|&mode| {
            let e = engine(mode);
            let x = upload_f32(&e, &initial(), &[N, N]);
            (mode, e, x)
        })
        .collect();
    let mut out = vec![0u8; (N * N * 4) as usize];

    // One chain from the same data in each mode: the results must agree.
    let mut results = Vec::new();
    for (_, e, x) in &engines {
        chain(e, x, &mut out);
        results.push(f32_values(&out));
    }
    let differing = results[0]
        .iter()
        .zip(&results[1])
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    println!(
        "DeferAndFuse and Strict results differ in {differing} of {} elements",
        N * N
    );

    let mut group = c.benchmark_group("views_20_writes_1024x1024");
    group.sample_size(20);
    for (mode, e, x) in &engines {
        group.bench_function(mode.name(), |b| b.iter(|| chain(e, x, &mut out)));
    }
    group.finish();

    // Medians of interleaved runs, and their ratio.
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); engines.len()];
    let mut capture: Vec<Vec<Duration>> = vec![Vec::new(); engines.len()];
    for _ in 0..30 {
        for (i, (_, e, x)) in engines.iter().enumerate() {
            let start = Instant::now();
            capture[i].push(chain(e, x, &mut out));
            samples[i].push(start.elapsed());
        }
    }
    let medians: Vec<Duration> = samples.into_iter().map(median).collect();
    let capture: Vec<Duration> = capture.into_iter().map(median).collect();
    for (((mode, e, _), m), c) in engines.iter().zip(&medians).zip(&capture) {
        let metrics = e.metrics();
        println!(
            "{}: median {:.3} ms per chain, of which {:.3} ms before the read ({} compilations, \
             {} executions, {} donated buffers in all)",
            mode.name(),
            m.as_secs_f64() * 1e3,
            c.as_secs_f64() * 1e3,
            metrics.values["compilations"],
            metrics.values["executions"],
            metrics
                .values
                .get("donated_buffers")
                .copied()
                .unwrap_or(0.0),
        );
    }
    println!(
        "strict / defer_and_fuse = {:.2}",
        medians[1].as_secs_f64() / medians[0].as_secs_f64()
    );
}

criterion_group!(benches, bench_views);
criterion_main!(benches);
