//! The chosen chains for each kind of view: short, gather-free where a box fits, and correct.

mod common;

use common::{base_array, bytes};
use views::eval::{eval_chain, eval_write, HostArray};
use views::reference::StridedMemory;
use views::{decompose, invert, Layout, ViewError, WriteStep};

/// The read chain of `view`, checked against the reference model, as text.
fn read(base_len: i64, base_elem_size: usize, view: &Layout) -> String {
    let chain = decompose(base_len, base_elem_size, view).unwrap();
    let base = base_array(base_len, base_elem_size, 7);
    let expected = StridedMemory::new(base.bytes.clone()).read(view);
    assert_eq!(eval_chain(&chain, &base).unwrap(), expected, "{chain}");
    chain.to_string()
}

/// The write program of `view`, checked against the reference model, as text.
fn write(base_len: i64, base_elem_size: usize, view: &Layout) -> String {
    let program = invert(base_len, base_elem_size, view).unwrap();
    let base = base_array(base_len, base_elem_size, 7);
    let update = HostArray::new(
        view.elem_size,
        &view.sizes,
        bytes(11, view.numel() as usize * view.elem_size),
    );
    let mut memory = StridedMemory::new(base.bytes.clone());
    memory.write(view, &update);
    let got = eval_write(&program, &base, &update).unwrap();
    assert_eq!(got.bytes, memory.bytes, "{program}");
    program.to_string()
}

fn f32_view(sizes: &[i64], strides: &[i64], offset: i64) -> Layout {
    Layout::new(4, sizes, strides, offset)
}

#[test]
fn contiguous_is_one_reshape() {
    assert_eq!(
        read(32, 4, &Layout::contiguous(4, &[4, 8])),
        "[32] | reshape [4,8]"
    );
    assert_eq!(read(32, 4, &Layout::contiguous(4, &[32])), "[32]");
    assert_eq!(
        read(32, 4, &Layout::contiguous(4, &[2, 2, 8])),
        "[32] | reshape [2,2,8]"
    );
}

#[test]
fn contiguous_prefix_of_a_larger_storage_is_slice_and_reshape() {
    assert_eq!(
        read(35, 4, &Layout::contiguous(4, &[4, 8])),
        "[35] | slice [0:32] | reshape [4,8]"
    );
}

#[test]
fn transpose_is_reshape_and_transpose() {
    assert_eq!(
        read(32, 4, &f32_view(&[8, 4], &[1, 8], 0)),
        "[32] | reshape [4,8] | transpose [1,0]"
    );
}

#[test]
fn permutation_is_reshape_and_transpose() {
    // x.permute(2, 0, 1) of a contiguous [2, 3, 4].
    assert_eq!(
        read(24, 4, &f32_view(&[4, 2, 3], &[1, 12, 4], 0)),
        "[24] | reshape [2,3,4] | transpose [2,0,1]"
    );
}

#[test]
fn sub_box_is_reshape_and_slice() {
    // x[1:3, 2:5] of a contiguous [4, 8].
    assert_eq!(
        read(32, 4, &f32_view(&[2, 3], &[8, 1], 10)),
        "[32] | reshape [4,8] | slice [1:3,2:5]"
    );
    // x[:, 1:3, :] of a contiguous [3, 4, 5] keeps the natural box.
    assert_eq!(
        read(60, 4, &f32_view(&[3, 2, 5], &[20, 5, 1], 5)),
        "[60] | reshape [3,4,5] | slice [0:3,1:3,0:5]"
    );
}

#[test]
fn stepped_slice_of_transpose() {
    // x[:, 1::2].t() of a contiguous 1024 x 1024.
    assert_eq!(
        read(1 << 20, 4, &f32_view(&[512, 1024], &[2, 1024], 1)),
        "[1048576] | reshape [1024,1024] | slice [0:1024,1:1024:2] | transpose [1,0]"
    );
    // x[1:3].t() of a contiguous [4, 8].
    assert_eq!(
        read(32, 4, &f32_view(&[8, 2], &[1, 8], 8)),
        "[32] | reshape [4,8] | slice [1:3,0:8] | transpose [1,0]"
    );
}

#[test]
fn diagonal_is_a_strided_slice() {
    assert_eq!(
        read(64, 4, &f32_view(&[8], &[9], 0)),
        "[64] | slice [0:64:9]"
    );
    // Batched: x.diagonal(dim1=1, dim2=2) of [3, 8, 8].
    assert_eq!(
        read(192, 4, &f32_view(&[3, 8], &[64, 9], 0)),
        "[192] | reshape [3,64] | slice [0:3,0:64:9]"
    );
    // An off-diagonal: x.diagonal(1) of [4, 4].
    assert_eq!(
        read(16, 4, &f32_view(&[3], &[5], 1)),
        "[16] | slice [1:12:5]"
    );
}

#[test]
fn select_narrow_unbind_split_are_slices() {
    // x[2] of [4, 8].
    assert_eq!(
        read(32, 4, &f32_view(&[8], &[1], 16)),
        "[32] | slice [16:24]"
    );
    // x[:, 3] (a column).
    assert_eq!(
        read(32, 4, &f32_view(&[4], &[8], 3)),
        "[32] | slice [3:28:8]"
    );
    // x.split(2, dim=1)[1] of [4, 8].
    assert_eq!(
        read(32, 4, &f32_view(&[4, 2], &[8, 1], 2)),
        "[32] | reshape [4,8] | slice [0:4,2:4]"
    );
    // x.unbind(0)[1] of [2, 3, 4] then narrow(1, 1, 2).
    assert_eq!(
        read(24, 4, &f32_view(&[3, 2], &[4, 1], 13)),
        "[24] | reshape [6,4] | slice [3:6,1:3]"
    );
}

#[test]
fn size_one_dims_ignore_their_strides() {
    assert_eq!(
        read(32, 4, &f32_view(&[1, 4, 1, 8], &[99, 8, 7, 1], 0)),
        "[32] | reshape [1,4,1,8]"
    );
}

#[test]
fn expand_is_a_broadcast() {
    // x[None].expand(3, 4, 8).
    assert_eq!(
        read(32, 4, &f32_view(&[3, 4, 8], &[0, 8, 1], 0)),
        "[32] | reshape [4,8] | broadcast_in_dim [3,4,8] dims [1,2]"
    );
    // An element expanded: x[0, 5].expand(3, 4).
    assert_eq!(
        read(32, 4, &f32_view(&[3, 4], &[0, 0], 5)),
        "[32] | slice [5:6] | broadcast_in_dim [3,4] dims [0]"
    );
    // A column expanded: x[:, :1].expand(4, 3).
    assert_eq!(
        read(32, 4, &f32_view(&[4, 3], &[8, 0], 0)),
        "[32] | slice [0:25:8] | broadcast_in_dim [4,3] dims [0]"
    );
}

#[test]
fn dtype_views_bitcast() {
    // f32 storage seen as uint8.
    assert_eq!(
        read(8, 4, &Layout::new(1, &[32], &[1], 0)),
        "[8] | bitcast_convert 4B->1B | reshape [32]"
    );
    assert_eq!(
        read(32, 4, &Layout::new(1, &[4, 32], &[32, 1], 0)),
        "[32] | bitcast_convert 4B->1B | reshape [4,32]"
    );
    // uint8 storage seen as f32.
    assert_eq!(
        read(32, 1, &Layout::new(4, &[8], &[1], 0)),
        "[32] | reshape [8,4] | bitcast_convert 1B->4B"
    );
    // uint8 storage of odd length seen as f32, a slice of it.
    assert_eq!(
        read(35, 1, &Layout::new(4, &[2], &[1], 3)),
        "[35] | slice [12:20] | reshape [2,4] | bitcast_convert 1B->4B"
    );
    // f64 storage seen as f16, a sub-box.
    assert_eq!(
        read(6, 8, &Layout::new(2, &[3, 2], &[8, 1], 1)),
        "[6] | bitcast_convert 8B->2B | reshape [3,8] | slice [0:3,1:3]"
    );
}

#[test]
fn empty_views_slice_nothing() {
    assert_eq!(
        read(16, 4, &f32_view(&[2, 0], &[6, 4], 0)),
        "[16] | slice [0:0] | reshape [2,0]"
    );
}

#[test]
fn zero_dim_view_is_one_element() {
    assert_eq!(
        read(16, 4, &f32_view(&[], &[], 7)),
        "[16] | slice [7:8] | reshape []"
    );
}

#[test]
fn a_box_overrunning_the_storage_is_padded() {
    // Rows of 4 in a storage of 6 elements: the second row's box ends past the storage.
    assert_eq!(
        read(6, 4, &f32_view(&[2, 2], &[4, 1], 0)),
        "[6] | pad low [0] high [2] | reshape [2,4] | slice [0:2,0:2]"
    );
}

#[test]
fn gather_only_when_no_box_fits() {
    // Overlapping windows (unfold).
    assert_eq!(
        read(8, 4, &f32_view(&[5, 4], &[1, 1], 0)),
        "[8] | gather 20 indices to [5,4]"
    );
    // Interleaved dims: no dim fits within one step of the other.
    assert_eq!(
        read(16, 4, &f32_view(&[2, 3], &[6, 4], 0)),
        "[16] | gather 6 indices to [2,3]"
    );
    // Expanded dims are broadcast after the gather, not gathered.
    assert_eq!(
        read(16, 4, &f32_view(&[2, 5, 3], &[6, 0, 4], 0)),
        "[16] | gather 6 indices to [2,3] | broadcast_in_dim [2,5,3] dims [0,2]"
    );
}

#[test]
fn contiguous_write_replaces() {
    assert_eq!(
        write(32, 4, &Layout::contiguous(4, &[4, 8])),
        "base: [32] | reshape [4,8]; update: [4,8]; replace; restore: [4,8] | reshape [32]"
    );
}

#[test]
fn sub_box_write_is_one_update_slice() {
    assert_eq!(
        write(32, 4, &f32_view(&[2, 3], &[8, 1], 10)),
        "base: [32] | reshape [4,8]; update: [2,3]; dynamic_update_slice at [1, 2]; \
         restore: [4,8] | reshape [32]"
    );
}

#[test]
fn stepped_write_splits_the_step_into_a_dim() {
    // x[:, 1::2].t() = v on 1024 x 1024.
    assert_eq!(
        write(1 << 20, 4, &f32_view(&[512, 1024], &[2, 1024], 1)),
        "base: [1048576] | reshape [1024,512,2]; \
         update: [512,1024] | transpose [1,0] | reshape [1024,512,1]; \
         dynamic_update_slice at [0, 0, 1]; restore: [1024,512,2] | reshape [1048576]"
    );
    // A column: x[:, 3] = v.
    assert_eq!(
        write(32, 4, &f32_view(&[4], &[8], 3)),
        "base: [32] | reshape [4,8]; update: [4] | reshape [4,1]; \
         dynamic_update_slice at [0, 3]; restore: [4,8] | reshape [32]"
    );
}

#[test]
fn diagonal_write_pads_the_base_into_rows() {
    assert_eq!(
        write(64, 4, &f32_view(&[8], &[9], 0)),
        "base: [64] | pad low [0] high [8] | reshape [8,9]; update: [8] | reshape [8,1]; \
         dynamic_update_slice at [0, 0]; restore: [8,9] | reshape [72] | slice [0:64]"
    );
}

#[test]
fn dtype_view_write_bitcasts_back() {
    assert_eq!(
        write(32, 4, &Layout::new(1, &[4, 8], &[32, 1], 4)),
        "base: [32] | bitcast_convert 4B->1B | reshape [4,32]; update: [4,8]; \
         dynamic_update_slice at [0, 4]; restore: [4,32] | reshape [32,4] | bitcast_convert 1B->4B"
    );
}

#[test]
fn interleaved_write_scatters() {
    let text = write(16, 4, &f32_view(&[2, 3], &[6, 4], 0));
    assert_eq!(
        text,
        "base: [16]; update: [2,3] | reshape [6]; scatter 6 indices; restore: [16]"
    );
}

#[test]
fn overlapping_write_keeps_the_last_writer() {
    let view = f32_view(&[5, 4], &[1, 1], 0);
    let program = invert(8, 4, &view).unwrap();
    assert_eq!(
        program.to_string(),
        "base: [8]; update: [5,4] | reshape [20] | gather 8 indices to [8]; \
         scatter 8 indices; restore: [8]"
    );
    // Location 3 is written by (0,3), (1,2), (2,1), (3,0): row-major, (3,0) comes last.
    let WriteStep::Scatter { indices } = &program.step else {
        panic!("expected a scatter");
    };
    let views::ViewOp::Gather {
        indices: writers, ..
    } = &program.update_ops.ops[1]
    else {
        panic!("expected a gather");
    };
    let at = indices.iter().position(|&i| i == 3).unwrap();
    assert_eq!(writers[at], 3 * 4);
    write(8, 4, &view);
}

#[test]
fn empty_write_keeps_the_base() {
    let program = invert(16, 4, &f32_view(&[2, 0], &[6, 4], 0)).unwrap();
    assert_eq!(program.step, WriteStep::Keep);
    write(16, 4, &f32_view(&[2, 0], &[6, 4], 0));
}

#[test]
fn expanded_write_is_rejected_with_pytorchs_message() {
    let err = invert(32, 4, &f32_view(&[3, 4, 8], &[0, 8, 1], 0)).unwrap_err();
    assert_eq!(err, ViewError::InternalOverlap);
    assert_eq!(
        err.to_string(),
        "unsupported operation: more than one element of the written-to tensor refers to a \
         single memory location. Please clone() the tensor before performing the operation."
    );
    // Empty but expanded: PyTorch still refuses.
    assert_eq!(
        invert(32, 4, &f32_view(&[3, 0], &[0, 1], 0)).unwrap_err(),
        ViewError::InternalOverlap
    );
}

#[test]
fn out_of_bounds_and_misaligned_views_are_errors() {
    let err = decompose(31, 4, &Layout::contiguous(4, &[4, 8])).unwrap_err();
    assert!(matches!(
        err,
        ViewError::OutOfBounds {
            required_bytes: 128,
            available_bytes: 124,
            ..
        }
    ));
    assert!(err
        .to_string()
        .contains("out of bounds for storage of size 124"));
    assert_eq!(
        decompose(10, 4, &Layout::new(3, &[2], &[1], 0)).unwrap_err(),
        ViewError::MisalignedElementSize {
            base_elem_size: 4,
            view_elem_size: 3
        }
    );
    assert!(matches!(
        decompose(10, 4, &f32_view(&[2], &[-1], 1)).unwrap_err(),
        ViewError::NegativeStride { dim: 0, stride: -1 }
    ));
    assert!(matches!(
        decompose(10, 4, &f32_view(&[2, 2], &[1], 1)).unwrap_err(),
        ViewError::RankMismatch { .. }
    ));
    assert!(matches!(
        invert(10, 4, &f32_view(&[2], &[1], -1)).unwrap_err(),
        ViewError::NegativeOffset { offset: -1 }
    ));
}

#[test]
fn chains_carry_their_shapes() {
    let chain = decompose(1 << 20, 4, &f32_view(&[512, 1024], &[2, 1024], 1)).unwrap();
    assert_eq!(chain.input.as_slice(), [1 << 20]);
    assert_eq!(chain.output_shape().unwrap().as_slice(), [512, 1024]);
    assert_eq!(chain.op_names(), ["reshape", "slice", "transpose"]);
    assert!(!chain.has_gather());
}
