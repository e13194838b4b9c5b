//! Sorting and advanced indexing: sort, topk, nonzero, masked_select, masked_scatter,
//! repeat_interleave's positions, and `index`/`index_put` with integer index tensors.
//!
//! Ops whose result size depends on the data (nonzero, masked_select, repeat_interleave) take
//! that size as a static param: the caller counts first (one host read, or the user's
//! `output_size`), so the op itself has a static shape and fuses like any other. Every selection is a stable sort by a key, which keeps equal keys in their
//! original order — PyTorch's order for `stable=True`, and the order of its row-major scans.

use crate::dtype::{DType, Shape, TensorType};
use crate::elementwise::is_nan;
use crate::emitter::{bracket_list, i64_array, Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout as layout;
use crate::params::wrap_dim;
use crate::promote::broadcast_shapes;
use crate::shape::check_expand;
use crate::{single, LowerArgs, Meta, MetaArgs, OpId, OpRule, ScalarValue};

fn fmt_shape(s: &[i64]) -> String {
    format!("{s:?}")
}

/// Where the index tensors of `index`/`index_put` take their elements from, and the result's
/// shape (PyTorch's advanced indexing rules).
#[derive(Debug, PartialEq)]
struct IndexPlan {
    /// The self dim each index tensor selects along (increasing).
    dims: Vec<usize>,
    /// The index tensors' common (broadcast) shape.
    batch: Shape,
    /// Where the batch dims sit in the result: in place of the indexed dims when those are
    /// adjacent, else at the front (PyTorch's rule).
    at: usize,
    shape: Shape,
}

impl IndexPlan {
    /// The result dims that come from self's unindexed dims, in order.
    fn window_dims(&self) -> Vec<i64> {
        let b = self.batch.len();
        (0..self.shape.len())
            .filter(|&d| d < self.at || d >= self.at + b)
            .map(|d| d as i64)
            .collect()
    }
}

fn index_plan(x: &TensorType, indices: &[TensorType], dims: &[i64]) -> Result<IndexPlan, OpError> {
    ensure!(
        dims.len() == indices.len(),
        "index: {} index tensors but {} indexed dims in the params",
        indices.len(),
        dims.len()
    );
    let rank = x.rank();
    let mut wrapped = Vec::with_capacity(dims.len());
    for &d in dims {
        if d < 0 || d as usize >= rank {
            return Err(OpError::index(format!(
                "too many indices for tensor of dimension {rank} (got {})",
                i128::from(d) + 1
            )));
        }
        let d = d as usize;
        ensure!(
            wrapped.last().is_none_or(|&last| last < d),
            "index: the indexed dims {dims:?} must increase"
        );
        wrapped.push(d);
    }
    let mut batch = Shape::new();
    for t in indices {
        if !matches!(t.dtype, DType::I64 | DType::I32) {
            return Err(OpError::index(
                "tensors used as indices must be long, int, byte or bool tensors",
            ));
        }
        batch = broadcast_shapes(&batch, &t.shape).map_err(|_| {
            let shapes: Vec<String> = indices.iter().map(|t| fmt_shape(&t.shape)).collect();
            OpError::index(format!(
                "shape mismatch: indexing tensors could not be broadcast together with shapes {}",
                shapes.join(", ")
            ))
        })?;
    }
    let selects = batch.iter().product::<i64>() > 0;
    if wrapped.iter().any(|&d| selects && x.shape[d] == 0) {
        // PyTorch's words, which name no dimension.
        return Err(OpError::index(
            "index is out of bounds for dimension with size 0".to_string(),
        ));
    }
    let adjacent = wrapped.windows(2).all(|w| w[1] == w[0] + 1);
    let rest = (0..rank).filter(|d| !wrapped.contains(d));
    let (at, shape) = match wrapped.first() {
        Some(&first) if adjacent => {
            let mut shape: Shape = x.shape[..first].iter().copied().collect();
            shape.extend(batch.iter().copied());
            shape.extend(x.shape[first + wrapped.len()..].iter().copied());
            (first, shape)
        }
        _ => {
            let mut shape = batch.clone();
            shape.extend(rest.map(|d| x.shape[d]));
            (0, shape)
        }
    };
    Ok(IndexPlan {
        dims: wrapped,
        batch,
        at,
        shape,
    })
}

/// PyTorch's `is_expandable_to`: `from` broadcasts to `to` without growing `to`.
fn expandable_to(from: &[i64], to: &[i64]) -> bool {
    from.len() <= to.len()
        && from
            .iter()
            .rev()
            .zip(to.iter().rev())
            .all(|(&f, &t)| f == t || f == 1)
}

fn check_count(op: OpId, count: i64, numel: i64) -> Result<(), OpError> {
    ensure!(
        (0..=numel).contains(&count),
        "{}: the selected count {count} is outside [0, {numel}] (the count is read from the data \
         before the op)",
        op.name()
    );
    Ok(())
}

// ---- rules: each op's meta beside its lowering --------------------------------------------

/// `sort` along a dim, stably: the values and their int64 positions.
pub(crate) struct Sort;

impl OpRule for Sort {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(1..=1, 0..=0)?;
        wrap_dim(layout::SortDim::decode(&a.params)?.dim, i[0].rank())?;
        Ok(Meta {
            outputs: smallvec::smallvec![i[0].clone(), i[0].with_dtype(DType::I64)],
            scalar_dtypes: Default::default(),
            variant: 0,
            float_default: None,
            matmul_precision: None,
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let l = layout::SortDim::decode(&a.params)?;
        lower_sorted(e, a, l.dim, l.descending, None)
    }
}

/// `topk`: the `k` largest (or smallest) values along a dim and their int64 positions, sorted.
pub(crate) struct TopK;

impl OpRule for TopK {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let layout::TopK { k, dim, .. } = layout::TopK::decode(&a.params)?;
        let dim = wrap_dim(dim, x.rank())?;
        let size = if x.rank() == 0 { 1 } else { x.shape[dim] };
        ensure!((0..=size).contains(&k), "selected index k out of range");
        let mut shape = x.shape.clone();
        if x.rank() > 0 {
            shape[dim] = k;
        }
        let values = x.with_shape(&shape);
        let indices = values.with_dtype(DType::I64);
        Ok(Meta {
            outputs: smallvec::smallvec![values, indices],
            scalar_dtypes: Default::default(),
            variant: 0,
            float_default: None,
            matmul_precision: None,
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let l = layout::TopK::decode(&a.params)?;
        lower_sorted(e, a, l.dim, l.largest, Some(l.k))
    }
}

/// `nonzero`: the coordinates (`[rank, count]`, int64) of the input's nonzero elements, their
/// count given.
pub(crate) struct Nonzero;

impl OpRule for Nonzero {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let count = layout::Count::decode(&a.params)?.count;
        check_count(a.op, count, x.numel())?;
        single(TensorType::new(DType::I64, &[x.rank() as i64, count]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let x = a.inputs[0];
        let x_ty = e.ty(x).clone();
        let out = a.out(0).clone();
        let v = if out.numel() == 0 {
            zeros(e, &out)
        } else {
            let key = if x_ty.dtype == DType::Bool {
                x
            } else {
                e.compare_const(Cmp::Ne, x, 0.0)
            };
            let order = positions_first(e, key, None);
            let pos = e.slice_dim(order, 0, 0, out.shape[1], 1);
            unravel(e, pos, &x_ty.shape)
        };
        Ok(vec![v])
    }
}

/// `masked_select`: the elements where a bool mask (broadcast with the input) holds, in
/// row-major order, their count given.
pub(crate) struct MaskedSelect;

impl OpRule for MaskedSelect {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(2..=2, 0..=0)?;
        let (x, mask) = (&a.inputs[0], &a.inputs[1]);
        ensure!(
            mask.dtype == DType::Bool,
            "masked_select: expected BoolTensor for mask"
        );
        let shape = broadcast_shapes(&x.shape, &mask.shape)?;
        let count = layout::Count::decode(&a.params)?.count;
        check_count(a.op, count, shape.iter().product())?;
        single(TensorType::new(x.dtype, &[count]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let v = if out.numel() == 0 {
            zeros(e, &out)
        } else {
            let b = e.broadcast_all(&[a.inputs[0], a.inputs[1]]);
            let picked = positions_first(e, b[1], Some(b[0]));
            e.slice_dim(picked, 0, 0, out.shape[0], 1)
        };
        Ok(vec![v])
    }
}

/// `repeat_interleave` of a 1-D repeats tensor: each position repeated its count of times,
/// the total given.
pub(crate) struct RepeatInterleave;

impl OpRule for RepeatInterleave {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let repeats = &a.inputs[0];
        ensure!(
            repeats.rank() == 1,
            "repeat_interleave only accept 1D vector as repeat"
        );
        if !matches!(repeats.dtype, DType::I32 | DType::I64) {
            return Err(OpError::not_implemented(format!(
                "\"repeat_interleave_pjrt\" not implemented for '{}'",
                repeats.dtype.scalar_type_name()
            )));
        }
        let total = layout::Count::decode(&a.params)?.count;
        ensure!(
            total >= 0,
            "repeat_interleave: output_size must be non-negative, but got {total}"
        );
        // No repeats make nothing, whatever size was asked for (as PyTorch's kernels).
        let total = if repeats.numel() == 0 { 0 } else { total };
        single(TensorType::new(repeats.dtype, &[total]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let v = if out.numel() == 0 {
            zeros(e, &out)
        } else {
            repeated_positions(e, a.inputs[0], out.shape[0], out.dtype)
        };
        Ok(vec![v])
    }
}

/// `masked_scatter_`: the input with the elements where a bool mask holds taken from a source
/// tensor, in row-major order.
pub(crate) struct MaskedScatter;

impl OpRule for MaskedScatter {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(3..=3, 0..=0)?;
        let (x, mask, source) = (&a.inputs[0], &a.inputs[1], &a.inputs[2]);
        ensure!(
            mask.dtype == DType::Bool,
            "masked_scatter_ only supports boolean masks, but got mask with dtype {}",
            mask.dtype.scalar_type_name()
        );
        ensure!(
            source.dtype == x.dtype,
            "masked_scatter_: expected self and source to have same dtypes but got {} and {}",
            x.dtype.scalar_type_name(),
            source.dtype.scalar_type_name()
        );
        check_expand(&mask.shape, &x.shape)?;
        single(x.clone())
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![lower_masked_scatter(
            e,
            a.inputs[0],
            a.inputs[1],
            a.inputs[2],
        )])
    }
}

/// `index`: the input at integer index tensors along some of its dims (PyTorch's advanced
/// indexing).
pub(crate) struct Index;

impl OpRule for Index {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        ensure!(!i.is_empty(), "index: expected self and index tensors");
        let dims = layout::IndexedDims::decode(&a.params)?.indexed_dims;
        let plan = index_plan(&i[0], &i[1..], dims)?;
        single(i[0].with_shape(&plan.shape))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let x = a.inputs[0];
        let x_ty = e.ty(x).clone();
        let types: Vec<TensorType> = a.inputs[1..].iter().map(|&v| e.ty(v).clone()).collect();
        let dims = layout::IndexedDims::decode(&a.params)?.indexed_dims;
        let plan = index_plan(&x_ty, &types, dims)?;
        Ok(vec![lower_index(e, x, &a.inputs[1..], &plan)])
    }
}

/// `index_put`: the input with values written (or accumulated) at integer index tensors along
/// some of its dims.
pub(crate) struct IndexPut;

impl OpRule for IndexPut {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let p = &a.params;
        let i = a.inputs;
        ensure!(
            i.len() >= 2,
            "index_put: expected self, values and index tensors"
        );
        let (x, values) = (&i[0], &i[1]);
        // 2 accumulates too: index_add, whose out-of-range errors differ (checks.rs).
        let l = layout::IndexPutDims::decode(p)?;
        if !(0..=2).contains(&l.accumulate) {
            return Err(p.invalid("accumulate must be 0, 1 or 2"));
        }
        let plan = index_plan(x, &i[2..], l.indexed_dims)?;
        // PyTorch checks the shapes first: `a[mask] = torch.tensor([])` is a shape error.
        ensure!(
            expandable_to(&values.shape, &plan.shape),
            "shape mismatch: value tensor of shape {} cannot be broadcast to indexing result \
             of shape {}",
            fmt_shape(&values.shape),
            fmt_shape(&plan.shape)
        );
        ensure!(
            values.dtype == x.dtype,
            "Index put requires the source and destination dtypes match, got {} for the \
             destination and {} for the source.",
            x.dtype.scalar_type_name(),
            values.dtype.scalar_type_name()
        );
        single(x.clone())
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let x = a.inputs[0];
        let x_ty = e.ty(x).clone();
        let types: Vec<TensorType> = a.inputs[2..].iter().map(|&v| e.ty(v).clone()).collect();
        let l = layout::IndexPutDims::decode(&a.params)?;
        let plan = index_plan(&x_ty, &types, l.indexed_dims)?;
        Ok(vec![lower_index_put(
            e,
            x,
            a.inputs[1],
            &a.inputs[2..],
            &plan,
            l.accumulate != 0,
        )])
    }
}

/// `sort` and `topk`: the input sorted along `dim` (`descending`, or largest first) with its
/// positions, the first `k` of each kept for `topk`.
fn lower_sorted(
    e: &mut Emitter,
    a: &LowerArgs,
    dim: i64,
    descending: bool,
    k: Option<i64>,
) -> Result<Vec<Value>, OpError> {
    let x = a.inputs[0];
    let x_ty = e.ty(x).clone();
    let (values, indices) = (a.out(0).clone(), a.out(1).clone());
    if values.numel() == 0 {
        return Ok(vec![zeros(e, &values), zeros(e, &indices)]);
    }
    if x_ty.rank() == 0 {
        return Ok(vec![x, zeros(e, &indices)]);
    }
    let dim = wrap_dim(dim, x_ty.rank())?;
    let iota = e.iota(x_ty.with_dtype(DType::I64), dim);
    let sorted = sort_by_key(e, &[x, iota], dim, |e, a, b| {
        value_order(e, a, b, descending)
    });
    Ok(match k {
        Some(k) => sorted
            .iter()
            .map(|&v| e.slice_dim(v, dim, 0, k, 1))
            .collect(),
        None => sorted,
    })
}

// ---- lowering ------------------------------------------------------------------------------

/// `operands` (one shape) sorted together along `dim` by the first one, stably; `before` is the
/// strict order of two key elements.
fn sort_by_key(
    e: &mut Emitter,
    operands: &[Value],
    dim: usize,
    before: impl FnOnce(&mut Emitter, Value, Value) -> Value,
) -> Vec<Value> {
    let mut arg_types = Vec::with_capacity(2 * operands.len());
    for &v in operands {
        let t = TensorType::scalar(e.dtype(v));
        arg_types.push(t.clone());
        arg_types.push(t);
    }
    let region = e.region(&arg_types, |e, args| vec![before(e, args[0], args[1])]);
    let results: Vec<TensorType> = operands.iter().map(|&v| e.ty(v).clone()).collect();
    e.op_with_regions(
        "stablehlo.sort",
        operands,
        &[region],
        &format!("dimension = {dim} : i64, is_stable = true"),
        results,
    )
}

/// PyTorch's sort order: NaN above every number (last ascending, first descending).
fn value_order(e: &mut Emitter, a: Value, b: Value, descending: bool) -> Value {
    let (a, b) = if descending { (b, a) } else { (a, b) };
    let dtype = e.dtype(a);
    if dtype == DType::Bool {
        // false < true
        let not_a = e.not(a);
        return e.and(not_a, b);
    }
    let less = e.compare(Cmp::Lt, a, b);
    if !dtype.is_float() {
        return less;
    }
    let a_nan = is_nan(e, a);
    let b_nan = is_nan(e, b);
    let a_num = e.not(a_nan);
    let nan_above = e.and(b_nan, a_num);
    e.or(less, nan_above)
}

/// True keys before false ones.
fn true_first(e: &mut Emitter, a: Value, b: Value) -> Value {
    let not_b = e.not(b);
    e.and(a, not_b)
}

fn zeros(e: &mut Emitter, ty: &TensorType) -> Value {
    e.constant(ty.clone(), ScalarValue::Int(0))
}

/// `carried` (by default the flat positions) flattened and reordered so the elements where
/// `mask` holds come first, in row-major order: the first `count` are the selected ones.
fn positions_first(e: &mut Emitter, mask: Value, carried: Option<Value>) -> Value {
    let n = e.ty(mask).numel();
    let flat = e.reshape(mask, &[n]);
    let carried = match carried {
        Some(v) => e.reshape(v, &[n]),
        None => e.iota(TensorType::new(DType::I64, &[n]), 0),
    };
    sort_by_key(e, &[flat, carried], 0, true_first)[1]
}

/// `repeat_interleave`'s result of `total` elements for the 1-d `repeats`: position `j` holds
/// how many repeats end at or before `j` (`#{i : repeats[0] + ... + repeats[i] <= j}`), the
/// position whose run covers `j`, capped at the last position (positions past the true total,
/// a padded bucket's or a wrong `output_size`'s, stay valid indices). The running ends come
/// from a lower-triangular sum, the counts from comparing every position with every end: both
/// fuse into reductions, and `repeats` is short wherever the op is used (a sequence's
/// durations, a batch's lengths, the experts' token counts).
fn repeated_positions(e: &mut Emitter, repeats: Value, total: i64, dtype: DType) -> Value {
    let n = e.ty(repeats).shape[0];
    let wide = e.convert(repeats, DType::I64);
    let square = TensorType::new(DType::I64, &[n, n]);
    let rows = e.iota(square.clone(), 0);
    let cols = e.iota(square.clone(), 1);
    let upto = e.compare(Cmp::Le, cols, rows);
    let spread = e.broadcast_in_dim(wide, &[n, n], &[1]);
    let none = zeros(e, &square);
    let kept = e.select(upto, spread, none);
    let ends = e.reduce_sum(kept, &[1]);
    let positions = e.iota(TensorType::new(DType::I64, &[total, n]), 0);
    let ends = e.broadcast_in_dim(ends, &[total, n], &[1]);
    let ended = e.compare(Cmp::Le, ends, positions);
    let counted = e.convert(ended, DType::I64);
    let count = e.reduce_sum(counted, &[1]);
    let last = e.constant(
        TensorType::new(DType::I64, &[total]),
        ScalarValue::Int(n - 1),
    );
    let capped = e.min(count, last);
    e.convert(capped, dtype)
}

/// The index tensors broadcast to the batch shape, wrapped (negative counts from the end) and
/// stacked into `[batch..., k]` int64 start indices.
fn stacked_indices(e: &mut Emitter, x_shape: &[i64], indices: &[Value], plan: &IndexPlan) -> Value {
    let mut full = plan.batch.to_vec();
    full.push(1);
    let parts: Vec<Value> = indices
        .iter()
        .zip(&plan.dims)
        .map(|(&idx, &d)| {
            let idx = e.convert(idx, DType::I64);
            let idx = e.broadcast_to(idx, &plan.batch);
            let negative = e.compare_const(Cmp::Lt, idx, 0.0);
            let size = e.full_like(idx, x_shape[d] as f64);
            let shifted = e.add(idx, size);
            let idx = e.select(negative, shifted, idx);
            e.reshape(idx, &full)
        })
        .collect();
    e.concatenate(&parts, plan.batch.len())
}

fn dims_list(dims: &[usize]) -> String {
    bracket_list(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>())
}

fn lower_index(e: &mut Emitter, x: Value, indices: &[Value], plan: &IndexPlan) -> Value {
    let x_ty = e.ty(x).clone();
    if indices.is_empty() {
        return x;
    }
    let out = x_ty.with_shape(&plan.shape);
    if out.numel() == 0 {
        return zeros(e, &out);
    }
    let start = stacked_indices(e, &x_ty.shape, indices, plan);
    let mut slice_sizes = x_ty.shape.to_vec();
    for &d in &plan.dims {
        slice_sizes[d] = 1;
    }
    let attrs = format!(
        "dimension_numbers = #stablehlo.gather<offset_dims = {}, collapsed_slice_dims = {}, start_index_map = {}, index_vector_dim = {}>, indices_are_sorted = false, slice_sizes = {}",
        bracket_list(&plan.window_dims()),
        dims_list(&plan.dims),
        dims_list(&plan.dims),
        plan.batch.len(),
        i64_array(&slice_sizes)
    );
    e.op("stablehlo.gather", &[x, start], &attrs, out)
}

fn lower_index_put(
    e: &mut Emitter,
    x: Value,
    values: Value,
    indices: &[Value],
    plan: &IndexPlan,
    accumulate: bool,
) -> Value {
    let x_ty = e.ty(x).clone();
    let dtype = x_ty.dtype;
    let updates = e.broadcast_to(values, &plan.shape);
    if indices.is_empty() {
        // Every element is selected once.
        return match (accumulate, dtype) {
            (false, _) => updates,
            (true, DType::Bool) => e.or(x, updates),
            (true, _) => e.add(x, updates),
        };
    }
    if plan.shape.iter().product::<i64>() == 0 {
        return x;
    }
    let start = stacked_indices(e, &x_ty.shape, indices, plan);
    let region = e.region(
        &[TensorType::scalar(dtype), TensorType::scalar(dtype)],
        |e, args| match (accumulate, dtype) {
            (false, _) => vec![args[1]],
            (true, DType::Bool) => vec![e.or(args[0], args[1])],
            (true, _) => vec![e.add(args[0], args[1])],
        },
    );
    let attrs = format!(
        "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = {}, inserted_window_dims = {}, scatter_dims_to_operand_dims = {}, index_vector_dim = {}>, indices_are_sorted = false, unique_indices = false",
        bracket_list(&plan.window_dims()),
        dims_list(&plan.dims),
        dims_list(&plan.dims),
        plan.batch.len()
    );
    e.op_with_regions(
        "stablehlo.scatter",
        &[x, start, updates],
        &[region],
        &attrs,
        vec![x_ty],
    )[0]
}

/// `src` (1-D) at positions `idx` (1-D, int64, in range).
fn take_1d(e: &mut Emitter, src: Value, idx: Value) -> Value {
    let n = e.shape(idx)[0];
    let start = e.reshape(idx, &[n, 1]);
    let attrs = "dimension_numbers = #stablehlo.gather<offset_dims = [], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>";
    let ty = e.ty(src).with_shape(&[n]);
    e.op("stablehlo.gather", &[src, start], attrs, ty)
}

/// `self.masked_scatter_(mask, source)`: the k-th selected element (row-major) takes
/// `source`'s k-th element. The rank of each selected element is the inverse of the sort that
/// puts the selected positions first.
fn lower_masked_scatter(e: &mut Emitter, x: Value, mask: Value, source: Value) -> Value {
    let ty = e.ty(x).clone();
    let n = ty.numel();
    let s = e.ty(source).numel();
    if n == 0 || s == 0 {
        return x;
    }
    let mask = e.broadcast_to(mask, &ty.shape);
    let mask = e.reshape(mask, &[n]);
    let order = positions_first(e, mask, None);
    let iota = e.iota(TensorType::new(DType::I64, &[n]), 0);
    let init = zeros(e, &TensorType::new(DType::I64, &[n]));
    let start = e.reshape(order, &[n, 1]);
    let region = e.region(
        &[
            TensorType::scalar(DType::I64),
            TensorType::scalar(DType::I64),
        ],
        |_, args| vec![args[1]],
    );
    let attrs = "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = true";
    let rank = e.op_with_regions(
        "stablehlo.scatter",
        &[init, start, iota],
        &[region],
        attrs,
        vec![TensorType::new(DType::I64, &[n])],
    )[0];
    // A selected element past the end of `source` is PyTorch's error; clamping keeps the read
    // in bounds.
    let last = e.full_like(rank, (s - 1) as f64);
    let rank = e.min(rank, last);
    let src = e.reshape(source, &[s]);
    let picked = take_1d(e, src, rank);
    let flat = e.reshape(x, &[n]);
    let merged = e.select(mask, picked, flat);
    e.reshape(merged, &ty.shape)
}

/// Coordinates `[rank, count]` of flat positions `pos` (`[count]`) in `shape`, row-major.
fn unravel(e: &mut Emitter, pos: Value, shape: &[i64]) -> Value {
    let count = e.shape(pos)[0];
    let mut stride = 1i64;
    let mut parts = vec![pos; shape.len()];
    for d in (0..shape.len()).rev() {
        let s = e.full_like(pos, stride as f64);
        let q = e.div(pos, s);
        let size = e.full_like(pos, shape[d] as f64);
        let c = e.rem(q, size);
        parts[d] = e.reshape(c, &[1, count]);
        stride *= shape[d];
    }
    e.concatenate(&parts, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{meta, ErrorKind};

    fn t(dtype: DType, shape: &[i64]) -> TensorType {
        TensorType::new(dtype, shape)
    }

    fn shapes(m: &Meta) -> Vec<(DType, Vec<i64>)> {
        m.outputs
            .iter()
            .map(|o| (o.dtype, o.shape.to_vec()))
            .collect()
    }

    #[test]
    fn sort_and_topk_types() {
        let x = t(DType::F32, &[4, 5]);
        let m = meta(OpId::Sort, std::slice::from_ref(&x), &[], &[1, 0]).unwrap();
        assert_eq!(
            shapes(&m),
            [(DType::F32, vec![4, 5]), (DType::I64, vec![4, 5])]
        );
        let m = meta(OpId::TopK, std::slice::from_ref(&x), &[], &[3, -1, 1, 1]).unwrap();
        assert_eq!(
            shapes(&m),
            [(DType::F32, vec![4, 3]), (DType::I64, vec![4, 3])]
        );
        let err = meta(OpId::TopK, std::slice::from_ref(&x), &[], &[6, 1, 1, 1]).unwrap_err();
        assert_eq!(err.message, "selected index k out of range");
        let err = meta(OpId::Sort, &[x], &[], &[2, 0]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Index);
        let m = meta(OpId::TopK, &[t(DType::I64, &[])], &[], &[1, 0, 1, 1]).unwrap();
        assert_eq!(shapes(&m), [(DType::I64, vec![]), (DType::I64, vec![])]);
    }

    #[test]
    fn data_dependent_sizes_come_from_the_count() {
        let m = meta(OpId::Nonzero, &[t(DType::F32, &[3, 4, 2])], &[], &[7]).unwrap();
        assert_eq!(shapes(&m), [(DType::I64, vec![3, 7])]);
        assert!(meta(OpId::Nonzero, &[t(DType::F32, &[3])], &[], &[4]).is_err());
        let m = meta(
            OpId::MaskedSelect,
            &[t(DType::F16, &[3, 1]), t(DType::Bool, &[4])],
            &[],
            &[5],
        )
        .unwrap();
        assert_eq!(shapes(&m), [(DType::F16, vec![5])]);
        let err = meta(
            OpId::MaskedSelect,
            &[t(DType::F32, &[3]), t(DType::U8, &[3])],
            &[],
            &[1],
        )
        .unwrap_err();
        assert_eq!(err.message, "masked_select: expected BoolTensor for mask");
    }

    #[test]
    fn index_places_the_batch_dims_like_pytorch() {
        let x = t(DType::F32, &[4, 5, 6, 7]);
        let i = |s: &[i64]| t(DType::I64, s);
        // One index: its dims replace the indexed dim.
        let m = meta(OpId::Index, &[x.clone(), i(&[2, 3])], &[], &[1]).unwrap();
        assert_eq!(shapes(&m), [(DType::F32, vec![4, 2, 3, 6, 7])]);
        // Adjacent indices broadcast together in place.
        let m = meta(OpId::Index, &[x.clone(), i(&[3, 1]), i(&[2])], &[], &[1, 2]).unwrap();
        assert_eq!(shapes(&m), [(DType::F32, vec![4, 3, 2, 7])]);
        // Separated indices move the batch dims to the front.
        let m = meta(OpId::Index, &[x.clone(), i(&[3]), i(&[3])], &[], &[0, 2]).unwrap();
        assert_eq!(shapes(&m), [(DType::F32, vec![3, 5, 7])]);
        let err = meta(OpId::Index, &[x.clone(), i(&[2]), i(&[3])], &[], &[0, 1]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Index);
        assert_eq!(
            err.message,
            "shape mismatch: indexing tensors could not be broadcast together with shapes [2], [3]"
        );
        let err = meta(OpId::Index, &[x.clone(), t(DType::F32, &[2])], &[], &[0]).unwrap_err();
        assert_eq!(
            err.message,
            "tensors used as indices must be long, int, byte or bool tensors"
        );
        let err = meta(OpId::Index, &[x, i(&[1])], &[], &[4]).unwrap_err();
        assert_eq!(
            err.message,
            "too many indices for tensor of dimension 4 (got 5)"
        );
        let err = meta(OpId::Index, &[t(DType::F32, &[0, 3]), i(&[1])], &[], &[0]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Index);
    }

    #[test]
    fn index_put_checks_values() {
        let x = t(DType::F32, &[4, 5]);
        let idx = t(DType::I64, &[3]);
        let m = meta(
            OpId::IndexPut,
            &[x.clone(), t(DType::F32, &[5]), idx.clone()],
            &[],
            &[1, 0],
        )
        .unwrap();
        assert_eq!(shapes(&m), [(DType::F32, vec![4, 5])]);
        let err = meta(
            OpId::IndexPut,
            &[x.clone(), t(DType::F32, &[2, 5]), idx.clone()],
            &[],
            &[0, 0],
        )
        .unwrap_err();
        assert_eq!(
            err.message,
            "shape mismatch: value tensor of shape [2, 5] cannot be broadcast to indexing result of shape [3, 5]"
        );
        // Both wrong: the shape is named first, as PyTorch does.
        let err = meta(
            OpId::IndexPut,
            &[x.clone(), t(DType::F64, &[0]), idx.clone()],
            &[],
            &[0, 0],
        )
        .unwrap_err();
        assert!(err.message.starts_with("shape mismatch"), "{}", err.message);
        let err = meta(OpId::IndexPut, &[x, t(DType::F64, &[]), idx], &[], &[0, 0]).unwrap_err();
        assert!(err
            .message
            .starts_with("Index put requires the source and destination dtypes match"));
    }

    #[test]
    fn repeat_interleave_types_and_errors() {
        let m = meta(OpId::RepeatInterleave, &[t(DType::I32, &[4])], &[], &[9]).unwrap();
        assert_eq!(shapes(&m), [(DType::I32, vec![9])]);
        // No repeats make nothing, whatever total was asked for.
        let m = meta(OpId::RepeatInterleave, &[t(DType::I64, &[0])], &[], &[3]).unwrap();
        assert_eq!(shapes(&m), [(DType::I64, vec![0])]);
        let err = meta(OpId::RepeatInterleave, &[t(DType::I64, &[2, 2])], &[], &[4]).unwrap_err();
        assert_eq!(
            err.message,
            "repeat_interleave only accept 1D vector as repeat"
        );
        let err = meta(OpId::RepeatInterleave, &[t(DType::F32, &[2])], &[], &[4]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotImplemented);
        assert_eq!(
            err.message,
            "\"repeat_interleave_pjrt\" not implemented for 'Float'"
        );
        assert!(meta(OpId::RepeatInterleave, &[t(DType::I64, &[2])], &[], &[-1]).is_err());
    }

    #[test]
    fn masked_scatter_checks() {
        let x = t(DType::F32, &[2, 3]);
        let m = meta(
            OpId::MaskedScatter,
            &[x.clone(), t(DType::Bool, &[3]), t(DType::F32, &[4])],
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(shapes(&m), [(DType::F32, vec![2, 3])]);
        assert!(meta(
            OpId::MaskedScatter,
            &[x.clone(), t(DType::Bool, &[3, 3]), t(DType::F32, &[4])],
            &[],
            &[],
        )
        .is_err());
        assert!(meta(
            OpId::MaskedScatter,
            &[x, t(DType::Bool, &[3]), t(DType::F64, &[4])],
            &[],
            &[],
        )
        .is_err());
    }

    #[test]
    fn lowerings_build() {
        let cases: Vec<(OpId, Vec<TensorType>, Vec<i64>)> = vec![
            (OpId::Sort, vec![t(DType::BF16, &[3, 4])], vec![0, 1]),
            (OpId::Sort, vec![t(DType::Bool, &[5])], vec![0, 0]),
            (OpId::TopK, vec![t(DType::I32, &[3, 4])], vec![2, 1, 0, 1]),
            (OpId::Nonzero, vec![t(DType::F32, &[3, 4])], vec![5]),
            (OpId::Nonzero, vec![t(DType::Bool, &[])], vec![1]),
            (
                OpId::MaskedSelect,
                vec![t(DType::F32, &[3, 4]), t(DType::Bool, &[4])],
                vec![2],
            ),
            (
                OpId::MaskedScatter,
                vec![
                    t(DType::F32, &[3, 4]),
                    t(DType::Bool, &[4]),
                    t(DType::F32, &[6]),
                ],
                vec![],
            ),
            (
                OpId::Index,
                vec![
                    t(DType::F32, &[3, 4, 5]),
                    t(DType::I64, &[2]),
                    t(DType::I32, &[2]),
                ],
                vec![0, 2],
            ),
            (
                OpId::IndexPut,
                vec![
                    t(DType::F32, &[3, 4]),
                    t(DType::F32, &[4]),
                    t(DType::I64, &[2]),
                ],
                vec![1, 0],
            ),
        ];
        for (op, inputs, params) in cases {
            let (text, _) = crate::lower_single(op, &inputs, &[], &params)
                .unwrap_or_else(|e| panic!("{op}: {e}"));
            assert!(text.contains("func.func public @main"), "{op}");
        }
    }
}
