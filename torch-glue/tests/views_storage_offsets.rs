//! Tensors at other offsets of a storage: `as_strided` with a storage offset, `set_` onto a
//! storage (also one of another dtype, as `torch.load` does with byte storages), and `resize_`
//! of storages, through the engine in every mode.

mod engine_support;

use defer::{Mode, TensorRef};
use engine_support::*;
use ops::{DType, OpId, ScalarArg};

const MODES: [Mode; 3] = [Mode::Strict, Mode::Debug, Mode::DeferAndFuse];

fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

fn in_place(e: &torch_glue::Engine, op: OpId, t: &TensorRef, scalars: &[ScalarArg]) {
    e.op(
        op,
        std::slice::from_ref(t),
        scalars,
        &[],
        std::slice::from_ref(t),
    )
    .unwrap_or_else(|err| panic!("{}: {}", op.name(), err.message));
}

/// `t = x.as_strided((2, 3), (3, 1), 20)`; `t.mul_(2)`;
/// `x.as_strided((6,), (1,), 40).copy_(t.neg())`.
#[test]
fn as_strided_with_a_storage_offset_reads_and_writes() {
    for mode in MODES {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(48), &[48]);
        let t = view(&x, &[2, 3], &[3, 1], 20);
        assert_eq!(
            download_f32(&e, &t),
            vec![20., 21., 22., 23., 24., 25.],
            "{mode:?}"
        );
        in_place(&e, OpId::Mul, &t, &[ScalarArg::float(2.0)]);
        let negated = output(
            &e.op(OpId::Neg, std::slice::from_ref(&t), &[], &[], &[])
                .unwrap(),
        );
        let tail = view(&x, &[6], &[1], 40);
        let source = view(&negated, &[6], &[1], 0);
        e.op(
            OpId::Copy,
            &[tail.clone(), source],
            &[],
            &[],
            std::slice::from_ref(&tail),
        )
        .unwrap();
        let mut want = iota(48);
        for v in &mut want[20..26] {
            *v *= 2.0;
        }
        for i in 0..6 {
            want[40 + i] = -want[20 + i];
        }
        assert_eq!(download_f32(&e, &x), want, "{mode:?} base");
        assert_eq!(
            download_f32(&e, &t),
            want[20..26].to_vec(),
            "{mode:?} the offset view reads the new base"
        );
        assert_eq!(download_f32(&e, &tail), want[40..46].to_vec(), "{mode:?}");
    }
}

/// `b.set_(a.untyped_storage(), 16, (4, 4))`: host writes into `b` land at offset 16 of `a`;
/// then `b.set_(a.untyped_storage(), 44, (4,))` (the last elements) and an op through it.
#[test]
fn set_onto_another_offset_of_a_storage() {
    for mode in MODES {
        let e = engine(mode);
        let a = upload_f32(&e, &iota(48), &[6, 8]);
        let b = view(&a, &[4, 4], &[4, 1], 16);
        let values: Vec<f32> = (0..16).map(|i| 100.0 + i as f32).collect();
        e.write_host(&b, &f32_bytes(&values)).unwrap();
        let mut want = iota(48);
        want[16..32].copy_from_slice(&values);
        assert_eq!(download_f32(&e, &a), want, "{mode:?}");
        assert_eq!(download_f32(&e, &b), values, "{mode:?}");

        let b = view(&a, &[4], &[1], 44);
        in_place(&e, OpId::Add, &b, &[ScalarArg::float(0.5)]);
        for v in &mut want[44..48] {
            *v += 0.5;
        }
        assert_eq!(download_f32(&e, &a), want, "{mode:?} tail");
    }
}

/// `torch.load`'s path: a storage written as bytes, then tensors `set_` onto it as f32 at a
/// byte offset, read and written.
#[test]
fn set_onto_a_byte_storage_reinterprets_its_bytes() {
    for mode in MODES {
        let e = engine(mode);
        let floats = [1.5f32, -2.0, 3.25, 4.0];
        let bytes = f32_bytes(&floats);
        let storage = upload(&e, DType::U8, &[16], &bytes);
        // t = torch.empty(0).set_(storage, 1, (3,)): the floats at bytes 4..16
        let t = view_as(&storage, DType::F32, &[3], &[1], 1);
        assert_eq!(download_f32(&e, &t), floats[1..].to_vec(), "{mode:?} read");
        in_place(&e, OpId::Mul, &t, &[ScalarArg::float(2.0)]);
        let want = f32_bytes(&[1.5, -4.0, 6.5, 8.0]);
        assert_eq!(download(&e, &storage), want, "{mode:?} the bytes changed");
        // The first float, through a one-element view at offset 0.
        let first = view_as(&storage, DType::F32, &[], &[], 0);
        assert_eq!(download_f32(&e, &first), vec![1.5], "{mode:?}");
    }
}

/// A storage read or written only through offset views before it has any value reads zeros
/// elsewhere.
#[test]
fn offset_views_of_an_unwritten_storage() {
    for mode in MODES {
        let e = engine(mode);
        let storage = e.new_storage(16 * 4);
        let whole = TensorRef::contiguous(storage, DType::F32, &[16]);
        let middle = view(&whole, &[2, 2], &[4, 1], 9);
        assert_eq!(download_f32(&e, &middle), vec![0.0; 4], "{mode:?}");
        in_place(&e, OpId::Add, &middle, &[ScalarArg::float(1.0)]);
        let mut want = vec![0.0f32; 16];
        for i in [9, 10, 13, 14] {
            want[i] = 1.0;
        }
        assert_eq!(download_f32(&e, &whole), want, "{mode:?}");
    }
}

/// `resize_` of a storage nothing has written: the new size holds, reads give zeros, and
/// writes through views of the resized storage land where they should.
#[test]
fn resize_of_an_unwritten_storage() {
    for mode in MODES {
        let e = engine(mode);
        let storage = e.new_storage(4 * 4);
        let small = TensorRef::contiguous(storage, DType::F32, &[4]);
        // A read fixes nothing: the storage is still unwritten.
        assert_eq!(download_f32(&e, &small), vec![0.0; 4], "{mode:?}");
        e.resize_storage(storage, 12 * 4).unwrap();
        assert_eq!(e.storage_nbytes(storage).unwrap(), 48);
        let large = TensorRef::contiguous(storage, DType::F32, &[12]);
        assert_eq!(download_f32(&e, &large), vec![0.0; 12], "{mode:?}");
        // The old size no longer describes the whole storage: a view of it is a prefix.
        in_place(&e, OpId::Fill, &small, &[ScalarArg::float(3.0)]);
        let tail = view(&large, &[4], &[2], 4);
        in_place(&e, OpId::Fill, &tail, &[ScalarArg::float(-1.0)]);
        let want = vec![3., 3., 3., 3., -1., 0., -1., 0., -1., 0., -1., 0.];
        assert_eq!(download_f32(&e, &large), want, "{mode:?}");
        // Shrinking is a resize too, and the dtype may change while nothing is written.
        let other = e.new_storage(64);
        e.resize_storage(other, 8).unwrap();
        let as_i64 = TensorRef::contiguous(other, DType::I64, &[1]);
        assert_eq!(download(&e, &as_i64), vec![0u8; 8], "{mode:?}");
    }
}

/// PyTorch's `resize_` of a written storage keeps its bytes (`x.untyped_storage().resize_(32)`
/// then `x.set_(storage, 0, (8,))`: the first four elements are still 0..3).
#[test]
fn resize_of_a_written_storage_keeps_its_bytes() {
    for mode in MODES {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(4), &[4]);
        e.resize_storage(x.storage, 32).unwrap();
        let grown = TensorRef::contiguous(x.storage, DType::F32, &[8]);
        assert_eq!(download_f32(&e, &grown)[..4], iota(4), "{mode:?}");
    }
}

/// `x.as_strided((4,), (1,), 46)` on 48 elements reaches past the end: PyTorch's `setStorage`
/// message, and the engine stays usable.
#[test]
fn as_strided_past_the_end_is_refused() {
    for mode in MODES {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(48), &[48]);
        let past = view(&x, &[4], &[1], 46);
        let err = e
            .op(OpId::Neg, std::slice::from_ref(&past), &[], &[], &[])
            .unwrap_err();
        assert!(
            err.message
                .contains("out of bounds for storage of size 192"),
            "{mode:?}: {}",
            err.message
        );
        let last = view(&x, &[2], &[1], 46);
        let negated = output(&e.op(OpId::Neg, &[last], &[], &[], &[]).unwrap());
        assert_eq!(download_f32(&e, &negated), vec![-46., -47.], "{mode:?}");
    }
}
