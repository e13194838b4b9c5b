//! Cold start against a warm persistent cache: the first step of a small training loop
//! (linear layer, bias, relu, summed loss, `loss.item()`, SGD update) in DeferAndFuse, in a new
//! engine, with an empty `TORCH_PJRT_CACHE_DIR` (every region compiles) and with one a previous
//! run filled (every region is deserialized from tier 3). Prints both medians and their ratio.
//! Then the same step in steady state (warm tier 1), Strict against DeferAndFuse, at the test's
//! tiny sizes and at an MNIST-sized layer (batch 64, 784 → 256).

#[path = "../tests/engine_support/mod.rs"]
mod engine_support;

use criterion::{criterion_group, criterion_main, Criterion};
use defer::Mode;
use engine_support::training::Model;
use engine_support::{engine_with, metric};
use std::path::Path;
use std::time::{Duration, Instant};

/// A new engine over `dir` runs the first step; returns its time, compilations and tier-3
/// hits.
fn first_step(dir: &Path) -> (Duration, f64, f64) {
    let start = Instant::now();
    let e = engine_with(Mode::DeferAndFuse, None, Some(dir.to_path_buf()));
    let model = Model::upload(&e);
    model.step(&e, 0, true);
    let elapsed = start.elapsed();
    (
        elapsed,
        metric(&e, "compilations"),
        metric(&e, "cache_hits_tier3"),
    )
}

fn cold() -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let (elapsed, compilations, _) = first_step(dir.path());
    assert!(compilations > 0.0);
    elapsed
}

fn warm(dir: &Path) -> Duration {
    let (elapsed, compilations, hits) = first_step(dir);
    assert_eq!(compilations, 0.0, "a warm start compiles nothing");
    assert!(hits > 0.0);
    elapsed
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn bench_cold_start(c: &mut Criterion) {
    let filled = tempfile::tempdir().unwrap();
    first_step(filled.path());

    let mut group = c.benchmark_group("first_training_step");
    group.sample_size(10);
    group.bench_function("cold_empty_cache_dir", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| cold()).sum())
    });
    group.bench_function("warm_tier3", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| warm(filled.path())).sum())
    });
    group.finish();

    let mut cold_samples = Vec::new();
    let mut warm_samples = Vec::new();
    for _ in 0..15 {
        cold_samples.push(cold());
        warm_samples.push(warm(filled.path()));
    }
    let (cold_median, warm_median) = (median(cold_samples), median(warm_samples));
    println!(
        "first step: cold {:.2} ms, tier-3 warm {:.2} ms (medians of 15); cold / warm = {:.1}",
        cold_median.as_secs_f64() * 1e3,
        warm_median.as_secs_f64() * 1e3,
        cold_median.as_secs_f64() / warm_median.as_secs_f64()
    );
}

fn bench_steady_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("steady_training_step");
    let sizes = [(8, 16, 4), (64, 784, 256)];
    for ((batch, inputs, outputs), mode) in sizes
        .into_iter()
        .flat_map(|s| [(s, Mode::Strict), (s, Mode::DeferAndFuse)])
    {
        let e = engine_with(mode, None, None);
        let model = Model::upload_sized(&e, batch, inputs, outputs);
        let mut n = 0;
        for _ in 0..3 {
            model.step(&e, n, false);
            n += 1;
        }
        let name = format!("{batch}x{inputs}x{outputs}/{}", mode.name());
        group.bench_function(name, |b| {
            b.iter(|| {
                model.step(&e, n, false);
                n += 1;
            })
        });
        e.sync().unwrap();
    }
    group.finish();
}

criterion_group!(benches, bench_cold_start, bench_steady_step);
criterion_main!(benches);
