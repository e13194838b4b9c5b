//! Lowers `views` chains (strided reads) and write programs (writes through views) to StableHLO.

use ops::{DType, Emitter, ScalarValue, TensorType, Value};
use views::{Chain, ViewOp, WriteProgram, WriteStep};

fn dims(values: &[i64]) -> Vec<usize> {
    values.iter().map(|&d| d as usize).collect()
}

/// Reinterprets the bits of `v` as `to` (same element size), as PyTorch's `view(dtype)`.
fn bitcast_same_size(e: &mut Emitter, v: Value, to: DType) -> Value {
    let from = e.dtype(v);
    if from == to {
        return v;
    }
    // i1 has no 8-bit representation in StableHLO: bool ↔ byte reinterpretation is a convert
    // (PyTorch's bools are 0 or 1 bytes).
    if from == DType::Bool || to == DType::Bool {
        return e.convert(v, to);
    }
    let ty = e.ty(v).with_dtype(to);
    e.bitcast(v, ty)
}

/// The dtype of the element size `size`: the view's or the base's.
fn dtype_of_size(size: usize, view: DType, base: DType) -> DType {
    if size == view.size_bytes() {
        view
    } else {
        base
    }
}

/// Constant `tensor<Nx1xi64>` indices.
fn index_column(e: &mut Emitter, indices: &[i64]) -> Value {
    // A dense literal must be nested like its type: emit it 1-D, then reshape.
    let n = indices.len() as i64;
    let flat = e.dense_i64(TensorType::new(DType::I64, &[n]), indices);
    e.reshape(flat, &[n, 1])
}

/// Applies one chain to `v`. Element types change only at `Bitcast` ops, between the base's
/// dtype and the view's.
pub fn lower_chain(
    e: &mut Emitter,
    mut v: Value,
    chain: &Chain,
    view: DType,
    base: DType,
) -> Value {
    if e.shape(v) != chain.input.as_slice() {
        v = e.reshape(v, &chain.input);
    }
    for op in &chain.ops {
        v = match op {
            ViewOp::Reshape { shape } => e.reshape(v, shape),
            ViewOp::Transpose { permutation } => e.transpose(v, &dims(permutation)),
            ViewOp::BroadcastInDim {
                shape,
                broadcast_dimensions,
            } => e.broadcast_in_dim(v, shape, &dims(broadcast_dimensions)),
            ViewOp::Slice {
                start_indices,
                limit_indices,
                strides,
            } => e.slice(v, start_indices, limit_indices, strides),
            ViewOp::Pad {
                edge_padding_low,
                edge_padding_high,
            } => {
                let zero = e.scalar_constant(e.dtype(v), ScalarValue::Int(0));
                let interior = vec![0; edge_padding_low.len()];
                e.pad(v, zero, edge_padding_low, edge_padding_high, &interior)
            }
            ViewOp::Bitcast {
                from_elem_size,
                to_elem_size,
            } => {
                let to = dtype_of_size(*to_elem_size, view, base);
                let mut shape = e.shape(v).to_vec();
                if to_elem_size < from_elem_size {
                    shape.push((from_elem_size / to_elem_size) as i64);
                } else {
                    shape.pop();
                }
                let ty = TensorType::new(to, &shape);
                e.bitcast(v, ty)
            }
            ViewOp::Gather { indices, shape } => {
                let n = indices.len() as i64;
                let flat = if n == 0 {
                    let ty = e.ty(v).with_shape(&[0]);
                    e.constant(ty, ScalarValue::Int(0))
                } else {
                    let idx = index_column(e, indices);
                    let ty = e.ty(v).with_shape(&[n]);
                    e.op(
                        "stablehlo.gather",
                        &[v, idx],
                        "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>",
                        ty,
                    )
                };
                e.reshape(flat, shape)
            }
        };
    }
    v
}

/// The new flat base after writing `update` (in the view's dtype and shape) through a view.
pub fn lower_write(
    e: &mut Emitter,
    base_value: Value,
    update: Value,
    program: &WriteProgram,
    view: DType,
    base: DType,
) -> Value {
    let update = e.convert(update, view);
    // With equal element sizes no chain has a Bitcast: the whole program runs in the base's
    // dtype, the update reinterpreted first.
    let (update, patch_dtype) = if view.size_bytes() == base.size_bytes() {
        (bitcast_same_size(e, update, base), base)
    } else {
        (update, view)
    };
    let written = match &program.step {
        WriteStep::Keep => return base_value,
        WriteStep::Replace => lower_chain(e, update, &program.update_ops, patch_dtype, base),
        WriteStep::UpdateSlice { start_indices } => {
            let target = lower_chain(e, base_value, &program.base_ops, patch_dtype, base);
            let patch = lower_chain(e, update, &program.update_ops, patch_dtype, base);
            let starts: Vec<Value> = start_indices
                .iter()
                .map(|&s| e.scalar_constant(DType::I64, ScalarValue::Int(s)))
                .collect();
            blend_update_slice(e, target, patch, &starts)
        }
        WriteStep::Scatter { indices } => {
            let target = lower_chain(e, base_value, &program.base_ops, patch_dtype, base);
            let patch = lower_chain(e, update, &program.update_ops, patch_dtype, base);
            let n = indices.len() as i64;
            let patch = e.reshape(patch, &[n]);
            let idx = index_column(e, indices);
            let dtype = e.dtype(target);
            let region = e.region(
                &[TensorType::scalar(dtype), TensorType::scalar(dtype)],
                |_, args| vec![args[1]],
            );
            // Scattered into zeros and blended with a scattered mask, never into the target
            // itself (see `blend_update_slice`).
            let ty = e.ty(target).clone();
            let zeros = e.constant(ty.clone(), ScalarValue::Int(0));
            let placed = scatter_flat(e, zeros, idx, patch, region);
            let mask_ty = TensorType::new(DType::Bool, &ty.shape);
            let falses = e.constant(mask_ty, ScalarValue::Bool(false));
            let trues = e.constant(TensorType::new(DType::Bool, &[n]), ScalarValue::Bool(true));
            let mask_region = e.region(
                &[
                    TensorType::scalar(DType::Bool),
                    TensorType::scalar(DType::Bool),
                ],
                |_, args| vec![args[1]],
            );
            let mask = scatter_flat(e, falses, idx, trues, mask_region);
            e.select(mask, placed, target)
        }
    };
    lower_chain(e, written, &program.restore_ops, patch_dtype, base)
}

/// `stablehlo.scatter` of single elements of `patch` into the 1-D `target` at `idx`
/// (`[N, 1]`), combining with `region`.
fn scatter_flat(e: &mut Emitter, target: Value, idx: Value, patch: Value, region: String) -> Value {
    let ty = e.ty(target).clone();
    e.op_with_regions(
        "stablehlo.scatter",
        &[target, idx, patch],
        &[region],
        "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = true",
        vec![ty],
    )[0]
}

/// `target` with `patch` written at `starts`, as a blend: the patch placed into zeros by
/// `dynamic_update_slice`, a mask placed likewise, then a select. The in-place form
/// (`dynamic_update_slice` into the target) is avoided on purpose: xla-cpu-pjrt 0.0.1
/// miscomputes chained in-place updates of a base whose update is computed from that base.
pub fn blend_update_slice(e: &mut Emitter, target: Value, patch: Value, starts: &[Value]) -> Value {
    let ty = e.ty(target).clone();
    let patch = e.convert(patch, ty.dtype);
    let patch_shape = e.shape(patch).to_vec();
    let zeros = e.constant(ty.clone(), ScalarValue::Int(0));
    let mut operands = vec![zeros, patch];
    operands.extend_from_slice(starts);
    let placed = e.op("stablehlo.dynamic_update_slice", &operands, "", ty.clone());
    let mask_ty = TensorType::new(DType::Bool, &ty.shape);
    let falses = e.constant(mask_ty.clone(), ScalarValue::Bool(false));
    let trues = e.constant(
        TensorType::new(DType::Bool, &patch_shape),
        ScalarValue::Bool(true),
    );
    let mut mask_operands = vec![falses, trues];
    mask_operands.extend_from_slice(starts);
    let mask = e.op(
        "stablehlo.dynamic_update_slice",
        &mask_operands,
        "",
        mask_ty,
    );
    e.select(mask, placed, target)
}

/// Reading helper used by callers: a read through a chain, then the same-size reinterpretation
/// to the view's dtype if the chain left the base's.
pub fn lower_read(e: &mut Emitter, v: Value, chain: &Chain, view: DType, base: DType) -> Value {
    let out = lower_chain(e, v, chain, view, base);
    bitcast_same_size(e, out, view)
}
