//! Snapshots of the StableHLO the capture graph emits for writes through views: what a strided
//! in-place op, a transpose, a diagonal, a dtype-reinterpreting view and a layout no box
//! expresses (the scatter fallback) become inside one module.

use defer::{FlushRequest, Graph, TensorRef};
use ops::{DType, OpId, ScalarArg};
use smallvec::SmallVec;

fn view(base: &TensorRef, dtype: DType, sizes: &[i64], strides: &[i64], offset: i64) -> TensorRef {
    TensorRef {
        storage: base.storage,
        dtype,
        sizes: SmallVec::from_slice(sizes),
        strides: SmallVec::from_slice(strides),
        offset,
    }
}

/// A graph over plain `u32` device values with one written f32 storage of `sizes`.
fn graph_with_base(sizes: &[i64]) -> (Graph<u32>, TensorRef) {
    let mut graph = Graph::new();
    let numel: i64 = sizes.iter().product();
    let storage = graph.new_storage(numel as u64 * 4);
    let x = TensorRef::contiguous(storage, DType::F32, sizes);
    graph.write_device(&x, 0u32).expect("write");
    (graph, x)
}

/// `t.<op>_(scalars)`: `t` is both the input and the destination.
fn in_place(graph: &mut Graph<u32>, op: OpId, t: &TensorRef, scalars: &[ScalarArg]) {
    graph
        .capture(
            op,
            std::slice::from_ref(t),
            scalars,
            &[],
            std::slice::from_ref(t),
        )
        .expect("capture");
}

/// The module of everything pending.
fn module(graph: &mut Graph<u32>) -> String {
    let flush = graph
        .flush(FlushRequest::All, |_| 0u32)
        .expect("flush")
        .expect("something to run");
    fuse::build_module(&flush.source().build()).expect("module")
}

#[test]
fn strided_columns_mul_in_place() {
    // x[:, 1::2].mul_(2) on a 4×6 base
    let (mut graph, x) = graph_with_base(&[4, 6]);
    let columns = view(&x, DType::F32, &[4, 3], &[6, 2], 1);
    in_place(&mut graph, OpId::Mul, &columns, &[ScalarArg::float(2.0)]);
    insta::assert_snapshot!(module(&mut graph));
}

#[test]
fn transpose_add_in_place() {
    // x.t().add_(1) on a 3×5 base
    let (mut graph, x) = graph_with_base(&[3, 5]);
    let t = view(&x, DType::F32, &[5, 3], &[1, 5], 0);
    in_place(&mut graph, OpId::Add, &t, &[ScalarArg::float(1.0)]);
    insta::assert_snapshot!(module(&mut graph));
}

#[test]
fn diagonal_zero_in_place() {
    // x.diagonal().zero_() on a 4×4 base
    let (mut graph, x) = graph_with_base(&[4, 4]);
    let diagonal = view(&x, DType::F32, &[4], &[5], 0);
    in_place(&mut graph, OpId::Fill, &diagonal, &[ScalarArg::float(0.0)]);
    insta::assert_snapshot!(module(&mut graph));
}

#[test]
fn int32_view_add_in_place() {
    // x.view(torch.int32)[1::2].add_(1 << 23) on an f32[8] base: the exponent of every other
    // element steps up by one.
    let (mut graph, x) = graph_with_base(&[8]);
    let odd = view(&x, DType::I32, &[4], &[2], 1);
    in_place(&mut graph, OpId::Add, &odd, &[ScalarArg::int(1 << 23)]);
    insta::assert_snapshot!(module(&mut graph));
}

#[test]
fn int16_view_fill_in_place() {
    // x.view(torch.int16)[1::2].fill_(0x4040) on an f32[4] base: a narrower view element.
    let (mut graph, x) = graph_with_base(&[4]);
    let high_halves = view(&x, DType::I16, &[4], &[2], 1);
    in_place(
        &mut graph,
        OpId::Fill,
        &high_halves,
        &[ScalarArg::int(0x4040)],
    );
    insta::assert_snapshot!(module(&mut graph));
}

#[test]
fn interleaved_as_strided_write_falls_back_to_scatter() {
    // x.as_strided((3, 2), (4, 3), 1).neg_() on an f32[12] base: elements 1, 4, 5, 8, 9, 12 ...
    // interleave, so no strided box holds exactly them.
    let (mut graph, x) = graph_with_base(&[12]);
    let interleaved = view(&x, DType::F32, &[3, 2], &[3, 4], 1);
    let program = views::invert(12, 4, &views::Layout::new(4, &[3, 2], &[3, 4], 1)).unwrap();
    assert!(
        matches!(program.step, views::WriteStep::Scatter { .. }),
        "{program}"
    );
    in_place(&mut graph, OpId::Neg, &interleaved, &[]);
    insta::assert_snapshot!(module(&mut graph));
}
