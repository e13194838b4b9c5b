//! Measures the host time per op of a tiny add through the engine in each mode: wall time, and
//! the calling thread's CPU time (on the CPU plugin the "device" is other threads on the same
//! cores, which preempt the caller; the thread's CPU time is the engine's own cost per op).
//! `op_overhead [MODE] [view]`: with `view`, each op negates a transposed view of one stored
//! matrix instead (Strict runs it by its direct path once warm). `OP_OVERHEAD_N` sets the count,
//! so that two runs under callgrind give the instructions per op.

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
        let n: usize = std::env::var("OP_OVERHEAD_N")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        if std::env::args().nth(2).as_deref() == Some("view") {
            views_of_one_value(&e, &x, n, mode);
            continue;
        }
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

/// `neg(x.view(4, 4).t())`, `n` times, each result released: an op whose input is a view.
fn views_of_one_value(e: &Engine, x: &TensorRef, n: usize, mode: Mode) {
    let transposed = TensorRef {
        storage: x.storage,
        dtype: DType::F32,
        sizes: [4, 4].as_slice().into(),
        strides: [1, 4].as_slice().into(),
        offset: 0,
    };
    let negate = || {
        e.op(OpId::Neg, std::slice::from_ref(&transposed), &[], &[], &[])
            .unwrap()
            .outputs[0]
            .0
    };
    for _ in 0..50 {
        let result = negate();
        e.sync().unwrap();
        e.release_storage(result).ok();
    }
    let start = Instant::now();
    let cpu_start = thread_cpu_seconds();
    for i in 0..n {
        let result = negate();
        e.release_storage(result).ok();
        if mode == Mode::DeferAndFuse && i % 500 == 499 {
            e.sync().unwrap();
        }
    }
    let host = start.elapsed();
    let cpu = thread_cpu_seconds() - cpu_start;
    e.sync().unwrap();
    println!(
        "{mode:?}, an op on a view: {:.2} µs/op host ({:.2} µs/op of the thread's CPU time)",
        host.as_secs_f64() * 1e6 / n as f64,
        cpu * 1e6 / n as f64,
    );
    println!("{}", e.metrics().report());
}
