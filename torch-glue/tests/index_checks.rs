//! Out-of-range indices (RFC 0012): indices whose values the host knows (uploads) are checked at
//! capture, raising PyTorch's error at the op in every mode; others are checked on the device,
//! raising at the op in Debug mode and at the next materialization point in Strict and
//! DeferAndFuse. The error is reported once and the engine stays usable.

mod engine_support;

use defer::{Mode, TensorRef};
use engine_support::*;
use ops::{param_layout as layout, typed, DType, ErrorKind, OpId};

fn upload_i64(e: &torch_glue::Engine, values: &[i64], sizes: &[i64]) -> TensorRef {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    upload(e, DType::I64, sizes, &bytes)
}

/// The values uploaded, then negated twice on the device: values the host does not follow.
fn computed_i64(e: &torch_glue::Engine, values: &[i64], sizes: &[i64]) -> TensorRef {
    let mut t = upload_i64(e, values, sizes);
    for _ in 0..2 {
        t = output(&e.op(OpId::Neg, &[t], &[], &[], &[]).expect("neg"));
    }
    t
}

#[test]
fn uploaded_indices_raise_at_the_op_in_every_mode() {
    for mode in [Mode::Strict, Mode::Debug, Mode::DeferAndFuse] {
        let e = engine(mode);
        let weight = upload_f32(&e, &(0..15).map(|v| v as f32).collect::<Vec<_>>(), &[5, 3]);
        let bad = upload_i64(&e, &[1, 7, 9], &[3]);
        let (executions, deferred) = (metric(&e, "executions"), metric(&e, "deferred_ops"));
        let err = e
            .op(OpId::Embedding, &[weight.clone(), bad], &[], &[], &[])
            .expect_err("raised at the op");
        assert_eq!(err.kind, ErrorKind::Index, "{mode:?}: {}", err.message);
        assert_eq!(err.message, "index out of range in self", "{mode:?}");
        // Nothing was captured or run for it, and no device check was made.
        assert_eq!(metric(&e, "executions"), executions, "{mode:?}");
        assert_eq!(metric(&e, "deferred_ops"), deferred, "{mode:?}");
        assert_eq!(metric(&e, "host_index_checks"), 1.0, "{mode:?}");
        assert_eq!(metric(&e, "device_index_checks"), 0.0, "{mode:?}");
        // The first bad index in row-major order, through a transposed view.
        let index = upload_i64(&e, &[0, 2, -1, 6], &[2, 2]);
        let transposed = view(&index, &[2, 2], &[1, 2], 0);
        let gather = typed::Gather.encode(layout::Dim { dim: 1 });
        let err = e
            .op(gather.op, &[weight, transposed], &[], &gather.params, &[])
            .expect_err("raised at the op");
        assert_eq!(err.kind, ErrorKind::Runtime, "{mode:?}");
        assert_eq!(
            err.message, "index -1 is out of bounds for dimension 1 with size 3",
            "{mode:?}"
        );
        e.sync().expect("nothing left to report");
    }
}

#[test]
fn out_of_range_computed_indices_raise_pytorchs_errors_in_every_mode() {
    for mode in [Mode::Strict, Mode::Debug, Mode::DeferAndFuse] {
        let e = engine(mode);
        let weight = upload_f32(&e, &(0..15).map(|v| v as f32).collect::<Vec<_>>(), &[5, 3]);
        let bad = computed_i64(&e, &[1, 7, 9], &[3]);
        let result = e.op(
            OpId::Embedding,
            &[weight.clone(), bad.clone()],
            &[],
            &[],
            &[],
        );
        let err = match mode {
            // Debug waits for the op and its check: the error comes from the op itself.
            Mode::Debug => result.expect_err("debug raises at the op"),
            _ => {
                let out = output(&result.expect("the op is captured"));
                let mut bytes = vec![0u8; 3 * 3 * 4];
                e.read_host(&out, &mut bytes)
                    .expect_err("the read reports the check")
            }
        };
        assert_eq!(err.kind, ErrorKind::Index, "{mode:?}: {}", err.message);
        assert_eq!(err.message, "index out of range in self", "{mode:?}");

        // Reported once: the next reads and syncs succeed, and in-range indices pass.
        e.sync().expect("the check was consumed");
        let good = upload_i64(&e, &[4, 0], &[2]);
        let index_select = typed::IndexSelect.encode(layout::Dim { dim: 0 });
        let gathered = e
            .op(
                index_select.op,
                &[weight.clone(), good],
                &[],
                &index_select.params,
                &[],
            )
            .expect("index_select");
        assert_eq!(
            download_f32(&e, &output(&gathered)),
            vec![12., 13., 14., 0., 1., 2.],
            "{mode:?}"
        );

        assert_eq!(metric(&e, "device_index_checks"), 1.0, "{mode:?}");
        // gather's error is a RuntimeError naming the first bad index in row-major order.
        let index = computed_i64(&e, &[0, 2, -1, 6], &[2, 2]);
        let gather = typed::Gather.encode(layout::Dim { dim: 1 });
        let result = e.op(gather.op, &[weight, index], &[], &gather.params, &[]);
        let err = match result {
            Err(err) => err,
            Ok(_) => e.sync().expect_err("sync reports the check"),
        };
        assert_eq!(err.kind, ErrorKind::Runtime, "{mode:?}");
        assert_eq!(
            err.message, "index -1 is out of bounds for dimension 1 with size 3",
            "{mode:?}"
        );
        e.sync().expect("usable afterwards");
    }
}

#[test]
fn defer_and_fuse_runs_the_check_inside_the_region() {
    let e = engine(Mode::DeferAndFuse);
    let weight = upload_f32(&e, &[1., 2., 3., 4.], &[2, 2]);
    let index = computed_i64(&e, &[1, 0, 1], &[3]);
    e.sync().unwrap();
    let executions = metric(&e, "executions");
    let out = e
        .op(OpId::Embedding, &[weight, index], &[], &[], &[])
        .expect("embedding");
    assert_eq!(
        metric(&e, "executions"),
        executions,
        "nothing runs at capture"
    );
    assert_eq!(
        download_f32(&e, &output(&out)),
        vec![3., 4., 1., 2., 3., 4.]
    );
    assert_eq!(
        metric(&e, "executions"),
        executions + 1.0,
        "op and check run as one region"
    );
}
