//! Errors raised when a layout cannot be read or written through a base.

use std::fmt;

/// PyTorch's message for a write into a tensor whose elements share memory (an expanded tensor).
pub const INTERNAL_OVERLAP_MESSAGE: &str = "unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.";

/// PyTorch's message for an op whose input and output share only part of their memory.
pub const PARTIAL_OVERLAP_MESSAGE: &str = "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location. Please clone() the tensor before performing the operation.";

/// Why a view cannot be decomposed or inverted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ViewError {
    /// `sizes` and `strides` have different lengths.
    RankMismatch { sizes: usize, strides: usize },
    /// A size is negative.
    NegativeSize { dim: usize, size: i64 },
    /// A stride is negative (PyTorch rejects these in `as_strided`).
    NegativeStride { dim: usize, stride: i64 },
    /// The storage offset is negative.
    NegativeOffset { offset: i64 },
    /// The base length is negative.
    NegativeBaseLength { base_len: i64 },
    /// An element size of zero bytes.
    ZeroElementSize,
    /// The view reaches past the end of the base.
    OutOfBounds {
        sizes: Vec<i64>,
        strides: Vec<i64>,
        offset: i64,
        elem_size: usize,
        required_bytes: i128,
        available_bytes: i128,
    },
    /// Neither element size divides the other, so view elements do not line up with base elements.
    MisalignedElementSize {
        base_elem_size: usize,
        view_elem_size: usize,
    },
    /// A size, stride or index computation does not fit in 64 bits.
    Overflow,
    /// A write into a view in which several elements share one memory location.
    InternalOverlap,
    /// A write whose input partially shares memory with its destination.
    PartialOverlap,
}

impl fmt::Display for ViewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ViewError::RankMismatch { sizes, strides } => write!(
                f,
                "mismatch in length of strides and shape: expected {sizes} strides, got {strides}"
            ),
            ViewError::NegativeSize { dim, size } => write!(
                f,
                "sizes must be non-negative, but got size {size} at dimension {dim}"
            ),
            ViewError::NegativeStride { dim, stride } => write!(
                f,
                "as_strided: negative strides are not supported, got stride {stride} at dimension {dim}"
            ),
            ViewError::NegativeOffset { offset } => write!(
                f,
                "storage offset must be non-negative, but got {offset}"
            ),
            ViewError::NegativeBaseLength { base_len } => write!(
                f,
                "a storage holds a non-negative number of elements, got {base_len}"
            ),
            ViewError::ZeroElementSize => write!(f, "element sizes must be at least one byte"),
            ViewError::OutOfBounds {
                sizes,
                strides,
                offset,
                elem_size,
                required_bytes,
                available_bytes,
            } => write!(
                f,
                "setStorage: sizes {:?}, strides {:?}, storage offset {offset}, and itemsize {elem_size} requiring a storage size of {required_bytes} are out of bounds for storage of size {available_bytes}",
                sizes, strides
            ),
            ViewError::MisalignedElementSize {
                base_elem_size,
                view_elem_size,
            } => write!(
                f,
                "cannot view a storage of {base_elem_size}-byte elements as {view_elem_size}-byte elements: \
                 one element size must divide the other"
            ),
            ViewError::Overflow => write!(f, "view arithmetic overflows 64-bit integers"),
            ViewError::InternalOverlap => f.write_str(INTERNAL_OVERLAP_MESSAGE),
            ViewError::PartialOverlap => f.write_str(PARTIAL_OVERLAP_MESSAGE),
        }
    }
}

impl std::error::Error for ViewError {}
