//! Engine benchmarks: per-op host cost through the C ABI (Strict, warm cache), execution-queue
//! throughput, capture cost per op in DeferAndFuse, liveness + fusion planning and key lookup
//! versus region size, memory-cut planning (cold and remembered), and 16-op elementwise chains
//! over 4M floats, DeferAndFuse vs Strict: a mix of transcendental functions through the engine
//! API, and the Python suite's arithmetic chain through the C ABI.
//!
//! Run: `cargo bench -p torch-glue --bench engine -- --warm-up-time 1 --measurement-time 3`.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use defer::{FlushRequest, Graph, Mode, StorageId, TensorRef};
use ops::{DType, OpId, ScalarArg};
use std::time::{Duration, Instant};
use torch_glue::abi::*;
use torch_glue::{Engine, EngineConfig};

/// Calls timed between two untimed clean-ups (releasing outputs, syncing), so queues, pending
/// graphs and memory stay bounded however many iterations criterion asks for.
const CHUNK: u64 = 500;

fn engine(mode: Mode, max_region_ops: usize) -> Engine {
    let mut config = EngineConfig::from_env().expect("config");
    config.default_mode = mode;
    config.max_region_ops = max_region_ops;
    config.compile.persistent_dir = None;
    config.compile.shared_dir = None;
    config.compile.dump_dir = None;
    Engine::new(config).expect("engine")
}

fn upload(e: &Engine, values: &[f32], sizes: &[i64]) -> TensorRef {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let t = TensorRef::contiguous(e.new_storage(bytes.len() as u64), DType::F32, sizes);
    e.write_host(&t, &bytes).expect("upload");
    t
}

fn op(e: &Engine, op: OpId, inputs: &[&TensorRef], scalars: &[ScalarArg]) -> TensorRef {
    let inputs: Vec<TensorRef> = inputs.iter().map(|t| (*t).clone()).collect();
    let captured = e.op(op, &inputs, scalars, &[], &[]).expect("op");
    let (storage, ty) = captured.outputs[0].clone();
    TensorRef::contiguous(storage, ty.dtype, &ty.shape)
}

fn ok(code: i32) {
    assert_eq!(code, TPJRT_OK, "{:?}", unsafe {
        // SAFETY: the ABI's last error is a valid C string.
        std::ffi::CStr::from_ptr(tpjrt_last_error())
    });
}

struct RawTensor {
    storage: u64,
    sizes: [i64; 1],
    strides: [i64; 1],
}

impl RawTensor {
    fn new(values: &[f32]) -> RawTensor {
        let mut storage = 0;
        // SAFETY: valid output pointer.
        ok(unsafe { tpjrt_storage_new(values.len() as u64 * 4, &mut storage) });
        let t = RawTensor {
            storage,
            sizes: [values.len() as i64],
            strides: [1],
        };
        // SAFETY: `values` is readable for its byte length.
        ok(unsafe { tpjrt_write_host(&t.raw(), values.as_ptr().cast(), values.len() as u64 * 4) });
        t
    }

    fn raw(&self) -> TpjrtTensor {
        TpjrtTensor {
            storage: self.storage,
            dtype: 6,
            ndim: 1,
            sizes: self.sizes.as_ptr(),
            strides: self.strides.as_ptr(),
            offset: 0,
        }
    }
}

fn empty_output() -> TpjrtOutput {
    TpjrtOutput {
        storage: 0,
        dtype: 0,
        ndim: 0,
        sizes: [0; TPJRT_MAX_DIMS],
        nbytes: 0,
    }
}

/// Times `iters` calls of `call` through the ABI in chunks; between chunks (untimed) releases
/// the outputs and syncs.
fn abi_calls(iters: u64, call: &TpjrtOpCall) -> Duration {
    let mut out = [empty_output()];
    let mut n = 0u64;
    let mut made: Vec<u64> = Vec::with_capacity(CHUNK as usize);
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let batch = left.min(CHUNK);
        let start = Instant::now();
        for _ in 0..batch {
            // SAFETY: `call` borrows live tensors; `out` has room for one output.
            let code = unsafe { tpjrt_op(call, out.as_mut_ptr(), 1, &mut n) };
            debug_assert_eq!(code, TPJRT_OK);
            made.push(out[0].storage);
        }
        total += start.elapsed();
        for s in made.drain(..) {
            if call.num_outs == 0 {
                ok(tpjrt_storage_release(s));
            }
        }
        ok(tpjrt_sync());
        left -= batch;
    }
    total
}

fn abi_op_strict(c: &mut Criterion) {
    // SAFETY: NULL = the plugin from the environment.
    ok(unsafe { tpjrt_init(std::ptr::null()) });
    ok(tpjrt_mode_push(0));
    let name = std::ffi::CString::new("add").unwrap();
    let mut add = 0;
    // SAFETY: valid string and output.
    ok(unsafe { tpjrt_op_id(name.as_ptr(), &mut add) });
    let a = RawTensor::new(&[1.0, 2.0, 3.0, 4.0]);
    let b = RawTensor::new(&[10.0, 20.0, 30.0, 40.0]);
    let out = RawTensor::new(&[0.0; 4]);
    let inputs = [a.raw(), b.raw()];
    let outs = [out.raw()];
    let call = |with_out: bool| TpjrtOpCall {
        op: add,
        inputs: inputs.as_ptr(),
        num_inputs: 2,
        scalars: std::ptr::null(),
        num_scalars: 0,
        params: std::ptr::null(),
        num_params: 0,
        outs: if with_out {
            outs.as_ptr()
        } else {
            std::ptr::null()
        },
        num_outs: u64::from(with_out),
        default_float: -1,
        matmul_precision: 0,
        device: 0,
    };
    // Warm the cache.
    abi_calls(10, &call(false));
    abi_calls(10, &call(true));
    let mut group = c.benchmark_group("abi_op_strict_warm");
    group.throughput(Throughput::Elements(1));
    group.bench_function("add_f32x4_new_output", |bench| {
        bench.iter_custom(|iters| abi_calls(iters, &call(false)))
    });
    group.bench_function("add_f32x4_out", |bench| {
        bench.iter_custom(|iters| abi_calls(iters, &call(true)))
    });
    group.finish();

    // Capture only: the same call in DeferAndFuse (the engine's region cap is 1000 by default;
    // chunks of 500 with a sync between never reach it).
    ok(tpjrt_mode_push(2));
    abi_calls(10, &call(false));
    let mut group = c.benchmark_group("capture_defer_and_fuse");
    group.throughput(Throughput::Elements(1));
    group.bench_function("abi_add_f32x4", |bench| {
        bench.iter_custom(|iters| abi_calls(iters, &call(false)))
    });
    group.finish();
    ok(tpjrt_mode_pop());
    ok(tpjrt_mode_pop());
}

fn capture(c: &mut Criterion) {
    let e = engine(Mode::DeferAndFuse, usize::MAX);
    let x = upload(&e, &[1.0; 4], &[4]);
    let mut group = c.benchmark_group("capture_defer_and_fuse");
    group.throughput(Throughput::Elements(1));
    // t = t * s, a chain of pending ops, as a loop body would capture.
    group.bench_function("engine_op_mul_scalar_chain", |bench| {
        bench.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let batch = left.min(CHUNK);
                let mut made: Vec<StorageId> = Vec::with_capacity(batch as usize);
                let mut t = x.clone();
                let start = Instant::now();
                for i in 0..batch {
                    t = op(&e, OpId::Mul, &[&t], &[ScalarArg::float(i as f64)]);
                    made.push(t.storage);
                }
                total += start.elapsed();
                for s in made {
                    e.release_storage(s).unwrap();
                }
                e.sync().unwrap();
                left -= batch;
            }
            total
        })
    });
    group.bench_function("graph_capture_mul_scalar_chain", |bench| {
        bench.iter_custom(|iters| {
            let mut g: Graph<u32> = Graph::new();
            let x = TensorRef::contiguous(g.new_storage(16), DType::F32, &[4]);
            g.write_device(&x, 1).unwrap();
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let batch = left.min(CHUNK);
                let mut made = Vec::with_capacity(batch as usize);
                let mut t = x.clone();
                let start = Instant::now();
                for i in 0..batch {
                    let captured = g
                        .capture(
                            OpId::Mul,
                            std::slice::from_ref(&t),
                            &[ScalarArg::float(i as f64)],
                            &[],
                            &[],
                        )
                        .unwrap();
                    t = TensorRef::contiguous(captured.outputs[0].0, DType::F32, &[4]);
                    made.push(t.storage);
                }
                total += start.elapsed();
                for s in made {
                    g.release_storage(s).unwrap();
                }
                let _ = g.flush(FlushRequest::All, |_| 0).unwrap();
                left -= batch;
            }
            total
        })
    });
    group.finish();
}

fn execute_queue(c: &mut Criterion) {
    const OPS: usize = 1000;
    let e = engine(Mode::Strict, usize::MAX);
    let a = upload(&e, &[1.0; 4], &[4]);
    let b = upload(&e, &[2.0; 4], &[4]);
    let run = || {
        for _ in 0..OPS {
            let c = op(&e, OpId::Add, &[&a, &b], &[]);
            e.release_storage(c.storage).unwrap();
        }
        e.sync().unwrap();
    };
    run();
    let mut group = c.benchmark_group("execute_queue");
    group.throughput(Throughput::Elements(OPS as u64));
    group.sample_size(20);
    group.bench_function("strict_1000_adds_then_sync", |bench| bench.iter(run));
    group.finish();
}

/// A pending chain of `n` ops on a `Graph<u32>` (a mix of elementwise ops with scalars),
/// every intermediate released except the last.
fn pending_chain(n: usize) -> (Graph<u32>, TensorRef) {
    let mut g: Graph<u32> = Graph::new();
    let x = TensorRef::contiguous(g.new_storage(64), DType::F32, &[4, 4]);
    g.write_device(&x, 1).unwrap();
    let ops = [OpId::Mul, OpId::Tanh, OpId::Add, OpId::Exp];
    let mut t = x.clone();
    for i in 0..n {
        let opid = ops[i % ops.len()];
        let scalars: Vec<ScalarArg> = match opid {
            OpId::Mul | OpId::Add => vec![ScalarArg::float(0.5)],
            _ => vec![],
        };
        let captured = g
            .capture(opid, std::slice::from_ref(&t), &scalars, &[], &[])
            .unwrap();
        let next = TensorRef::contiguous(captured.outputs[0].0, DType::F32, &[4, 4]);
        if t.storage != x.storage {
            g.release_storage(t.storage).unwrap();
        }
        t = next;
    }
    (g, t)
}

fn planning(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_region");
    group.sample_size(20);
    for n in [10usize, 100, 1000, 10_000] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(
            BenchmarkId::new("liveness_region_key", n),
            &n,
            |bench, &n| {
                bench.iter_batched(
                    || pending_chain(n),
                    |(mut g, t)| {
                        g.flush(FlushRequest::Storages(&[t.storage]), |_| 0)
                            .unwrap()
                    },
                    BatchSize::PerIteration,
                )
            },
        );
        group.bench_with_input(
            BenchmarkId::new("plus_stablehlo_text", n),
            &n,
            |bench, &n| {
                bench.iter_batched(
                    || pending_chain(n),
                    |(mut g, t)| {
                        let f = g
                            .flush(FlushRequest::Storages(&[t.storage]), |_| 0)
                            .unwrap()
                            .unwrap();
                        fuse::build_module(&f.source().build()).unwrap()
                    },
                    BatchSize::PerIteration,
                )
            },
        );
    }
    group.finish();
}

/// A pending chain of `n` `[32, 32]` matrix products (4 KiB results, so each is a candidate
/// memory cut), every eighth result held and the others released.
fn pending_product_chain(n: usize) -> Graph<u32> {
    let mut g: Graph<u32> = Graph::new();
    let x = TensorRef::contiguous(g.new_storage(4096), DType::F32, &[32, 32]);
    g.write_device(&x, 1).unwrap();
    let mut t = x.clone();
    for i in 0..n {
        let inputs = [t.clone(), x.clone()];
        let captured = g.capture(OpId::Mm, &inputs, &[], &[], &[]).unwrap();
        let next = TensorRef::contiguous(captured.outputs[0].0, DType::F32, &[32, 32]);
        if t.storage != x.storage && i % 8 != 0 {
            g.release_storage(t.storage).unwrap();
        }
        t = next;
    }
    g
}

fn memory_cuts(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_cuts");
    group.sample_size(20);
    for n in [10usize, 100, 1000] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("plan", n), &n, |bench, &n| {
            bench.iter_batched(
                || pending_product_chain(n),
                |mut g| g.memory_cuts(),
                BatchSize::PerIteration,
            )
        });
        group.bench_with_input(BenchmarkId::new("remembered", n), &n, |bench, &n| {
            let mut g = pending_product_chain(n);
            g.memory_cuts();
            bench.iter(|| g.memory_cuts())
        });
    }
    group.finish();
}

fn key_lookup(c: &mut Criterion) {
    let name = pjrt::configured_plugin_name();
    let plugin = pjrt::Plugin::load(&name).expect("the plugin TORCH_PJRT_PLUGIN names");
    let client = pjrt::Client::new(&plugin).expect("a client");
    let compiler = compile::Compiler::new(client, compile::CompileConfig::default()).unwrap();
    // One small executable stands in for every region's (lookup never looks inside it).
    let (mut g, t) = pending_chain(2);
    let f = g
        .flush(FlushRequest::Storages(&[t.storage]), |_| 0)
        .unwrap()
        .unwrap();
    let text = fuse::build_module(&f.source().build()).unwrap();
    let exe = compiler
        .request(compile::CacheKey::new(1, 1, 1), move || Ok(text))
        .wait()
        .expect("compile");
    let mut group = c.benchmark_group("key_lookup_tier1");
    for n in [10usize, 100, 1000, 10_000] {
        let (mut g, t) = pending_chain(n);
        let f = g
            .flush(FlushRequest::Storages(&[t.storage]), |_| 0)
            .unwrap()
            .unwrap();
        let key = compile::CacheKey::new(f.shapeless, f.dims, 7);
        compiler.insert(key, exe.clone());
        group.bench_with_input(BenchmarkId::from_parameter(n), &key, |bench, key| {
            bench.iter(|| compiler.lookup(std::hint::black_box(key)).is_some())
        });
    }
    group.finish();
}

/// 16 elementwise ops over `x`, intermediates released as Python would; returns the result.
fn chain16(e: &Engine, x: &TensorRef) -> TensorRef {
    let steps: [(OpId, Option<f64>); 16] = [
        (OpId::Mul, Some(0.5)),
        (OpId::Add, Some(1.0)),
        (OpId::Tanh, None),
        (OpId::Mul, Some(3.0)),
        (OpId::Sigmoid, None),
        (OpId::Sub, Some(0.25)),
        (OpId::Abs, None),
        (OpId::Add, Some(0.5)),
        (OpId::Sqrt, None),
        (OpId::Mul, Some(-2.0)),
        (OpId::Exp, None),
        (OpId::Add, Some(1.0)),
        (OpId::Log, None),
        (OpId::Neg, None),
        (OpId::Mul, Some(0.75)),
        (OpId::Relu, None),
    ];
    let mut t = x.clone();
    for (opid, s) in steps {
        let scalars: Vec<ScalarArg> = s.map(ScalarArg::float).into_iter().collect();
        let next = op(e, opid, &[&t], &scalars);
        if t.storage != x.storage {
            e.release_storage(t.storage).unwrap();
        }
        t = next;
    }
    t
}

fn chain_4m(c: &mut Criterion) {
    const N: usize = 4 << 20;
    let mut group = c.benchmark_group("chain16_4m_f32");
    group.sample_size(10);
    group.throughput(Throughput::Bytes((N * 4) as u64));
    for mode in [Mode::Strict, Mode::DeferAndFuse] {
        let e = engine(mode, usize::MAX);
        let x = upload(&e, &vec![0.5; N], &[N as i64]);
        let run = || {
            let y = chain16(&e, &x);
            e.sync().unwrap();
            e.release_storage(y.storage).unwrap();
        };
        run();
        group.bench_function(mode.name(), |bench| bench.iter(run));
    }
    group.finish();
}

/// The suite's elementwise chain (`benches/python/workloads.py`: `* 0.999`, `+ 0.01`, relu,
/// `- 0.005`, repeated) of 16 ops over 4M floats through the C ABI, one sync per call: the ops
/// are cheap, so the chain is bound by memory traffic and dispatch, which fusion removes.
fn chain16_abi_4m(c: &mut Criterion) {
    const N: usize = 4 << 20;
    // SAFETY: NULL = the plugin from the environment; a started engine is kept.
    ok(unsafe { tpjrt_init(std::ptr::null()) });
    let op_id = |name: &str| {
        let name = std::ffi::CString::new(name).unwrap();
        let mut id = 0;
        // SAFETY: valid string and output.
        ok(unsafe { tpjrt_op_id(name.as_ptr(), &mut id) });
        id
    };
    let steps: [(i32, Option<f64>); 4] = [
        (op_id("mul"), Some(0.999)),
        (op_id("add"), Some(0.01)),
        (op_id("relu"), None),
        (op_id("sub"), Some(0.005)),
    ];
    let x = RawTensor::new(&vec![0.5; N]);
    let run = || {
        let mut current = RawTensor {
            storage: x.storage,
            sizes: x.sizes,
            strides: x.strides,
        };
        for i in 0..16 {
            let (op, scalar) = steps[i % steps.len()];
            let scalars: Vec<TpjrtScalar> = scalar
                .map(|v| TpjrtScalar {
                    kind: TPJRT_SCALAR_FLOAT,
                    tensor_dtype: -1,
                    int_value: 0,
                    float_value: v,
                })
                .into_iter()
                .collect();
            let inputs = [current.raw()];
            let call = TpjrtOpCall {
                op,
                inputs: inputs.as_ptr(),
                num_inputs: 1,
                scalars: scalars.as_ptr(),
                num_scalars: scalars.len() as u64,
                params: std::ptr::null(),
                num_params: 0,
                outs: std::ptr::null(),
                num_outs: 0,
                default_float: -1,
                matmul_precision: 0,
                device: 0,
            };
            let mut out = [empty_output()];
            let mut n = 0u64;
            // SAFETY: `call` borrows live tensors; `out` has room for one output.
            ok(unsafe { tpjrt_op(&call, out.as_mut_ptr(), 1, &mut n) });
            if current.storage != x.storage {
                ok(tpjrt_storage_release(current.storage));
            }
            current.storage = out[0].storage;
        }
        ok(tpjrt_sync());
        ok(tpjrt_storage_release(current.storage));
    };
    let mut group = c.benchmark_group("chain16_abi_4m_f32");
    group.sample_size(10);
    group.throughput(Throughput::Bytes((N * 4) as u64));
    for (code, name) in [(0, "strict"), (2, "defer_and_fuse")] {
        ok(tpjrt_mode_push(code));
        run();
        group.bench_function(name, |bench| bench.iter(run));
        ok(tpjrt_mode_pop());
    }
    group.finish();
}

criterion_group!(
    benches,
    abi_op_strict,
    capture,
    execute_queue,
    planning,
    memory_cuts,
    key_lookup,
    chain_4m,
    chain16_abi_4m
);
criterion_main!(benches);
