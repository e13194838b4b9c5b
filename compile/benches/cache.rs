//! Criterion benchmarks of the compile cache: a tier-1 hit among 10,000 entries (lookup and
//! request), and the first run of a 100-op elementwise module from a warm tier-3 directory
//! versus a cold compile, on the plugin `TORCH_PJRT_PLUGIN` names (the CPU plugin by default).

use compile::{CacheKey, CompileConfig, Compiler};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use pjrt::{Client, ElementType, Plugin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const OPS: usize = 100;

/// A chain of `OPS` elementwise ops over `tensor<1024xf32>`; `seed` changes one constant so every
/// cold compile is of a module the plugin has not seen.
fn elementwise_module(seed: u64) -> String {
    let ty = "tensor<1024xf32>";
    let mut body = format!(
        "  %c = stablehlo.constant dense<{}.5> : {ty}\n",
        seed % 1000
    );
    let mut previous = "%a".to_string();
    for i in 0..OPS {
        let line = match i % 4 {
            0 => format!("stablehlo.add {previous}, %b : {ty}"),
            1 => format!("stablehlo.multiply {previous}, %c : {ty}"),
            2 => format!("stablehlo.tanh {previous} : {ty}"),
            _ => format!("stablehlo.subtract {previous}, %a : {ty}"),
        };
        body.push_str(&format!("  %v{i} = {line}\n"));
        previous = format!("%v{i}");
    }
    format!(
        "func.func public @main(%a: {ty}, %b: {ty}) -> {ty} {{\n{body}  return {previous} : {ty}\n}}"
    )
}

fn client() -> Client {
    let name = pjrt::configured_plugin_name();
    let plugin = Plugin::load(&name).expect("the plugin TORCH_PJRT_PLUGIN names");
    Client::new(&plugin).expect("client")
}

fn config() -> CompileConfig {
    CompileConfig {
        threads: 1,
        ..CompileConfig::default()
    }
}

fn tier1(c: &mut Criterion) {
    let client = client();
    let compiler = Compiler::new(
        client,
        CompileConfig {
            tier1_capacity: 16_384,
            ..config()
        },
    )
    .unwrap();
    let options = compiler.options_fingerprint();
    let executable = compiler
        .request(CacheKey::new(0, 0, options), || Ok(elementwise_module(0)))
        .wait()
        .unwrap();
    for i in 1..10_000u64 {
        let key = CacheKey::new(i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i, options);
        compiler.insert(key, executable.clone());
    }
    let hot = CacheKey::new(5_000u64.wrapping_mul(0x9e37_79b9_7f4a_7c15), 5_000, options);
    assert!(compiler.lookup(&hot).is_some());
    let mut group = c.benchmark_group("tier1_hit_100_op_region");
    group.bench_function("lookup_among_10k", |b| {
        b.iter(|| compiler.lookup(std::hint::black_box(&hot)).unwrap())
    });
    group.bench_function("request_and_wait_among_10k", |b| {
        b.iter(|| {
            compiler
                .request(std::hint::black_box(hot), || unreachable!("a hit"))
                .wait()
                .unwrap()
        })
    });
    group.finish();
}

fn run_once(executable: &pjrt::LoadedExecutable, a: &pjrt::Buffer, b: &pjrt::Buffer) {
    let out = executable.execute(&[a, b]).unwrap();
    out[0].wait_ready().unwrap();
}

fn first_run(c: &mut Criterion) {
    let client = client();
    let zeros = vec![0u8; 1024 * 4];
    let a = client
        .buffer_from_host(&zeros, ElementType::F32, &[1024])
        .unwrap();
    let b = client
        .buffer_from_host(&zeros, ElementType::F32, &[1024])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let warm_config = || CompileConfig {
        persistent_dir: Some(dir.path().to_path_buf()),
        ..config()
    };
    let options = Compiler::new(client.clone(), warm_config())
        .unwrap()
        .options_fingerprint();
    let warm_key = CacheKey::new(1, 1, options);
    {
        let filler = Compiler::new(client.clone(), warm_config()).unwrap();
        filler
            .request(warm_key, || Ok(elementwise_module(1)))
            .wait()
            .unwrap();
    }

    let mut group = c.benchmark_group("first_run_100_op_module");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    let seed = AtomicU64::new(2);
    group.bench_function("cold_compile", |bench| {
        bench.iter_batched(
            || Arc::new(Compiler::new(client.clone(), config()).unwrap()),
            |compiler| {
                let seed = seed.fetch_add(1, Ordering::Relaxed);
                let key = CacheKey::new(seed, 1, options);
                let executable = compiler
                    .request(key, move || Ok(elementwise_module(seed)))
                    .wait()
                    .unwrap();
                run_once(&executable, &a, &b);
                compiler
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("tier3_warm", |bench| {
        bench.iter_batched(
            || Arc::new(Compiler::new(client.clone(), warm_config()).unwrap()),
            |compiler| {
                let executable = compiler
                    .request(warm_key, || unreachable!("a tier-3 hit"))
                    .wait()
                    .unwrap();
                run_once(&executable, &a, &b);
                assert_eq!(compiler.stats().compilations, 0);
                compiler
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, tier1, first_run);
criterion_main!(benches);
