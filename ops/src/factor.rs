//! Matrix factorizations: Cholesky, LU with partial pivoting (and its permutation), QR and the
//! symmetric eigendecomposition, over batches of real matrices. `solve`, `inv`, `det` and the
//! rest of `torch.linalg` compose from these in the plugin.
//!
//! Cholesky is `stablehlo.cholesky`; QR and `eigh` are XLA's `Qr`,
//! `ProductOfElementaryHouseholderReflectors` and `Eigh` custom calls, which every XLA compiler
//! expands itself; LU is a `stablehlo.while` over the columns, since StableHLO has no LU op.

use crate::dtype::ScalarValue;
use crate::dtype::{DType, Shape, TensorType};
use crate::elementwise::not_implemented_for;
use crate::emitter::{Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout as layout;
use crate::{LowerArgs, Meta, MetaArgs, MetaOutputs, OpRule};

/// Checks `a` is a batch of matrices (square when `square`) of float32 or float64, the dtypes
/// these factorizations compute in (PyTorch's CPU refuses reduced floats the same way).
fn check_matrices(name: &str, kernel: &str, a: &TensorType, square: bool) -> Result<(), OpError> {
    ensure!(
        a.rank() >= 2,
        "{name}: The input tensor A must have at least 2 dimensions."
    );
    if square {
        let r = a.rank();
        ensure!(
            a.shape[r - 1] == a.shape[r - 2],
            "{name}: A must be batches of square matrices, but they are {} by {} matrices",
            a.shape[r - 2],
            a.shape[r - 1]
        );
    }
    if !matches!(a.dtype, DType::F32 | DType::F64) {
        return Err(not_implemented_for(kernel, a.dtype));
    }
    Ok(())
}

/// `[batch..., m, n]` → (`batch...`, their product, m, n).
fn split_batch(shape: &[i64]) -> (Shape, i64, i64, i64) {
    let r = shape.len();
    let batch: Shape = shape[..r - 2].iter().copied().collect();
    (
        batch.clone(),
        batch.iter().product(),
        shape[r - 2],
        shape[r - 1],
    )
}

fn with_dims(batch: &[i64], tail: &[i64]) -> Shape {
    batch.iter().chain(tail).copied().collect()
}

fn int(e: &mut Emitter, dtype: DType, shape: &[i64], value: i64) -> Value {
    e.constant(TensorType::new(dtype, shape), ScalarValue::Int(value))
}

fn float(e: &mut Emitter, dtype: DType, shape: &[i64], value: f64) -> Value {
    e.constant(TensorType::new(dtype, shape), ScalarValue::Float(value))
}

/// Sets every element outside the band `lower <= col - row` (or `col - row <= upper`) of the
/// trailing matrices to zero: `triu(v, lower)` or `tril(v, upper)`.
fn keep_triangle(e: &mut Emitter, v: Value, upper: bool, diagonal: i64) -> Value {
    let shape = e.shape(v).to_vec();
    let r = shape.len();
    let idx = TensorType::new(DType::I64, &shape);
    let rows = e.iota(idx.clone(), r - 2);
    let cols = e.iota(idx, r - 1);
    let offset = int(e, DType::I64, &shape, diagonal);
    let shifted = e.add(rows, offset);
    let keep = if upper {
        e.compare(Cmp::Ge, cols, shifted)
    } else {
        e.compare(Cmp::Le, cols, shifted)
    };
    let zero = e.full_like(v, 0.0);
    e.select(keep, v, zero)
}

/// The trailing two dims of `v` swapped.
fn transpose_last(e: &mut Emitter, v: Value) -> Value {
    let r = e.rank(v);
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 1, r - 2);
    e.transpose(v, &perm)
}

/// `v[..., i]` of a `[B, m]` (or `[B, m, n]` along `dim`) value, for a 0-d `i64` index `i`:
/// a masked sum, exact since every other term is zero.
fn pick(e: &mut Emitter, v: Value, dim: usize, i: Value) -> Value {
    masked_pick(e, v, dim, i, &[])
}

/// Like [`pick`], with one index per batch row: `index` is `[B]`.
fn pick_per_batch(e: &mut Emitter, v: Value, dim: usize, index: Value) -> Value {
    masked_pick(e, v, dim, index, &[0])
}

/// The elements of `v` whose position along `dim` equals `index` (broadcast along
/// `index_dims`), summed over `dim`.
fn masked_pick(e: &mut Emitter, v: Value, dim: usize, index: Value, index_dims: &[usize]) -> Value {
    let shape = e.shape(v).to_vec();
    let positions = e.iota(TensorType::new(DType::I64, &shape), dim);
    let at = e.broadcast_in_dim(index, &shape, index_dims);
    let hit = e.compare(Cmp::Eq, positions, at);
    let zero = e.full_like(v, 0.0);
    let kept = e.select(hit, v, zero);
    e.reduce_sum(kept, &[dim])
}

/// `counter < limit` for a 0-d `i64` loop counter.
fn counter_below(e: &mut Emitter, counter: Value, limit: i64) -> Value {
    let limit = int(e, DType::I64, &[], limit);
    e.compare(Cmp::Lt, counter, limit)
}

fn next_counter(e: &mut Emitter, counter: Value) -> Value {
    let one = int(e, DType::I64, &[], 1);
    e.add(counter, one)
}

// ----- Cholesky ----------------------------------------------------------------------------------

/// `linalg_cholesky_ex`: the lower (or upper) Cholesky factor of each symmetric positive-definite
/// matrix, read from its lower (upper) triangle, and LAPACK's `info`: 0, or the order of the
/// first leading minor that is not positive-definite (the factor's values are then unspecified).
pub(crate) struct Cholesky;

impl OpRule for Cholesky {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        check_matrices("linalg.cholesky", "linalg_cholesky_ex", x, true)?;
        let r = x.rank();
        Ok(Meta::of_outputs(MetaOutputs::from_vec(vec![
            x.clone(),
            TensorType::new(DType::I32, &x.shape[..r - 2]),
        ])))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let upper = layout::Cholesky::decode(&a.params)?.upper;
        let x = a.inputs[0];
        // The upper factor of A is the transpose of the lower factor of A's transpose, which
        // reads A's upper triangle.
        let source = if upper { transpose_last(e, x) } else { x };
        let ty = e.ty(source).clone();
        let factor = e.op("stablehlo.cholesky", &[source], "lower = true", ty);
        let factor = keep_triangle(e, factor, false, 0);
        let factor = if upper {
            transpose_last(e, factor)
        } else {
            factor
        };
        let info = cholesky_info(e, source, factor);
        Ok(vec![factor, info])
    }
}

/// LAPACK's `info` for the Cholesky factorization of `source` (read from its lower triangle):
/// XLA leaves a failed factor's values unspecified (NaN throughout on XLA CPU), so the matrices
/// whose `factor` is not finite are factored again, unblocked, until the first pivot that is not
/// positive. The loop runs no step when every factor is finite.
fn cholesky_info(e: &mut Emitter, source: Value, factor: Value) -> Value {
    let dtype = e.dtype(source);
    let full = e.shape(source).to_vec();
    let (batch, b, n, _) = split_batch(&full);
    let cube = [b, n, n];
    let flat = e.reshape(source, &cube);
    let symmetric = symmetrize(e, flat, true);
    let factor = e.reshape(factor, &cube);
    let finite = e.op(
        "stablehlo.is_finite",
        &[factor],
        "",
        TensorType::new(DType::Bool, &cube),
    );
    let finite = e.convert(finite, DType::I32);
    let all_finite = e.reduce_with(finite, 1.0, &[1, 2], "stablehlo.minimum");
    let zero_b = int(e, DType::I32, &[b], 0);
    let failed = e.compare(Cmp::Eq, all_finite, zero_b);
    let counter = int(e, DType::I64, &[], 0);
    let info = int(e, DType::I32, &[b], 0);
    let done = e.while_loop(
        &[counter, symmetric, info, failed],
        |e, c| {
            let (i, info, failed) = (c[0], c[2], c[3]);
            let below = counter_below(e, i, n);
            // Some failed matrix has not met its failing pivot yet.
            let zero = int(e, DType::I32, &[b], 0);
            let unfound = e.compare(Cmp::Eq, info, zero);
            let pending = e.and(failed, unfound);
            let pending = e.convert(pending, DType::I32);
            let any = e.reduce_with(pending, 0.0, &[0], "stablehlo.maximum");
            let one = int(e, DType::I32, &[], 1);
            let any = e.compare(Cmp::Eq, any, one);
            e.and(below, any)
        },
        |e, c| {
            let (i, x, info, failed) = (c[0], c[1], c[2], c[3]);
            let column = pick(e, x, 2, i); // [B, n]
            let pivot = pick(e, column, 1, i); // [B]
            let zero = float(e, dtype, &[b], 0.0);
            let positive = e.compare(Cmp::Gt, pivot, zero);
            let zero_i = int(e, DType::I32, &[b], 0);
            let unfound = e.compare(Cmp::Eq, info, zero_i);
            let not_positive = e.not(positive);
            let record = e.and(not_positive, unfound);
            let one64 = int(e, DType::I64, &[], 1);
            let order = e.add(i, one64);
            let order = e.convert(order, DType::I32);
            let order = e.broadcast_in_dim(order, &[b], &[]);
            let info = e.select(record, order, info);
            // l = column / sqrt(pivot) below the pivot; the trailing matrix loses l l^T.
            let root = e.sqrt(pivot);
            let root = e.broadcast_in_dim(root, &[b, n], &[0]);
            let l = e.div(column, root);
            let rows = e.iota(TensorType::new(DType::I64, &[b, n]), 1);
            let at = e.broadcast_in_dim(i, &[b, n], &[]);
            let under = e.compare(Cmp::Gt, rows, at);
            let zero2 = float(e, dtype, &[b, n], 0.0);
            let l = e.select(under, l, zero2);
            let l_rows = e.broadcast_in_dim(l, &cube, &[0, 1]);
            let l_cols = e.broadcast_in_dim(l, &cube, &[0, 2]);
            let outer = e.mul(l_rows, l_cols);
            let x = e.sub(x, outer);
            vec![next_counter(e, i), x, info, failed]
        },
    );
    e.reshape(done[2], &batch)
}

// ----- LU ----------------------------------------------------------------------------------------

/// `linalg_lu_factor_ex`: `P A = L U` of each `m x n` matrix by Gaussian elimination with
/// partial pivoting (LAPACK's `getrf`): `L` below the diagonal (unit diagonal implied) and `U`
/// on and above it in one matrix, the 1-based row swapped with row `i` at step `i` (`int32`),
/// and `info`: 0, or the 1-based index of the first exactly zero pivot. Without `pivot`, no rows
/// are swapped (pivots are `1..=k`).
pub(crate) struct LuFactor;

impl OpRule for LuFactor {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        check_matrices("torch.linalg.lu_factor", "linalg_lu_factor_ex", x, false)?;
        let (batch, _, m, n) = split_batch(&x.shape);
        Ok(Meta::of_outputs(MetaOutputs::from_vec(vec![
            x.clone(),
            TensorType::new(DType::I32, &with_dims(&batch, &[m.min(n)])),
            TensorType::new(DType::I32, &batch),
        ])))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let pivot = layout::LuFactor::decode(&a.params)?.pivot;
        let x = a.inputs[0];
        let dtype = e.dtype(x);
        let full = e.shape(x).to_vec();
        let (batch, b, m, n) = split_batch(&full);
        let k = m.min(n);
        let flat = e.reshape(x, &[b, m, n]);
        let counter = int(e, DType::I64, &[], 0);
        let pivots = int(e, DType::I32, &[b, k], 0);
        let info = int(e, DType::I32, &[b], 0);
        let done = e.while_loop(
            &[counter, flat, pivots, info],
            |e, c| counter_below(e, c[0], k),
            |e, c| {
                let (i, x, pivots, info) = (c[0], c[1], c[2], c[3]);
                let cube = [b, m, n];
                let column = pick(e, x, 2, i); // [B, m]
                let p = if pivot {
                    // The first row at or below i with the largest magnitude (LAPACK's idamax).
                    let rows = e.iota(TensorType::new(DType::I64, &[b, m]), 1);
                    let at = e.broadcast_in_dim(i, &[b, m], &[]);
                    let below = e.compare(Cmp::Ge, rows, at);
                    let magnitude = e.abs(column);
                    let never = float(e, dtype, &[b, m], -1.0);
                    let candidates = e.select(below, magnitude, never);
                    first_argmax(e, candidates, rows)
                } else {
                    e.broadcast_in_dim(i, &[b], &[])
                };
                let row_p = pick_per_batch(e, x, 1, p); // [B, n]
                let row_i = pick(e, x, 1, i);
                let idx = TensorType::new(DType::I64, &cube);
                let rows = e.iota(idx.clone(), 1);
                let cols = e.iota(idx, 2);
                let i3 = e.broadcast_in_dim(i, &cube, &[]);
                let p3 = e.broadcast_in_dim(p, &cube, &[0]);
                let at_i = e.compare(Cmp::Eq, rows, i3);
                let at_p = e.compare(Cmp::Eq, rows, p3);
                let row_p3 = e.broadcast_in_dim(row_p, &cube, &[0, 2]);
                let row_i3 = e.broadcast_in_dim(row_i, &cube, &[0, 2]);
                let swapped = e.select(at_p, row_i3, x);
                let swapped = e.select(at_i, row_p3, swapped);
                // The pivot, and the multipliers under it (left as they are when it is zero:
                // then they are zero too, as the pivot is the column's largest).
                let d = pick(e, row_p, 1, i); // [B]
                let column = pick(e, swapped, 2, i); // [B, m]
                let d2 = e.broadcast_in_dim(d, &[b, m], &[0]);
                let zero2 = float(e, dtype, &[b, m], 0.0);
                let nonzero = e.compare(Cmp::Ne, d2, zero2);
                // Times the reciprocal, as LAPACK scales a pivot's column.
                let one2 = float(e, dtype, &[b, m], 1.0);
                let reciprocal = e.div(one2, d2);
                let scaled = e.mul(column, reciprocal);
                let multipliers = e.select(nonzero, scaled, column);
                let l3 = e.broadcast_in_dim(multipliers, &cube, &[0, 1]);
                let below = e.compare(Cmp::Gt, rows, i3);
                let right = e.compare(Cmp::Gt, cols, i3);
                let on_column = e.compare(Cmp::Eq, cols, i3);
                let trailing = e.and(below, right);
                let product = e.mul(l3, row_p3);
                let updated = e.sub(swapped, product);
                let x = e.select(trailing, updated, swapped);
                let under = e.and(below, on_column);
                let x = e.select(under, l3, x);
                // Bookkeeping: the 1-based pivot row, and the first zero pivot.
                let steps = e.iota(TensorType::new(DType::I64, &[b, k]), 1);
                let ik = e.broadcast_in_dim(i, &[b, k], &[]);
                let this_step = e.compare(Cmp::Eq, steps, ik);
                let one = int(e, DType::I64, &[b], 1);
                let p1 = e.add(p, one);
                let p1 = e.convert(p1, DType::I32);
                let p1 = e.broadcast_in_dim(p1, &[b, k], &[0]);
                let pivots = e.select(this_step, p1, pivots);
                let zero_b = float(e, dtype, &[b], 0.0);
                let singular = e.compare(Cmp::Eq, d, zero_b);
                let zero_info = int(e, DType::I32, &[b], 0);
                let first = e.compare(Cmp::Eq, info, zero_info);
                let record = e.and(singular, first);
                let one64 = int(e, DType::I64, &[], 1);
                let order = e.add(i, one64);
                let order = e.convert(order, DType::I32);
                let order = e.broadcast_in_dim(order, &[b], &[]);
                let info = e.select(record, order, info);
                let i = next_counter(e, i);
                vec![i, x, pivots, info]
            },
        );
        let lu = e.reshape(done[1], &full);
        let pivots = e.reshape(done[2], &with_dims(&batch, &[k]));
        let info = e.reshape(done[3], &batch);
        Ok(vec![lu, pivots, info])
    }
}

/// The index (from `positions`, `[B, m]` `i64`) of each row's largest value in `values`
/// (`[B, m]`), the first of equal ones.
fn first_argmax(e: &mut Emitter, values: Value, positions: Value) -> Value {
    let dtype = e.dtype(values);
    let low = float(e, dtype, &[], f64::NEG_INFINITY);
    let far = int(e, DType::I64, &[], i64::MAX);
    let r = e.reduce(&[values, positions], &[low, far], &[1], |e, args| {
        let (best, best_at, v, at) = (args[0], args[1], args[2], args[3]);
        let larger = e.compare(Cmp::Gt, v, best);
        let equal = e.compare(Cmp::Eq, v, best);
        let earlier = e.compare(Cmp::Lt, at, best_at);
        let tie = e.and(equal, earlier);
        let take = e.or(larger, tie);
        vec![e.select(take, v, best), e.select(take, at, best_at)]
    });
    r[1]
}

/// `lu_permutation`: the row order `perm` (`int64`, `[*, m]`) that LAPACK's 1-based `pivots`
/// (`[*, k]`, row `i` swapped with row `pivots[i] - 1` in turn) make: row `j` of `P^T A` is row
/// `perm[j]` of `A`. `m` is the param `rows`.
pub(crate) struct LuPermutation;

impl OpRule for LuPermutation {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let rows = layout::LuPermutation::decode(&a.params)?.rows;
        let p = &a.inputs[0];
        ensure!(
            p.rank() >= 1 && p.dtype == DType::I32,
            "lu_unpack: LU_pivots is expected to be a contiguous tensor of torch.int32 dtype, got {}-d {}",
            p.rank(),
            p.dtype
        );
        let k = p.shape[p.rank() - 1];
        ensure!(
            rows >= k,
            "lu_unpack: expected at least {k} rows for {k} pivots, got {rows}"
        );
        let mut shape: Shape = p.shape[..p.rank() - 1].iter().copied().collect();
        shape.push(rows);
        crate::single(TensorType::new(DType::I64, &shape))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let m = layout::LuPermutation::decode(&a.params)?.rows;
        let pivots = a.inputs[0];
        let shape = e.shape(pivots).to_vec();
        let r = shape.len();
        let k = shape[r - 1];
        let b: i64 = shape[..r - 1].iter().product();
        let flat = e.reshape(pivots, &[b, k]);
        let flat = e.convert(flat, DType::I64);
        let one = int(e, DType::I64, &[b, k], 1);
        let targets = e.sub(flat, one);
        let order = e.iota(TensorType::new(DType::I64, &[b, m]), 1);
        let counter = int(e, DType::I64, &[], 0);
        let done = e.while_loop(
            &[counter, order, targets],
            |e, c| counter_below(e, c[0], k),
            |e, c| {
                let (i, order, targets) = (c[0], c[1], c[2]);
                let s = pick(e, targets, 1, i); // [B]
                let at_i = pick(e, order, 1, i);
                let at_s = pick_per_batch(e, order, 1, s);
                let positions = e.iota(TensorType::new(DType::I64, &[b, m]), 1);
                let i2 = e.broadcast_in_dim(i, &[b, m], &[]);
                let s2 = e.broadcast_in_dim(s, &[b, m], &[0]);
                let is_i = e.compare(Cmp::Eq, positions, i2);
                let is_s = e.compare(Cmp::Eq, positions, s2);
                let at_i2 = e.broadcast_in_dim(at_i, &[b, m], &[0]);
                let at_s2 = e.broadcast_in_dim(at_s, &[b, m], &[0]);
                let order = e.select(is_s, at_i2, order);
                let order = e.select(is_i, at_s2, order);
                vec![next_counter(e, i), order, targets]
            },
        );
        let mut out: Shape = shape[..r - 1].iter().copied().collect();
        out.push(m);
        Ok(vec![e.reshape(done[1], &out)])
    }
}

// ----- QR ----------------------------------------------------------------------------------------

/// `linalg_qr`: `A = Q R` by Householder reflections. `mode` 0 (`"reduced"`): `Q` is `m x k`
/// and `R` `k x n`; 1 (`"complete"`): `Q` is `m x m` and `R` `m x n`; 2 (`"r"`): `R` only
/// (`Q` is empty).
pub(crate) struct Qr;

impl OpRule for Qr {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let mode = layout::Qr::decode(&a.params)?.mode;
        let x = &a.inputs[0];
        check_matrices("linalg.qr", "linalg_qr", x, false)?;
        let (batch, _, m, n) = split_batch(&x.shape);
        let k = m.min(n);
        let (q, r) = match mode {
            0 => (with_dims(&batch, &[m, k]), with_dims(&batch, &[k, n])),
            1 => (with_dims(&batch, &[m, m]), with_dims(&batch, &[m, n])),
            2 => (Shape::from_slice(&[0]), with_dims(&batch, &[k, n])),
            _ => return Err(OpError::runtime(format!("linalg.qr: unknown mode {mode}"))),
        };
        Ok(Meta::of_outputs(MetaOutputs::from_vec(vec![
            TensorType::new(x.dtype, &q),
            TensorType::new(x.dtype, &r),
        ])))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let mode = layout::Qr::decode(&a.params)?.mode;
        let (q, r) = householder_qr(e, a.inputs[0], mode, a.out(0).clone(), a.out(1).clone());
        Ok(vec![q, r])
    }
}

/// `linalg_qr`'s factors of `x` in `mode` (see [`Qr`]); `q_ty` and `r_ty` are their types.
fn householder_qr(
    e: &mut Emitter,
    x: Value,
    mode: i64,
    q_ty: TensorType,
    r_ty: TensorType,
) -> (Value, Value) {
    let dtype = e.dtype(x);
    let full = e.shape(x).to_vec();
    let (batch, _, m, n) = split_batch(&full);
    let k = m.min(n);
    if k == 0 {
        // Nothing to factor: Q is the identity's first columns, R is zeros.
        let r = e.constant(r_ty, ScalarValue::Float(0.0));
        let q = if mode == 2 {
            e.constant(q_ty, ScalarValue::Float(0.0))
        } else {
            identity_columns(e, &q_ty)
        };
        return (q, r);
    }
    let nr = batch.len();
    let taus_shape = with_dims(&batch, &[k]);
    // LAPACK's geqrf: R on and above the diagonal, the reflectors' vectors below it.
    let (h, taus) = packed_qr(e, x, TensorType::new(dtype, &taus_shape));
    let r_rows = if mode == 1 { m } else { k };
    let r = e.slice_dim(h, nr, 0, r_rows, 1);
    let r = keep_triangle(e, r, true, 0);
    if mode == 2 {
        let q = e.constant(q_ty, ScalarValue::Float(0.0));
        return (q, r);
    }
    let q_cols = if mode == 1 { m } else { k };
    // The reflectors, as many columns as Q has: cut to k, or zero-padded to m.
    let vectors = if q_cols <= n {
        e.slice_dim(h, nr + 1, 0, q_cols, 1)
    } else {
        let zero = float(e, dtype, &[], 0.0);
        let mut high = vec![0; nr + 2];
        high[nr + 1] = q_cols - n;
        e.pad(h, zero, &vec![0; nr + 2], &high, &vec![0; nr + 2])
    };
    let q = e.op(
        "stablehlo.custom_call",
        &[vectors, taus],
        "call_target_name = \"ProductOfElementaryHouseholderReflectors\"",
        TensorType::new(dtype, &with_dims(&batch, &[m, q_cols])),
    );
    (q, r)
}

/// XLA's `Qr` custom call, LAPACK's `geqrf`: R on and above the diagonal and the reflectors'
/// vectors below it (`x`'s type), and the reflectors' scalars (`taus`).
fn packed_qr(e: &mut Emitter, x: Value, taus: TensorType) -> (Value, Value) {
    let packed = e.ty(x).clone();
    let r = e.op_with_regions(
        "stablehlo.custom_call",
        &[x],
        &[],
        "call_target_name = \"Qr\"",
        vec![packed, taus],
    );
    (r[0], r[1])
}

/// The first columns of an identity matrix, in each matrix of `ty`.
fn identity_columns(e: &mut Emitter, ty: &TensorType) -> Value {
    let r = ty.rank();
    let idx = TensorType::new(DType::I64, &ty.shape);
    let rows = e.iota(idx.clone(), r - 2);
    let cols = e.iota(idx, r - 1);
    let on = e.compare(Cmp::Eq, rows, cols);
    let one = e.constant(ty.clone(), ScalarValue::Float(1.0));
    let zero = e.constant(ty.clone(), ScalarValue::Float(0.0));
    e.select(on, one, zero)
}

/// `geqrf`: LAPACK's packed QR (R on and above the diagonal, the Householder vectors below it)
/// and the reflectors' scalars, from XLA's `Qr` custom call.
pub(crate) struct Geqrf;

impl OpRule for Geqrf {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        check_matrices("torch.geqrf", "geqrf", x, false)?;
        let (batch, _, m, n) = split_batch(&x.shape);
        Ok(Meta::of_outputs(MetaOutputs::from_vec(vec![
            x.clone(),
            TensorType::new(x.dtype, &with_dims(&batch, &[m.min(n)])),
        ])))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let x = a.inputs[0];
        if a.out(1).shape.last() == Some(&0) {
            let taus = e.constant(a.out(1).clone(), ScalarValue::Float(0.0));
            return Ok(vec![x, taus]);
        }
        let (packed, taus) = packed_qr(e, x, a.out(1).clone());
        Ok(vec![packed, taus])
    }
}

/// `linalg_householder_product`: `H_1 ... H_k` of the `k` reflectors packed in `input`'s
/// columns (`m x n`, `m >= n >= k`), its first `n` columns; XLA's
/// `ProductOfElementaryHouseholderReflectors`.
pub(crate) struct HouseholderProduct;

impl OpRule for HouseholderProduct {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(2..=2, 0..=0)?;
        let (x, tau) = (&a.inputs[0], &a.inputs[1]);
        check_matrices(
            "torch.linalg.householder_product",
            "linalg_householder_product",
            x,
            false,
        )?;
        let (batch, _, m, n) = split_batch(&x.shape);
        ensure!(
            m >= n,
            "torch.linalg.householder_product: input.shape[-2] must be greater than or equal to input.shape[-1]"
        );
        ensure!(
            tau.rank() == x.rank() - 1 && tau.shape[..tau.rank() - 1] == batch[..],
            "torch.linalg.householder_product: Expected batch dimensions of tau to be equal to input.shape[:-2], but got {:?}",
            tau.shape.as_slice()
        );
        ensure!(
            tau.shape[tau.rank() - 1] <= n,
            "torch.linalg.householder_product: input.shape[-1] must be greater than or equal to tau.shape[-1]"
        );
        ensure!(
            tau.dtype == x.dtype,
            "torch.linalg.householder_product: tau dtype {} does not match input dtype {}",
            tau.dtype,
            x.dtype
        );
        crate::single(x.clone())
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let (x, tau) = (a.inputs[0], a.inputs[1]);
        let out = a.out(0).clone();
        let k = *e.shape(tau).last().unwrap_or(&0);
        if k == 0 || out.shape.contains(&0) {
            return Ok(vec![identity_columns(e, &out)]);
        }
        Ok(vec![e.op(
            "stablehlo.custom_call",
            &[x, tau],
            "call_target_name = \"ProductOfElementaryHouseholderReflectors\"",
            out,
        )])
    }
}

// ----- symmetric eigendecomposition --------------------------------------------------------------

/// `_linalg_eigh`: the eigenvalues (ascending) and eigenvectors (columns) of each symmetric
/// matrix, read from its lower (or upper) triangle. Without `compute_v` the eigenvectors are
/// an empty tensor, as PyTorch's. Eigenvectors are unique only up to sign.
pub(crate) struct Eigh;

impl OpRule for Eigh {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let l = layout::Eigh::decode(&a.params)?;
        let x = &a.inputs[0];
        check_matrices("linalg.eigh", "linalg_eigh", x, true)?;
        let (batch, _, n, _) = split_batch(&x.shape);
        let vectors = if l.compute_v {
            x.shape.clone()
        } else {
            Shape::from_slice(&[0])
        };
        Ok(Meta::of_outputs(MetaOutputs::from_vec(vec![
            TensorType::new(x.dtype, &with_dims(&batch, &[n])),
            TensorType::new(x.dtype, &vectors),
        ])))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let l = layout::Eigh::decode(&a.params)?;
        let x = a.inputs[0];
        let dtype = e.dtype(x);
        let full = e.shape(x).to_vec();
        let (batch, _, n, _) = split_batch(&full);
        let values_ty = TensorType::new(dtype, &with_dims(&batch, &[n]));
        if n == 0 {
            let values = e.constant(values_ty, ScalarValue::Float(0.0));
            let vectors = e.constant(a.out(1).clone(), ScalarValue::Float(0.0));
            return Ok(vec![values, vectors]);
        }
        let (vectors, values) = jacobi_eigh(e, x, !l.upper);
        // XLA's Jacobi rotations leave float64 eigenvectors about 1e-8 off (the residual
        // `A V - V W`; LAPACK's is 1e-15), so they are refined once (RFC 0051).
        let (vectors, values) = if dtype == DType::F64 {
            let symmetric = symmetrize(e, x, !l.upper);
            refine_eigenvectors(e, symmetric, vectors)
        } else {
            (vectors, values)
        };
        let r = [vectors, values];
        let vectors = if l.compute_v {
            r[0]
        } else {
            e.constant(a.out(1).clone(), ScalarValue::Float(0.0))
        };
        Ok(vec![r[1], vectors])
    }
}

/// XLA's `Eigh` custom call (cyclic Jacobi sweeps): the eigenvectors (columns) and the ascending
/// eigenvalues of the symmetric matrices `x` stands for, read from its lower triangle when
/// `lower`. The config is (lower, sort, sweeps, tolerance); the sweeps converge quadratically.
fn jacobi_eigh(e: &mut Emitter, x: Value, lower: bool) -> (Value, Value) {
    let dtype = e.dtype(x);
    let full = e.shape(x).to_vec();
    let values_ty = TensorType::new(dtype, &full[..full.len() - 1]);
    let tolerance = if dtype == DType::F64 { 1e-15 } else { 1e-7 };
    let config = format!(
        "call_target_name = \"Eigh\", backend_config = \"{},1,100,{tolerance:e}\"",
        u8::from(lower)
    );
    let r = e.op_with_regions(
        "stablehlo.custom_call",
        &[x],
        &[],
        &config,
        vec![TensorType::new(dtype, &full), values_ty],
    );
    (r[0], r[1])
}

/// The symmetric matrix that `x`'s lower (or upper) triangle stands for.
fn symmetrize(e: &mut Emitter, x: Value, lower: bool) -> Value {
    let source = if lower { x } else { transpose_last(e, x) };
    let triangle = keep_triangle(e, source, false, 0);
    let strictly = keep_triangle(e, source, false, -1);
    let mirrored = transpose_last(e, strictly);
    e.add(triangle, mirrored)
}

/// One first-order refinement of approximate eigenvectors `v` (orthonormal columns) of the
/// symmetric `a`: with `B = V^T A V = D + E` (`E` off the diagonal, small), `V (I + X)` with
/// `X_ij = E_ij / (d_j - d_i)` makes the off-diagonal vanish to first order, and the
/// eigenvalues are `B`'s diagonal (Rayleigh quotients, second-order accurate). Pairs whose
/// eigenvalues are too close for the step to be small are left as they are: within such a
/// cluster any orthonormal basis is as good.
fn refine_eigenvectors(e: &mut Emitter, a: Value, v: Value) -> (Value, Value) {
    let dtype = e.dtype(a);
    let full = e.shape(a).to_vec();
    let rank = full.len();
    let batch_dims: Vec<usize> = (0..rank - 2).collect();
    let (last, row) = (rank - 1, rank - 2);
    let av = e.dot_general(a, v, &batch_dims, &batch_dims, &[last], &[row], dtype);
    let vt = transpose_last(e, v);
    let b = e.dot_general(vt, av, &batch_dims, &batch_dims, &[last], &[row], dtype);
    let idx = TensorType::new(DType::I64, &full);
    let rows = e.iota(idx.clone(), row);
    let cols = e.iota(idx, last);
    let on_diag = e.compare(Cmp::Eq, rows, cols);
    let zero = e.full_like(b, 0.0);
    let diagonal_only = e.select(on_diag, b, zero);
    let values = e.reduce_sum(diagonal_only, &[last]);
    let mut dims_i: Vec<usize> = (0..rank - 2).collect();
    dims_i.push(row);
    let mut dims_j: Vec<usize> = (0..rank - 2).collect();
    dims_j.push(last);
    let d_i = e.broadcast_in_dim(values, &full, &dims_i);
    let d_j = e.broadcast_in_dim(values, &full, &dims_j);
    let gap = e.sub(d_j, d_i);
    let step = e.div(b, gap);
    // |E_ij| < 1e-3 |gap|: the step is small, and no gap is zero.
    let magnitude = e.abs(b);
    let gap_magnitude = e.abs(gap);
    let bound = e.full_like(gap, 1e-3);
    let bound = e.mul(gap_magnitude, bound);
    let small = e.compare(Cmp::Lt, magnitude, bound);
    let off = e.not(on_diag);
    let keep = e.and(small, off);
    let step = e.select(keep, step, zero);
    let turn = e.dot_general(v, step, &batch_dims, &batch_dims, &[last], &[row], dtype);
    (e.add(v, turn), values)
}

// ----- singular value decomposition --------------------------------------------------------------

/// `_linalg_svd`: `A = U diag(S) Vh` with the singular values descending; `U` and `Vh` are
/// `m x k` and `k x n` (`k = min(m, n)`), or square with `full_matrices`, or empty tensors
/// without `compute_uv`, as PyTorch's. Singular vectors are unique only up to sign.
///
/// XLA has no SVD expander, so it is built on the symmetric eigensolver (RFC 0052): a wide
/// matrix is transposed and a tall one reduced to its square `R` by QR (`U = Q U_R`); the
/// eigenvalues of `[[0, R], [R^T, 0]]` are `±σ` with eigenvectors `[u; ±v] / √2`. This keeps
/// the Jacobi solver's backward stability, where the eigenvalues of `A^T A` would square `A`'s
/// condition number.
pub(crate) struct Svd;

impl OpRule for Svd {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let l = layout::Svd::decode(&a.params)?;
        let x = &a.inputs[0];
        check_matrices("linalg.svd", "linalg_svd", x, false)?;
        let (batch, _, m, n) = split_batch(&x.shape);
        let k = m.min(n);
        let (u, vh) = if !l.compute_uv {
            (Shape::from_slice(&[0]), Shape::from_slice(&[0]))
        } else if l.full_matrices {
            (with_dims(&batch, &[m, m]), with_dims(&batch, &[n, n]))
        } else {
            (with_dims(&batch, &[m, k]), with_dims(&batch, &[k, n]))
        };
        Ok(Meta::of_outputs(MetaOutputs::from_vec(vec![
            TensorType::new(x.dtype, &u),
            TensorType::new(x.dtype, &with_dims(&batch, &[k])),
            TensorType::new(x.dtype, &vh),
        ])))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let l = layout::Svd::decode(&a.params)?;
        let x = a.inputs[0];
        let (u_ty, s_ty, vh_ty) = (a.out(0).clone(), a.out(1).clone(), a.out(2).clone());
        let dtype = e.dtype(x);
        let full = e.shape(x).to_vec();
        let (batch, _, m, n) = split_batch(&full);
        let k = m.min(n);
        let nr = batch.len();
        if k == 0 {
            let s = e.constant(s_ty, ScalarValue::Float(0.0));
            let (u, vh) = if l.compute_uv {
                (identity_columns(e, &u_ty), identity_columns(e, &vh_ty))
            } else {
                let u = e.constant(u_ty, ScalarValue::Float(0.0));
                (u, e.constant(vh_ty, ScalarValue::Float(0.0)))
            };
            return Ok(vec![u, s, vh]);
        }
        // `t` is tall (`p x k`): `A` or its transpose.
        let wide = m < n;
        let p = m.max(n);
        let t = if wide { transpose_last(e, x) } else { x };
        let (q, r) = if p > k {
            // Complete Q only when its extra columns are asked for; R alone without vectors.
            let mode = match (l.compute_uv, l.full_matrices) {
                (false, _) => 2,
                (true, true) => 1,
                (true, false) => 0,
            };
            let q_shape = match mode {
                2 => Shape::from_slice(&[0]),
                1 => with_dims(&batch, &[p, p]),
                _ => with_dims(&batch, &[p, k]),
            };
            let r_rows = if mode == 1 { p } else { k };
            let (q, r) = householder_qr(
                e,
                t,
                mode,
                TensorType::new(dtype, &q_shape),
                TensorType::new(dtype, &with_dims(&batch, &[r_rows, k])),
            );
            let r = if r_rows > k {
                e.slice_dim(r, nr, 0, k, 1)
            } else {
                r
            };
            (Some(q), r)
        } else {
            (None, t)
        };
        let (s, vectors) = square_svd(e, r, l.compute_uv);
        let Some((ur, vr)) = vectors else {
            let u = e.constant(u_ty, ScalarValue::Float(0.0));
            let vh = e.constant(vh_ty, ScalarValue::Float(0.0));
            return Ok(vec![u, s, vh]);
        };
        // `t = U_t diag(S) V_t^T`.
        let u_t = match q {
            Some(q) => {
                let batch_dims: Vec<usize> = (0..nr).collect();
                let leading = e.slice_dim(q, nr + 1, 0, k, 1);
                let product = e.dot_general(
                    leading,
                    ur,
                    &batch_dims,
                    &batch_dims,
                    &[nr + 1],
                    &[nr],
                    dtype,
                );
                if l.full_matrices {
                    let rest = e.slice_dim(q, nr + 1, k, p, 1);
                    e.concatenate(&[product, rest], nr + 1)
                } else {
                    product
                }
            }
            None => ur,
        };
        // A tall A's U is `U_t`; a wide one's is `V_t`, and its `Vh` is `U_t^T`.
        let (u, v) = if wide { (vr, u_t) } else { (u_t, vr) };
        let vh = transpose_last(e, v);
        Ok(vec![u, s, vh])
    }
}

/// The singular values (descending) of the square matrices `r`, and with `compute_uv` their
/// left and right singular vectors (columns), from the eigendecomposition of
/// `[[0, R], [R^T, 0]]`.
fn square_svd(e: &mut Emitter, r: Value, compute_uv: bool) -> (Value, Option<(Value, Value)>) {
    let dtype = e.dtype(r);
    let shape = e.shape(r).to_vec();
    let nr = shape.len() - 2;
    let k = shape[nr];
    let zeros = e.full_like(r, 0.0);
    let rt = transpose_last(e, r);
    let top = e.concatenate(&[zeros, r], nr + 1);
    let bottom = e.concatenate(&[rt, zeros], nr + 1);
    let joined = e.concatenate(&[top, bottom], nr);
    let (vectors, values) = jacobi_eigh(e, joined, true);
    let (vectors, values) = if dtype == DType::F64 {
        // As for `eigh` (RFC 0051): float64 Jacobi vectors are refined once.
        refine_eigenvectors(e, joined, vectors)
    } else {
        (vectors, values)
    };
    // The k largest eigenvalues, descending: the singular values. Zero ones may come out as
    // tiny negatives.
    let largest = e.slice_dim(values, nr, k, 2 * k, 1);
    let largest = e.reverse(largest, &[nr]);
    let s = e.abs(largest);
    if !compute_uv {
        return (s, None);
    }
    let columns = e.slice_dim(vectors, nr + 1, k, 2 * k, 1);
    let columns = e.reverse(columns, &[nr + 1]);
    let scale = float(e, dtype, &shape, std::f64::consts::SQRT_2);
    let u = e.slice_dim(columns, nr, 0, k, 1);
    let u = e.mul(u, scale);
    let v = e.slice_dim(columns, nr, k, 2 * k, 1);
    let v = e.mul(v, scale);
    (
        s,
        Some((orthonormal_columns(e, u), orthonormal_columns(e, v))),
    )
}

/// The columns of the square matrices `y`, made exactly orthonormal by Householder QR with each
/// column's sign kept (`Q` times the signs of `R`'s diagonal). Columns that are already
/// orthonormal come back as they are, to rounding; for a zero singular value, whose vectors
/// the eigensolver leaves as any mix of the null spaces, this picks an orthonormal completion.
fn orthonormal_columns(e: &mut Emitter, y: Value) -> Value {
    let dtype = e.dtype(y);
    let shape = e.shape(y).to_vec();
    let nr = shape.len() - 2;
    let k = shape[nr];
    let taus_ty = TensorType::new(dtype, &with_dims(&shape[..nr], &[k]));
    let (packed, taus) = packed_qr(e, y, taus_ty);
    let q = e.op(
        "stablehlo.custom_call",
        &[packed, taus],
        "call_target_name = \"ProductOfElementaryHouseholderReflectors\"",
        TensorType::new(dtype, &shape),
    );
    let idx = TensorType::new(DType::I64, &shape);
    let rows = e.iota(idx.clone(), nr);
    let cols = e.iota(idx, nr + 1);
    let on_diag = e.compare(Cmp::Eq, rows, cols);
    let zero = e.full_like(packed, 0.0);
    let diagonal = e.select(on_diag, packed, zero);
    let diagonal = e.reduce_sum(diagonal, &[nr]);
    let negative = e.compare_const(Cmp::Lt, diagonal, 0.0);
    let minus = e.full_like(diagonal, -1.0);
    let plus = e.full_like(diagonal, 1.0);
    let sign = e.select(negative, minus, plus);
    let mut dims: Vec<usize> = (0..nr).collect();
    dims.push(nr + 1);
    let sign = e.broadcast_in_dim(sign, &shape, &dims);
    e.mul(q, sign)
}
