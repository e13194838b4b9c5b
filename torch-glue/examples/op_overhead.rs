//! Measures the host time per op of a tiny add through the engine in each mode.

use defer::{Mode, TensorRef};
use ops::{DType, OpId, ScalarArg};
use std::time::Instant;
use torch_glue::{Engine, EngineConfig};

fn main() {
    let only = std::env::args().nth(1);
    for mode in [Mode::Strict, Mode::DeferAndFuse] {
        if only.as_deref().is_some_and(|m| m != mode.name()) {
            continue;
        }
        let mut config = EngineConfig::from_env().unwrap();
        config.default_mode = mode;
        let e = Engine::new(config).unwrap();
        let bytes: Vec<u8> = [1.0f32; 16].iter().flat_map(|v| v.to_le_bytes()).collect();
        let storage = e.new_storage(64);
        let x = TensorRef::contiguous(storage, DType::F32, &[16]);
        e.write_host(&x, &bytes).unwrap();
        let n = 20_000;
        let mut cur = x.clone();
        // Warm up (compiles).
        for _ in 0..50 {
            let c = e
                .op(OpId::Add, &[cur.clone(), x.clone()], &[], &[], &[])
                .unwrap();
            cur = TensorRef::contiguous(c.outputs[0].0, DType::F32, &[16]);
        }
        e.sync().unwrap();
        let start = Instant::now();
        for i in 0..n {
            let c = e
                .op(
                    OpId::Add,
                    &[cur.clone()],
                    &[ScalarArg::float(1.0)],
                    &[],
                    &[],
                )
                .unwrap();
            let next = TensorRef::contiguous(c.outputs[0].0, DType::F32, &[16]);
            e.release_storage(cur.storage).ok();
            cur = next;
            if mode == Mode::DeferAndFuse && i % 500 == 499 {
                e.sync().unwrap();
            }
        }
        let host = start.elapsed();
        e.sync().unwrap();
        let total = start.elapsed();
        println!(
            "{mode:?}: {:.2} µs/op host, {:.2} µs/op incl. device",
            host.as_secs_f64() * 1e6 / n as f64,
            total.as_secs_f64() * 1e6 / n as f64
        );
        println!("{}", e.metrics().report());
    }
}
