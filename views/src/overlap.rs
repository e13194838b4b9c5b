//! PyTorch's memory-overlap checks (`has_internal_overlap`, `get_overlap_status`) on layouts.

use crate::error::ViewError;
use crate::layout::Layout;

/// Whether elements of one view share memory, as PyTorch's `MemOverlap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemOverlap {
    /// Non-overlapping and dense: no element shares memory.
    No,
    /// Some dim has stride 0 and size > 1: elements certainly share memory.
    Yes,
    /// Not cheaply decided; PyTorch lets writes proceed.
    TooHard,
}

/// How two views of one storage share memory, as PyTorch's `MemOverlapStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemOverlapStatus {
    /// Same bytes, same strides.
    Full,
    /// Some bytes in common.
    Partial,
    /// No byte in common.
    No,
    /// At least one view is not non-overlapping and dense.
    TooHard,
}

/// PyTorch's `has_internal_overlap`: `No` for non-overlapping-and-dense layouts, `Yes` when a
/// dim of size > 1 has stride 0, `TooHard` otherwise (even when the layout does overlap).
pub fn has_internal_overlap(layout: &Layout) -> MemOverlap {
    if layout.is_non_overlapping_and_dense() {
        return MemOverlap::No;
    }
    let expanded = layout
        .sizes
        .iter()
        .zip(&layout.strides)
        .any(|(&size, &stride)| stride == 0 && size > 1);
    if expanded {
        MemOverlap::Yes
    } else {
        MemOverlap::TooHard
    }
}

/// PyTorch's `get_overlap_status` for two views of the same storage, on the byte ranges
/// `[offset * elem_size, (offset + numel) * elem_size)`.
///
/// PyTorch answers `Full` for a tensor compared with itself before anything else; a caller that
/// knows both layouts are one tensor should do the same.
pub fn overlap_status(a: &Layout, b: &Layout) -> MemOverlapStatus {
    if a.numel() == 0 || b.numel() == 0 {
        return MemOverlapStatus::No;
    }
    if !a.is_non_overlapping_and_dense() || !b.is_non_overlapping_and_dense() {
        return MemOverlapStatus::TooHard;
    }
    let (a_begin, a_end) = byte_range(a);
    let (b_begin, b_end) = byte_range(b);
    if a_begin == b_begin && a_end == b_end {
        return if a.strides == b.strides {
            MemOverlapStatus::Full
        } else {
            MemOverlapStatus::Partial
        };
    }
    if a_begin < b_end && b_begin < a_end {
        return MemOverlapStatus::Partial;
    }
    MemOverlapStatus::No
}

fn byte_range(layout: &Layout) -> (i128, i128) {
    let elem_size = layout.elem_size as i128;
    let begin = layout.offset as i128 * elem_size;
    (begin, begin + layout.numel() as i128 * elem_size)
}

/// PyTorch's `assert_no_internal_overlap`: a written-to view must not be expanded.
pub fn check_no_internal_overlap(written: &Layout) -> Result<(), ViewError> {
    match has_internal_overlap(written) {
        MemOverlap::Yes => Err(ViewError::InternalOverlap),
        MemOverlap::No | MemOverlap::TooHard => Ok(()),
    }
}

/// PyTorch's `assert_no_partial_overlap`: an input may be exactly the output, but not part of it.
pub fn check_no_partial_overlap(written: &Layout, input: &Layout) -> Result<(), ViewError> {
    match overlap_status(written, input) {
        MemOverlapStatus::Partial => Err(ViewError::PartialOverlap),
        _ => Ok(()),
    }
}

/// PyTorch's `assert_no_overlap`: an input may share no memory with the output at all (ops
/// such as `index_put_` or `cat` with `out=` that cannot work in place).
pub fn check_no_overlap(written: &Layout, input: &Layout) -> Result<(), ViewError> {
    match overlap_status(written, input) {
        MemOverlapStatus::Partial | MemOverlapStatus::Full => Err(ViewError::PartialOverlap),
        MemOverlapStatus::No | MemOverlapStatus::TooHard => Ok(()),
    }
}
