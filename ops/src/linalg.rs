//! Matrix products: `mm`, `bmm`, `addmm`, `baddbmm`, `dot`, `matmul` (batched broadcasting).

use crate::dtype::{DType, Shape, TensorType};
use crate::elementwise::{k, not_implemented_for, prep};
use crate::emitter::{Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout as layout;
use crate::promote::broadcast_shapes;
use crate::{LowerArgs, Meta, MetaArgs, OpId, OpRule};

fn mm_shape(a: &TensorType, b: &TensorType) -> Result<Shape, OpError> {
    ensure!(a.rank() == 2, "self must be a matrix");
    ensure!(b.rank() == 2, "mat2 must be a matrix");
    ensure!(
        a.shape[1] == b.shape[0],
        "mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})",
        a.shape[0],
        a.shape[1],
        b.shape[0],
        b.shape[1]
    );
    ensure!(
        a.dtype == b.dtype,
        "expected m1 and m2 to have the same dtype, but got: {} != {}",
        a.dtype.typemeta_name(),
        b.dtype.typemeta_name()
    );
    if a.dtype == DType::Bool {
        return Err(not_implemented_for("addmm_impl_cpu_", a.dtype));
    }
    Ok(Shape::from_slice(&[a.shape[0], b.shape[1]]))
}

fn bmm_shape(a: &TensorType, b: &TensorType) -> Result<Shape, OpError> {
    ensure!(a.rank() == 3, "batch1 must be a 3D tensor");
    ensure!(b.rank() == 3, "batch2 must be a 3D tensor");
    ensure!(
        b.shape[0] == a.shape[0] && b.shape[1] == a.shape[2],
        "Expected size for first two dimensions of batch2 tensor to be: [{}, {}] but got: [{}, {}].",
        a.shape[0],
        a.shape[2],
        b.shape[0],
        b.shape[1]
    );
    if a.dtype == DType::Bool {
        return Err(not_implemented_for("bmm", a.dtype));
    }
    ensure!(
        a.dtype == b.dtype,
        "expected scalar type {} but found {}",
        a.dtype.scalar_type_name(),
        b.dtype.scalar_type_name()
    );
    Ok(Shape::from_slice(&[a.shape[0], a.shape[1], b.shape[2]]))
}

fn dot_check(a: &TensorType, b: &TensorType) -> Result<(), OpError> {
    ensure!(
        a.rank() == 1 && b.rank() == 1,
        "1D tensors expected, but got {}D and {}D tensors",
        a.rank(),
        b.rank()
    );
    ensure!(
        a.shape[0] == b.shape[0],
        "inconsistent tensor size, expected tensor [{}] and src [{}] to have the same number of elements, but got {} and {} elements respectively",
        a.shape[0],
        b.shape[0],
        a.shape[0],
        b.shape[0]
    );
    ensure!(
        a.dtype == b.dtype,
        "dot : expected both vectors to have same dtype, but found {} and {}",
        a.dtype.scalar_type_name(),
        b.dtype.scalar_type_name()
    );
    if a.dtype == DType::Bool {
        return Err(not_implemented_for("dot", a.dtype));
    }
    Ok(())
}

/// The output shape of `torch.matmul`, with its checks.
fn matmul_shape(a: &TensorType, b: &TensorType) -> Result<Shape, OpError> {
    let (ra, rb) = (a.rank(), b.rank());
    ensure!(
        ra > 0 && rb > 0,
        "both arguments to matmul need to be at least 1D, but they are {ra}D and {rb}D"
    );
    match (ra, rb) {
        (1, 1) => {
            dot_check(a, b)?;
            Ok(Shape::new())
        }
        (2, 1) => {
            ensure!(
                a.shape[1] == b.shape[0],
                "size mismatch, got input ({}), mat ({}x{}), vec ({})",
                a.shape[0],
                a.shape[0],
                a.shape[1],
                b.shape[0]
            );
            ensure!(
                a.dtype == b.dtype,
                "expected m1 and m2 to have the same dtype, but got: {} != {}",
                a.dtype.typemeta_name(),
                b.dtype.typemeta_name()
            );
            Ok(Shape::from_slice(&a.shape[..1]))
        }
        (1, 2) => {
            let s = mm_shape(&a.with_shape(&[1, a.shape[0]]), b)?;
            Ok(Shape::from_slice(&s[1..]))
        }
        (_, 1) | (_, 2) => {
            // Batch dims of `a` fold into rows.
            let rows: i64 = a.shape[..ra - 1].iter().product();
            let k = a.shape[ra - 1];
            let b2 = if rb == 1 {
                b.with_shape(&[b.shape[0], 1])
            } else {
                b.clone()
            };
            mm_shape(&a.with_shape(&[rows, k]), &b2)?;
            let mut s = Shape::from_slice(&a.shape[..ra - 1]);
            if rb == 2 {
                s.push(b.shape[1]);
            }
            Ok(s)
        }
        _ => {
            let a_batch = &a.shape[..ra.saturating_sub(2)];
            let b_batch = &b.shape[..rb - 2];
            let batch = broadcast_shapes(a_batch, b_batch)?;
            let n = if ra >= 2 { a.shape[ra - 2] } else { 1 };
            let kk = a.shape[ra - 1];
            let (bk, p) = (b.shape[rb - 2], b.shape[rb - 1]);
            let bsize: i64 = batch.iter().product();
            bmm_shape(
                &a.with_shape(&[bsize, n, kk]),
                &b.with_shape(&[bsize, bk, p]),
            )?;
            let mut s = batch;
            if ra >= 2 {
                s.push(n);
            }
            s.push(p);
            Ok(s)
        }
    }
}

/// `linalg.solve_triangular`'s checks and result shape, in PyTorch's words.
fn solve_triangular_shape(m: &TensorType, b: &TensorType, left: bool) -> Result<Shape, OpError> {
    ensure!(
        m.dtype == b.dtype,
        "linalg.solve_triangular: Expected A and B to have the same dtype, but found A of type {} \
         and B of type {} instead",
        m.dtype.scalar_type_name(),
        b.dtype.scalar_type_name()
    );
    if !matches!(m.dtype, DType::F32 | DType::F64) {
        return Err(not_implemented_for("linalg_solve_triangular", m.dtype));
    }
    ensure!(
        m.rank() >= 2,
        "linalg.solve_triangular: The input tensor A must have at least 2 dimensions."
    );
    ensure!(
        b.rank() >= 2,
        "linalg.solve_triangular: The input tensor B must have at least 2 dimensions."
    );
    let (rm, rb) = (m.rank(), b.rank());
    let n = m.shape[rm - 1];
    ensure!(
        m.shape[rm - 2] == n,
        "linalg.solve_triangular: A must be batches of square matrices, but they are {} by {} \
         matrices",
        m.shape[rm - 2],
        n
    );
    let (b_rows, b_cols) = (b.shape[rb - 2], b.shape[rb - 1]);
    let fits = if left { b_rows == n } else { b_cols == n };
    ensure!(
        fits,
        "linalg.solve_triangular: Incompatible shapes of A and B for the equation {} ({}x{} and \
         {}x{})",
        if left { "AX = B" } else { "XA = B" },
        n,
        n,
        b_rows,
        b_cols
    );
    let mut shape = broadcast_shapes(&m.shape[..rm - 2], &b.shape[..rb - 2])?;
    shape.push(b_rows);
    shape.push(b_cols);
    Ok(shape)
}

/// A product's meta: its shape (checked by `shape`) in the first operand's dtype.
fn product_meta(
    a: &MetaArgs,
    shape: fn(&TensorType, &TensorType) -> Result<Shape, OpError>,
) -> Result<Meta, OpError> {
    a.expect_counts(2..=2, 0..=0)?;
    let (x, y) = (&a.inputs[0], &a.inputs[1]);
    Ok(Meta::single(
        TensorType::new(x.dtype, &shape(x, y)?),
        vec![],
    ))
}

/// A product lowered by [`matmul`].
fn lower_product(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let out = a.out(0).clone();
    Ok(vec![matmul(e, a.inputs[0], a.inputs[1], &out)])
}

/// `mm`: `[n, k] x [k, m]`.
pub(crate) struct Mm;

impl OpRule for Mm {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        product_meta(a, mm_shape)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_product(e, a)
    }
}

/// `bmm`: `[b, n, k] x [b, k, m]`.
pub(crate) struct Bmm;

impl OpRule for Bmm {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        product_meta(a, bmm_shape)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_product(e, a)
    }
}

/// `dot`: two vectors to a 0-d result.
pub(crate) struct Dot;

impl OpRule for Dot {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        product_meta(a, |x, y| {
            dot_check(x, y)?;
            Ok(Shape::new())
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_product(e, a)
    }
}

/// `matmul`, with its batch dims broadcast.
pub(crate) struct Matmul;

impl OpRule for Matmul {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        product_meta(a, matmul_shape)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_product(e, a)
    }
}

/// `addmm` and `baddbmm`: `beta * self + alpha * (mat1 @ mat2)`, each factor optional.
pub(crate) struct AddProduct;

impl OpRule for AddProduct {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(3..=3, 0..=2)?;
        let addmm = a.op == OpId::Addmm;
        if addmm {
            ensure!(
                i[0].dtype == i[2].dtype,
                "self and mat2 must have the same dtype, but got {} and {}",
                i[0].dtype.scalar_type_name(),
                i[2].dtype.scalar_type_name()
            );
        } else {
            ensure!(
                i[0].dtype == i[1].dtype && i[1].dtype == i[2].dtype,
                "Input dtypes must be the same, got: input {}, batch1: {}, batch2: {}",
                i[0].dtype.typemeta_name(),
                i[1].dtype.typemeta_name(),
                i[2].dtype.typemeta_name()
            );
        }
        if !addmm && i[1].dtype == DType::Bool {
            return Err(not_implemented_for("baddbmm", DType::Bool));
        }
        let shape = if addmm {
            mm_shape(&i[1], &i[2])?
        } else {
            bmm_shape(&i[1], &i[2])?
        };
        crate::shape::check_expand(&i[0].shape, &shape)?;
        let dtype = i[1].dtype;
        Ok(Meta::single(
            TensorType { dtype, shape },
            vec![dtype.compute_dtype(); a.scalars.len()],
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let cd = out.dtype.compute_dtype();
        let prod_ty = out.with_dtype(cd);
        let prod = matmul(e, a.inputs[1], a.inputs[2], &prod_ty);
        let this = prep(e, a.inputs[0], cd, &out.shape);
        let beta = a.scalars.first().map(|&s| prep(e, s, cd, &out.shape));
        let alpha = a.scalars.get(1).map(|&s| prep(e, s, cd, &out.shape));
        let prod = match alpha {
            Some(al) => e.mul(al, prod),
            None => prod,
        };
        let this = match beta {
            Some(b) => {
                // beta == 0 ignores self entirely (NaN and inf included), as PyTorch.
                let scaled = e.mul(b, this);
                let zero = k(e, scaled, 0.0);
                let is_zero = e.compare(Cmp::Eq, b, zero);
                e.select(is_zero, zero, scaled)
            }
            None => this,
        };
        let r = e.add(this, prod);
        Ok(vec![e.convert(r, out.dtype)])
    }
}

/// `linalg_solve_triangular`: `A X = B` (or `X A = B`) for a triangular `A`.
pub(crate) struct SolveTriangular;

impl OpRule for SolveTriangular {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(2..=2, 0..=0)?;
        let left = layout::SolveTriangular::decode(&a.params)?.left;
        let shape = solve_triangular_shape(&i[0], &i[1], left)?;
        Ok(Meta::single(TensorType::new(i[0].dtype, &shape), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let layout::SolveTriangular {
            upper,
            left,
            unitriangular: unit,
        } = layout::SolveTriangular::decode(&a.params)?;
        // stablehlo.triangular_solve wants equal batch dims: both are broadcast to the
        // result's, A keeping its square matrices.
        let rank = out.shape.len();
        let n = e.shape(a.inputs[0])[e.rank(a.inputs[0]) - 1];
        let mut a_shape = out.shape[..rank - 2].to_vec();
        a_shape.extend_from_slice(&[n, n]);
        let m = e.broadcast_to(a.inputs[0], &a_shape);
        let b = e.broadcast_to(a.inputs[1], &out.shape);
        let attrs = format!(
            "left_side = {left}, lower = {}, unit_diagonal = {unit}, transpose_a = \
             #stablehlo<transpose NO_TRANSPOSE>",
            !upper
        );
        Ok(vec![e.op(
            "stablehlo.triangular_solve",
            &[m, b],
            &attrs,
            out.clone(),
        )])
    }
}

/// `a @ b` in the computation dtype; reduced floats multiply in f32, as PyTorch's CPU kernels.
fn matmul(e: &mut Emitter, a: Value, b: Value, out: &TensorType) -> Value {
    let cd = out.dtype.compute_dtype();
    let a = e.convert(a, cd);
    let b = e.convert(b, cd);
    let (ra, rb) = (e.rank(a), e.rank(b));
    let r = if rb <= 2 {
        // No batch dims on the right: contract a's last dim with b's first.
        e.dot_general(a, b, &[], &[], &[ra - 1], &[0], cd)
    } else {
        let a2 = if ra == 1 {
            let k = e.shape(a)[0];
            e.reshape(a, &[1, k])
        } else {
            a
        };
        let (sa, sb) = (e.shape(a2).to_vec(), e.shape(b).to_vec());
        let (ra2, rb) = (sa.len(), sb.len());
        let batch = broadcast_shapes(&sa[..ra2 - 2], &sb[..rb - 2]).expect("meta checked");
        let nb = batch.len();
        let mut full_a = batch.to_vec();
        full_a.extend_from_slice(&sa[ra2 - 2..]);
        let mut full_b = batch.to_vec();
        full_b.extend_from_slice(&sb[rb - 2..]);
        let a3 = e.broadcast_to(a2, &full_a);
        let b3 = e.broadcast_to(b, &full_b);
        let batch_dims: Vec<usize> = (0..nb).collect();
        e.dot_general(a3, b3, &batch_dims, &batch_dims, &[nb + 1], &[nb], cd)
    };
    let r = e.reshape(r, &out.shape);
    e.convert(r, out.dtype)
}

// ----- attention ---------------------------------------------------------------------------------

/// Scaled dot-product attention in one op (`scaled_dot_product_attention` at PrivateUse1, through
/// PyTorch's `_scaled_dot_product_fused_attention_overrideable`): `softmax(q @ k^T * scale + mask)
/// @ v` over `query [*, Hq, L, E]`, `key [*, Hkv, S, E]`, `value [*, Hkv, S, Ev]`, with an
/// optional bias (bool: keep where true; float: added) broadcast to `[*, Hq, L, S]` and a causal
/// mask aligned to the top left, as PyTorch's. Query heads that are a multiple of the key's
/// share key heads in groups (grouped-query attention). A row masked everywhere gives zeros, as
/// the CPU's kernel. Outputs: the attention `[*, Hq, L, Ev]` and each row's logsumexp
/// `[*, Hq, L]` in the computation dtype.
pub(crate) struct Attention;

impl OpRule for Attention {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let l = layout::Attention::decode(&a.params)?;
        let with_bias = usize::from(l.has_attn_bias);
        a.expect_counts(3 + with_bias..=3 + with_bias, 0..=0)?;
        let (q, key, v) = (&a.inputs[0], &a.inputs[1], &a.inputs[2]);
        let r = q.rank();
        ensure!(
            r >= 2 && key.rank() == r && v.rank() == r,
            "scaled_dot_product_attention: expected query, key and value of one rank of at least 2, got {}-d, {}-d and {}-d",
            r,
            key.rank(),
            v.rank()
        );
        ensure!(
            q.dtype.is_float() && key.dtype == q.dtype && v.dtype == q.dtype,
            "scaled_dot_product_attention: expected query, key and value of one floating dtype, got {}, {} and {}",
            q.dtype,
            key.dtype,
            v.dtype
        );
        let (lq, e) = (q.shape[r - 2], q.shape[r - 1]);
        let (s, ev) = (key.shape[r - 2], v.shape[r - 1]);
        ensure!(
            key.shape[r - 1] == e && v.shape[r - 2] == s && key.shape[..r - 2] == v.shape[..r - 2],
            "scaled_dot_product_attention: key {:?} and value {:?} do not match query {:?}",
            key.shape.as_slice(),
            v.shape.as_slice(),
            q.shape.as_slice()
        );
        let grouped = |d: usize| {
            let (hq, hk) = (q.shape[d], key.shape[d]);
            hq == hk || (d + 3 == r && hk > 0 && hq % hk == 0)
        };
        ensure!(
            (0..r - 2).all(grouped),
            "scaled_dot_product_attention: query {:?} and key {:?} differ in a batch dim (query heads must be a multiple of key heads)",
            q.shape.as_slice(),
            key.shape.as_slice()
        );
        let batch = &q.shape[..r - 2];
        if l.has_attn_bias {
            let bias = &a.inputs[3];
            ensure!(
                bias.dtype == DType::Bool || bias.dtype == q.dtype,
                "scaled_dot_product_attention: expected a bool mask or one of the query's dtype {}, got {}",
                q.dtype,
                bias.dtype
            );
            let mut scores: Shape = batch.iter().copied().collect();
            scores.extend([lq, s]);
            let joined = broadcast_shapes(&bias.shape, &scores)?;
            ensure!(
                joined == scores,
                "scaled_dot_product_attention: a mask of shape {:?} does not broadcast to the scores' {:?}",
                bias.shape.as_slice(),
                scores.as_slice()
            );
        }
        let mut out: Shape = batch.iter().copied().collect();
        out.extend([lq, ev]);
        Ok(Meta::of_outputs(crate::MetaOutputs::from_vec(vec![
            TensorType::new(q.dtype, &out),
            TensorType::new(q.dtype.compute_dtype(), &out[..r - 1]),
        ])))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_attention(e, a.inputs, &a.params, a.meta, None)
    }
}

/// What the forward and the backward of attention share: the inputs in the computation dtype,
/// the key and value repeated over grouped query heads, and each row's softmax.
struct AttentionRows {
    /// The query and the key, each times `root_scale`.
    q: Value,
    key: Value,
    v: Value,
    /// `softmax(scores)`, zero in rows masked everywhere: `[*, Hq, L, S]`.
    probs: Value,
    /// Each row's shift (its maximum, 0 when masked everywhere) and sum of exponentials.
    shift: Value,
    sum: Value,
    /// The square root of the scale, by which `q` and `key` are already multiplied.
    root_scale: f64,
    /// The key heads before grouping, when the query has more.
    key_heads: Option<i64>,
}

/// Computes [`AttentionRows`] from `query, key, value[, bias]` (the inputs from `first`).
fn attention_rows(
    e: &mut Emitter,
    inputs: &[Value],
    l: &layout::Attention,
    cd: DType,
    key_len: Option<(Value, i64)>,
) -> AttentionRows {
    let q = e.convert(inputs[0], cd);
    let mut key = e.convert(inputs[1], cd);
    let mut v = e.convert(inputs[2], cd);
    let qs = e.shape(q).to_vec();
    let r = qs.len();
    let nb = r - 2;
    let (lq, depth) = (qs[r - 2], qs[r - 1]);
    // Grouped-query attention: each key head serves `group` query heads in a row, so it is
    // repeated in place (head `h` of the query reads key head `h / group`).
    let mut key_heads = None;
    if r >= 3 && e.shape(key)[r - 3] != qs[r - 3] {
        key_heads = Some(e.shape(key)[r - 3]);
        for t in [&mut key, &mut v] {
            let ts = e.shape(*t).to_vec();
            let hk = ts[r - 3];
            let group = qs[r - 3] / hk;
            let mut wide = ts[..r - 2].to_vec();
            wide.push(group);
            wide.extend_from_slice(&ts[r - 2..]);
            let dims: Vec<usize> = (0..r).map(|d| if d < r - 2 { d } else { d + 1 }).collect();
            let spread = e.broadcast_in_dim(*t, &wide, &dims);
            let mut merged = ts.clone();
            merged[r - 3] = hk * group;
            *t = e.reshape(spread, &merged);
        }
    }
    let s = e.shape(key)[r - 2];
    let batch: Vec<usize> = (0..nb).collect();
    // Query and key each scaled by the scale's square root before their product, as PyTorch's
    // math composition does, so both round alike.
    let scale = if l.has_scale {
        l.scale
    } else {
        1.0 / (depth as f64).sqrt()
    };
    let root_scale = scale.sqrt();
    let root_q = k(e, q, root_scale);
    let q = e.mul(q, root_q);
    let root_k = k(e, key, root_scale);
    let key = e.mul(key, root_k);
    let mut scores = e.dot_general(q, key, &batch, &batch, &[r - 1], &[r - 1], cd);
    let score_shape = e.shape(scores).to_vec();
    let neg_inf = k(e, scores, f64::NEG_INFINITY);
    if l.is_causal {
        // Query row `i` sees key columns `j <= i`, whatever `L` and `S` are (top left).
        let rows = e.iota(TensorType::new(DType::I64, &[lq, s]), 0);
        let cols = e.iota(TensorType::new(DType::I64, &[lq, s]), 1);
        let seen = e.compare(Cmp::Le, cols, rows);
        let seen = e.broadcast_in_dim(seen, &score_shape, &[nb, nb + 1]);
        scores = e.select(seen, scores, neg_inf);
    }
    if l.has_attn_bias {
        let bias = inputs[3];
        let br = e.rank(bias);
        let dims: Vec<usize> = (r - br..r).collect();
        if e.dtype(bias) == DType::Bool {
            let keep = e.broadcast_in_dim(bias, &score_shape, &dims);
            scores = e.select(keep, scores, neg_inf);
        } else {
            let bias = e.convert(bias, cd);
            let bias = e.broadcast_in_dim(bias, &score_shape, &dims);
            scores = e.add(scores, bias);
        }
    }
    // Last, so that a bias's unspecified padding never reaches a row.
    if let Some((len, bucket)) = key_len {
        let keep = crate::padding::in_bounds(e, &score_shape, &[r - 1], len, bucket);
        scores = e.select(keep, scores, neg_inf);
    }
    // A softmax whose fully masked rows (maximum -inf) shift by 0 and give zeros.
    let rows: Vec<usize> = (0..r - 1).collect();
    let row_max = e.reduce_with(scores, f64::NEG_INFINITY, &[r - 1], "stablehlo.maximum");
    let masked = e.compare_const(Cmp::Eq, row_max, f64::NEG_INFINITY);
    let zero_rows = k(e, row_max, 0.0);
    let shift = e.select(masked, zero_rows, row_max);
    let shift_wide = e.broadcast_in_dim(shift, &score_shape, &rows);
    let shifted = e.sub(scores, shift_wide);
    let ex = e.exp(shifted);
    let sum = e.reduce_sum(ex, &[r - 1]);
    let sum_wide = e.broadcast_in_dim(sum, &score_shape, &rows);
    let probs = e.div(ex, sum_wide);
    let masked_wide = e.broadcast_in_dim(masked, &score_shape, &rows);
    let zeros = k(e, probs, 0.0);
    let probs = e.select(masked_wide, zeros, probs);
    AttentionRows {
        q,
        key,
        v,
        probs,
        shift,
        sum,
        root_scale,
        key_heads,
    }
}

/// [`Attention`]'s lowering. With `key_len` (`(len, bucket)`: the key and value hold `bucket`
/// positions of which the first `len`, a runtime scalar, are theirs), positions past `len`
/// are masked out of every row, as a mask would (`crate::padding` plans it).
pub(crate) fn lower_attention(
    e: &mut Emitter,
    inputs: &[Value],
    params: &crate::Params,
    meta: &Meta,
    key_len: Option<(Value, i64)>,
) -> Result<Vec<Value>, OpError> {
    let l = layout::Attention::decode(params)?;
    let (out, lse_type) = (&meta.outputs[0], &meta.outputs[1]);
    let cd = out.dtype.compute_dtype();
    let rows = attention_rows(e, inputs, &l, cd, key_len);
    let r = e.rank(rows.q);
    let batch: Vec<usize> = (0..r - 2).collect();
    let attended = e.dot_general(rows.probs, rows.v, &batch, &batch, &[r - 1], &[r - 2], cd);
    let attended = e.convert(attended, out.dtype);
    let log_sum = e.log(rows.sum);
    let lse = e.add(rows.shift, log_sum);
    let lse = e.convert(lse, lse_type.dtype);
    Ok(vec![attended, lse])
}

/// The gradients of [`Attention`] (`_scaled_dot_product_fused_attention_overrideable_backward`)
/// from `grad_out, query, key, value, out[, bias]`: the query's, key's and value's, then the
/// bias's when `bias_grad`. The softmax is computed again from the inputs; with `P` its rows,
/// `dV = P^T dO`, `dS = P * (dP - rowsum(dP * P))` with `dP = dO V^T`, `dQ = scale * dS K`,
/// `dK = scale * dS^T Q`, the key's and value's summed over the query heads that share them,
/// and the bias's `dS` summed to its shape. A masked position has `P = 0`, so no gradient.
pub(crate) struct AttentionBackward;

impl OpRule for AttentionBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let l = layout::AttentionBackward::decode(&a.params)?;
        let with_bias = usize::from(l.has_attn_bias);
        a.expect_counts(5 + with_bias..=5 + with_bias, 0..=0)?;
        let (g, q, key, v, out) = (
            &a.inputs[0],
            &a.inputs[1],
            &a.inputs[2],
            &a.inputs[3],
            &a.inputs[4],
        );
        let mut forward: Vec<TensorType> = vec![q.clone(), key.clone(), v.clone()];
        if l.has_attn_bias {
            forward.push(a.inputs[5].clone());
        }
        let params = [
            i64::from(l.is_causal),
            i64::from(l.has_attn_bias),
            i64::from(l.has_scale),
            crate::f64_param(l.scale),
        ];
        let fwd = crate::meta(OpId::Attention, &forward, &[], &params)?;
        for (name, t) in [("grad_out", g), ("out", out)] {
            ensure!(
                t.shape == fwd.outputs[0].shape && t.dtype == q.dtype,
                "_scaled_dot_product_fused_attention_overrideable_backward: expected {name} of {} {:?}, got {} {:?}",
                q.dtype,
                fwd.outputs[0].shape.as_slice(),
                t.dtype,
                t.shape.as_slice()
            );
        }
        let mut grads = vec![q.clone(), key.clone(), v.clone()];
        if l.bias_grad {
            ensure!(
                l.has_attn_bias && a.inputs[5].dtype.is_float(),
                "_scaled_dot_product_fused_attention_overrideable_backward: a gradient of the mask needs a float mask"
            );
            grads.push(a.inputs[5].clone());
        }
        Ok(Meta::of_outputs(crate::MetaOutputs::from_vec(grads)))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_attention_backward(e, a.inputs, &a.params, a.meta, None)
    }
}

/// [`AttentionBackward`]'s lowering; `key_len` as for [`lower_attention`] (every padded input
/// then holds zeros past the length, so padded rows and columns add nothing).
pub(crate) fn lower_attention_backward(
    e: &mut Emitter,
    inputs: &[Value],
    params: &crate::Params,
    meta: &Meta,
    key_len: Option<(Value, i64)>,
) -> Result<Vec<Value>, OpError> {
    let l = layout::AttentionBackward::decode(params)?;
    let forward = layout::Attention {
        is_causal: l.is_causal,
        has_attn_bias: l.has_attn_bias,
        has_scale: l.has_scale,
        scale: l.scale,
    };
    let dtype = meta.outputs[0].dtype;
    let cd = dtype.compute_dtype();
    let mut forward_inputs = vec![inputs[1], inputs[2], inputs[3]];
    if l.has_attn_bias {
        forward_inputs.push(inputs[5]);
    }
    let rows = attention_rows(e, &forward_inputs, &forward, cd, key_len);
    let grad = e.convert(inputs[0], cd);
    let r = e.rank(rows.q);
    let batch: Vec<usize> = (0..r - 2).collect();
    let score_shape = e.shape(rows.probs).to_vec();
    let row_dims: Vec<usize> = (0..r - 1).collect();
    // dV = P^T dO: contract the query rows.
    let dv = e.dot_general(rows.probs, grad, &batch, &batch, &[r - 2], &[r - 2], cd);
    // dS = P * (dP - rowsum(dP * P)) with dP = dO V^T: the softmax's backward as PyTorch's
    // (`rowsum(dO * O)` is the same sum, rounded otherwise).
    let dp = e.dot_general(grad, rows.v, &batch, &batch, &[r - 1], &[r - 1], cd);
    let weighted = e.mul(dp, rows.probs);
    let row_dot = e.reduce_sum(weighted, &[r - 1]);
    let row_dot = e.broadcast_in_dim(row_dot, &score_shape, &row_dims);
    let centered = e.sub(dp, row_dot);
    let ds = e.mul(rows.probs, centered);
    // The scores were (q * root) (key * root)^T: each factor's gradient is the product with
    // the other scaled factor, times the root again.
    let dq = e.dot_general(ds, rows.key, &batch, &batch, &[r - 1], &[r - 2], cd);
    let root_dq = k(e, dq, rows.root_scale);
    let dq = e.mul(dq, root_dq);
    let dk = e.dot_general(ds, rows.q, &batch, &batch, &[r - 2], &[r - 2], cd);
    let root_dk = k(e, dk, rows.root_scale);
    let dk = e.mul(dk, root_dk);
    let (dk, dv) = match rows.key_heads {
        // Each key head's gradient sums those of the query heads it served.
        Some(hk) => {
            let mut sum_groups = |t: Value| {
                let ts = e.shape(t).to_vec();
                let mut split = ts[..r - 3].to_vec();
                split.extend([hk, ts[r - 3] / hk]);
                split.extend_from_slice(&ts[r - 2..]);
                let grouped = e.reshape(t, &split);
                e.reduce_sum(grouped, &[r - 2])
            };
            (sum_groups(dk), sum_groups(dv))
        }
        None => (dk, dv),
    };
    let mut grads = vec![
        e.convert(dq, dtype),
        e.convert(dk, dtype),
        e.convert(dv, dtype),
    ];
    if l.bias_grad {
        // The bias was broadcast to the scores: its gradient sums over what it was
        // broadcast along (missing leading dims and its size-1 dims).
        let bias_type = meta.outputs[3].clone();
        let br = bias_type.rank();
        let summed: Vec<usize> = (0..r)
            .filter(|&d| d < r - br || (bias_type.shape[d - (r - br)] == 1 && score_shape[d] != 1))
            .collect();
        let reduced = if summed.is_empty() {
            ds
        } else {
            e.reduce_sum(ds, &summed)
        };
        let reduced = e.reshape(reduced, &bias_type.shape);
        grads.push(e.convert(reduced, bias_type.dtype));
    }
    Ok(grads)
}
