//! Writes through a view: the program that gives the whole base its new value when the view's
//! elements are replaced.

use std::sync::Arc;

use crate::decompose::element_ratio;
use crate::error::ViewError;
use crate::layout::{check_scanned_in_bounds, Dims, Layout};
use crate::ops::{Chain, ChainBuilder};
use crate::overlap::{has_internal_overlap, MemOverlap};
use crate::plan::{
    merge_extents, plan_write_box, round_up, strided_indices, Analysis, Extent, Extents, WriteBox,
};

/// How the reshaped base (the *target*) takes the reshaped update (the *patch*).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WriteStep {
    /// The view is empty: the base keeps its value.
    Keep,
    /// The patch covers the whole target and has its shape: it is the new target.
    Replace,
    /// `stablehlo.dynamic_update_slice(target, patch, start_indices)`: the starts are constants
    /// (0-d `i64` operands) and always in range, so StableHLO's clamping never applies.
    UpdateSlice { start_indices: Dims },
    /// `stablehlo.scatter` into a 1-D target: `target[indices[i]] = patch[i]` for the 1-D
    /// patch. Indices are unique (`unique_indices = true`), so the order of updates does not
    /// matter; overlapping views were resolved beforehand (see [`invert`]). Lowers to a constant
    /// `tensor<Nx1xi64>` of indices, `update_window_dims = []`, `inserted_window_dims = [0]`,
    /// `scatter_dims_to_operand_dims = [0]`, `index_vector_dim = 1`, and an update computation
    /// returning the update.
    Scatter { indices: Arc<[i64]> },
}

/// New base value for a write of `update` (shape = the view's sizes) through a view:
///
/// ```text
/// target  = base_ops(old_base)          // reshapes, pads, bitcast
/// patch   = update_ops(update)          // reshapes, transpose, gather
/// written = step(target, patch)
/// new_base = restore_ops(written)       // inverse of base_ops: reshapes, slices, bitcast
/// ```
///
/// `restore_ops` undoes `base_ops` exactly, so elements outside the view keep their values.
/// For [`WriteStep::Replace`] the target is never read and `base_ops` may be skipped.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WriteProgram {
    pub base_ops: Chain,
    pub update_ops: Chain,
    pub step: WriteStep,
    pub restore_ops: Chain,
}

impl WriteProgram {
    /// Whether the write falls back to a scatter.
    pub fn has_scatter(&self) -> bool {
        matches!(self.step, WriteStep::Scatter { .. })
    }

    /// Op names of the whole program, in evaluation order (the step in the middle).
    pub fn op_names(&self) -> Vec<&'static str> {
        let step = match self.step {
            WriteStep::Keep => "keep",
            WriteStep::Replace => "replace",
            WriteStep::UpdateSlice { .. } => "dynamic_update_slice",
            WriteStep::Scatter { .. } => "scatter",
        };
        let mut names = self.base_ops.op_names();
        names.extend(self.update_ops.op_names());
        names.push(step);
        names.extend(self.restore_ops.op_names());
        names
    }
}

impl std::fmt::Display for WriteProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "base: {}; update: {}; ", self.base_ops, self.update_ops)?;
        match &self.step {
            WriteStep::Keep => f.write_str("keep")?,
            WriteStep::Replace => f.write_str("replace")?,
            WriteStep::UpdateSlice { start_indices } => {
                write!(f, "dynamic_update_slice at {:?}", start_indices.as_slice())?
            }
            WriteStep::Scatter { indices } => write!(f, "scatter {} indices", indices.len())?,
        }
        write!(f, "; restore: {}", self.restore_ops)
    }
}

/// The program writing a value of shape `view.sizes` through `view` into a base of `base_len`
/// elements of `base_elem_size` bytes.
///
/// Non-overlapping views become a `dynamic_update_slice` into the base reshaped (and, when
/// needed, padded) into a box, or a scatter of unique flat indices when no box fits. A view with
/// a stride-0 dim of size > 1 is rejected as PyTorch rejects it
/// ([`ViewError::InternalOverlap`]). Other overlapping views (from `as_strided`) follow
/// PyTorch's sequential semantics: elements are written in row-major order of the view and the
/// last write to a location wins; the program gathers those last writers and scatters them.
pub fn invert(
    base_len: i64,
    base_elem_size: usize,
    view: &Layout,
) -> Result<WriteProgram, ViewError> {
    let scan = view.scan()?;
    let ratio = element_ratio(base_elem_size, view.elem_size)?;
    check_scanned_in_bounds(base_len, base_elem_size, view, &scan)?;
    if has_internal_overlap(view) == MemOverlap::Yes {
        return Err(ViewError::InternalOverlap);
    }
    if base_elem_size > view.elem_size {
        base_len.checked_mul(ratio).ok_or(ViewError::Overflow)?;
    }
    let mut program = WriteProgram {
        base_ops: Chain::identity(&[base_len]),
        update_ops: Chain::identity(&view.sizes),
        step: WriteStep::Keep,
        restore_ops: Chain::identity(&[base_len]),
    };
    if view.numel() > 0 {
        let elem_sizes = ElemSizes {
            base: base_elem_size,
            view: view.elem_size,
            ratio,
        };
        build_write(&mut program, base_len, elem_sizes, view);
    }
    Ok(program)
}

/// Fills the empty chains of `program` for a non-empty view.
fn build_write(program: &mut WriteProgram, base_len: i64, elem_sizes: ElemSizes, view: &Layout) {
    let mut base = ChainBuilder::new(&mut program.base_ops);
    let len = write_prefix(&mut base, base_len, elem_sizes);
    let analysis = Analysis::new(view);
    let mut sorted = analysis.sorted_extents();
    if sorted.is_empty() {
        sorted.push(Extent { size: 1, stride: 1 });
    }

    let Some(plan) = choose_write_box(len, view.offset, &sorted) else {
        let target = base.shape().clone();
        let mut update = ChainBuilder::new(&mut program.update_ops);
        program.step = scatter_step(&mut update, view, &analysis);
        program.restore_ops.input = target;
        restore_prefix(
            &mut ChainBuilder::new(&mut program.restore_ops),
            base_len,
            len,
            elem_sizes,
        );
        return;
    };

    base.pad(&[plan.flat_pad_low], &[plan.flat_pad_high]);
    base.reshape(&plan.shape);
    let zeros = Dims::from_elem(0, plan.shape.len());
    base.pad(&zeros, &plan.box_pad_high);
    base.reshape(&plan.split_shape);

    let mut update = ChainBuilder::new(&mut program.update_ops);
    if !analysis.moving.is_empty() {
        update.reshape(&analysis.view_sizes());
        let to_sorted: Dims = analysis.order.iter().map(|&i| i as i64).collect();
        update.transpose(&to_sorted);
    }
    update.reshape(&plan.patch);

    program.step = if plan.patch == plan.split_shape {
        WriteStep::Replace
    } else {
        WriteStep::UpdateSlice {
            start_indices: plan.start.clone(),
        }
    };

    program.restore_ops.input = plan.split_shape.clone();
    let mut restore = ChainBuilder::new(&mut program.restore_ops);
    let padded_box: Dims = plan
        .shape
        .iter()
        .zip(&plan.box_pad_high)
        .map(|(&m, &p)| m + p)
        .collect();
    restore.reshape(&padded_box);
    restore.slice(&zeros, &plan.shape, &Dims::from_elem(1, plan.shape.len()));
    let padded_len = len + plan.flat_pad_low + plan.flat_pad_high;
    restore.reshape(&[padded_len]);
    restore.slice(&[plan.flat_pad_low], &[plan.flat_pad_low + len], &[1]);
    restore_prefix(&mut restore, base_len, len, elem_sizes);
}

#[derive(Clone, Copy)]
struct ElemSizes {
    base: usize,
    view: usize,
    /// Larger size over smaller size.
    ratio: i64,
}

/// Turns the base into a flat array of view-sized elements without losing any byte; returns
/// its length.
fn write_prefix(builder: &mut ChainBuilder, base_len: i64, sizes: ElemSizes) -> i64 {
    let ElemSizes { base, view, ratio } = sizes;
    if base == view {
        return base_len;
    }
    if base > view {
        let len = base_len * ratio;
        builder.bitcast(base, view);
        builder.reshape(&[len]);
        len
    } else {
        // Pad a trailing partial view element; restore_prefix slices it off again.
        let padded = round_up(base_len, ratio);
        builder.pad(&[0], &[padded - base_len]);
        builder.reshape(&[padded / ratio, ratio]);
        builder.bitcast(base, view);
        padded / ratio
    }
}

/// Inverse of [`write_prefix`], from the flat working array of `len` elements.
fn restore_prefix(builder: &mut ChainBuilder, base_len: i64, len: i64, sizes: ElemSizes) {
    let ElemSizes { base, view, ratio } = sizes;
    if base > view {
        builder.reshape(&[base_len, ratio]);
        builder.bitcast(view, base);
    } else if base < view {
        builder.bitcast(view, base);
        builder.reshape(&[len * ratio]);
        builder.slice(&[0], &[base_len], &[1]);
    }
}

/// The write box for the sorted extents: unmerged dims unless merging saves ops or is the only
/// way. Either way the update reaches the patch shape by one reshape after its transpose, since
/// merged dims are runs of sorted dims.
fn choose_write_box(len: i64, offset: i64, sorted: &[Extent]) -> Option<WriteBox> {
    let plain = plan_write_box(len, offset, sorted);
    if let Some(plan) = &plain {
        if plan.extra_ops() == 0 {
            return plain;
        }
    }
    let merged: Extents = merge_extents(sorted);
    if merged.len() == sorted.len() {
        return plain;
    }
    let fused = plan_write_box(len, offset, &merged);
    match (plain, fused) {
        (Some(p), Some(f)) if f.extra_ops() < p.extra_ops() => Some(f),
        (Some(p), _) => Some(p),
        (None, fused) => fused,
    }
}

/// Last resort: scatter into the flat array. Overlapping views keep, for each location, the
/// element written last in row-major order, picked by a gather from the update.
fn scatter_step(update: &mut ChainBuilder, view: &Layout, analysis: &Analysis) -> WriteStep {
    let indices = strided_indices(view.offset, &analysis.view_extents());
    update.reshape(&[indices.len() as i64]);

    let mut by_location: Vec<(i64, usize)> = indices
        .iter()
        .enumerate()
        .map(|(position, &index)| (index, position))
        .collect();
    by_location.sort_unstable();
    let overlaps = by_location.windows(2).any(|w| w[0].0 == w[1].0);
    if !overlaps {
        return WriteStep::Scatter {
            indices: indices.into(),
        };
    }
    let mut locations = Vec::new();
    let mut last_writers = Vec::new();
    for (i, &(index, position)) in by_location.iter().enumerate() {
        let is_last = by_location.get(i + 1).is_none_or(|next| next.0 != index);
        if is_last {
            locations.push(index);
            last_writers.push(position as i64);
        }
    }
    let winners = locations.len() as i64;
    update.gather(last_writers, &[winners]);
    WriteStep::Scatter {
        indices: locations.into(),
    }
}
