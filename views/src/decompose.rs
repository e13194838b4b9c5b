//! Reads through a view: a strided layout over a flat base becomes a short chain of view ops.

use crate::error::ViewError;
use crate::layout::{check_validated_in_bounds, push_all, Dims, Layout};
use crate::ops::{Chain, ChainBuilder};
use crate::plan::{
    merge_extents, plan_read_box, strided_indices, Analysis, Extent, Extents, ReadBox,
};

/// The chain that turns a base value (shape `[base_len]`, `base_elem_size`-byte elements) into
/// the value of `view` (shape `view.sizes`, `view.elem_size`-byte elements).
///
/// Forms, shortest first: a reshape of the flat array into a box, a strided slice of it, a
/// transpose into the view's dim order, and a reshape or broadcast adding size-1 and expanded
/// dims; a bitcast in front when the element sizes differ. Layouts that are no strided sub-box
/// of any reshaping of the base (interleaved dims, overlapping windows) read through a gather.
pub fn decompose(base_len: i64, base_elem_size: usize, view: &Layout) -> Result<Chain, ViewError> {
    view.validate()?;
    let ratio = element_ratio(base_elem_size, view.elem_size)?;
    check_validated_in_bounds(base_len, base_elem_size, view)?;
    if base_elem_size > view.elem_size {
        base_len.checked_mul(ratio).ok_or(ViewError::Overflow)?;
    }
    let mut chain = Chain::identity(&[base_len]);
    build_read(
        &mut ChainBuilder::new(&mut chain),
        base_len,
        base_elem_size,
        ratio,
        view,
    );
    Ok(chain)
}

fn build_read(
    builder: &mut ChainBuilder,
    base_len: i64,
    base_elem_size: usize,
    ratio: i64,
    view: &Layout,
) {
    let len = read_prefix(builder, base_len, base_elem_size, view.elem_size, ratio);
    if view.numel() == 0 {
        builder.slice(&[0], &[0], &[1]);
        builder.reshape(&view.sizes);
        return;
    }

    if view.is_contiguous() {
        // The common case, and a cheap one: a run of the flat array, reshaped.
        builder.slice(&[view.offset], &[view.offset + view.numel()], &[1]);
        builder.reshape(&view.sizes);
        return;
    }

    let analysis = Analysis::new(view);
    let sorted = analysis.sorted_extents();
    let mut plain = ReadBox::default();
    let mut fused = ReadBox::default();
    match choose_read_box(len, view.offset, &sorted, &mut plain, &mut fused) {
        Some(plan) => {
            emit_read_box(builder, len, plan);
            if analysis.moving.is_empty() {
                // One element, shape [1]: broadcast it directly rather than reshape to [] first.
                if analysis.broadcasts {
                    builder.broadcast_in_dim(&view.sizes, &[0]);
                } else {
                    builder.reshape(&view.sizes);
                }
                return;
            }
            if plan.merged {
                builder.reshape(&analysis.sorted_sizes());
            }
            let mut to_view_order = Dims::from_elem(0, analysis.order.len());
            for (sorted_position, &moving_index) in analysis.order.iter().enumerate() {
                to_view_order[moving_index] = sorted_position as i64;
            }
            builder.transpose(&to_view_order);
        }
        None => {
            let indices = strided_indices(view.offset, &analysis.view_extents());
            builder.gather(indices, &analysis.view_sizes());
        }
    }
    add_unmoving_dims(builder, view, &analysis);
}

/// Ratio between the larger and the smaller element size, checked to be whole.
pub(crate) fn element_ratio(
    base_elem_size: usize,
    view_elem_size: usize,
) -> Result<i64, ViewError> {
    if base_elem_size == 0 || view_elem_size == 0 {
        return Err(ViewError::ZeroElementSize);
    }
    let (big, small) = if base_elem_size >= view_elem_size {
        (base_elem_size, view_elem_size)
    } else {
        (view_elem_size, base_elem_size)
    };
    if big % small != 0 {
        return Err(ViewError::MisalignedElementSize {
            base_elem_size,
            view_elem_size,
        });
    }
    Ok((big / small) as i64)
}

/// Turns the base into a flat array of view-sized elements; returns its length.
fn read_prefix(
    builder: &mut ChainBuilder,
    base_len: i64,
    base_elem_size: usize,
    view_elem_size: usize,
    ratio: i64,
) -> i64 {
    if base_elem_size == view_elem_size {
        return base_len;
    }
    if base_elem_size > view_elem_size {
        let len = base_len * ratio;
        builder.bitcast(base_elem_size, view_elem_size);
        builder.reshape(&[len]);
        len
    } else {
        // A trailing partial view element is unreachable by any in-bounds view: drop it.
        let len = base_len / ratio;
        if base_len % ratio != 0 {
            builder.slice(&[0], &[len * ratio], &[1]);
        }
        builder.reshape(&[len, ratio]);
        builder.bitcast(base_elem_size, view_elem_size);
        len
    }
}

/// The read box for the sorted extents, planned into `plain` or `fused`: unmerged dims (no
/// reshape to split merged dims back) unless merging avoids extra ops or is the only way.
fn choose_read_box<'a>(
    len: i64,
    offset: i64,
    sorted: &[Extent],
    plain: &'a mut ReadBox,
    fused: &'a mut ReadBox,
) -> Option<&'a ReadBox> {
    let plain_fits = plan_read_box(len, offset, sorted, plain);
    if plain_fits && plain.extra_ops(len) == 0 {
        return Some(plain);
    }
    let merged: Extents = merge_extents(sorted);
    let fused_fits = merged.len() < sorted.len() && plan_read_box(len, offset, &merged, fused);
    fused.merged = true;
    match (plain_fits, fused_fits) {
        (true, true) if fused.extra_ops(len) + 1 < plain.extra_ops(len) => Some(fused),
        (true, _) => Some(plain),
        (false, true) => Some(fused),
        (false, false) => None,
    }
}

fn emit_read_box(builder: &mut ChainBuilder, len: i64, plan: &ReadBox) {
    let end = plan.flat_end.min(len);
    builder.slice(&[plan.flat_start], &[end], &[1]);
    builder.pad(&[0], &[plan.flat_end - end]);
    builder.reshape(&plan.shape);
    builder.slice(&plan.start, &plan.limit, &plan.step);
}

/// From the moving dims in view order to the view's shape: size-1 dims by reshape, expanded
/// (stride-0) dims by broadcast.
fn add_unmoving_dims(builder: &mut ChainBuilder, view: &Layout, analysis: &Analysis) {
    if analysis.broadcasts {
        let dims: Dims = push_all(analysis.moving.iter().map(|d| d.view_dim as i64));
        builder.broadcast_in_dim(&view.sizes, &dims);
    } else {
        builder.reshape(&view.sizes);
    }
}
