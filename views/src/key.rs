//! Cache keys for chains and write programs: their structure fed into any hasher.
//!
//! Everything is fed as explicit tags and little-endian integers, never through derived `Hash`
//! impls, so the byte stream (and hence a key under a fixed hash such as xxh3) does not change
//! with the compiler. The key covers shapes and attributes, not data: the same view pattern on
//! another base of the same length keys the same.

use std::hash::Hasher;

use crate::invert::{WriteProgram, WriteStep};
use crate::ops::{Chain, ViewOp};

fn feed_u64<H: Hasher>(state: &mut H, value: u64) {
    state.write(&value.to_le_bytes());
}

fn feed_dims<H: Hasher>(state: &mut H, dims: &[i64]) {
    feed_u64(state, dims.len() as u64);
    for &d in dims {
        state.write(&d.to_le_bytes());
    }
}

fn feed_op<H: Hasher>(state: &mut H, op: &ViewOp) {
    match op {
        ViewOp::Reshape { shape } => {
            state.write_u8(1);
            feed_dims(state, shape);
        }
        ViewOp::Transpose { permutation } => {
            state.write_u8(2);
            feed_dims(state, permutation);
        }
        ViewOp::BroadcastInDim {
            shape,
            broadcast_dimensions,
        } => {
            state.write_u8(3);
            feed_dims(state, shape);
            feed_dims(state, broadcast_dimensions);
        }
        ViewOp::Slice {
            start_indices,
            limit_indices,
            strides,
        } => {
            state.write_u8(4);
            feed_dims(state, start_indices);
            feed_dims(state, limit_indices);
            feed_dims(state, strides);
        }
        ViewOp::Pad {
            edge_padding_low,
            edge_padding_high,
        } => {
            state.write_u8(5);
            feed_dims(state, edge_padding_low);
            feed_dims(state, edge_padding_high);
        }
        ViewOp::Bitcast {
            from_elem_size,
            to_elem_size,
        } => {
            state.write_u8(6);
            feed_u64(state, *from_elem_size as u64);
            feed_u64(state, *to_elem_size as u64);
        }
        ViewOp::Gather { indices, shape } => {
            state.write_u8(7);
            feed_dims(state, indices);
            feed_dims(state, shape);
        }
    }
}

/// Feeds the chain's input shape and every op with its attributes into `state`.
pub fn hash_chain<H: Hasher>(chain: &Chain, state: &mut H) {
    feed_dims(state, &chain.input);
    feed_u64(state, chain.ops.len() as u64);
    for op in &chain.ops {
        feed_op(state, op);
    }
}

/// Feeds the three chains and the write step of a program into `state`.
pub fn hash_write_program<H: Hasher>(program: &WriteProgram, state: &mut H) {
    hash_chain(&program.base_ops, state);
    hash_chain(&program.update_ops, state);
    match &program.step {
        WriteStep::Keep => state.write_u8(1),
        WriteStep::Replace => state.write_u8(2),
        WriteStep::UpdateSlice { start_indices } => {
            state.write_u8(3);
            feed_dims(state, start_indices);
        }
        WriteStep::Scatter { indices } => {
            state.write_u8(4);
            feed_dims(state, indices);
        }
    }
    hash_chain(&program.restore_ops, state);
}

/// [`hash_chain`] in two parts: the chain's structure (op kinds, ranks, permutations, which dims
/// broadcast, strides, element sizes) into `structure`, and every size and position (shapes,
/// slice bounds, padding, gathered indices) into `sizes`. The same view pattern over a longer
/// sequence then keeps its structure key and changes only its sizes key, so a recompile for a
/// new length is seen as one (RFC 0026).
pub fn hash_chain_split<S: Hasher, D: Hasher>(chain: &Chain, structure: &mut S, sizes: &mut D) {
    feed_u64(structure, chain.input.len() as u64);
    feed_dims(sizes, &chain.input);
    feed_u64(structure, chain.ops.len() as u64);
    for op in &chain.ops {
        feed_op_split(op, structure, sizes);
    }
}

/// [`hash_write_program`] in the two parts of [`hash_chain_split`].
pub fn hash_write_program_split<S: Hasher, D: Hasher>(
    program: &WriteProgram,
    structure: &mut S,
    sizes: &mut D,
) {
    hash_chain_split(&program.base_ops, structure, sizes);
    hash_chain_split(&program.update_ops, structure, sizes);
    match &program.step {
        WriteStep::Keep => structure.write_u8(1),
        WriteStep::Replace => structure.write_u8(2),
        WriteStep::UpdateSlice { start_indices } => {
            structure.write_u8(3);
            feed_u64(structure, start_indices.len() as u64);
            feed_dims(sizes, start_indices);
        }
        WriteStep::Scatter { indices } => {
            structure.write_u8(4);
            feed_dims(sizes, indices);
        }
    }
    hash_chain_split(&program.restore_ops, structure, sizes);
}

fn feed_op_split<S: Hasher, D: Hasher>(op: &ViewOp, structure: &mut S, sizes: &mut D) {
    match op {
        ViewOp::Reshape { shape } => {
            structure.write_u8(1);
            feed_u64(structure, shape.len() as u64);
            feed_dims(sizes, shape);
        }
        ViewOp::Transpose { permutation } => {
            structure.write_u8(2);
            feed_dims(structure, permutation);
        }
        ViewOp::BroadcastInDim {
            shape,
            broadcast_dimensions,
        } => {
            structure.write_u8(3);
            feed_dims(structure, broadcast_dimensions);
            feed_u64(structure, shape.len() as u64);
            feed_dims(sizes, shape);
        }
        ViewOp::Slice {
            start_indices,
            limit_indices,
            strides,
        } => {
            structure.write_u8(4);
            feed_dims(structure, strides);
            feed_dims(sizes, start_indices);
            feed_dims(sizes, limit_indices);
        }
        ViewOp::Pad {
            edge_padding_low,
            edge_padding_high,
        } => {
            structure.write_u8(5);
            feed_u64(structure, edge_padding_low.len() as u64);
            feed_dims(sizes, edge_padding_low);
            feed_dims(sizes, edge_padding_high);
        }
        ViewOp::Bitcast {
            from_elem_size,
            to_elem_size,
        } => {
            structure.write_u8(6);
            feed_u64(structure, *from_elem_size as u64);
            feed_u64(structure, *to_elem_size as u64);
        }
        ViewOp::Gather { indices, shape } => {
            structure.write_u8(7);
            feed_u64(structure, shape.len() as u64);
            feed_dims(sizes, indices);
            feed_dims(sizes, shape);
        }
    }
}
