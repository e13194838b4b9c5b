//! Reads through a view: a strided layout over a flat base becomes a short chain of view ops.

use crate::error::ViewError;
use smallvec::SmallVec;

use crate::layout::{check_scanned_in_bounds, push_all, Dims, Layout};
use crate::ops::{Chain, ChainBuilder, ViewOp};
use crate::plan::{
    div_non_negative, gcd, merge_extents, plan_read_box, rem_non_negative, strided_indices,
    Analysis, Extent, Extents, ReadBox,
};

/// The chain that turns a base value (shape `[base_len]`, `base_elem_size`-byte elements) into
/// the value of `view` (shape `view.sizes`, `view.elem_size`-byte elements).
///
/// Forms, shortest first: a reshape of the flat array into a box, a strided slice of it, a
/// transpose into the view's dim order, and a reshape or broadcast adding size-1 and expanded
/// dims; a bitcast in front when the element sizes differ. Layouts that are no strided sub-box
/// of any reshaping of the base (interleaved dims, overlapping windows) read through a gather.
pub fn decompose(base_len: i64, base_elem_size: usize, view: &Layout) -> Result<Chain, ViewError> {
    // Built inside the returned value, and returned from one place: a chain is large and inline,
    // and every move of it is a copy of several hundred bytes.
    let mut result = Ok(Chain {
        input: one_dim(base_len),
        ops: SmallVec::new(),
    });
    let Ok(chain) = &mut result else {
        unreachable!()
    };
    if let Err(e) = fill_read(chain, base_len, base_elem_size, view) {
        result = Err(e);
    }
    result
}

/// Checks the view against the base and fills `chain` (the identity on `[base_len]`) with the
/// ops that read it.
fn fill_read(
    chain: &mut Chain,
    base_len: i64,
    base_elem_size: usize,
    view: &Layout,
) -> Result<(), ViewError> {
    let scan = view.scan()?;
    let ratio = element_ratio(base_elem_size, view.elem_size)?;
    check_scanned_in_bounds(base_len, base_elem_size, view, &scan)?;
    if base_elem_size > view.elem_size {
        base_len.checked_mul(ratio).ok_or(ViewError::Overflow)?;
    }
    let numel = scan.numel;
    if base_elem_size == view.elem_size && numel > 0 && scan.contiguous {
        // The commonest view: a run of the flat array, reshaped.
        if view.offset != 0 || numel != base_len {
            chain.ops.push(ViewOp::Slice {
                start_indices: one_dim(view.offset),
                limit_indices: one_dim(view.offset + numel),
                strides: one_dim(1),
            });
        }
        if view.sizes.as_slice() != [numel] {
            chain.ops.push(ViewOp::Reshape {
                shape: view.sizes.clone(),
            });
        }
        #[cfg(debug_assertions)]
        {
            let mut general = Chain::identity(&[base_len]);
            build_read(
                &mut ChainBuilder::new(&mut general),
                base_len,
                view.elem_size,
                1,
                view,
            );
            debug_assert_eq!(
                *chain, general,
                "fast and general reads differ for {view:?}"
            );
        }
        return Ok(());
    }
    if base_elem_size == view.elem_size && numel > 0 && read_whole_box(chain, base_len, view) {
        #[cfg(debug_assertions)]
        {
            let mut general = Chain::identity(&[base_len]);
            build_general_read(&mut ChainBuilder::new(&mut general), base_len, view);
            debug_assert_eq!(
                *chain, general,
                "fast and general reads differ for {view:?}"
            );
        }
        return Ok(());
    }
    build_read(
        &mut ChainBuilder::new(chain),
        base_len,
        base_elem_size,
        ratio,
        view,
    );
    Ok(())
}

/// A one-element `Dims`, built by copy (cheaper than `from_slice` on a hot path).
#[inline]
fn one_dim(value: i64) -> Dims {
    Dims::from_buf_and_len([value, 0, 0, 0, 0, 0], 1)
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
    build_general_read(builder, len, view);
}

fn build_general_read(builder: &mut ChainBuilder, len: i64, view: &Layout) {
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

/// Most views read as one box of the whole flat array: reshape, slice, transpose, then a reshape
/// or broadcast to the view's shape. This plans and emits that form directly, without the
/// general planner's scratch vectors and the builder's rewriting; it returns false (with
/// `chain` untouched) for every other layout, which the general path handles. It emits exactly
/// what the general path would (checked in debug builds).
fn read_whole_box(chain: &mut Chain, base_len: i64, view: &Layout) -> bool {
    // Scratch arrays as long as `Dims`' inline buffer, so that each becomes a `Dims` by copy.
    const MAX_RANK: usize = 6;
    let rank = view.rank();
    if rank > MAX_RANK {
        return false;
    }
    // Moving dims (size ≥ 2, stride > 0) in view order, then their order by descending stride.
    let mut sizes = [0i64; MAX_RANK];
    let mut strides = [0i64; MAX_RANK];
    let mut view_dims = [0i64; MAX_RANK];
    let mut k = 0;
    let mut broadcasts = false;
    for d in 0..rank {
        let (size, stride) = (view.sizes[d], view.strides[d]);
        if size >= 2 {
            if stride == 0 {
                broadcasts = true;
            } else {
                sizes[k] = size;
                strides[k] = stride;
                view_dims[k] = d as i64;
                k += 1;
            }
        }
    }
    if k == 0 {
        return false;
    }
    let mut order = [0usize; MAX_RANK];
    for (i, slot) in order.iter_mut().enumerate().take(k) {
        *slot = i;
    }
    for i in 1..k {
        let mut j = i;
        while j > 0 && strides[order[j - 1]] < strides[order[j]] {
            order.swap(j - 1, j);
            j -= 1;
        }
    }

    // The box: dim i has row-major stride t_i (gcd of the outer strides, 1 innermost), the view
    // steps s_i / t_i along it, and each inner dim must fit within one step of the outer one.
    let mut box_stride = [0i64; MAX_RANK];
    let mut step = [0i64; MAX_RANK];
    let mut box_size = [0i64; MAX_RANK];
    let mut g = 0;
    for i in 0..k {
        let (n, s) = (sizes[order[i]], strides[order[i]]);
        g = gcd(g, s);
        box_stride[i] = if i + 1 == k { 1 } else { g };
        step[i] = div_non_negative(s, box_stride[i]);
        if i > 0 {
            box_size[i] = div_non_negative(box_stride[i - 1], box_stride[i]);
            if box_size[i] - 1 - (n - 1) * step[i] < 0 {
                return false;
            }
        }
    }
    let t0 = box_stride[0];
    if rem_non_negative(base_len, t0) != 0 {
        return false;
    }
    box_size[0] = div_non_negative(base_len, t0);
    let mut start = [0i64; MAX_RANK];
    let mut limit = [0i64; MAX_RANK];
    let within_row = rem_non_negative(view.offset, t0);
    start[0] = div_non_negative(view.offset, t0);
    let mut whole = true;
    for i in 0..k {
        let n = sizes[order[i]];
        if i > 0 {
            start[i] = rem_non_negative(div_non_negative(within_row, box_stride[i]), box_size[i]);
            if start[i] > box_size[i] - 1 - (n - 1) * step[i] {
                return false;
            }
        }
        limit[i] = start[i] + (n - 1) * step[i] + 1;
        whole &= start[i] == 0 && limit[i] == box_size[i] && step[i] == 1;
    }
    if limit[0] > box_size[0] {
        return false;
    }

    let ops = &mut chain.ops;
    if k > 1 || t0 != 1 {
        ops.push(ViewOp::Reshape {
            shape: Dims::from_buf_and_len(box_size, k),
        });
    }
    if !whole {
        ops.push(ViewOp::Slice {
            start_indices: Dims::from_buf_and_len(start, k),
            limit_indices: Dims::from_buf_and_len(limit, k),
            strides: Dims::from_buf_and_len(step, k),
        });
    }
    let transposed = order[..k].windows(2).any(|pair| pair[0] > pair[1]);
    if transposed {
        let mut to_view_order = [0i64; MAX_RANK];
        for (sorted_position, &moving_index) in order[..k].iter().enumerate() {
            to_view_order[moving_index] = sorted_position as i64;
        }
        ops.push(ViewOp::Transpose {
            permutation: Dims::from_buf_and_len(to_view_order, k),
        });
    }
    if broadcasts {
        ops.push(ViewOp::BroadcastInDim {
            shape: view.sizes.clone(),
            broadcast_dimensions: Dims::from_buf_and_len(view_dims, k),
        });
        return true;
    }
    // The shape so far: the moving dims in view order once sliced or transposed, else the box.
    let current: &[i64] = if transposed || !whole {
        &sizes[..k]
    } else if k > 1 {
        &box_size[..k]
    } else {
        std::slice::from_ref(&base_len)
    };
    if current == view.sizes.as_slice() {
        return true;
    }
    match ops.last_mut() {
        // A reshape of a reshape is one reshape, or none when it gives back the flat base.
        Some(ViewOp::Reshape { .. }) if view.sizes.as_slice() == [base_len] => {
            ops.pop();
        }
        Some(ViewOp::Reshape { shape }) => shape.clone_from(&view.sizes),
        _ => ops.push(ViewOp::Reshape {
            shape: view.sizes.clone(),
        }),
    }
    true
}
