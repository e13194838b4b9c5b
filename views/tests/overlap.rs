//! PyTorch's overlap checks: known cases, and consistency with the memory the layouts touch.

mod common;

use std::collections::BTreeSet;

use common::{config, strided_case};
use proptest::prelude::*;
use views::{
    check_no_internal_overlap, check_no_overlap, check_no_partial_overlap, has_internal_overlap,
    overlap_status, Layout, MemOverlap, MemOverlapStatus, ViewError, INTERNAL_OVERLAP_MESSAGE,
    PARTIAL_OVERLAP_MESSAGE,
};

fn f32_view(sizes: &[i64], strides: &[i64], offset: i64) -> Layout {
    Layout::new(4, sizes, strides, offset)
}

/// Every byte the layout's elements occupy, with multiplicity.
fn touched_bytes(layout: &Layout) -> Vec<i64> {
    let mut bytes = Vec::new();
    let rank = layout.rank();
    if layout.sizes.contains(&0) {
        return bytes;
    }
    let mut index = vec![0i64; rank];
    loop {
        let element = layout.offset + (0..rank).map(|d| index[d] * layout.strides[d]).sum::<i64>();
        let start = element * layout.elem_size as i64;
        bytes.extend(start..start + layout.elem_size as i64);
        let mut d = rank;
        loop {
            if d == 0 {
                return bytes;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < layout.sizes[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

#[test]
fn internal_overlap_follows_pytorch() {
    assert_eq!(
        has_internal_overlap(&Layout::contiguous(4, &[2, 3])),
        MemOverlap::No
    );
    assert_eq!(
        has_internal_overlap(&f32_view(&[3, 2], &[1, 3], 0)),
        MemOverlap::No
    );
    assert_eq!(
        has_internal_overlap(&f32_view(&[4, 3], &[1, 0], 0)),
        MemOverlap::Yes
    );
    assert_eq!(
        has_internal_overlap(&f32_view(&[4, 1], &[1, 0], 0)),
        MemOverlap::No
    );
    assert_eq!(
        has_internal_overlap(&f32_view(&[2, 3], &[6, 2], 0)),
        MemOverlap::TooHard
    );
    assert_eq!(
        has_internal_overlap(&f32_view(&[4, 4], &[1, 1], 0)),
        MemOverlap::TooHard
    );
    assert_eq!(
        has_internal_overlap(&f32_view(&[1], &[0], 3)),
        MemOverlap::No
    );
    assert_eq!(has_internal_overlap(&f32_view(&[], &[], 3)), MemOverlap::No);
    // PyTorch answers Yes even for an empty expanded tensor.
    assert_eq!(
        has_internal_overlap(&f32_view(&[3, 0], &[0, 1], 0)),
        MemOverlap::Yes
    );
}

#[test]
fn overlap_status_follows_pytorch() {
    let x = Layout::contiguous(4, &[4, 4]);
    assert_eq!(overlap_status(&x, &x), MemOverlapStatus::Full);
    let rows_0_2 = f32_view(&[2, 4], &[4, 1], 0);
    let rows_1_3 = f32_view(&[2, 4], &[4, 1], 4);
    let rows_2_4 = f32_view(&[2, 4], &[4, 1], 8);
    assert_eq!(
        overlap_status(&rows_0_2, &rows_1_3),
        MemOverlapStatus::Partial
    );
    assert_eq!(overlap_status(&rows_0_2, &rows_2_4), MemOverlapStatus::No);
    let transposed = f32_view(&[4, 4], &[1, 4], 0);
    assert_eq!(overlap_status(&x, &transposed), MemOverlapStatus::Partial);
    let strided = f32_view(&[4, 2], &[4, 2], 0);
    assert_eq!(overlap_status(&x, &strided), MemOverlapStatus::TooHard);
    let empty = f32_view(&[0, 4], &[4, 1], 0);
    assert_eq!(overlap_status(&x, &empty), MemOverlapStatus::No);
    // Byte ranges, not element ranges: bytes 4..8 of the storage seen as uint8.
    let bytes_4_8 = Layout::new(1, &[4], &[1], 4);
    assert_eq!(overlap_status(&x, &bytes_4_8), MemOverlapStatus::Partial);
    // Same bytes and numerically equal strides: PyTorch says Full whatever the dtypes.
    let first_element_bytes = Layout::new(1, &[4], &[1], 0);
    let first_element = f32_view(&[1], &[1], 0);
    assert_eq!(
        overlap_status(&first_element, &first_element_bytes),
        MemOverlapStatus::Full
    );
}

#[test]
fn checks_raise_pytorchs_errors() {
    let expanded = f32_view(&[4, 3], &[1, 0], 0);
    let err = check_no_internal_overlap(&expanded).unwrap_err();
    assert_eq!(err, ViewError::InternalOverlap);
    assert_eq!(err.to_string(), INTERNAL_OVERLAP_MESSAGE);
    assert!(check_no_internal_overlap(&f32_view(&[4, 4], &[1, 1], 0)).is_ok());

    let x = Layout::contiguous(4, &[4, 4]);
    let rows_1_3 = f32_view(&[2, 4], &[4, 1], 4);
    let err = check_no_partial_overlap(&x, &rows_1_3).unwrap_err();
    assert_eq!(err, ViewError::PartialOverlap);
    assert_eq!(err.to_string(), PARTIAL_OVERLAP_MESSAGE);
    assert!(check_no_partial_overlap(&x, &x).is_ok());
    assert_eq!(
        check_no_overlap(&x, &x).unwrap_err(),
        ViewError::PartialOverlap
    );
    assert!(check_no_overlap(&x, &f32_view(&[4], &[1], 16)).is_ok());
    assert_eq!(
        PARTIAL_OVERLAP_MESSAGE,
        "unsupported operation: some elements of the input tensor and the written-to tensor \
         refer to a single memory location. Please clone() the tensor before performing the \
         operation."
    );
}

proptest! {
    #![proptest_config(config(1000))]

    /// `Yes` and `No` are never wrong about the memory a layout touches.
    #[test]
    fn internal_overlap_is_sound(case in strided_case()) {
        let touched = touched_bytes(&case.view);
        let distinct: BTreeSet<i64> = touched.iter().copied().collect();
        match has_internal_overlap(&case.view) {
            MemOverlap::Yes => {
                prop_assert!(case.view.numel() == 0 || distinct.len() < touched.len())
            }
            MemOverlap::No => {
                prop_assert_eq!(distinct.len(), touched.len());
                if let (Some(first), Some(last)) = (distinct.first(), distinct.last()) {
                    prop_assert_eq!((last - first + 1) as usize, distinct.len(), "dense");
                }
            }
            MemOverlap::TooHard => prop_assert!(!case.view.is_non_overlapping_and_dense()),
        }
    }

    /// The status of two layouts agrees with the bytes they touch.
    #[test]
    fn overlap_status_is_sound(a in strided_case(), b in strided_case()) {
        let bytes_a: BTreeSet<i64> = touched_bytes(&a.view).into_iter().collect();
        let bytes_b: BTreeSet<i64> = touched_bytes(&b.view).into_iter().collect();
        let shared = bytes_a.intersection(&bytes_b).count();
        match overlap_status(&a.view, &b.view) {
            MemOverlapStatus::No => prop_assert_eq!(shared, 0),
            MemOverlapStatus::Full => {
                prop_assert!(bytes_a == bytes_b && a.view.strides == b.view.strides)
            }
            // Partial also covers the same range walked with other strides.
            MemOverlapStatus::Partial => prop_assert!(shared > 0),
            MemOverlapStatus::TooHard => prop_assert!(
                !a.view.is_non_overlapping_and_dense() || !b.view.is_non_overlapping_and_dense()
            ),
        }
    }
}
