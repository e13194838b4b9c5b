//! Strict's direct path: a warm op on device values (whole or viewed) runs without a pending node, under the
//! key its capture and flush would give (debug builds check the two keyings agree on every cold
//! op), with the results, metrics and errors of the general path.

mod common;

use common::*;
use defer::{ErrorKind, Mode, TensorRef};
use ops::{DType, OpId, ScalarArg};
use torch_glue::Engine;

#[test]
fn warm_ops_take_the_direct_path_and_share_the_flushed_programs() {
    let e = engine(Mode::Strict);
    let x = upload(&e, DType::F32, &[1.0, 2.0, 3.0, 4.0], &[4]);
    e.reset_metrics();
    // Cold: captured and flushed; the read waits for the compile.
    let mut cur = op(&e, typed::Add, &[&x], &[ScalarArg::float(0.5)]);
    assert_eq!(read(&e, &cur), vec![1.5, 2.5, 3.5, 4.5]);
    assert_eq!(metric(&e, "direct_ops"), 0.0);
    for _ in 0..4 {
        cur = op(&e, typed::Add, &[&cur], &[ScalarArg::float(0.5)]);
    }
    assert_eq!(read(&e, &cur), vec![3.5, 4.5, 5.5, 6.5]);
    assert_eq!(metric(&e, "compilations"), 1.0, "one program for the chain");
    assert_eq!(metric(&e, "direct_ops"), 4.0, "the warm ops run directly");
    assert_eq!(metric(&e, "executions"), 5.0);
    assert_eq!(metric(&e, "regions"), 5.0);
    assert_eq!(metric(&e, "materializations"), 5.0);
    assert_eq!(metric(&e, "cache_hits"), 4.0);
    // Each op lifts its scalar; the same 0.5 is uploaded once and its buffer reused.
    assert_eq!(
        metric(&e, "host_to_device"),
        1.0,
        "one transfer of the lifted 0.5"
    );
    assert_eq!(metric(&e, "upload_reuses"), 4.0);
    assert_eq!(metric(&e, "pending_ops"), 0.0);

    // A changed scalar is new data for the same program.
    let y = op(&e, typed::Add, &[&x], &[ScalarArg::float(-1.0)]);
    assert_eq!(read(&e, &y), vec![0.0, 1.0, 2.0, 3.0]);
    assert_eq!(metric(&e, "compilations"), 1.0);
    assert_eq!(metric(&e, "direct_ops"), 5.0);
}

#[test]
fn repeated_and_reshaped_inputs_are_numbered_as_capture_numbers_them() {
    let e = engine(Mode::Strict);
    let x = upload(&e, DType::F32, &[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let y = upload(&e, DType::F32, &[10.0, 20.0, 30.0, 40.0], &[2, 2]);
    // The same storage read twice is one argument; a whole storage read in another shape is
    // reshaped. Each form runs cold (captured) then warm (direct).
    let flat = TensorRef::contiguous(x.storage, DType::F32, &[4]);
    for round in 0..2 {
        let twice = op(&e, typed::Mul, &[&x, &x], &[]);
        assert_eq!(read(&e, &twice), vec![1.0, 4.0, 9.0, 16.0], "round {round}");
        let mixed = op(&e, typed::Sub, &[&y, &x], &[ScalarArg::float(2.0)]);
        assert_eq!(
            read(&e, &mixed),
            vec![8.0, 16.0, 24.0, 32.0],
            "round {round}"
        );
        let swapped = op(&e, typed::Sub, &[&x, &y], &[ScalarArg::float(2.0)]);
        assert_eq!(
            read(&e, &swapped),
            vec![-19.0, -38.0, -57.0, -76.0],
            "round {round}"
        );
        let reshaped = op(&e, typed::Neg, &[&flat], &[]);
        assert_eq!(read(&e, &reshaped), vec![-1.0, -2.0, -3.0, -4.0]);
    }
    // `y - 2x` and `x - 2y` are one program with its arguments swapped: the second runs
    // directly in the first round already, and all four in the second.
    assert_eq!(metric(&e, "compilations"), 3.0);
    assert_eq!(metric(&e, "direct_ops"), 5.0);
}

#[test]
fn pending_inputs_take_the_general_path_and_warm_views_the_direct_one() {
    let e = engine(Mode::Strict);
    let x = upload(&e, DType::F32, &[1.0, 2.0, 3.0, 4.0], &[4]);
    for _ in 0..2 {
        // Pending input: captured in DeferAndFuse, read in Strict.
        let pending = with_mode(&e, Mode::DeferAndFuse, || {
            op(&e, typed::Mul, &[&x], &[ScalarArg::float(3.0)])
        });
        let after = op(&e, typed::Add, &[&pending], &[ScalarArg::float(1.0)]);
        assert_eq!(read(&e, &after), vec![4.0, 7.0, 10.0, 13.0]);
        // A strided view of the storage.
        let every_other = TensorRef {
            storage: x.storage,
            dtype: DType::F32,
            sizes: [2].as_slice().into(),
            strides: [2].as_slice().into(),
            offset: 1,
        };
        let neg = op(&e, typed::Neg, &[&every_other], &[]);
        assert_eq!(read(&e, &neg), vec![-2.0, -4.0]);
    }
    // The Strict `add` reading a pending value ran in the same region as its producer's
    // materialization, both times; the view's `neg` ran directly once its program was known.
    assert_eq!(metric(&e, "direct_ops"), 1.0);
}

#[test]
fn warm_ops_on_views_run_directly_with_their_window_offsets() {
    let e = engine(Mode::Strict);
    let m = upload(&e, DType::F32, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let transposed = TensorRef {
        storage: m.storage,
        dtype: DType::F32,
        sizes: [3, 2].as_slice().into(),
        strides: [1, 3].as_slice().into(),
        offset: 0,
    };
    let row = |k: i64| TensorRef {
        storage: m.storage,
        dtype: DType::F32,
        sizes: [3].as_slice().into(),
        strides: [1].as_slice().into(),
        offset: 3 * k,
    };
    e.reset_metrics();
    for round in 0..2 {
        let neg = op(&e, typed::Neg, &[&transposed], &[]);
        assert_eq!(
            read(&e, &neg),
            vec![-1.0, -4.0, -2.0, -5.0, -3.0, -6.0],
            "round {round}"
        );
        for k in 0..2 {
            let shifted = op(&e, typed::Add, &[&row(k)], &[ScalarArg::float(10.0)]);
            let first = 3.0 * k as f64 + 11.0;
            assert_eq!(
                read(&e, &shifted),
                vec![first, first + 1.0, first + 2.0],
                "round {round}, row {k}"
            );
        }
        // A view read with a whole value: two arguments, the view's offset a runtime scalar.
        let mixed = op(&e, typed::Mul, &[&row(1), &row(0)], &[]);
        assert_eq!(read(&e, &mixed), vec![4.0, 10.0, 18.0], "round {round}");
    }
    // The rows differ only in their offset, a runtime scalar: one program for both.
    assert_eq!(metric(&e, "compilations"), 3.0);
    // Cold: the transpose, the first row and the product; everything else ran directly.
    assert_eq!(metric(&e, "direct_ops"), 5.0);
    assert_eq!(metric(&e, "pending_ops"), 0.0);
}

#[test]
fn errors_are_capture_errors_and_leave_the_engine_usable() {
    let e = engine(Mode::Strict);
    let b = upload(&e, DType::Bool, &[1.0, 0.0], &[2]);
    let x = upload(&e, DType::F32, &[1.0, 2.0], &[2]);
    // Warm the program the failing call would otherwise find.
    let warm = op(&e, typed::Neg, &[&x], &[]);
    let _ = read(&e, &warm);
    let err = e
        .op(OpId::Neg, std::slice::from_ref(&b), &[], &[], &[])
        .expect_err("negating a bool tensor");
    assert!(err.message.contains("bool tensor"), "{}", err.message);
    let released = upload(&e, DType::F32, &[1.0, 2.0], &[2]);
    release(&e, released.clone());
    let err = e
        .op(OpId::Neg, std::slice::from_ref(&released), &[], &[], &[])
        .expect_err("a released storage");
    assert_eq!(err.kind, ErrorKind::Runtime, "{}", err.message);
    let y = op(&e, typed::Neg, &[&x], &[]);
    assert_eq!(read(&e, &y), vec![-1.0, -2.0]);
    assert_eq!(metric(&e, "direct_ops"), 1.0);
}

/// `op(inputs, out=outs)`.
fn op_out(e: &Engine, op: OpId, inputs: &[&TensorRef], scalars: &[ScalarArg], out: &TensorRef) {
    let inputs: Vec<TensorRef> = inputs.iter().map(|t| (*t).clone()).collect();
    e.op(op, &inputs, scalars, &[], std::slice::from_ref(out))
        .unwrap_or_else(|err| panic!("{}: {}", op.name(), err.message));
}

#[test]
fn in_place_ops_run_directly_and_donate_as_their_flush_would() {
    let e = engine(Mode::Strict);
    let x = upload(&e, DType::F32, &[1.0, 2.0, 3.0, 4.0], &[4]);
    e.reset_metrics();
    // x.add_(0.5): cold (captured, flushed, compiled), then warm.
    op_out(&e, OpId::Add, &[&x], &[ScalarArg::float(0.5)], &x);
    assert_eq!(read(&e, &x), vec![1.5, 2.5, 3.5, 4.5]);
    let donated_cold = metric(&e, "donated_buffers");
    let donating = std::env::var("TORCH_PJRT_DONATE").as_deref() != Ok("0");
    assert_eq!(
        donated_cold,
        f64::from(u8::from(donating)),
        "x's old value is donated"
    );
    for _ in 0..4 {
        op_out(&e, OpId::Add, &[&x], &[ScalarArg::float(0.5)], &x);
    }
    assert_eq!(read(&e, &x), vec![3.5, 4.5, 5.5, 6.5]);
    assert_eq!(metric(&e, "compilations"), 1.0);
    assert_eq!(metric(&e, "direct_ops"), 4.0);
    assert_eq!(
        metric(&e, "donated_buffers"),
        5.0 * donated_cold,
        "each warm in-place op donates as the cold one did"
    );

    // out= into another whole tensor, warm after one run.
    let y = upload(&e, DType::F32, &[10.0, 20.0, 30.0, 40.0], &[4]);
    let z = upload(&e, DType::F32, &[0.0; 4], &[4]);
    for round in 0..2 {
        op_out(&e, OpId::Mul, &[&x, &y], &[], &z);
        assert_eq!(
            read(&e, &z),
            vec![35.0, 90.0, 165.0, 260.0],
            "round {round}"
        );
    }
    assert_eq!(metric(&e, "direct_ops"), 5.0);

    // An out= of another dtype is cast by capture: never direct.
    let wide = upload(&e, DType::F64, &[0.0; 4], &[4]);
    for _ in 0..2 {
        op_out(&e, OpId::Mul, &[&x, &y], &[], &wide);
        assert_eq!(read(&e, &wide), vec![35.0, 90.0, 165.0, 260.0]);
    }
    assert_eq!(metric(&e, "direct_ops"), 5.0);
    // A wrong out= shape is capture's error.
    let short = upload(&e, DType::F32, &[0.0; 2], &[2]);
    let err = e
        .op(OpId::Mul, &[x.clone(), y.clone()], &[], &[], &[short])
        .expect_err("out shape");
    assert!(err.message.contains("shape"), "{}", err.message);
}
