//! Measures the host time per op of a tiny add through the engine in each mode: wall time, and
//! the calling thread's CPU time (on the CPU plugin the "device" is other threads on the same
//! cores, which preempt the caller; the thread's CPU time is the engine's own cost per op).

use defer::{Mode, TensorRef};
use ops::{DType, OpId, ScalarArg};
use std::time::Instant;

/// CPU time consumed by the calling thread so far.
fn thread_cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}
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
        // Warm up: compile the loop's own op (and let the compile finish) before timing.
        for _ in 0..50 {
            let c = e
                .op(
                    OpId::Add,
                    &[cur.clone()],
                    &[ScalarArg::float(1.0)],
                    &[],
                    &[],
                )
                .unwrap();
            cur = TensorRef::contiguous(c.outputs[0].0, DType::F32, &[16]);
        }
        e.sync().unwrap();
        let start = Instant::now();
        let cpu_start = thread_cpu_seconds();
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
        let cpu = thread_cpu_seconds() - cpu_start;
        e.sync().unwrap();
        let total = start.elapsed();
        println!(
            "{mode:?}: {:.2} µs/op host ({:.2} µs/op of the thread's CPU time), {:.2} µs/op incl. \
             device",
            host.as_secs_f64() * 1e6 / n as f64,
            cpu * 1e6 / n as f64,
            total.as_secs_f64() * 1e6 / n as f64
        );
        println!("{}", e.metrics().report());
    }
}
