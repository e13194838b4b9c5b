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
