//! Writes and reads through views where the engine's result must be PyTorch's: expanded
//! fills, overlap checks against whole outputs, empty views, index-list layouts, a fused chain
//! of writes, and a repeated program served from the cache. Each test states PyTorch's answer.

mod engine_support;

use defer::{Mode, TensorRef};
use engine_support::*;
use ops::{OpId, ScalarArg};

const MODES: [Mode; 3] = [Mode::Strict, Mode::Debug, Mode::DeferAndFuse];

fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

fn in_place(
    e: &torch_glue::Engine,
    op: OpId,
    t: &TensorRef,
    scalars: &[ScalarArg],
) -> Result<defer::Captured, defer::EngineError> {
    e.op(
        op,
        std::slice::from_ref(t),
        scalars,
        &[],
        std::slice::from_ref(t),
    )
}

/// `x[:, 2:3].expand(6, 5).fill_(-1)`: PyTorch fills expanded tensors (every element gets the
/// same value, so the order does not matter); only ops that read what they write refuse them.
#[test]
fn fill_through_an_expanded_view_writes_like_pytorch() {
    for mode in MODES {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(48), &[6, 8]);
        let expanded = view(&x, &[6, 5], &[8, 0], 2);
        in_place(&e, OpId::Fill, &expanded, &[ScalarArg::float(-1.0)])
            .unwrap_or_else(|err| panic!("{mode:?}: {}", err.message));
        let mut want = iota(48);
        for r in 0..6 {
            want[r * 8 + 2] = -1.0;
        }
        assert_eq!(download_f32(&e, &x), want, "{mode:?}");
    }
}

/// `x.expand(3, 4).mul_(2)` is refused, as PyTorch refuses it (reading and writing shared
/// elements), and leaves `x` unchanged.
#[test]
fn arithmetic_through_an_expanded_view_is_refused() {
    for mode in MODES {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(4), &[4]);
        let expanded = view(&x, &[3, 4], &[0, 1], 0);
        let err = in_place(&e, OpId::Mul, &expanded, &[ScalarArg::float(2.0)]).unwrap_err();
        assert!(
            err.message
                .contains("more than one element of the written-to tensor"),
            "{mode:?}: {}",
            err.message
        );
        assert_eq!(download_f32(&e, &x), iota(4), "{mode:?}");
    }
}

/// `x.add_(x[2])`: the input is part of the output; PyTorch raises "unsupported operation: some
/// elements of the input tensor and the written-to tensor refer to a single memory location".
#[test]
fn partial_overlap_with_a_whole_output_is_refused() {
    for mode in MODES {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(48), &[6, 8]);
        let row = view(&x, &[8], &[1], 16);
        let result = e.op(
            OpId::Add,
            &[x.clone(), row],
            &[],
            &[],
            std::slice::from_ref(&x),
        );
        let err = result.expect_err("x.add_(x[2]) must be refused");
        assert!(
            err.message
                .contains("some elements of the input tensor and the written-to tensor"),
            "{mode:?}: {}",
            err.message
        );
        assert_eq!(download_f32(&e, &x), iota(48), "{mode:?}");
    }
}

/// The same overlap through a view output is refused (the check the engine does make):
/// `f[1:9].add_(f[0:8])` with `f = x.view(-1)`, both dense.
#[test]
fn partial_overlap_with_a_view_output_is_refused() {
    for mode in MODES {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(48), &[6, 8]);
        let out = view(&x, &[8], &[1], 1);
        let input = view(&x, &[8], &[1], 0);
        let err = e
            .op(OpId::Add, &[out.clone(), input], &[], &[], &[out])
            .unwrap_err();
        assert!(
            err.message
                .contains("some elements of the input tensor and the written-to tensor"),
            "{mode:?}: {}",
            err.message
        );
        assert_eq!(download_f32(&e, &x), iota(48), "{mode:?}");
    }
}

/// `x[1:5, 2:6].add_(x[0:4, 2:6])`: neither view is dense, so PyTorch cannot tell and lets it
/// run; the engine reads both before writing.
#[test]
fn overlap_pytorch_cannot_see_is_allowed() {
    for mode in MODES {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(48), &[6, 8]);
        let out = view(&x, &[4, 4], &[8, 1], 10);
        let input = view(&x, &[4, 4], &[8, 1], 2);
        e.op(OpId::Add, &[out.clone(), input], &[], &[], &[out])
            .unwrap();
        let mut want = iota(48);
        for r in 1..5 {
            for c in 2..6 {
                want[r * 8 + c] += ((r - 1) * 8 + c) as f32;
            }
        }
        assert_eq!(download_f32(&e, &x), want, "{mode:?}");
    }
}

/// `x[:, 8:].cpu()`: an empty strided view reads as an empty array.
#[test]
fn reading_an_empty_strided_view() {
    for mode in MODES {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(48), &[6, 8]);
        let empty = view(&x, &[6, 0], &[8, 1], 8);
        assert_eq!(download(&e, &empty), Vec::<u8>::new(), "{mode:?}");
    }
}

/// `x[:, 8:].fill_(1)` and `x[:, 8:].add_(1)`: writes through empty views change nothing.
#[test]
fn writing_through_an_empty_view_changes_nothing() {
    for mode in MODES {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(48), &[6, 8]);
        let empty = view(&x, &[6, 0], &[8, 1], 8);
        in_place(&e, OpId::Fill, &empty, &[ScalarArg::float(1.0)]).unwrap();
        in_place(&e, OpId::Add, &empty, &[ScalarArg::float(1.0)]).unwrap();
        assert_eq!(download_f32(&e, &x), iota(48), "{mode:?}");
    }
}

/// `x.as_strided((3, 2), (3, 4), 1).neg_()`: the elements 1, 5, 4, 8, 7, 11 interleave, so the
/// read is a gather and the write the scatter fallback.
#[test]
fn interleaved_as_strided_read_and_write() {
    for mode in MODES {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(12), &[12]);
        let interleaved = view(&x, &[3, 2], &[3, 4], 1);
        assert_eq!(
            download_f32(&e, &interleaved),
            vec![1., 5., 4., 8., 7., 11.],
            "{mode:?} read"
        );
        in_place(&e, OpId::Neg, &interleaved, &[]).unwrap();
        let mut want = iota(12);
        for i in [1, 4, 5, 7, 8, 11] {
            want[i] = -want[i];
        }
        assert_eq!(download_f32(&e, &x), want, "{mode:?} write");
    }
}

/// `x.as_strided((5, 4), (2, 1)).copy_(src)`: overlapping windows; PyTorch writes in row-major
/// order, so each location keeps the last window element written to it.
#[test]
fn overlapping_as_strided_copy_keeps_the_last_writer() {
    for mode in MODES {
        let e = engine(mode);
        let x = upload_f32(&e, &iota(16), &[16]);
        let src = upload_f32(
            &e,
            &(100..120).map(|v| v as f32).collect::<Vec<_>>(),
            &[5, 4],
        );
        let windows = view(&x, &[5, 4], &[2, 1], 0);
        e.op(
            OpId::Copy,
            &[windows.clone(), src],
            &[],
            &[],
            std::slice::from_ref(&windows),
        )
        .unwrap();
        // PyTorch: x[:12] = [100, 101, 104, 105, 108, 109, 112, 113, 116, 117, 118, 119]
        let mut want = iota(16);
        want[..12].copy_from_slice(&[
            100., 101., 104., 105., 108., 109., 112., 113., 116., 117., 118., 119.,
        ]);
        assert_eq!(download_f32(&e, &x), want, "{mode:?}");
    }
}

/// DeferAndFuse: `y[1].copy_(y.transpose(0, 2)[1:4].neg()[:20])` then
/// `y.view(torch.int32)[2, 1::2].copy_(-that)`, fused into one region. The module is right; the
/// XLA CPU plugin computes 3 wrong elements of the first write.
#[test]
fn two_fused_writes_through_views_of_one_base() {
    let data: Vec<f32> = (0..60).map(|i| i as f32 + 1.0).collect();
    let mut results = Vec::new();
    for mode in MODES {
        let e = engine(mode);
        let y = upload_f32(&e, &data, &[3, 4, 5]);
        let t = view(&y, &[3, 4, 3], &[1, 5, 20], 1);
        let negated = output(&e.op(OpId::Neg, &[t], &[], &[], &[]).unwrap());
        let row = view(&y, &[4, 5], &[5, 1], 20);
        let prefix = view(&negated, &[4, 5], &[5, 1], 0);
        e.op(OpId::Copy, &[row.clone(), prefix], &[], &[], &[row])
            .unwrap();
        let bits = view_as(&y, ops::DType::I32, &[2, 5], &[10, 1], 45);
        let flipped = output(
            &e.op(OpId::Neg, std::slice::from_ref(&bits), &[], &[], &[])
                .unwrap(),
        );
        e.op(OpId::Copy, &[bits.clone(), flipped], &[], &[], &[bits])
            .unwrap();
        let got = download_f32(&e, &y);
        // y[1] holds -y[k, j, 1 + i] for flat (i, j, k) < 20 of the [3, 4, 3] view.
        for n in 0..20 {
            let (i, j, k) = (n / 12, (n / 3) % 4, n % 3);
            let source = k * 20 + j * 5 + 1 + i;
            assert_eq!(got[20 + n], -data[source], "{mode:?} y[{}]", 20 + n);
        }
        results.push(got);
    }
    assert_eq!(results[0], results[2], "Strict and DeferAndFuse");
}

/// The same Strict program again and again on other data: after the first run nothing
/// compiles.
#[test]
fn a_repeated_strict_program_is_served_from_the_cache() {
    let e = engine(Mode::Strict);
    let mut compilations = Vec::new();
    for round in 0..20 {
        let data: Vec<f32> = (0..60).map(|i| (i * (round + 1)) as f32).collect();
        let y = upload_f32(&e, &data, &[3, 4, 5]);
        // y[1].fill_(-2); y[:, 1:3, ::2].add_(y[:, 1:3, ::2])
        let row = view(&y, &[4, 5], &[5, 1], 20);
        in_place(&e, OpId::Fill, &row, &[ScalarArg::float(-2.0)]).unwrap();
        let strided = view(&y, &[3, 2, 3], &[20, 5, 2], 5);
        e.op(
            OpId::Add,
            &[strided.clone(), strided.clone()],
            &[],
            &[],
            std::slice::from_ref(&strided),
        )
        .unwrap();
        let got = download_f32(&e, &y);
        let mut want = data.clone();
        want[20..40].fill(-2.0);
        for a in 0..3 {
            for b in 1..3 {
                for c in [0, 2, 4] {
                    want[a * 20 + b * 5 + c] *= 2.0;
                }
            }
        }
        assert_eq!(got, want, "round {round}");
        e.sync().unwrap();
        compilations.push(metric(&e, "compilations"));
        e.release_storage(y.storage).unwrap();
    }
    assert!(
        compilations.iter().all(|&c| c == compilations[0]),
        "compilations after each run: {compilations:?}"
    );
}
