//! Loss functions and their gradients: `mse_loss`, `smooth_l1_loss`, `huber_loss`,
//! `binary_cross_entropy`, `nll_loss` over `[N, C]` or `[C]`, and the spatial `nll_loss2d` (N-d
//! `nll_loss` and `cross_entropy` reach it with the classes on dim 1).
//!
//! Formulas follow PyTorch's CPU kernels, in the computation dtype (f32 for bf16/f16); a mean
//! reduction divides the sum by the element count.

use crate::dtype::{DType, ScalarArg, Shape, TensorType};
use crate::elementwise::{k, not_implemented_for, prep};
use crate::emitter::{Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout::{self as layout, ParamLayout};
use crate::params::{Params, Reduction};
use crate::promote::{broadcast_all, result_type, Operand};
use crate::{LowerArgs, Meta, MetaArgs, MetaOutputs, OpId, OpRule, ScalarDTypes};

/// The CPU kernel name PyTorch's dtype error names.
fn kernel_name(op: OpId) -> &'static str {
    use OpId::*;
    match op {
        MseLoss | MseLossBackward => "mse_cpu",
        SmoothL1Loss | SmoothL1LossBackward => "smooth_l1_cpu",
        HuberLoss | HuberLossBackward => "huber_cpu",
        _ => "binary_cross_entropy",
    }
}

fn reduced(x: &TensorType, dtype: DType, reduction: Reduction) -> TensorType {
    if reduction == Reduction::None {
        x.with_dtype(dtype)
    } else {
        TensorType::scalar(dtype)
    }
}

/// PyTorch's checks of a loss's hyper-parameter (`beta`, `delta`), a value scalar.
fn check_parameter(op: OpId, s: &ScalarArg) -> Result<(), OpError> {
    // NaN fails both checks, as in PyTorch.
    let v = s.value.as_f64();
    let (ok, message) = match op {
        OpId::SmoothL1Loss | OpId::SmoothL1LossBackward => (
            v >= 0.0,
            "smooth_l1_loss does not support negative values for beta.",
        ),
        _ => (
            v > 0.0,
            "huber_loss does not support non-positive values for delta.",
        ),
    };
    ensure!(ok, "{message}");
    Ok(())
}

/// A gradient shaped and typed like `self`: every other operand must broadcast to it.
fn like_self(op: OpId, x: &TensorType, others: &[&TensorType]) -> Result<TensorType, OpError> {
    if !x.dtype.is_float() {
        return Err(not_implemented_for(kernel_name(op), x.dtype));
    }
    let mut shapes: Vec<&[i64]> = vec![&x.shape];
    shapes.extend(others.iter().map(|t| &t.shape[..]));
    let shape = broadcast_all(shapes)?;
    ensure!(
        shape == x.shape,
        "{}: the gradient has the shape of self {:?}, but the operands broadcast to {:?}",
        op.name(),
        x.shape.as_slice(),
        shape.as_slice()
    );
    Ok(x.clone())
}

/// `nll_loss2d`'s checks of its input, target and weight shapes and its target's dtype.
fn nll2d_checks(
    x: &TensorType,
    target: &TensorType,
    weight: Option<&TensorType>,
) -> Result<(), OpError> {
    ensure!(
        target.rank() == 3,
        "only batches of spatial targets supported (3D tensors) but got targets of dimension: {}",
        target.rank()
    );
    ensure!(
        x.rank() == 4,
        "only batches of spatial inputs supported (4D tensors), but got input of dimension: {}",
        x.rank()
    );
    if let Some(w) = weight {
        ensure!(
            w.numel() == x.shape[1],
            "weight tensor should be defined either for all or no classes"
        );
    }
    ensure!(
        matches!(target.dtype, DType::I64 | DType::U8),
        "expected target dtype to be Long or Byte, but got {}",
        target.dtype.scalar_type_name()
    );
    ensure!(
        x.shape[0] == target.shape[0]
            && x.shape[2] == target.shape[1]
            && x.shape[3] == target.shape[2],
        "size mismatch (got input: {:?} , target: {:?}",
        x.shape.as_slice(),
        target.shape.as_slice()
    );
    Ok(())
}

/// The checks of `nll_loss2d_backward` (`[grad, self, target, total_weight, weight?]`) in
/// PyTorch's order.
fn nll2d_backward_checks(i: &[TensorType], reduction: Reduction) -> Result<(), OpError> {
    let (g, x, target, total, weight) = (&i[0], &i[1], &i[2], &i[3], i.get(4));
    nll2d_checks(x, target, weight)?;
    ensure!(
        total.numel() == 1,
        "expected total_weight to be a single element tensor, got: {:?} ({} elements)",
        total.shape.as_slice(),
        total.numel()
    );
    let kernel = "nll_loss2d_backward_out_frame";
    if !x.dtype.is_float() {
        return Err(not_implemented_for(kernel, x.dtype));
    }
    if reduction == Reduction::None {
        ensure!(
            g.rank() == 3,
            "grad_output must have same dimension as target (3) but got dimension: {:?}",
            g.shape.as_slice()
        );
        ensure!(
            g.shape == target.shape,
            "size mismatch (got grad_output: {:?} target: {:?}",
            g.shape.as_slice(),
            target.shape.as_slice()
        );
        return backward_dtypes(kernel, g, x, target, total, weight, true);
    }
    // The kernel reads total_weight before it checks grad_output's shape.
    backward_dtypes(kernel, total, x, target, total, weight, false)?;
    ensure!(
        g.rank() <= 1 && g.numel() == 1,
        "Expected a single element grad_output tensor, but got: {:?}",
        g.shape.as_slice()
    );
    backward_dtypes(kernel, g, x, target, total, weight, false)
}

/// The nll losses' first checks, forward and backward: `self` 1-d or 2-d, `target` 0-d or 1-d.
fn nll_ranks(x: &TensorType, target: &TensorType) -> Result<(), OpError> {
    ensure!(
        x.rank() >= 1 && x.rank() <= 2,
        "input tensor should be 1D or 2D"
    );
    ensure!(
        target.rank() <= 1,
        "0D or 1D target tensor expected, multi-target not supported"
    );
    Ok(())
}

fn nll_checks(
    x: &TensorType,
    target: &TensorType,
    weight: Option<&TensorType>,
) -> Result<(), OpError> {
    nll_ranks(x, target)?;
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

/// The checks of `nll_loss_backward` (`[grad, self, target, total_weight, weight?]`), in
/// PyTorch's order: the shapes (as the forward's, then `total_weight` a single element and
/// `grad` shaped like the forward's output), then the dtypes its CPU kernel reads.
fn nll_backward_checks(i: &[TensorType], reduction: Reduction) -> Result<(), OpError> {
    let (g, x, target, total, weight) = (&i[0], &i[1], &i[2], &i[3], i.get(4));
    nll_ranks(x, target)?;
    let no_batch_dim = x.rank() == 1 && target.rank() == 0;
    if !no_batch_dim && target.rank() == 0 {
        return Err(OpError::index(
            "Dimension specified as 0 but tensor has no dimensions",
        ));
    }
    ensure!(
        no_batch_dim || (x.rank() == 2 && x.shape[0] == target.shape[0]),
        "size mismatch (got input: {:?}, target: {:?})",
        x.shape.as_slice(),
        target.shape.as_slice()
    );
    ensure!(
        total.numel() == 1,
        "expected total_weight to be a  single element tensor, got: {:?} ({} elements)",
        total.shape.as_slice(),
        total.numel()
    );
    if let Some(w) = weight {
        ensure!(
            w.numel() == x.shape[x.rank() - 1],
            "weight tensor should be defined either for all or no classes"
        );
    }
    let per_sample = reduction == Reduction::None && x.rank() == 2;
    if per_sample {
        ensure!(
            g.rank() == 1 && g.shape[0] == x.shape[0],
            "Expected a tensor of dimension 1 and tensor.size[0] == {} but got: dimension {} and tensor.size[0] = {}",
            x.shape[0],
            g.rank(),
            g.shape.first().copied().unwrap_or(1)
        );
    } else {
        ensure!(
            g.rank() <= 1 && g.numel() == 1,
            "Expected a single element grad_output tensor, but got: {:?}",
            g.shape.as_slice()
        );
    }
    backward_dtypes(
        "nll_loss_backward_out_frame",
        g,
        x,
        target,
        total,
        weight,
        per_sample,
    )
}

/// The dtypes the nll losses' CPU backward kernels read, in their order: `self` a float (the
/// dispatch), `target` int64 or uint8, then `weight`, `total_weight` (unless each sample has its
/// own gradient) and `grad` of `self`'s dtype.
fn backward_dtypes(
    kernel: &str,
    g: &TensorType,
    x: &TensorType,
    target: &TensorType,
    total: &TensorType,
    weight: Option<&TensorType>,
    per_sample: bool,
) -> Result<(), OpError> {
    if !x.dtype.is_float() {
        return Err(not_implemented_for(kernel, x.dtype));
    }
    ensure!(
        matches!(target.dtype, DType::I64 | DType::U8),
        "expected scalar type Long but found {}",
        target.dtype.scalar_type_name()
    );
    let mut read: Vec<&TensorType> = weight.into_iter().collect();
    if !per_sample {
        read.push(total);
    }
    read.push(g);
    for t in read {
        ensure!(
            t.dtype == x.dtype,
            "expected scalar type {} but found {}",
            x.dtype.scalar_type_name(),
            t.dtype.scalar_type_name()
        );
    }
    Ok(())
}

/// A loss's reduction, and the class the nll losses ignore.
fn reduction_of(p: &Params) -> Result<(Reduction, Option<i64>), OpError> {
    if p.op().param_layout() == ParamLayout::NllLossReduction {
        let l = layout::NllLossReduction::decode(p)?;
        Ok((l.reduction, Some(l.ignore_index)))
    } else {
        Ok((layout::LossReduction::decode(p)?.reduction, None))
    }
}

/// `mse_loss`, `smooth_l1_loss` and `huber_loss`: an elementwise loss of `self - target`, reduced.
pub(crate) struct PointwiseLoss;

impl OpRule for PointwiseLoss {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        let (reduction, _) = reduction_of(&a.params)?;
        let scalars = usize::from(a.op != OpId::MseLoss);
        a.expect_counts(2..=2, scalars..=scalars)?;
        if a.op != OpId::MseLoss {
            check_parameter(a.op, &a.scalars[0])?;
        }
        let dtype = result_type(&[Operand::Tensor(&i[0]), Operand::Tensor(&i[1])]);
        if !dtype.is_float() {
            return Err(not_implemented_for(kernel_name(a.op), dtype));
        }
        let shape = broadcast_all([&i[0].shape[..], &i[1].shape[..]])?;
        let out = reduced(&TensorType { dtype, shape }, dtype, reduction);
        let scalar_dtypes: ScalarDTypes = a.scalars.iter().map(|_| dtype).collect();
        Ok(Meta::single(out, scalar_dtypes))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let (reduction, _) = reduction_of(&a.params)?;
        let out = a.out(0).clone();
        let cd = out.dtype.compute_dtype();
        let shape: Shape = broadcast_all([e.shape(a.inputs[0]), e.shape(a.inputs[1])])?;
        let x = prep(e, a.inputs[0], cd, &shape);
        let t = prep(e, a.inputs[1], cd, &shape);
        let d = e.sub(x, t);
        let loss = match a.op {
            OpId::MseLoss => e.mul(d, d),
            _ => {
                let z = e.abs(d);
                let p = prep(e, a.scalars[0], cd, &shape);
                let half = k(e, z, 0.5);
                let below = e.compare(Cmp::Lt, z, p);
                let hz = e.mul(half, z);
                let hzz = e.mul(hz, z);
                let hp = e.mul(half, p);
                if a.op == OpId::SmoothL1Loss {
                    // |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta
                    let quad = e.div(hzz, p);
                    let lin = e.sub(z, hp);
                    e.select(below, quad, lin)
                } else {
                    // |d| < delta ? 0.5 d^2 : delta (|d| - 0.5 delta)
                    let zh = e.sub(z, hp);
                    let lin = e.mul(p, zh);
                    e.select(below, hzz, lin)
                }
            }
        };
        let r = reduce(e, loss, reduction);
        Ok(vec![e.convert(r, out.dtype)])
    }
}

/// The gradients of `mse_loss`, `smooth_l1_loss` and `huber_loss` with respect to `self`.
pub(crate) struct PointwiseLossBackward;

impl OpRule for PointwiseLossBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        reduction_of(&a.params)?;
        let scalars = usize::from(a.op != OpId::MseLossBackward);
        a.expect_counts(3..=3, scalars..=scalars)?;
        if a.op != OpId::MseLossBackward {
            check_parameter(a.op, &a.scalars[0])?;
        }
        let out = like_self(a.op, &i[1], &[&i[0], &i[2]])?;
        let scalar_dtypes: ScalarDTypes = a
            .scalars
            .iter()
            .map(|_| out.dtype.compute_dtype())
            .collect();
        Ok(Meta::single(out, scalar_dtypes))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let (reduction, _) = reduction_of(&a.params)?;
        let out = a.out(0).clone();
        let cd = out.dtype.compute_dtype();
        let shape = out.shape.clone();
        let g = prep(e, a.inputs[0], cd, &shape);
        let x = prep(e, a.inputs[1], cd, &shape);
        let t = prep(e, a.inputs[2], cd, &shape);
        let d = e.sub(x, t);
        let n = norm(reduction, out.numel());
        let r = match a.op {
            OpId::MseLossBackward => {
                // 2 / numel (mean) or 2, times (x - t) times g
                let c = k(e, d, 2.0 * n);
                let cd_ = e.mul(c, d);
                e.mul(cd_, g)
            }
            _ => {
                let p = prep(e, a.scalars[0], cd, &shape);
                let np = e.neg(p);
                let c = k(e, g, n);
                let ng = e.mul(c, g);
                let nng = e.neg(ng);
                let low = e.compare(Cmp::Le, d, np);
                let high = e.compare(Cmp::Ge, d, p);
                let (lo, hi, mid) = if a.op == OpId::SmoothL1LossBackward {
                    // -norm g, norm g, norm (x - t) g / beta
                    let dg = e.mul(ng, d);
                    (nng, ng, e.div(dg, p))
                } else {
                    // -norm g delta, norm g delta, norm (x - t) g
                    let lo = e.mul(nng, p);
                    let hi = e.mul(ng, p);
                    let c = k(e, d, n);
                    let cd_ = e.mul(c, d);
                    (lo, hi, e.mul(cd_, g))
                };
                let r = e.select(high, hi, mid);
                e.select(low, lo, r)
            }
        };
        Ok(vec![e.convert(r, out.dtype)])
    }
}

/// `binary_cross_entropy` of probabilities `self` against `target`, optionally weighted.
pub(crate) struct BinaryCrossEntropy;

impl OpRule for BinaryCrossEntropy {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        let (reduction, _) = reduction_of(&a.params)?;
        a.expect_counts(2..=3, 0..=0)?;
        let x = &i[0];
        if !x.dtype.is_float() {
            return Err(not_implemented_for("binary_cross_entropy", x.dtype));
        }
        ensure!(
            i[1].dtype == x.dtype,
            "Found dtype {} but expected {}",
            i[1].dtype.scalar_type_name(),
            x.dtype.scalar_type_name()
        );
        let weights: Vec<&TensorType> = i[1..].iter().collect();
        like_self(a.op, x, &weights)?;
        Ok(Meta::single(reduced(x, x.dtype, reduction), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let (reduction, _) = reduction_of(&a.params)?;
        let out = a.out(0).clone();
        let cd = out.dtype.compute_dtype();
        let shape = e.shape(a.inputs[0]).to_vec();
        let x = e.convert(a.inputs[0], cd);
        let t = prep(e, a.inputs[1], cd, &shape);
        // (t - 1) * max(log1p(-x), -100) - t * max(log(x), -100)
        let floor = k(e, x, -100.0);
        let nx = e.neg(x);
        let l1 = e.unary("stablehlo.log_plus_one", nx);
        let l1 = e.max(l1, floor);
        let l0 = e.log(x);
        let l0 = e.max(l0, floor);
        let one = k(e, x, 1.0);
        let tm1 = e.sub(t, one);
        let a1 = e.mul(tm1, l1);
        let a0 = e.mul(t, l0);
        let mut loss = e.sub(a1, a0);
        if let Some(&w) = a.inputs.get(2) {
            let w = prep(e, w, cd, &shape);
            loss = e.mul(loss, w);
        }
        let r = reduce(e, loss, reduction);
        Ok(vec![e.convert(r, out.dtype)])
    }
}

/// The gradient of `binary_cross_entropy` with respect to `self`.
pub(crate) struct BinaryCrossEntropyBackward;

impl OpRule for BinaryCrossEntropyBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        reduction_of(&a.params)?;
        a.expect_counts(3..=4, 0..=0)?;
        let others: Vec<&TensorType> = [&i[0]].into_iter().chain(&i[2..]).collect();
        Ok(Meta::single(like_self(a.op, &i[1], &others)?, vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let (reduction, _) = reduction_of(&a.params)?;
        let out = a.out(0).clone();
        let cd = out.dtype.compute_dtype();
        let shape = out.shape.clone();
        let g = prep(e, a.inputs[0], cd, &shape);
        let x = prep(e, a.inputs[1], cd, &shape);
        let t = prep(e, a.inputs[2], cd, &shape);
        // g * (x - t) / max((1 - x) * x, 1e-12), times the weight, over numel for a mean
        let one = k(e, x, 1.0);
        let omx = e.sub(one, x);
        let den = e.mul(omx, x);
        let eps = k(e, x, 1e-12);
        let den = e.max(den, eps);
        let d = e.sub(x, t);
        let gd = e.mul(g, d);
        let mut r = e.div(gd, den);
        if let Some(&w) = a.inputs.get(3) {
            let w = prep(e, w, cd, &shape);
            r = e.mul(r, w);
        }
        if reduction == Reduction::Mean {
            let n = k(e, r, out.numel() as f64);
            r = e.div(r, n);
        }
        Ok(vec![e.convert(r, out.dtype)])
    }
}

/// `nll_loss_forward` over `[N, C]` or `[C]` inputs; outputs `(output, total_weight)`.
pub(crate) struct NllLoss;

impl OpRule for NllLoss {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        let p = &a.params;
        a.expect_counts(2..=3, 0..=0)?;
        let (x, target, weight) = (&i[0], &i[1], i.get(2));
        nll_checks(x, target, weight)?;
        let (reduction, _) = reduction_of(p)?;
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
            float_default: None,
            matmul_precision: None,
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let layout::NllLossReduction {
            reduction,
            ignore_index,
        } = layout::NllLossReduction::decode(&a.params)?;
        let x = a.inputs[0];
        let dtype = e.dtype(x);
        let cd = dtype.compute_dtype();
        let xc = e.convert(x, cd);
        let (mask, w) = nll_mask(e, xc, a.inputs[1], a.inputs.get(2).copied(), ignore_index);
        let r = e.rank(xc);
        // Per-sample loss: -w[target] * x[target]; other classes contribute nothing, even
        // where x is -inf (a log-softmax of a masked row) or NaN.
        let wx = e.mul(w, xc);
        let zero = e.full_like(xc, 0.0);
        let wx = e.select(mask, wx, zero);
        let picked = e.reduce_sum(wx, &[r - 1]);
        let loss = e.neg(picked);
        let wsum = e.reduce_sum(w, &[r - 1]);
        let (out, total) = reduce_weighted(e, loss, wsum, reduction, cd);
        Ok(vec![e.convert(out, dtype), e.convert(total, dtype)])
    }
}

/// The gradient of `nll_loss_forward` with respect to `self`.
pub(crate) struct NllLossBackward;

impl OpRule for NllLossBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        let p = &a.params;
        a.expect_counts(4..=5, 0..=0)?;
        let (reduction, _) = reduction_of(p)?;
        nll_backward_checks(i, reduction)?;
        Ok(Meta::single(i[1].clone(), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let layout::NllLossReduction {
            reduction,
            ignore_index,
        } = layout::NllLossReduction::decode(&a.params)?;
        let (grad, x, target, total) = (a.inputs[0], a.inputs[1], a.inputs[2], a.inputs[3]);
        let dtype = e.dtype(x);
        let cd = dtype.compute_dtype();
        let shape = e.shape(x).to_vec();
        let r = shape.len();
        let xc = e.convert(x, cd);
        let (mask, w) = nll_mask(e, xc, target, a.inputs.get(4).copied(), ignore_index);
        let g = e.convert(grad, cd);
        // Without a reduction a batch's gradient holds one value per sample (dim 0).
        let per_sample: Option<&[usize]> = if r == 2 { Some(&[0]) } else { None };
        let g = spread_gradient(e, g, total, reduction, &shape, per_sample);
        let r = picked_gradient(e, mask, w, g);
        Ok(vec![e.convert(r, dtype)])
    }
}

/// `nll_loss2d_forward` over `[N, C, H, W]` inputs and `[N, H, W]` targets.
pub(crate) struct NllLoss2d;

impl OpRule for NllLoss2d {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        let (reduction, _) = reduction_of(&a.params)?;
        a.expect_counts(2..=3, 0..=0)?;
        let x = &i[0];
        nll2d_checks(x, &i[1], i.get(2))?;
        if !x.dtype.is_float() {
            return Err(not_implemented_for("nll_loss2d_forward_out_frame", x.dtype));
        }
        let out = if reduction == Reduction::None {
            TensorType::new(x.dtype, &i[1].shape)
        } else {
            TensorType::scalar(x.dtype)
        };
        let mut outputs = MetaOutputs::new();
        outputs.push(out);
        outputs.push(TensorType::scalar(x.dtype));
        Ok(Meta::of_outputs(outputs))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let layout::NllLossReduction {
            reduction,
            ignore_index,
        } = layout::NllLossReduction::decode(&a.params)?;
        let out = a.out(0).clone();
        let cd = out.dtype.compute_dtype();
        let x = e.convert(a.inputs[0], cd);
        let (mask, w) = nll_weights(e, x, a.inputs[1], a.inputs.get(2).copied(), ignore_index);
        // Per-position loss -w[target] * x[target]; other classes contribute nothing,
        // even where x is -inf.
        let wx = e.mul(w, x);
        let zero = k(e, x, 0.0);
        let wx = e.select(mask, wx, zero);
        let picked = e.reduce_sum(wx, &[1]);
        let loss = e.neg(picked);
        let wsum = e.reduce_sum(w, &[1]);
        let (r, total) = reduce_weighted(e, loss, wsum, reduction, cd);
        Ok(vec![e.convert(r, out.dtype), e.convert(total, out.dtype)])
    }
}

/// The gradient of `nll_loss2d_forward` with respect to `self`.
pub(crate) struct NllLoss2dBackward;

impl OpRule for NllLoss2dBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        let (reduction, _) = reduction_of(&a.params)?;
        a.expect_counts(4..=5, 0..=0)?;
        nll2d_backward_checks(i, reduction)?;
        Ok(Meta::single(i[1].clone(), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let layout::NllLossReduction {
            reduction,
            ignore_index,
        } = layout::NllLossReduction::decode(&a.params)?;
        let out = a.out(0).clone();
        let cd = out.dtype.compute_dtype();
        let (g, x, target, total) = (a.inputs[0], a.inputs[1], a.inputs[2], a.inputs[3]);
        let shape = out.shape.clone();
        let xc = e.convert(x, cd);
        let (mask, w) = nll_weights(e, xc, target, a.inputs.get(4).copied(), ignore_index);
        let g = e.convert(g, cd);
        // Without a reduction the gradient holds one value per position ([N, H, W]).
        let g = spread_gradient(e, g, total, reduction, &shape, Some(&[0, 2, 3]));
        let r = picked_gradient(e, mask, w, g);
        Ok(vec![e.convert(r, out.dtype)])
    }
}

/// The nll losses' gradient: `-w * g` at each target class that is not ignored, and zero
/// elsewhere, as PyTorch's kernels write it: when every target is ignored a mean's `g` is
/// `1 / 0`, and the gradient is still zeros, not `0 * inf`.
fn picked_gradient(e: &mut Emitter, mask: Value, w: Value, g: Value) -> Value {
    let wg = e.mul(w, g);
    let r = e.neg(wg);
    let zero = k(e, r, 0.0);
    e.select(mask, r, zero)
}

/// The reduction of an elementwise loss: itself, its sum or its mean.
fn reduce(e: &mut Emitter, loss: Value, reduction: Reduction) -> Value {
    let all: Vec<usize> = (0..e.rank(loss)).collect();
    match reduction {
        Reduction::None => loss,
        Reduction::Sum => e.reduce_sum(loss, &all),
        Reduction::Mean => {
            let n = e.ty(loss).numel();
            let s = e.reduce_sum(loss, &all);
            let count = k(e, s, n as f64);
            e.div(s, count)
        }
    }
}

/// The nll losses' reduction of per-sample losses `loss` and their weights `wsum` (in `cd`):
/// `(output, total_weight)`, where a mean divides the summed loss by the summed weight and no
/// reduction has a total weight of 0.
fn reduce_weighted(
    e: &mut Emitter,
    loss: Value,
    wsum: Value,
    reduction: Reduction,
    cd: DType,
) -> (Value, Value) {
    match reduction {
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
    }
}

/// The nll losses' incoming gradient `g` spread over `shape`: placed along `per_sample` dims
/// when there was no reduction (a broadcast when it is a single value), divided by the total
/// weight for a mean.
fn spread_gradient(
    e: &mut Emitter,
    g: Value,
    total: Value,
    reduction: Reduction,
    shape: &[i64],
    per_sample: Option<&[usize]>,
) -> Value {
    let cd = e.dtype(g);
    // A single gradient and total weight may come as `[1]` or `[1, 1]`.
    let single = |e: &mut Emitter, v: Value| e.reshape(v, &[]);
    match (reduction, per_sample) {
        (Reduction::None, Some(dims)) => e.broadcast_in_dim(g, shape, dims),
        (Reduction::Mean, _) => {
            let g = single(e, g);
            let total = single(e, total);
            let t = e.convert(total, cd);
            let q = e.div(g, t);
            e.broadcast_to(q, shape)
        }
        _ => {
            let g = single(e, g);
            e.broadcast_to(g, shape)
        }
    }
}

/// The factor a mean reduction puts on each element's gradient (`1 / numel`), else 1.
fn norm(reduction: Reduction, numel: i64) -> f64 {
    if reduction == Reduction::Mean {
        1.0 / numel as f64
    } else {
        1.0
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
            // PyTorch takes a weight of any shape with one element per class.
            let w = e.reshape(w, &[shape[r - 1]]);
            e.broadcast_in_dim(w, &shape, &[r - 1])
        }
        None => e.full_like(x, 1.0),
    };
    let zero = e.full_like(x, 0.0);
    let w = e.select(mask, w, zero);
    (mask, w)
}

/// For `x` of shape `[N, C, H, W]` and `target` `[N, H, W]`: the one-hot mask of each
/// position's target class (none where the target is `ignore_index`) and the class weights
/// under it (zero elsewhere), both shaped like `x`.
fn nll_weights(
    e: &mut Emitter,
    x: Value,
    target: Value,
    weight: Option<Value>,
    ignore_index: i64,
) -> (Value, Value) {
    let shape = e.shape(x).to_vec();
    let t = e.convert(target, DType::I64);
    let t = e.broadcast_in_dim(t, &shape, &[0, 2, 3]);
    let classes = e.iota(TensorType::new(DType::I64, &shape), 1);
    let mask = e.compare(Cmp::Eq, t, classes);
    let ignore = e.full_like(t, ignore_index as f64);
    let valid = e.compare(Cmp::Ne, t, ignore);
    let mask = e.and(mask, valid);
    let w = match weight {
        Some(w) => {
            let w = e.convert(w, e.dtype(x));
            let w = e.reshape(w, &[shape[1]]);
            e.broadcast_in_dim(w, &shape, &[1])
        }
        None => k(e, x, 1.0),
    };
    let zero = k(e, x, 0.0);
    (mask, e.select(mask, w, zero))
}

#[cfg(test)]
mod tests {
    use crate::dtype::{DType, ScalarArg, TensorType};
    use crate::{meta, OpId};

    fn t(dtype: DType, shape: &[i64]) -> TensorType {
        TensorType::new(dtype, shape)
    }

    #[test]
    fn pointwise_losses_reduce_to_a_scalar() {
        let (x, y) = (t(DType::F32, &[4, 3]), t(DType::I64, &[3]));
        let m = meta(OpId::MseLoss, &[x.clone(), y.clone()], &[], &[1]).unwrap();
        assert_eq!(m.outputs[0], t(DType::F32, &[]));
        let m = meta(OpId::MseLoss, &[x.clone(), y.clone()], &[], &[0]).unwrap();
        assert_eq!(m.outputs[0], t(DType::F32, &[4, 3]));
        let beta = ScalarArg::float(0.5);
        let m = meta(OpId::SmoothL1Loss, &[x.clone(), x.clone()], &[beta], &[2]).unwrap();
        assert_eq!(m.outputs[0], t(DType::F32, &[]));
        assert_eq!(m.scalar_dtypes.as_slice(), &[DType::F32]);
        let err = meta(
            OpId::HuberLoss,
            &[x.clone(), x.clone()],
            &[ScalarArg::float(0.0)],
            &[1],
        )
        .unwrap_err();
        assert_eq!(
            err.message,
            "huber_loss does not support non-positive values for delta."
        );
        let err = meta(OpId::MseLoss, &[y.clone(), y], &[], &[1]).unwrap_err();
        assert_eq!(err.message, "\"mse_cpu\" not implemented for 'Long'");
    }

    #[test]
    fn loss_gradients_have_the_type_of_self() {
        let x = t(DType::BF16, &[2, 3]);
        let g = t(DType::BF16, &[]);
        let m = meta(
            OpId::HuberLossBackward,
            &[g.clone(), x.clone(), x.clone()],
            &[ScalarArg::float(1.0)],
            &[1],
        )
        .unwrap();
        assert_eq!(m.outputs[0], x);
        assert_eq!(m.scalar_dtypes.as_slice(), &[DType::F32]);
        let w = t(DType::BF16, &[3]);
        let m = meta(
            OpId::BinaryCrossEntropyBackward,
            &[g, x.clone(), x.clone(), w],
            &[],
            &[0],
        )
        .unwrap();
        assert_eq!(m.outputs[0], x);
    }

    #[test]
    fn binary_cross_entropy_wants_one_dtype() {
        let x = t(DType::F32, &[5]);
        let err = meta(
            OpId::BinaryCrossEntropy,
            &[x.clone(), t(DType::F64, &[5])],
            &[],
            &[1],
        )
        .unwrap_err();
        assert_eq!(err.message, "Found dtype Double but expected Float");
        let m = meta(OpId::BinaryCrossEntropy, &[x.clone(), x], &[], &[0]).unwrap();
        assert_eq!(m.outputs[0], t(DType::F32, &[5]));
    }

    #[test]
    fn nll_loss2d_is_spatial() {
        let x = t(DType::F32, &[2, 5, 3, 4]);
        let target = t(DType::I64, &[2, 3, 4]);
        let m = meta(
            OpId::NllLoss2d,
            &[x.clone(), target.clone()],
            &[],
            &[0, -100],
        )
        .unwrap();
        assert_eq!(m.outputs[0], t(DType::F32, &[2, 3, 4]));
        assert_eq!(m.outputs[1], t(DType::F32, &[]));
        let m = meta(
            OpId::NllLoss2d,
            &[x.clone(), target.clone(), t(DType::F32, &[5])],
            &[],
            &[1, -100],
        )
        .unwrap();
        assert_eq!(m.outputs[0], t(DType::F32, &[]));
        let err = meta(
            OpId::NllLoss2d,
            &[x.clone(), t(DType::I64, &[2, 12])],
            &[],
            &[1, -100],
        )
        .unwrap_err();
        assert_eq!(
            err.message,
            "only batches of spatial targets supported (3D tensors) but got targets of dimension: 2"
        );
        let m = meta(
            OpId::NllLoss2dBackward,
            &[t(DType::F32, &[]), x.clone(), target, t(DType::F32, &[])],
            &[],
            &[1, -100],
        )
        .unwrap();
        assert_eq!(m.outputs[0], x);
    }
}
