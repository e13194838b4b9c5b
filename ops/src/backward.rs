//! Backward ops autograd emits beside their forward ops' families: threshold, (log-)softmax and
//! embedding's dense gradient.

use crate::dtype::{DType, TensorType};
use crate::elementwise::{k, prep};
use crate::emitter::{bracket_list, Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::norm::{bcast, zeros};
use crate::param_layout as layout;
use crate::params::wrap_dim;
use crate::promote::{broadcast_all, result_type, Operand};
use crate::reduce::sum_keepdim;
use crate::{LowerArgs, Meta, MetaArgs, OpId, OpRule};

fn embedding_dense_backward_meta(a: &MetaArgs) -> Result<Meta, OpError> {
    let i = a.inputs;
    let p = &a.params;
    a.expect_counts(2..=2, 0..=0)?;
    let (g, indices) = (&i[0], &i[1]);
    let num_weights = layout::EmbeddingBackward::decode(p)?.num_weights;
    if !matches!(indices.dtype, DType::I64 | DType::I32) {
        return Err(OpError::runtime(format!(
            "Expected tensor for argument #2 'indices' to have one of the following scalar types: Long, Int; but got torch.{}Tensor instead (while checking arguments for embedding_backward)",
            indices.dtype.scalar_type_name()
        )));
    }
    if g.rank() == 0 {
        return Err(OpError::index(
            "Dimension specified as -1 but tensor has no dimensions",
        ));
    }
    let d = g.shape[g.rank() - 1];
    ensure!(
        num_weights >= 0,
        "Trying to create tensor with negative dimension {num_weights}: [{num_weights}, {d}]"
    );
    ensure!(
        g.numel() == indices.numel() * d,
        "shape '[{}, {d}]' is invalid for input of size {}",
        indices.numel(),
        g.numel()
    );
    Ok(Meta::single(
        TensorType::new(g.dtype, &[num_weights, d]),
        vec![],
    ))
}

/// `threshold_backward`: the gradient where `self` is above the threshold, else zero.
pub(crate) struct ThresholdBackward;

impl OpRule for ThresholdBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(2..=2, 1..=1)?;
        let ops = [Operand::Tensor(&i[0]), Operand::Tensor(&i[1])];
        let dtype = result_type(&ops);
        let shape = broadcast_all([&i[1].shape[..], &i[0].shape[..]])?;
        Ok(Meta::single(
            TensorType { dtype, shape },
            vec![dtype.compute_dtype()],
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let cd = out.dtype.compute_dtype();
        let g = prep(e, a.inputs[0], cd, &out.shape);
        let x = prep(e, a.inputs[1], cd, &out.shape);
        let t = prep(e, a.scalars[0], cd, &out.shape);
        let below = e.compare(Cmp::Le, x, t);
        let zero = k(e, g, 0.0);
        let r = e.select(below, zero, g);
        Ok(vec![e.convert(r, out.dtype)])
    }
}

/// `_softmax_backward_data` and `_log_softmax_backward_data`, from the forward op's output.
pub(crate) struct SoftmaxBackward;

impl OpRule for SoftmaxBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(2..=2, 0..=0)?;
        let layout::SoftmaxBackwardDim { dim, input_dtype } =
            layout::SoftmaxBackwardDim::decode(&a.params)?;
        let dim = wrap_dim(dim, i[0].rank())?;
        if !i[0].dtype.is_float() {
            let base = if a.op == OpId::SoftmaxBackward {
                "softmax"
            } else {
                "log_softmax"
            };
            let lastdim = if dim + 1 >= i[0].rank() {
                "lastdim_"
            } else {
                ""
            };
            return Err(crate::elementwise::not_implemented_for(
                &format!("{base}_backward_{lastdim}kernel_impl"),
                i[0].dtype,
            ));
        }
        ensure!(
            i[0].shape == i[1].shape,
            "grad_output and output must have the same shape, got {:?} and {:?}",
            i[0].shape.as_slice(),
            i[1].shape.as_slice()
        );
        Ok(Meta::single(i[0].with_dtype(input_dtype), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let cd = out
            .dtype
            .compute_dtype()
            .max(e.dtype(a.inputs[0]).compute_dtype());
        let g = e.convert(a.inputs[0], cd);
        let y = e.convert(a.inputs[1], cd);
        let shape = out.shape.to_vec();
        let all: Vec<usize> = (0..shape.len()).collect();
        if shape.is_empty() {
            // A 0-d softmax is constant: its gradient is zero.
            let z = k(e, g, 0.0);
            return Ok(vec![e.convert(z, out.dtype)]);
        }
        let dim = wrap_dim(
            layout::SoftmaxBackwardDim::decode(&a.params)?.dim,
            shape.len(),
        )?;
        let r = if a.op == OpId::LogSoftmaxBackward {
            // g - exp(y) * sum(g)
            let s = sum_keepdim(e, g, &[dim]);
            let sb = e.broadcast_in_dim(s, &shape, &all);
            let ey = e.exp(y);
            let t = e.mul(ey, sb);
            e.sub(g, t)
        } else {
            // y * (g - sum(g * y))
            let gy = e.mul(g, y);
            let s = sum_keepdim(e, gy, &[dim]);
            let sb = e.broadcast_in_dim(s, &shape, &all);
            let d = e.sub(g, sb);
            e.mul(y, d)
        };
        Ok(vec![e.convert(r, out.dtype)])
    }
}

/// `embedding_dense_backward`: the gradient of an embedding table, `[num_weights, d]`.
pub(crate) struct EmbeddingDenseBackward;

impl OpRule for EmbeddingDenseBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        embedding_dense_backward_meta(a)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_embedding_backward(e, a)
    }
}

/// `stablehlo.scatter` adding `updates` (`[m, window...]`) into rows `indices` (`[m]`, i64) of
/// `base` along dim 0.
fn scatter_add_rows(e: &mut Emitter, base: Value, indices: Value, updates: Value) -> Value {
    let m = e.shape(indices)[0];
    let indices = e.reshape(indices, &[m, 1]);
    let window: Vec<i64> = (1..e.rank(updates) as i64).collect();
    let dtype = e.dtype(base);
    let scalar = TensorType::scalar(dtype);
    let region = e.region(&[scalar.clone(), scalar], |e, args| {
        vec![e.add(args[0], args[1])]
    });
    let window = if window.is_empty() {
        String::new()
    } else {
        format!("update_window_dims = {}, ", bracket_list(&window))
    };
    let attrs = format!(
        "scatter_dimension_numbers = #stablehlo.scatter<{window}inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false"
    );
    let ty = e.ty(base).clone();
    e.op_with_regions(
        "stablehlo.scatter",
        &[base, indices, updates],
        &[region],
        &attrs,
        vec![ty],
    )[0]
}

fn lower_embedding_backward(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let p = layout::EmbeddingBackward::decode(&a.params)?;
    let (padding_idx, scale_by_freq) = (p.padding_idx, p.scale_grad_by_freq);
    let out = a.out(0).clone();
    let (num_weights, d) = (out.shape[0], out.shape[1]);
    let m = e.ty(a.inputs[1]).numel();
    if m == 0 || out.numel() == 0 {
        return Ok(vec![zeros(e, &out)]);
    }
    let acc = if out.dtype.is_float() {
        out.dtype.compute_dtype()
    } else {
        out.dtype
    };
    let idx = e.convert(a.inputs[1], DType::I64);
    let idx = e.reshape(idx, &[m]);
    let g = e.convert(a.inputs[0], acc);
    let g = e.reshape(g, &[m, d]);
    // Rows looked up at padding_idx contribute nothing.
    let pad = e.compare_const(Cmp::Eq, idx, padding_idx as f64);
    let pad = bcast(e, pad, &[m, d], &[0]);
    let zero = k(e, g, 0.0);
    let g = e.select(pad, zero, g);
    let base = zeros(e, &TensorType::new(acc, &[num_weights, d]));
    let mut sum = scatter_add_rows(e, base, idx, g);
    if scale_by_freq {
        let ones = e.constant(TensorType::new(acc, &[m]), crate::ScalarValue::Int(1));
        let counts = zeros(e, &TensorType::new(acc, &[num_weights]));
        let counts = scatter_add_rows(e, counts, idx, ones);
        let counts = bcast(e, counts, &[num_weights, d], &[0]);
        sum = if acc.is_float() {
            // Every contribution to row k is scaled by 1 / count[k] (rows never looked up stay 0).
            let one = k(e, counts, 1.0);
            let counts = e.max(counts, one);
            let inv = e.div(one, counts);
            e.mul(sum, inv)
        } else {
            // PyTorch's integer scale is `int(1 / count)`: rows seen more than once get nothing.
            let once = e.compare_const(Cmp::Eq, counts, 1.0);
            let zero = k(e, sum, 0.0);
            e.select(once, sum, zero)
        };
    }
    Ok(vec![e.convert(sum, out.dtype)])
}
