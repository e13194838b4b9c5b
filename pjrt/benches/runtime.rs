//! Criterion benchmarks of the PJRT layer: execute latency of a tiny module, host↔device
//! transfers at 4 KB / 4 MB / 64 MB, compile time and deserialize-and-load time, on the plugin
//! `TORCH_PJRT_PLUGIN` names (the CPU plugin by default).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pjrt::{Client, ElementType, Plugin};
use std::time::Duration;

const TINY: &str = r#"
func.func public @main(%a: tensor<16xf32>, %b: tensor<16xf32>) -> tensor<16xf32> {
  %s = stablehlo.add %a, %b : tensor<16xf32>
  return %s : tensor<16xf32>
}"#;

fn small_module(seed: usize) -> String {
    // A distinct constant per iteration defeats any compile caching inside the plugin.
    format!(
        r#"
func.func public @main(%a: tensor<256xf32>) -> tensor<256xf32> {{
  %c = stablehlo.constant dense<{seed}.0> : tensor<256xf32>
  %s = stablehlo.add %a, %c : tensor<256xf32>
  %e = stablehlo.exponential %s : tensor<256xf32>
  %t = stablehlo.tanh %e : tensor<256xf32>
  %m = stablehlo.multiply %t, %a : tensor<256xf32>
  return %m : tensor<256xf32>
}}"#
    )
}

fn client() -> Client {
    let name = pjrt::configured_plugin_name();
    let plugin = Plugin::load(&name).expect("the plugin TORCH_PJRT_PLUGIN names");
    Client::new(&plugin).expect("client")
}

fn execute(c: &mut Criterion) {
    let client = client();
    let exe = client.compile(TINY).unwrap();
    let bytes = vec![0u8; 64];
    let a = client
        .buffer_from_host(&bytes, ElementType::F32, &[16])
        .unwrap();
    let b = client
        .buffer_from_host(&bytes, ElementType::F32, &[16])
        .unwrap();
    c.bench_function("execute/tiny_add_synced", |bench| {
        bench.iter(|| {
            let out = exe.execute(&[&a, &b]).unwrap();
            out[0].wait_ready().unwrap();
        })
    });
}

fn transfers(c: &mut Criterion) {
    let client = client();
    let mut group = c.benchmark_group("transfer");
    group.measurement_time(Duration::from_secs(3));
    for (label, bytes) in [("4KB", 4usize << 10), ("4MB", 4 << 20), ("64MB", 64 << 20)] {
        let host = vec![1u8; bytes];
        let dims = [(bytes / 4) as i64];
        group.throughput(Throughput::Bytes(bytes as u64));
        if bytes >= 64 << 20 {
            group.sample_size(10);
        }
        group.bench_with_input(BenchmarkId::new("host_to_device", label), &host, |b, h| {
            b.iter(|| {
                let buf = client.buffer_from_host(h, ElementType::F32, &dims).unwrap();
                buf.wait_ready().unwrap();
            })
        });
        let device = client
            .buffer_from_host(&host, ElementType::F32, &dims)
            .unwrap();
        let mut out = vec![0u8; bytes];
        group.bench_with_input(BenchmarkId::new("device_to_host", label), &(), |b, _| {
            b.iter(|| device.to_host_into(&mut out).unwrap())
        });
    }
    group.finish();
}

fn compile_and_load(c: &mut Criterion) {
    let client = client();
    let mut group = c.benchmark_group("compile");
    group.sample_size(10);
    let mut seed = 0usize;
    group.bench_function("small_module", |b| {
        b.iter(|| {
            seed += 1;
            client.compile(&small_module(seed)).unwrap()
        })
    });
    let serialized = client
        .compile(&small_module(0))
        .unwrap()
        .serialize()
        .unwrap();
    group.sample_size(30);
    group.bench_function("deserialize_and_load", |b| {
        b.iter(|| client.deserialize(&serialized).unwrap())
    });
    group.finish();
}

criterion_group!(benches, execute, transfers, compile_and_load);
criterion_main!(benches);
