//! Strided reads and writes through views in every mode, checked against a host model of
//! PyTorch's strided memory semantics.
mod common;
use common::*;
use defer::{Mode, TensorRef};
use ops::{DType, OpId, ScalarArg};
use smallvec::SmallVec;

fn view(base: &TensorRef, sizes: &[i64], strides: &[i64], offset: i64) -> TensorRef {
    TensorRef {
        storage: base.storage,
        dtype: base.dtype,
        sizes: SmallVec::from_slice(sizes),
        strides: SmallVec::from_slice(strides),
        offset,
    }
}

fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

#[test]
fn reads_through_transposes_slices_and_diagonals() {
    for mode in [Mode::Strict, Mode::Debug, Mode::DeferAndFuse] {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(16), &[4, 4]);
        // x.t()
        let t = view(&x, &[4, 4], &[1, 4], 0);
        let y = op(&e, typed::Add, &[&t], &[ScalarArg::float(0.5)]);
        let want: Vec<f32> = (0..16)
            .map(|i| ((i % 4) * 4 + i / 4) as f32 + 0.5)
            .collect();
        assert_eq!(read_f32(&e, &y), want, "{mode:?} transpose");
        // x[1:, ::2]
        let s = view(&x, &[3, 2], &[4, 2], 4);
        let y = op(&e, typed::Neg, &[&s], &[]);
        assert_eq!(
            read_f32(&e, &y),
            vec![-4., -6., -8., -10., -12., -14.],
            "{mode:?} slice"
        );
        // x.diagonal() read directly to the host
        let d = view(&x, &[4], &[5], 0);
        assert_eq!(
            read_f32(&e, &d),
            vec![0., 5., 10., 15.],
            "{mode:?} diagonal"
        );
    }
}

#[test]
fn writes_through_views_update_the_base() {
    for mode in [Mode::Strict, Mode::Debug, Mode::DeferAndFuse] {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(16), &[4, 4]);
        // x[:, 1::2].mul_(2)
        let cols = view(&x, &[4, 2], &[4, 2], 1);
        e.op(
            OpId::Mul,
            std::slice::from_ref(&cols),
            &[ScalarArg::float(2.0)],
            &[],
            std::slice::from_ref(&cols),
        )
        .unwrap();
        // x.diagonal().fill_(-1)
        let diag = view(&x, &[4], &[5], 0);
        e.op(
            OpId::Fill,
            std::slice::from_ref(&diag),
            &[ScalarArg::float(-1.0)],
            &[],
            std::slice::from_ref(&diag),
        )
        .unwrap();
        let mut want = iota(16);
        for r in 0..4 {
            for c in [1, 3] {
                want[r * 4 + c] *= 2.0;
            }
            want[r * 5] = -1.0;
        }
        assert_eq!(read_f32(&e, &x), want, "{mode:?}");
        // A sibling view reads the new base.
        let row = view(&x, &[4], &[1], 4);
        assert_eq!(read_f32(&e, &row), want[4..8].to_vec(), "{mode:?} sibling");
    }
}

#[test]
fn host_writes_into_a_strided_destination() {
    let e = engine(Mode::Strict);
    let x = upload_f32(&e, &[0.0; 6], &[2, 3]);
    // x[:, 1] = [7, 8]
    let col = view(&x, &[2], &[3], 1);
    let bytes: Vec<u8> = [7.0f32, 8.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    e.write_host(&col, &bytes).unwrap();
    assert_eq!(read_f32(&e, &x), vec![0., 7., 0., 0., 8., 0.]);
}

#[test]
fn overlapping_writes_are_rejected_with_pytorch_messages() {
    let e = engine(Mode::Strict);
    let x = upload_f32(&e, &iota(4), &[4]);
    // x.expand(3, 4).add_(1)
    let expanded = view(&x, &[3, 4], &[0, 1], 0);
    let err = e
        .op(
            OpId::Add,
            std::slice::from_ref(&expanded),
            &[ScalarArg::float(1.0)],
            &[],
            std::slice::from_ref(&expanded),
        )
        .unwrap_err();
    assert!(
        err.message
            .contains("more than one element of the written-to tensor"),
        "{}",
        err.message
    );
    // z[1:].add_(z[:-1])
    let tail = view(&x, &[3], &[1], 1);
    let head = view(&x, &[3], &[1], 0);
    let err = e
        .op(OpId::Add, &[tail.clone(), head], &[], &[], &[tail])
        .unwrap_err();
    assert!(
        err.message
            .contains("some elements of the input tensor and the written-to tensor"),
        "{}",
        err.message
    );
    // The engine is still usable and x unchanged.
    assert_eq!(read_f32(&e, &x), iota(4));
}

#[test]
fn dtype_reinterpretation_reads_bits() {
    let e = engine(Mode::Strict);
    let x = upload_f32(&e, &[1.0, -2.0], &[2]);
    let as_i32 = TensorRef {
        dtype: DType::I32,
        ..x.clone()
    };
    let y = op(&e, typed::Clone, &[&as_i32], &[]);
    let mut bytes = vec![0u8; 8];
    e.read_host(&y, &mut bytes).unwrap();
    let got: Vec<i32> = bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(
        got,
        vec![1.0f32.to_bits() as i32, (-2.0f32).to_bits() as i32]
    );
}
