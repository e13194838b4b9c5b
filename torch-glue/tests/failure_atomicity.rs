//! A failure at any step of a flush or its launch leaves no read waiting: the values the failed
//! flush made fail with its error, and an engine whose graph a failure left half-updated stops
//! with a clear error instead of running on. Failures are injected at each named step
//! (`defer::fail_point`) in each mode.
mod common;
use common::*;
use defer::fail_point::{self, FailAction, FailPoint};
use defer::{EngineError, Mode, TensorRef};
use ops::{DType, OpId, ScalarArg};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use torch_glue::Engine;

/// Reads `t` on another thread; a read still blocked after the limit is a hang.
fn read_within(e: &Arc<Engine>, t: &TensorRef, limit: Duration) -> Result<Vec<f64>, EngineError> {
    let (sent, received) = mpsc::channel();
    let (engine, tensor) = (e.clone(), t.clone());
    let reader = std::thread::spawn(move || {
        let mut bytes = vec![0u8; tensor.numel() as usize * tensor.dtype.size_bytes()];
        let result = engine
            .read_host(&tensor, &mut bytes)
            .map(|()| decode(tensor.dtype, &bytes));
        let _ = sent.send(result);
    });
    let result = received
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("a read blocked for {limit:?}: a value nothing will compute"));
    // Joined so that its handle on the engine is gone: the engine must not be torn down on this
    // thread while the process exits.
    reader.join().expect("the reader thread");
    result
}

const LIMIT: Duration = Duration::from_secs(60);

/// `(x + 1) * 2` on `[0, 1, 2, 3]`, left pending in DeferAndFuse (run at once in Strict).
fn pending_chain(e: &Engine) -> (TensorRef, TensorRef) {
    let x = upload_f32(e, &[0.0, 1.0, 2.0, 3.0], &[4]);
    let y = op(e, typed::Add, &[&x], &[ScalarArg::float(1.0)]);
    let z = op(e, typed::Mul, &[&y], &[ScalarArg::float(2.0)]);
    (y, z)
}

/// Runs `f`, turning a panic into an error as the C ABI does.
fn caught<T>(f: impl FnOnce() -> Result<T, EngineError>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(e.message),
        Err(_) => Err("panicked".to_string()),
    }
}

/// After the failure: either the engine still works (a new computation is right) or it has
/// stopped, and then every call that needs the graph says so.
fn still_works_or_says_stopped(e: &Arc<Engine>, expect_stopped: bool, what: &str) {
    if expect_stopped {
        let why = e
            .stopped()
            .unwrap_or_else(|| panic!("{what}: the engine must stop"));
        assert!(!why.is_empty());
        let x = TensorRef::contiguous(e.new_storage(16), DType::F32, &[4]);
        let err = e.write_host(&x, &[0u8; 16]).unwrap_err();
        assert!(err.message.contains("stopped"), "{what}: {}", err.message);
        assert!(
            err.message.contains("Restart the process"),
            "{what}: {}",
            err.message
        );
        let err = e
            .op(OpId::Neg, std::slice::from_ref(&x), &[], &[], &[])
            .unwrap_err();
        assert!(err.message.contains("stopped"), "{what}: {}", err.message);
        // Releasing storages (tensors dying) stays quiet.
        e.release_storage(x.storage)
            .expect("release after the engine stopped");
    } else {
        assert!(e.stopped().is_none(), "{what}: {:?}", e.stopped());
        let a = upload_f32(e, &[1.0, 2.0], &[2]);
        let b = op(e, typed::Mul, &[&a], &[ScalarArg::float(3.0)]);
        assert_eq!(
            read_within(e, &b, LIMIT).expect(what),
            vec![3.0, 6.0],
            "{what}"
        );
    }
}

#[test]
fn a_failed_flush_leaves_no_read_waiting_in_defer_and_fuse() {
    for point in FailPoint::ALL {
        for action in [FailAction::Error, FailAction::Panic] {
            let what = format!("{point:?} {action:?}");
            let e = Arc::new(engine(Mode::DeferAndFuse));
            let (y, z) = pending_chain(&e);
            fail_point::arm(point, action);
            let first = caught(|| {
                let mut bytes = vec![0u8; 16];
                e.read_host(&z, &mut bytes)
            });
            assert!(
                !fail_point::is_armed(),
                "{what}: the read never reached the point"
            );
            fail_point::disarm();
            let message = first.expect_err(&what);
            // Nothing was installed before the plan: the pending ops stay pending and run on
            // the next read. A launch error leaves a consistent graph whose values failed.
            let stops = action == FailAction::Panic
                || matches!(point, FailPoint::FlushInstalled | FailPoint::FlushDrained);
            match (point, action) {
                (FailPoint::FlushPlanned, FailAction::Error) => {
                    assert!(message.contains("injected failure"), "{what}: {message}");
                    assert_eq!(
                        read_within(&e, &z, LIMIT).expect(&what),
                        vec![2., 4., 6., 8.]
                    );
                    assert_eq!(
                        read_within(&e, &y, LIMIT).expect(&what),
                        vec![1., 2., 3., 4.]
                    );
                }
                (FailPoint::LaunchEnqueue, FailAction::Error) => {
                    assert!(message.contains("injected failure"), "{what}: {message}");
                    for t in [&z, &y] {
                        let err = read_within(&e, t, LIMIT).expect_err(&what);
                        assert!(err.message.contains("injected failure"), "{what}: {err}");
                    }
                }
                _ => {
                    for t in [&z, &y] {
                        let err = read_within(&e, t, LIMIT).expect_err(&what);
                        assert!(
                            err.message.contains("stopped") || err.message.contains("injected"),
                            "{what}: {err}"
                        );
                    }
                }
            }
            still_works_or_says_stopped(&e, stops, &what);
        }
    }
}

#[test]
fn a_failed_launch_leaves_no_read_waiting_in_strict() {
    for path in ["flush", "direct"] {
        for action in [FailAction::Error, FailAction::Panic] {
            let what = format!("{path} {action:?}");
            let e = Arc::new(engine(Mode::Strict));
            let x = upload_f32(&e, &[0.0, 1.0, 2.0, 3.0], &[4]);
            if path == "direct" {
                // A warm op on device values skips the pending graph (`run_if_compiled`).
                let warm = op(&e, typed::Neg, &[&x], &[]);
                assert_eq!(
                    read_within(&e, &warm, LIMIT).unwrap(),
                    vec![0., -1., -2., -3.]
                );
            }
            let live_before = metric(&e, "live_storages");
            fail_point::arm(FailPoint::LaunchEnqueue, action);
            let failed = caught(|| e.op(OpId::Neg, std::slice::from_ref(&x), &[], &[], &[]));
            assert!(
                !fail_point::is_armed(),
                "{what}: the op never reached the launch"
            );
            fail_point::disarm();
            assert!(failed.is_err(), "{what}");
            if action == FailAction::Error {
                // The op's output was released: the caller never learned its id.
                assert_eq!(metric(&e, "live_storages"), live_before, "{what}");
            }
            still_works_or_says_stopped(&e, action == FailAction::Panic, &what);
        }
    }
}

#[test]
fn a_failed_launch_in_debug_raises_at_the_op() {
    let e = Arc::new(engine(Mode::Debug));
    let x = upload_f32(&e, &[0.0, 1.0], &[2]);
    fail_point::arm(FailPoint::LaunchEnqueue, FailAction::Error);
    let err = e
        .op(OpId::Neg, std::slice::from_ref(&x), &[], &[], &[])
        .unwrap_err();
    assert!(err.message.contains("injected failure"), "{}", err.message);
    still_works_or_says_stopped(&e, false, "debug");
}
