//! Bad input through the C ABI: each mistake gives the status code of the right Python exception
//! and a message saying what was expected and what was got, creates nothing, and leaves the
//! engine usable — in every eager mode.

mod common;

use common::abi::*;
use common::{layout, typed};
use ops::params::{Reduction, RoundingMode};
use std::ffi::CString;
use torch_glue::abi::*;

const MODES: [i32; 3] = [0, 1, 2];

/// Asserts the code and that the message contains every fragment.
fn expect_err<T>(result: Result<T, AbiError>, code: i32, fragments: &[&str]) {
    let Err(err) = result else {
        panic!("the call must fail with code {code} ({fragments:?})");
    };
    assert_eq!(err.code, code, "status code for: {}", err.message);
    for f in fragments {
        assert!(
            err.message.contains(f),
            "message lacks {f:?}: {}",
            err.message
        );
    }
}

/// The engine still computes correctly, and a failed call created no storage.
fn assert_usable(live_before: f64) {
    assert_eq!(
        metric("live_storages"),
        live_before,
        "a failed call must not create storages"
    );
    let a = upload_f32(&[1.0, 2.0, 3.0], &[3]);
    let b = upload_f32(&[10.0, 20.0, 30.0], &[3]);
    let c = op1(typed::Add, &[&a, &b], &[scalar_float(2.0)]);
    assert_eq!(read_f32(&c).unwrap(), vec![21.0, 42.0, 63.0]);
    for t in [&a, &b, &c] {
        release(t).unwrap();
    }
    assert_eq!(metric("live_storages"), live_before);
}

/// Runs `check` in every mode with a pending value around (DeferAndFuse must not lose it).
fn in_every_mode(check: impl Fn()) {
    init();
    let _guard = global_lock();
    for mode in MODES {
        with_mode(mode, || {
            let x = upload_f32(&[1.0, -2.0], &[2]);
            let pending = op1(typed::Neg, &[&x], &[]);
            let live = metric("live_storages");
            check();
            assert_usable(live);
            assert_eq!(read_f32(&pending).unwrap(), vec![-1.0, 2.0], "mode {mode}");
            release(&x).unwrap();
            release(&pending).unwrap();
        });
    }
}

#[test]
fn unknown_op_id_and_name() {
    in_every_mode(|| {
        let a = upload_f32(&[1.0], &[1]);
        let live = metric("live_storages");
        let known = ops::OpId::ALL.len().to_string();
        // Op codes no op has: only the raw call can send them.
        expect_err(
            op_raw(9999, &[&a, &a], &[], &[], &[], 4),
            TPJRT_NOT_IMPLEMENTED,
            &["9999", &known],
        );
        expect_err(
            op_raw(-1, &[&a], &[], &[], &[], 4),
            TPJRT_NOT_IMPLEMENTED,
            &["-1", "tpjrt_op_id"],
        );
        let name = CString::new("not_an_aten_op").unwrap();
        let mut id = 12345;
        // SAFETY: valid string and output.
        let code = unsafe { tpjrt_op_id(name.as_ptr(), &mut id) };
        expect_err(
            check(code),
            TPJRT_NOT_IMPLEMENTED,
            &["'not_an_aten_op'", "not supported"],
        );
        assert_eq!(id, 12345, "a failed lookup writes nothing");
        assert_eq!(metric("live_storages"), live);
        release(&a).unwrap();
    });
}

#[test]
fn wrong_arity() {
    in_every_mode(|| {
        let a = upload_f32(&[1.0, 2.0], &[2]);
        let live = metric("live_storages");
        expect_err(
            op(typed::Add, &[&a, &a, &a], &[]),
            TPJRT_RUNTIME_ERROR,
            &[
                "add",
                "expected tensor inputs (self, other)",
                "got 3 tensor input(s)",
            ],
        );
        expect_err(
            op(typed::Add, &[&a], &[]),
            TPJRT_RUNTIME_ERROR,
            &["expected", "got 1 tensor input(s) and 0 scalar(s)"],
        );
        expect_err(
            op(typed::Neg, &[&a], &[scalar_float(1.0)]),
            TPJRT_RUNTIME_ERROR,
            &["neg", "got 1 tensor input(s) and 1 scalar(s)"],
        );
        assert_eq!(metric("live_storages"), live);
        release(&a).unwrap();
    });
}

#[test]
fn shape_mismatch() {
    in_every_mode(|| {
        let a = upload_f32(&[1.0, 2.0, 3.0], &[3]);
        let b = upload_f32(&[1.0, 2.0, 3.0, 4.0], &[4]);
        let m = upload_f32(&[0.0; 6], &[2, 3]);
        expect_err(
            op(typed::Add, &[&a, &b], &[]),
            TPJRT_RUNTIME_ERROR,
            &["size of tensor a (3) must match the size of tensor b (4)"],
        );
        expect_err(
            op(typed::Mm, &[&m, &m], &[]),
            TPJRT_RUNTIME_ERROR,
            &["cannot be multiplied (2x3 and 2x3)"],
        );
        // An out= tensor of the wrong shape.
        let out = AbiTensor::contiguous(storage_new(8), F32, &[2]);
        expect_err(
            op_room(typed::Add, &[&a, &a], &[], &[&out], 1),
            TPJRT_RUNTIME_ERROR,
            &["output 0 has shape [2]", "result has shape [3]"],
        );
        for t in [&a, &b, &m, &out] {
            release(t).unwrap();
        }
    });
}

#[test]
fn dtype_mismatch() {
    in_every_mode(|| {
        let a = upload_f32(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
        let d = AbiTensor::contiguous(storage_new(32), F64, &[2, 2]);
        write(&d, &[0u8; 32]).unwrap();
        expect_err(
            op(typed::Mm, &[&a, &d], &[]),
            TPJRT_RUNTIME_ERROR,
            &["same dtype", "float != double"],
        );
        // The storage holds float32 values; reading it as int32 is a reinterpretation
        // (`x.view(torch.int32)`): either supported, bit for bit, or refused as not implemented.
        let as_int = AbiTensor {
            dtype: 3,
            ..a.clone()
        };
        match op(typed::Neg, &[&as_int], &[]) {
            Ok(outs) => {
                let t = AbiTensor::from_output(&outs[0]);
                assert_eq!(t.dtype, 3);
                let bytes = read_bytes(&t, 16).unwrap();
                let got: Vec<i32> = bytes
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                let want: Vec<i32> = [1.0f32, 2.0, 3.0, 4.0]
                    .iter()
                    .map(|v| (v.to_bits() as i32).wrapping_neg())
                    .collect();
                assert_eq!(got, want, "neg of the float32 bits read as int32");
                release(&t).unwrap();
            }
            Err(err) => {
                assert_eq!(err.code, TPJRT_NOT_IMPLEMENTED, "{}", err.message);
                assert!(
                    err.message
                        .contains("holds float32 values but is read as int32"),
                    "{}",
                    err.message
                );
            }
        }
        // qint8 (ScalarType 12) is not a pjrt dtype.
        let quantized = AbiTensor {
            dtype: 12,
            ..a.clone()
        };
        expect_err(
            op(typed::Neg, &[&quantized], &[]),
            TPJRT_TYPE_ERROR,
            &["dtype code 12", "supported: float64, float32"],
        );
        expect_err(
            op(typed::BitwiseAnd, &[&a, &a], &[]),
            TPJRT_NOT_IMPLEMENTED,
            &["bitwise_and", "Float"],
        );
        release(&a).unwrap();
        release(&d).unwrap();
    });
}

#[test]
fn released_storage() {
    in_every_mode(|| {
        let a = upload_f32(&[1.0, 2.0], &[2]);
        let b = upload_f32(&[3.0, 4.0], &[2]);
        release(&a).unwrap();
        let id = a.storage.to_string();
        let fragments = ["pjrt storage", id.as_str(), "does not exist", "released"];
        expect_err(
            op(typed::Add, &[&b, &a], &[]),
            TPJRT_RUNTIME_ERROR,
            &fragments,
        );
        expect_err(read_f32(&a), TPJRT_RUNTIME_ERROR, &fragments);
        expect_err(write(&a, &[0u8; 8]), TPJRT_RUNTIME_ERROR, &fragments);
        expect_err(release(&a), TPJRT_RUNTIME_ERROR, &fragments);
        expect_err(
            check(tpjrt_storage_resize(a.storage, 4)),
            TPJRT_RUNTIME_ERROR,
            &fragments,
        );
        release(&b).unwrap();
    });
}

#[test]
fn non_contiguous_and_partial_views() {
    in_every_mode(|| {
        let base = upload_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let live = metric("live_storages");
        // base.t(): sizes [3, 2], strides [1, 3].
        let transposed = AbiTensor {
            sizes: vec![3, 2],
            strides: vec![1, 3],
            ..base.clone()
        };
        match op(typed::Neg, &[&transposed], &[]) {
            // Strided views supported: the values are those of the transpose.
            Ok(outs) => {
                let t = AbiTensor::from_output(&outs[0]);
                assert_eq!(
                    read_f32(&t).unwrap(),
                    vec![-1.0, -4.0, -2.0, -5.0, -3.0, -6.0]
                );
                release(&t).unwrap();
            }
            Err(err) => {
                assert_eq!(err.code, TPJRT_NOT_IMPLEMENTED, "{}", err.message);
                for f in [
                    "sizes [3, 2]",
                    "strides [1, 3]",
                    "not contiguous",
                    ".contiguous()",
                ] {
                    assert!(err.message.contains(f), "lacks {f:?}: {}", err.message);
                }
                assert_eq!(metric("live_storages"), live);
            }
        }
        // base[1]: an offset window on the storage.
        let row = AbiTensor {
            sizes: vec![3],
            strides: vec![1],
            offset: 3,
            ..base.clone()
        };
        match read_f32(&row) {
            Ok(values) => assert_eq!(values, vec![4.0, 5.0, 6.0]),
            Err(err) => {
                assert_eq!(err.code, TPJRT_NOT_IMPLEMENTED, "{}", err.message);
                assert!(err.message.contains("storage offset 3"), "{}", err.message);
            }
        }
        // A window reaching past the end of its storage is never valid.
        let past_end = AbiTensor {
            sizes: vec![4],
            strides: vec![2],
            ..base.clone()
        };
        let Err(err) = op(typed::Neg, &[&past_end], &[]) else {
            panic!("a window past the end of its storage must be refused");
        };
        assert_ne!(err.code, TPJRT_OK);
        assert!(
            err.message.contains("[4]") && err.message.contains("[2]"),
            "{}",
            err.message
        );
        // A negative ndim.
        let negative = TpjrtTensor {
            ndim: -1,
            ..base.raw()
        };
        let mut bytes = [0u8; 24];
        // SAFETY: `negative` borrows `base`; `bytes` is writable.
        let code = unsafe { tpjrt_read_host(&negative, bytes.as_mut_ptr().cast(), 24) };
        expect_err(check(code), TPJRT_RUNTIME_ERROR, &["ndim -1"]);
        release(&base).unwrap();
    });
}

#[test]
fn transfers_of_the_wrong_size() {
    in_every_mode(|| {
        let a = upload_f32(&[1.0, 2.0, 3.0], &[3]);
        expect_err(
            write(&a, &[0u8; 8]),
            TPJRT_RUNTIME_ERROR,
            &["3 float32 elements", "needs 12 bytes", "got 8 bytes"],
        );
        expect_err(
            read_bytes(&a, 16),
            TPJRT_RUNTIME_ERROR,
            &["12-byte buffer", "got 16 bytes"],
        );
        assert_eq!(
            read_f32(&a).unwrap(),
            vec![1.0, 2.0, 3.0],
            "the failed write changed nothing"
        );
        // SAFETY: a null source with a non-zero length is refused before it is read.
        let code = unsafe { tpjrt_write_host(&a.raw(), std::ptr::null(), 12) };
        expect_err(
            check(code),
            TPJRT_RUNTIME_ERROR,
            &["null pointer", "12 elements"],
        );
        release(&a).unwrap();
    });
}

#[test]
fn bad_scalars_params_and_pointers() {
    in_every_mode(|| {
        let a = upload_f32(&[1.0, 2.0], &[2]);
        let i = upload_i64(&[7, 8], &[2]);
        let bad_kind = TpjrtScalar {
            kind: 7,
            ..scalar_float(1.0)
        };
        expect_err(
            op(typed::Add, &[&a], &[bad_kind]),
            TPJRT_RUNTIME_ERROR,
            &["scalar kind 7", "expected 0 (bool), 1 (int) or 2 (float)"],
        );
        expect_err(
            op(
                typed::Div.encode(layout::DivRounding {
                    rounding_mode: RoundingMode::Floor,
                }),
                &[&i],
                &[scalar_int(0)],
            ),
            TPJRT_RUNTIME_ERROR,
            &["ZeroDivisionError"],
        );
        expect_err(
            op(typed::Add, &[&i], &[scalar_int(1), scalar_float(0.5)]),
            TPJRT_RUNTIME_ERROR,
            &["alpha must not be a floating point number"],
        );
        expect_err(
            op(
                typed::Sum.encode(layout::ReduceDtypeDims {
                    keepdim: false,
                    dtype: None,
                    dims: &[5],
                }),
                &[&a],
                &[],
            ),
            TPJRT_INDEX_ERROR,
            &["Dimension out of range", "got 5"],
        );
        // A null inputs array with a non-zero count.
        let call = TpjrtOpCall {
            op: op_id("neg"),
            inputs: std::ptr::null(),
            num_inputs: 2,
            scalars: std::ptr::null(),
            num_scalars: 0,
            params: std::ptr::null(),
            num_params: 0,
            outs: std::ptr::null(),
            num_outs: 0,
            default_float: -1,
            matmul_precision: 0,
            device: 0,
        };
        let mut n = 0u64;
        // SAFETY: the null array is refused before anything is read through it.
        let code = unsafe { tpjrt_op(&call, std::ptr::null_mut(), 0, &mut n) };
        expect_err(
            check(code),
            TPJRT_RUNTIME_ERROR,
            &["null pointer", "2 elements"],
        );
        // SAFETY: a null call is refused.
        let code = unsafe { tpjrt_op(std::ptr::null(), std::ptr::null_mut(), 0, &mut n) };
        expect_err(check(code), TPJRT_RUNTIME_ERROR, &["null op call"]);
        // A default dtype that is not a floating point one (int64's code is 4).
        let raw = [a.raw()];
        let call = TpjrtOpCall {
            op: op_id("neg"),
            inputs: raw.as_ptr(),
            num_inputs: 1,
            scalars: std::ptr::null(),
            num_scalars: 0,
            params: std::ptr::null(),
            num_params: 0,
            outs: std::ptr::null(),
            num_outs: 0,
            default_float: 4,
            matmul_precision: 0,
            device: 0,
        };
        // SAFETY: `raw` outlives the call.
        let code = unsafe { tpjrt_op(&call, std::ptr::null_mut(), 0, &mut n) };
        expect_err(
            check(code),
            TPJRT_TYPE_ERROR,
            &["default dtype must be a floating point dtype", "int64"],
        );
        release(&a).unwrap();
        release(&i).unwrap();
    });
}

#[test]
fn too_little_room_for_outputs() {
    in_every_mode(|| {
        let logp = upload_f32(&[-1.0, -2.0, -0.5, -3.0], &[2, 2]);
        let target = upload_i64(&[0, 1], &[2]);
        let live = metric("live_storages");
        let nll = typed::NllLoss.encode(layout::NllLossReduction {
            reduction: Reduction::Mean,
            ignore_index: -100,
        });
        let raw_inputs = [logp.raw(), target.raw()];
        let call = TpjrtOpCall {
            op: code_of(nll.op),
            inputs: raw_inputs.as_ptr(),
            num_inputs: 2,
            scalars: std::ptr::null(),
            num_scalars: 0,
            params: nll.params.as_ptr(),
            num_params: nll.params.len() as u64,
            outs: std::ptr::null(),
            num_outs: 0,
            default_float: -1,
            matmul_precision: 0,
            device: 0,
        };
        let mut one = [TpjrtOutput {
            storage: 0,
            dtype: 0,
            ndim: 0,
            sizes: [0; TPJRT_MAX_DIMS],
            nbytes: 0,
        }];
        let mut n = 0u64;
        // SAFETY: room for one output is passed, and said.
        let code = unsafe { tpjrt_op(&call, one.as_mut_ptr(), 1, &mut n) };
        expect_err(
            check(code),
            TPJRT_RUNTIME_ERROR,
            &["2 outputs", "room for 1"],
        );
        assert_eq!(n, 2, "the needed count is reported");
        assert_eq!(
            metric("live_storages"),
            live,
            "outputs the caller was never given must not stay allocated"
        );
        // With room: mean loss and total weight.
        let outs = op(nll.clone(), &[&logp, &target], &[]).unwrap();
        assert_eq!(outs.len(), 2);
        let loss = AbiTensor::from_output(&outs[0]);
        let weight = AbiTensor::from_output(&outs[1]);
        assert_eq!(read_f32(&loss).unwrap(), vec![2.0]);
        assert_eq!(read_f32(&weight).unwrap(), vec![2.0]);
        for t in [&logp, &target, &loss, &weight] {
            release(t).unwrap();
        }
    });
}

#[test]
fn bad_modes() {
    init();
    let _guard = global_lock();
    expect_err(
        check(tpjrt_mode_push(7)),
        TPJRT_VALUE_ERROR,
        &["mode code 7", "expected 0 (strict)"],
    );
    expect_err(
        check(tpjrt_mode_set(-1)),
        TPJRT_VALUE_ERROR,
        &["mode code -1"],
    );
    expect_err(check(tpjrt_mode_pop()), TPJRT_RUNTIME_ERROR, &["underflow"]);
    let mut mode = -1;
    // SAFETY: a writable int.
    check(unsafe { tpjrt_mode_get(&mut mode) }).unwrap();
    assert_eq!(mode, 0, "the default mode survives the failed calls");
    assert_usable(metric("live_storages"));
}

#[test]
fn each_status_code_names_its_python_exception_class() {
    let class = |code| {
        // SAFETY: the ABI returns a static NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(tpjrt_error_class(code)) }
            .to_str()
            .expect("ASCII")
            .to_string()
    };
    assert_eq!(class(TPJRT_RUNTIME_ERROR), "RuntimeError");
    assert_eq!(class(TPJRT_VALUE_ERROR), "ValueError");
    assert_eq!(class(TPJRT_TYPE_ERROR), "TypeError");
    assert_eq!(class(TPJRT_NOT_IMPLEMENTED), "NotImplementedError");
    assert_eq!(class(TPJRT_INDEX_ERROR), "IndexError");
    assert_eq!(class(99), "RuntimeError");
}
