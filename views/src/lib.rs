//! Strided layouts as chains of primitive view ops, and the inverse chains for writes through views.
//!
//! A storage's value is a flat array of `base_len` elements; a PyTorch tensor is a strided
//! window on it ([`Layout`]). Devices hold immutable arrays without strides, so:
//!
//! - [`decompose`] turns a layout into a [`Chain`] of StableHLO-shaped [`ViewOp`]s whose result,
//!   applied to the base, is the view's value;
//! - [`invert`] turns a layout into a [`WriteProgram`] that computes the base's new value when a
//!   new value is written through the view;
//! - [`has_internal_overlap`] and [`overlap_status`] are PyTorch's overlap checks, with its
//!   error messages ([`INTERNAL_OVERLAP_MESSAGE`], [`PARTIAL_OVERLAP_MESSAGE`]);
//! - [`hash_chain`] and [`hash_write_program`] key the chains for compilation caches;
//! - [`eval`] runs chains on host arrays, and [`reference`](mod@reference) is the
//!   strided-memory oracle the tests compare them with.
//!
//! The crate knows nothing about storages, devices or PyTorch: only sizes, strides and offsets.

mod decompose;
mod error;
pub mod eval;
mod invert;
mod key;
mod layout;
mod ops;
mod overlap;
mod plan;
pub mod reference;

pub use decompose::decompose;
pub use error::{ViewError, INTERNAL_OVERLAP_MESSAGE, PARTIAL_OVERLAP_MESSAGE};
pub use invert::{invert, WriteProgram, WriteStep};
pub use key::{hash_chain, hash_chain_split, hash_write_program, hash_write_program_split};
pub use layout::{check_in_bounds, contiguous_strides, is_non_overlapping_and_dense, Dims, Layout};
pub use ops::{Chain, ShapeError, ViewOp};
pub use overlap::{
    check_no_internal_overlap, check_no_overlap, check_no_partial_overlap, has_internal_overlap,
    overlap_status, MemOverlap, MemOverlapStatus,
};
