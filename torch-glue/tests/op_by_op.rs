//! The op-by-op engine: Strict and Debug agree and share one executable per op signature;
//! Strict returns before the device (and the compiler) finish; Debug raises an execution-time
//! error at the op that caused it; after any error the engine keeps working.

mod common;

use common::*;
use defer::{ErrorKind, Mode, TensorRef};
use ops::{DType, OpId, ScalarArg};
use std::time::{Duration, Instant};
use torch_glue::Engine;

/// A small program of 6 ops; returns its result.
fn program(e: &Engine, x: &TensorRef, y: &TensorRef) -> TensorRef {
    let a = op(e, typed::Mul, &[x, y], &[]);
    let b = op(e, typed::Add, &[&a, x], &[ScalarArg::float(0.5)]);
    let c = op(e, typed::Tanh, &[&b], &[]);
    let d = op(e, typed::Mm, &[&c, y], &[]);
    let s = op(
        e,
        typed::Softmax.encode(layout::SoftmaxDim {
            dim: 1,
            half_to_float: false,
        }),
        &[&d],
        &[],
    );
    op(
        e,
        typed::Sum.encode(layout::ReduceDtypeDims {
            keepdim: false,
            dtype: None,
            dims: &[0],
        }),
        &[&s],
        &[],
    )
}

#[test]
fn strict_and_debug_agree_and_share_executables() {
    let e = engine(Mode::Strict);
    let mut rng = Rng::new(11);
    let x = upload(&e, DType::F32, &rng.values(16, -1.0, 1.0), &[4, 4]);
    let y = upload(&e, DType::F32, &rng.values(16, -1.0, 1.0), &[4, 4]);
    e.reset_metrics();
    let strict = read(&e, &program(&e, &x, &y));
    assert_eq!(metric(&e, "executions"), 6.0, "one execution per op");
    assert_eq!(
        metric(&e, "compilations"),
        6.0,
        "one compilation per op signature"
    );
    assert_eq!(metric(&e, "deferred_ops"), 0.0);

    e.reset_metrics();
    let debug = with_mode(&e, Mode::Debug, || read(&e, &program(&e, &x, &y)));
    assert_eq!(metric(&e, "executions"), 6.0);
    assert_eq!(
        metric(&e, "compilations"),
        0.0,
        "Debug reuses Strict's executables"
    );
    assert_eq!(metric(&e, "cache_hits"), 6.0);
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&strict), bits(&debug), "same executables, same bits");

    // Another signature of the same op (new dims) compiles once more, and is named a recompile.
    let z = upload(&e, DType::F32, &rng.values(8, -1.0, 1.0), &[8]);
    let w = op(&e, typed::Tanh, &[&z], &[]);
    let _ = read(&e, &w);
    assert_eq!(metric(&e, "compilations"), 1.0);
    assert_eq!(metric(&e, "recompiles"), 1.0);
    let metrics = e.metrics();
    let reason = metrics
        .recompile_reasons
        .last()
        .expect("a recompile reason");
    let first = &reason.changes[0];
    assert_eq!(
        (first.op.as_str(), first.op_index, first.what.as_str()),
        ("aten::tanh", Some(0), "input 0 (self) shape")
    );
    assert_eq!((first.old.as_str(), first.new.as_str()), ("[4, 4]", "[8]"));
    assert_eq!(reason.total_changes, 2, "the input's and the output's dim");
    let text = metrics.last_recompile_reason.expect("the reason's text");
    assert!(
        text.contains(
            "strict mode of tanh: op 0 (aten::tanh): input 0 (self) shape changed [4, 4] -> [8]"
        ),
        "{text}"
    );
}

/// `n` chained `[n, n]` matrix products; returns the last.
fn mm_chain(e: &Engine, a: &TensorRef, steps: usize) -> TensorRef {
    let mut m = op(e, typed::Mm, &[a, a], &[]);
    for _ in 1..steps {
        let next = op(e, typed::Mm, &[&m, a], &[]);
        release(e, std::mem::replace(&mut m, next));
    }
    m
}

/// Times `steps` op calls of the chain, then the reduction and read that wait for them.
fn time_chain(e: &Engine, a: &TensorRef, steps: usize) -> (Duration, Duration, f64) {
    let t0 = Instant::now();
    let m = mm_chain(e, a, steps);
    let calls = t0.elapsed();
    let total = op(e, sum_all(), &[&m], &[]);
    let value = read(e, &total)[0];
    (calls, t0.elapsed(), value)
}

#[test]
fn strict_returns_before_the_device_finishes_and_debug_waits() {
    const N: usize = 768;
    const STEPS: usize = 6;
    let e = engine(Mode::Strict);
    let a = upload(
        &e,
        DType::F32,
        &vec![1.0 / N as f64; N * N],
        &[N as i64, N as i64],
    );
    // Warm the cache: later calls pay neither compilation nor its wait.
    let (_, _, warm) = time_chain(&e, &a, 2);
    assert!(
        (warm - N as f64 * N as f64 / N as f64).abs() < 1e-2,
        "warm-up value {warm}"
    );
    e.reset_metrics();

    let (strict_calls, strict_total, v) = time_chain(&e, &a, STEPS);
    assert_eq!(metric(&e, "compilations"), 0.0, "warm cache");
    assert!((v - N as f64).abs() < 1e-2, "chain value {v}");
    assert!(
        strict_calls * 5 < strict_total,
        "Strict op calls must return before the device finishes: {STEPS} calls took \
         {strict_calls:?}, completion {strict_total:?}"
    );

    let (debug_calls, debug_total, v) = with_mode(&e, Mode::Debug, || time_chain(&e, &a, STEPS));
    assert!((v - N as f64).abs() < 1e-2, "chain value {v}");
    let after_calls = debug_total - debug_calls;
    assert!(
        debug_calls > after_calls * 3,
        "Debug op calls wait for the device: {STEPS} calls took {debug_calls:?}, the read \
         after them {after_calls:?}"
    );
}

#[test]
fn sync_waits_for_work_whose_results_were_released() {
    const N: usize = 768;
    const STEPS: usize = 6;
    let e = engine(Mode::Strict);
    let a = upload(
        &e,
        DType::F32,
        &vec![1.0 / N as f64; N * N],
        &[N as i64, N as i64],
    );
    let _ = time_chain(&e, &a, 2);
    // How long the chain takes, waited for by `sync` while its result is held: the fastest of
    // three runs, so that a run slowed by other work on the machine does not set the bar.
    let device = (0..3)
        .map(|_| {
            let start = Instant::now();
            let held = mm_chain(&e, &a, STEPS);
            e.sync().expect("sync");
            let took = start.elapsed();
            release(&e, held);
            took
        })
        .min()
        .expect("three runs");
    // The same chain whose result nobody holds any more: `torch.pjrt.synchronize()` must still
    // wait for it (a timing loop that discards its results relies on this).
    let start = Instant::now();
    let m = mm_chain(&e, &a, STEPS);
    release(&e, m);
    e.sync().expect("sync");
    let synced = start.elapsed();
    assert!(
        synced * 2 > device,
        "sync returned after {synced:?} while the same work, held, took {device:?}"
    );
}

#[test]
fn strict_does_not_wait_for_compilation() {
    let e = engine(Mode::Strict);
    let x = upload_f32(&e, &[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let t0 = Instant::now();
    let y = op(&e, typed::Log1p, &[&x], &[]);
    let call = t0.elapsed();
    let got = read(&e, &y);
    let compile = Duration::from_secs_f64(metric(&e, "compile_seconds"));
    assert_eq!(metric(&e, "compilations"), 1.0);
    assert!(
        call < compile,
        "a Strict call of a new op signature returns while it compiles: call {call:?}, \
         compilation {compile:?}"
    );
    let want: Vec<f64> = [1.0f64, 2.0, 3.0, 4.0].iter().map(|v| v.ln_1p()).collect();
    assert_close("log1p", &got, &want, Tol::ulps(DType::F32, 4.0));
}

/// `full` of 2^38 float32 elements (1 TiB): meta accepts it, the device cannot allocate it.
fn huge_full(e: &Engine) -> Result<defer::Captured, defer::EngineError> {
    let full = typed::Full.encode(layout::Creation {
        dtype: DType::F32,
        sizes: &[1 << 38],
    });
    try_op(e, full, &[], &[ScalarArg::float(1.0)], &[])
}

/// The engine still runs ops and reads values correctly in every mode.
fn assert_usable(e: &Engine) {
    for mode in [Mode::Strict, Mode::Debug, Mode::DeferAndFuse] {
        with_mode(e, mode, || {
            let a = upload_f32(e, &[1.0, 2.0, 3.0], &[3]);
            let b = op(e, typed::Mul, &[&a, &a], &[]);
            let c = op(e, typed::Add, &[&b, &a], &[ScalarArg::float(2.0)]);
            assert_eq!(
                read_f32(e, &c),
                vec![3.0, 8.0, 15.0],
                "after an error, in {mode:?}"
            );
        });
    }
}

#[test]
fn debug_raises_execution_errors_at_the_op() {
    let e = engine(Mode::Debug);
    let live = metric(&e, "live_storages");
    let err = huge_full(&e).expect_err("Debug waits for the device and raises at the op");
    assert_eq!(err.kind, ErrorKind::Runtime);
    // The allocation's size as the CPU plugin and as the GPU plugins write it.
    assert!(
        err.message.contains("full")
            && (err.message.contains("1099511627776 bytes") || err.message.contains("1.00TiB")),
        "the message names the op and what failed: {}",
        err.message
    );
    assert_eq!(
        metric(&e, "live_storages"),
        live,
        "a Debug op that failed must not leave an unreachable output storage behind"
    );
    assert_usable(&e);
}

#[test]
fn strict_reports_execution_errors_when_the_value_is_read() {
    let e = engine(Mode::Strict);
    let captured = huge_full(&e).expect("Strict enqueues and returns before the device runs it");
    let (storage, ty) = captured.outputs[0].clone();
    assert_eq!(ty.shape.as_slice(), &[1i64 << 38]);
    let t = TensorRef::contiguous(storage, ty.dtype, &ty.shape);
    // A dependent op is also enqueued; the failure travels to it.
    let s = op(&e, sum_all(), &[&t], &[]);
    let mut byte = [0u8; 4];
    let err = e
        .read_host(&s, &mut byte)
        .expect_err("the failure reaches the dependent value");
    // The CPU plugin fails `full`'s allocation and the failure travels to `sum`; XLA's GPU
    // compiler already fails compiling `sum` (its autotuner allocates a 1 TiB input).
    let failed_op = |m: &str| m.contains("full") || m.starts_with("sum:");
    assert!(
        failed_op(&err.message) && err.message.contains("Out of memory"),
        "the error names the op that failed and why: {}",
        err.message
    );
    let err = e
        .sync()
        .expect_err("sync raises the pending failure of the newest region");
    assert!(failed_op(&err.message), "{}", err.message);
    e.sync()
        .expect("a failure is raised once; the next sync is clean");
    release(&e, t);
    release(&e, s);
    assert_usable(&e);
}

#[test]
fn defer_and_fuse_execution_error_leaves_later_work_usable() {
    let e = engine(Mode::DeferAndFuse);
    let captured = huge_full(&e).expect("deferred");
    let (storage, ty) = captured.outputs[0].clone();
    let t = TensorRef::contiguous(storage, ty.dtype, &ty.shape);
    let x = upload_f32(&e, &[1.0, 2.0], &[2]);
    let y = op(&e, typed::Exp, &[&x], &[]);
    // Ordered materialization runs the older `full` in y's region: the region fails as a whole.
    let mut bytes = [0u8; 8];
    let err = e
        .read_host(&y, &mut bytes)
        .expect_err("the region holding `full` fails");
    assert!(err.message.contains("full"), "{}", err.message);
    release(&e, t);
    let z = op(&e, typed::Add, &[&x, &x], &[]);
    assert_eq!(read_f32(&e, &z), vec![2.0, 4.0], "later regions run");
    assert_usable(&e);
}

#[test]
fn capture_errors_leave_every_mode_usable() {
    for mode in [Mode::Strict, Mode::Debug, Mode::DeferAndFuse] {
        let e = engine(mode);
        let a = upload_f32(&e, &[1.0, 2.0, 3.0], &[3]);
        let b = upload_f32(&e, &[1.0, 2.0, 3.0, 4.0], &[4]);
        let pending = op(&e, typed::Neg, &[&a], &[]);
        let live = metric(&e, "live_storages");
        let err = e
            .op(OpId::Add, &[a.clone(), b.clone()], &[], &[], &[])
            .expect_err("shape mismatch");
        assert_eq!(err.kind, ErrorKind::Runtime, "{mode:?}");
        assert!(
            err.message.contains("(3)") && err.message.contains("(4)"),
            "{mode:?}: the message names both sizes: {}",
            err.message
        );
        let m = upload_f32(&e, &[0.0; 6], &[2, 3]);
        let live = live + 1.0;
        let err = e
            .op(OpId::Mm, &[m.clone(), m.clone()], &[], &[], &[])
            .expect_err("mm of mismatched matrices");
        assert!(err.message.contains("(2x3 and 2x3)"), "{}", err.message);
        assert_eq!(
            metric(&e, "live_storages"),
            live,
            "{mode:?}: failed captures create nothing"
        );
        let c = op(&e, typed::Mul, &[&pending, &a], &[]);
        assert_eq!(read_f32(&e, &c), vec![-1.0, -4.0, -9.0], "{mode:?}");
        if mode == Mode::DeferAndFuse {
            assert_eq!(metric(&e, "region_ops"), 2.0, "only the valid ops ran");
        }
    }
}
