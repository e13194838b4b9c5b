//! Backward ops an MLP's autograd emits: threshold, (log-)softmax and nll_loss gradients.

use crate::dtype::{DType, TensorType};
use crate::elementwise::{k, prep};
use crate::emitter::{Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::params::{wrap_dim, Reduction};
use crate::promote::{broadcast_all, result_type, Operand};
use crate::reduce::sum_keepdim;
use crate::{LowerArgs, Meta, MetaArgs, OpId};

fn nll_checks(
    x: &TensorType,
    target: &TensorType,
    weight: Option<&TensorType>,
    backward: bool,
) -> Result<(), OpError> {
    if backward {
        ensure!(
            matches!(target.dtype, DType::I64 | DType::U8),
            "expected scalar type Long but found {}",
            target.dtype.scalar_type_name()
        );
        if let Some(w) = weight {
            ensure!(
                w.numel() == x.shape[x.rank().max(1) - 1],
                "weight tensor should be defined either for all or no classes"
            );
        }
    }
    ensure!(
        x.rank() >= 1 && x.rank() <= 2,
        "input tensor should be 1D or 2D"
    );
    ensure!(
        target.rank() <= 1,
        "0D or 1D target tensor expected, multi-target not supported"
    );
    let batch = if x.rank() == 2 { x.shape[0] } else { 1 };
    let target_n = if target.rank() == 1 {
        target.shape[0]
    } else {
        1
    };
    ensure!(
        batch == target_n && (x.rank() == 2) == (target.rank() == 1),
        "size mismatch (got input: {:?}, target: {:?})",
        x.shape.as_slice(),
        target.shape.as_slice()
    );
    ensure!(
        matches!(target.dtype, DType::I64 | DType::U8),
        "expected target dtype to be Long or Byte, but got {}",
        target.dtype.scalar_type_name()
    );
    let classes = x.shape[x.rank() - 1];
    if let Some(w) = weight {
        ensure!(
            w.numel() == classes,
            "weight tensor should be defined either for all {classes} classes or no classes but got weight tensor of shape: {:?}",
            w.shape.as_slice()
        );
    }
    Ok(())
}

pub(crate) fn meta(a: &MetaArgs) -> Result<Meta, OpError> {
    use OpId::*;
    let i = a.inputs;
    let p = &a.params;
    match a.op {
        ThresholdBackward => {
            a.expect_counts(2..=2, 1..=1)?;
            let ops = [Operand::Tensor(&i[0]), Operand::Tensor(&i[1])];
            let dtype = result_type(&ops);
            let shape = broadcast_all([&i[1].shape[..], &i[0].shape[..]])?;
            Ok(Meta::single(
                TensorType { dtype, shape },
                vec![dtype.compute_dtype()],
            ))
        }
        LogSoftmaxBackward | SoftmaxBackward => {
            a.expect_counts(2..=2, 0..=0)?;
            let dim = wrap_dim(p.get(0)?, i[0].rank())?;
            let input_dtype = p.dtype(1)?;
            if !i[0].dtype.is_float() {
                let base = if a.op == SoftmaxBackward {
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
        NllLoss => {
            a.expect_counts(2..=3, 0..=0)?;
            let (x, target, weight) = (&i[0], &i[1], i.get(2));
            nll_checks(x, target, weight, false)?;
            let reduction = p.reduction(0)?;
            p.get(1)?;
            let out_shape: &[i64] = if reduction == Reduction::None && x.rank() == 2 {
                &x.shape[..1]
            } else {
                &[]
            };
            Ok(Meta {
                outputs: smallvec::smallvec![
                    TensorType::new(x.dtype, out_shape),
                    TensorType::scalar(x.dtype),
                ],
                scalar_dtypes: crate::ScalarDTypes::new(),
                variant: 0,
            })
        }
        NllLossBackward => {
            a.expect_counts(4..=5, 0..=0)?;
            let (x, target, weight) = (&i[1], &i[2], i.get(4));
            nll_checks(x, target, weight, true)?;
            p.reduction(0)?;
            p.get(1)?;
            Ok(Meta::single(x.clone(), vec![]))
        }
        op => Err(OpError::runtime(format!(
            "{}: not a backward op",
            op.name()
        ))),
    }
}

/// The one-hot mask `target[n] == class` of shape `x`'s ([N, C] or [C]) and the per-sample
/// weights (0 where the target is `ignore_index`), both shaped like `x`.
fn nll_mask(
    e: &mut Emitter,
    x: Value,
    target: Value,
    weight: Option<Value>,
    ignore_index: i64,
) -> (Value, Value) {
    let shape = e.shape(x).to_vec();
    let dtype = e.dtype(x);
    let r = shape.len();
    let t = e.convert(target, DType::I64);
    let t = e.broadcast_in_dim(t, &shape, &(0..r - 1).collect::<Vec<_>>());
    let classes = e.iota(TensorType::new(DType::I64, &shape), r - 1);
    let mask = e.compare(Cmp::Eq, t, classes);
    let ignore = e.full_like(t, ignore_index as f64);
    let valid = e.compare(Cmp::Ne, t, ignore);
    let mask = e.and(mask, valid);
    let w = match weight {
        Some(w) => {
            let w = e.convert(w, dtype);
            e.broadcast_in_dim(w, &shape, &[r - 1])
        }
        None => e.full_like(x, 1.0),
    };
    let zero = e.full_like(x, 0.0);
    let w = e.select(mask, w, zero);
    (mask, w)
}

pub(crate) fn lower(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    use OpId::*;
    let p = &a.params;
    match a.op {
        ThresholdBackward => {
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
        LogSoftmaxBackward | SoftmaxBackward => {
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
            let dim = wrap_dim(p.get(0)?, shape.len())?;
            let r = if a.op == LogSoftmaxBackward {
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
        NllLoss => {
            let reduction = p.reduction(0)?;
            let ignore_index = p.get(1)?;
            let x = a.inputs[0];
            let dtype = e.dtype(x);
            let cd = dtype.compute_dtype();
            let xc = e.convert(x, cd);
            let (_, w) = nll_mask(e, xc, a.inputs[1], a.inputs.get(2).copied(), ignore_index);
            let r = e.rank(xc);
            // Per-sample loss: -w[target] * x[target].
            let wx = e.mul(w, xc);
            let picked = e.reduce_sum(wx, &[r - 1]);
            let loss = e.neg(picked);
            let wsum = e.reduce_sum(w, &[r - 1]);
            let (out, total) = match reduction {
                Reduction::None => (loss, e.f64_constant(cd, 0.0)),
                Reduction::Sum | Reduction::Mean => {
                    let all: Vec<usize> = (0..e.rank(loss)).collect();
                    let s = e.reduce_sum(loss, &all);
                    let total = e.reduce_sum(wsum, &all);
                    if reduction == Reduction::Mean {
                        (e.div(s, total), total)
                    } else {
                        (s, total)
                    }
                }
            };
            Ok(vec![e.convert(out, dtype), e.convert(total, dtype)])
        }
        NllLossBackward => {
            let reduction = p.reduction(0)?;
            let ignore_index = p.get(1)?;
            let (grad, x, target, total) = (a.inputs[0], a.inputs[1], a.inputs[2], a.inputs[3]);
            let dtype = e.dtype(x);
            let cd = dtype.compute_dtype();
            let shape = e.shape(x).to_vec();
            let r = shape.len();
            let xc = e.convert(x, cd);
            let (_, w) = nll_mask(e, xc, target, a.inputs.get(4).copied(), ignore_index);
            let g = e.convert(grad, cd);
            let g = match reduction {
                Reduction::None if r == 2 => e.broadcast_in_dim(g, &shape, &[0]),
                Reduction::Mean => {
                    let t = e.convert(total, cd);
                    let q = e.div(g, t);
                    e.broadcast_to(q, &shape)
                }
                _ => e.broadcast_to(g, &shape),
            };
            let wg = e.mul(w, g);
            let r = e.neg(wg);
            Ok(vec![e.convert(r, dtype)])
        }
        op => Err(OpError::runtime(format!(
            "{}: not a backward op",
            op.name()
        ))),
    }
}
