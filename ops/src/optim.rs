//! Fused optimizer steps for one parameter: `_fused_adam_`/`_fused_adamw_` and `_fused_sgd_`.
//!
//! The hyper-parameters (learning rate, betas, weight decay, eps, momentum, dampening) are
//! lifted f64 scalars, so a learning-rate schedule never recompiles. As in PyTorch's CPU kernels,
//! the per-step coefficients (bias corrections, step size) are computed in f64 from the step
//! count and then rounded to the parameter's computation dtype, in which the update runs.
//! Optional inputs are announced by presence flags in the params; the branches PyTorch's kernels
//! take on a hyper-parameter's value (a zero weight decay, lerp's two-sided formula) are static
//! params too, so each step's module holds only the arithmetic it runs.

use crate::dtype::{DType, TensorType};
use crate::emitter::{Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout as layout;
use crate::params::Params;
use crate::{LowerArgs, Meta, MetaArgs, MetaOutputs, OpId, OpRule, ScalarDTypes};

/// Where the optional inputs sit, given their presence flags (in layout order).
fn place(
    op: OpId,
    count: usize,
    required: usize,
    present: &[bool],
) -> Result<Vec<Option<usize>>, OpError> {
    let expected = required + present.iter().filter(|&&f| f).count();
    ensure!(
        count == expected,
        "{}: the presence flags in the params announce {expected} tensor inputs ({}), got {}",
        op.name(),
        op.inputs_layout(),
        count
    );
    let mut next = required;
    Ok(present
        .iter()
        .map(|&f| {
            f.then(|| {
                next += 1;
                next - 1
            })
        })
        .collect())
}

/// Adam's flags (layout `FusedAdamFlags`) with its optional inputs placed.
struct AdamFlags {
    amsgrad: bool,
    maximize: bool,
    adamw: bool,
    weight_decay: bool,
    /// `|1 - beta1| < 0.5`: which side lerp's formula starts from.
    small_lerp_weight: bool,
    /// Input positions of max_exp_avg_sq, lr and found_inf.
    max_exp_avg_sq: Option<usize>,
    lr: Option<usize>,
    found_inf: Option<usize>,
}

fn adam_flags(op: OpId, p: &Params, count: usize) -> Result<AdamFlags, OpError> {
    let f = layout::FusedAdamFlags::decode(p)?;
    let at = place(op, count, 5, &[f.amsgrad, f.lr_is_tensor, f.has_found_inf])?;
    Ok(AdamFlags {
        amsgrad: f.amsgrad,
        maximize: f.maximize,
        adamw: f.adamw,
        weight_decay: f.weight_decay,
        small_lerp_weight: f.small_lerp_weight,
        max_exp_avg_sq: at[0],
        lr: at[1],
        found_inf: at[2],
    })
}

/// SGD's flags (layout `FusedSgdFlags`) with its optional inputs placed.
struct SgdFlags {
    nesterov: bool,
    maximize: bool,
    first_step: bool,
    weight_decay: bool,
    momentum_buffer: Option<usize>,
    lr: Option<usize>,
    found_inf: Option<usize>,
}

fn sgd_flags(op: OpId, p: &Params, count: usize) -> Result<SgdFlags, OpError> {
    let f = layout::FusedSgdFlags::decode(p)?;
    let at = place(
        op,
        count,
        2,
        &[f.has_momentum_buffer, f.lr_is_tensor, f.has_found_inf],
    )?;
    Ok(SgdFlags {
        nesterov: f.nesterov,
        maximize: f.maximize,
        first_step: f.is_first_step,
        weight_decay: f.weight_decay,
        momentum_buffer: at[0],
        lr: at[1],
        found_inf: at[2],
    })
}

/// A state tensor must match its parameter exactly.
fn check_state(op: OpId, param: &TensorType, name: &str, t: &TensorType) -> Result<(), OpError> {
    ensure!(
        t.shape == param.shape && t.dtype == param.dtype,
        "{}: {name} must have the parameter's shape {:?} and dtype {}, got {:?} and {}",
        op.name(),
        param.shape.as_slice(),
        param.dtype.scalar_type_name(),
        t.shape.as_slice(),
        t.dtype.scalar_type_name()
    );
    Ok(())
}

/// Step counts, tensor learning rates and `found_inf` are one-element float tensors.
fn check_one(op: OpId, name: &str, t: &TensorType) -> Result<(), OpError> {
    ensure!(
        t.numel() == 1 && t.dtype.is_float(),
        "{}: {name} must be a one-element floating point tensor, got shape {:?} and dtype {}",
        op.name(),
        t.shape.as_slice(),
        t.dtype.scalar_type_name()
    );
    Ok(())
}

/// The parameter every step updates (input 0), which must be floating point.
fn parameter<'a>(a: &MetaArgs<'a>) -> Result<&'a TensorType, OpError> {
    let param = a.inputs.first().ok_or_else(|| {
        OpError::runtime(format!(
            "{}: expected tensor inputs ({})",
            a.op.name(),
            a.op.inputs_layout()
        ))
    })?;
    ensure!(
        param.dtype.is_float(),
        "{}: the parameter must be a floating point tensor, got {}",
        a.op.name(),
        param.dtype.scalar_type_name()
    );
    Ok(param)
}

/// A step's meta: `outputs` (each like the parameter) and `scalars` lifted f64 hyper-parameters.
fn step_meta(a: &MetaArgs, outputs: MetaOutputs, scalars: usize) -> Result<Meta, OpError> {
    let inputs = a.inputs.len();
    a.expect_counts(inputs..=inputs, scalars..=scalars)?;
    Ok(Meta {
        outputs,
        scalar_dtypes: ScalarDTypes::from_elem(DType::F64, scalars),
        variant: 0,
        float_default: None,
        matmul_precision: None,
    })
}

/// The `lr` and `found_inf` inputs, where given, are one-element float tensors.
fn check_lr_and_found_inf(
    a: &MetaArgs,
    lr: Option<usize>,
    found_inf: Option<usize>,
) -> Result<(), OpError> {
    for (name, at) in [("lr", lr), ("found_inf", found_inf)] {
        if let Some(at) = at {
            check_one(a.op, name, &a.inputs[at])?;
        }
    }
    Ok(())
}

/// `_fused_adam_` and `_fused_adamw_` on one parameter.
pub(crate) struct FusedAdam;

impl OpRule for FusedAdam {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        let param = parameter(a)?;
        let f = adam_flags(a.op, &a.params, i.len())?;
        for (name, at) in [("grad", 1), ("exp_avg", 2), ("exp_avg_sq", 3)] {
            check_state(a.op, param, name, &i[at])?;
        }
        check_one(a.op, "the step count", &i[4])?;
        if let Some(at) = f.max_exp_avg_sq {
            check_state(a.op, param, "max_exp_avg_sq", &i[at])?;
        }
        let mut outputs = MetaOutputs::new();
        outputs.push(param.clone());
        outputs.push(param.clone());
        outputs.push(param.clone());
        if f.amsgrad {
            outputs.push(param.clone());
        }
        check_lr_and_found_inf(a, f.lr, f.found_inf)?;
        // lr (unless a tensor), beta1, beta2, weight_decay, eps
        step_meta(a, outputs, 4 + usize::from(f.lr.is_none()))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_adam(e, a)
    }
}

/// `_fused_sgd_` on one parameter.
pub(crate) struct FusedSgd;

impl OpRule for FusedSgd {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        let param = parameter(a)?;
        let f = sgd_flags(a.op, &a.params, i.len())?;
        check_state(a.op, param, "grad", &i[1])?;
        let mut outputs = MetaOutputs::new();
        outputs.push(param.clone());
        if let Some(at) = f.momentum_buffer {
            check_state(a.op, param, "momentum_buffer", &i[at])?;
            outputs.push(param.clone());
        }
        check_lr_and_found_inf(a, f.lr, f.found_inf)?;
        // lr (unless a tensor), weight_decay, momentum, dampening
        step_meta(a, outputs, 3 + usize::from(f.lr.is_none()))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_sgd(e, a)
    }
}

/// A one-element tensor as a 0-d f64 value.
fn scalar_f64(e: &mut Emitter, v: Value) -> Value {
    let v = e.reshape(v, &[]);
    e.convert(v, DType::F64)
}

/// `1 - x` for a 0-d f64 value.
fn one_minus(e: &mut Emitter, x: Value) -> Value {
    let one = e.f64_constant(DType::F64, 1.0);
    e.sub(one, x)
}

/// A 0-d f64 coefficient rounded to `dtype` and broadcast to `shape`.
fn coeff(e: &mut Emitter, c: Value, dtype: DType, shape: &[i64]) -> Value {
    let c = e.convert(c, dtype);
    e.broadcast_in_dim(c, shape, &[])
}

/// `p` broadcast to `shape`.
fn splat(e: &mut Emitter, p: Value, shape: &[i64]) -> Value {
    e.broadcast_in_dim(p, shape, &[])
}

/// The predicate `found_inf == 1` (skip the step), broadcast to `shape`.
fn skip_step(e: &mut Emitter, found_inf: Value, shape: &[i64]) -> Value {
    let f = scalar_f64(e, found_inf);
    let skip = e.compare_const(Cmp::Eq, f, 1.0);
    splat(e, skip, shape)
}

fn lower_adam(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let f = adam_flags(a.op, &a.params, a.inputs.len())?;
    let i = a.inputs;
    let dtype = a.out(0).dtype;
    let cd = dtype.compute_dtype();
    let shape = a.out(0).shape.to_vec();
    let s = a.scalars;
    let (lr, rest) = match f.lr {
        Some(at) => (scalar_f64(e, i[at]), s),
        None => (s[0], &s[1..]),
    };
    let (beta1, beta2, wd, eps) = (rest[0], rest[1], rest[2], rest[3]);

    // Per-step coefficients, in f64.
    let step = scalar_f64(e, i[4]);
    let b1_pow = e.pow(beta1, step);
    let bc1 = one_minus(e, b1_pow);
    let b2_pow = e.pow(beta2, step);
    let bc2 = one_minus(e, b2_pow);
    let step_size = e.div(lr, bc1);
    let neg_step_size = e.neg(step_size);
    let bc2_sqrt = e.sqrt(bc2);
    let grad_coeff = one_minus(e, beta1);
    let sq_coeff = one_minus(e, beta2);

    let p = e.convert(i[0], cd);
    let mut g = e.convert(i[1], cd);
    let m = e.convert(i[2], cd);
    let v = e.convert(i[3], cd);
    if f.maximize {
        g = e.neg(g);
    }
    let mut p_decayed = p;
    if f.weight_decay && f.adamw {
        let lr_wd = e.mul(lr, wd);
        let decay = one_minus(e, lr_wd);
        let c = coeff(e, decay, cd, &shape);
        p_decayed = e.mul(p, c);
    } else if f.weight_decay {
        let c = coeff(e, wd, cd, &shape);
        let pw = e.mul(p, c);
        g = e.add(g, pw);
    }
    // exp_avg.lerp_(grad, 1 - beta1): m + w (g - m) for a small weight, else g - (g - m)(1 - w).
    let diff = e.sub(g, m);
    let w = coeff(e, grad_coeff, cd, &shape);
    let m_new = if f.small_lerp_weight {
        let step_m = e.mul(w, diff);
        e.add(m, step_m)
    } else {
        let one = e.full_like(w, 1.0);
        let c = e.sub(one, w);
        let step_m = e.mul(diff, c);
        e.sub(g, step_m)
    };
    let b2 = coeff(e, beta2, cd, &shape);
    let c2 = coeff(e, sq_coeff, cd, &shape);
    let vb = e.mul(v, b2);
    let cg = e.mul(c2, g);
    let cgg = e.mul(cg, g);
    let v_new = e.add(vb, cgg);
    let (second, max_new) = match f.max_exp_avg_sq {
        Some(at) if f.amsgrad => {
            let vmax = e.convert(i[at], cd);
            let vmax_new = e.max(vmax, v_new);
            (vmax_new, Some((vmax, vmax_new)))
        }
        _ => (v_new, None),
    };
    let root = e.sqrt(second);
    let bc2s = coeff(e, bc2_sqrt, cd, &shape);
    let scaled = e.div(root, bc2s);
    let eps_v = coeff(e, eps, cd, &shape);
    let denom = e.add(scaled, eps_v);
    let nss = coeff(e, neg_step_size, cd, &shape);
    let upd = e.mul(nss, m_new);
    let upd = e.div(upd, denom);
    let p_new = e.add(p_decayed, upd);

    let mut results = vec![(p, p_new), (m, m_new), (v, v_new)];
    if let Some(pair) = max_new {
        results.push(pair);
    }
    finish(e, results, f.found_inf.map(|at| i[at]), dtype, &shape)
}

fn lower_sgd(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let f = sgd_flags(a.op, &a.params, a.inputs.len())?;
    let i = a.inputs;
    let dtype = a.out(0).dtype;
    let cd = dtype.compute_dtype();
    let shape = a.out(0).shape.to_vec();
    let s = a.scalars;
    let (lr, rest) = match f.lr {
        Some(at) => (scalar_f64(e, i[at]), s),
        None => (s[0], &s[1..]),
    };
    let (wd, momentum, dampening) = (rest[0], rest[1], rest[2]);

    let p = e.convert(i[0], cd);
    let mut g = e.convert(i[1], cd);
    if f.maximize {
        g = e.neg(g);
    }
    if f.weight_decay {
        let wd_c = coeff(e, wd, cd, &shape);
        let pw = e.mul(p, wd_c);
        g = e.add(pw, g);
    }
    let mut results = vec![];
    let mut buffer = None;
    if let Some(at) = f.momentum_buffer {
        let buf = e.convert(i[at], cd);
        let mom = coeff(e, momentum, cd, &shape);
        let buf_new = if f.first_step {
            g
        } else {
            let keep = one_minus(e, dampening);
            let keep = coeff(e, keep, cd, &shape);
            let bm = e.mul(buf, mom);
            let kg = e.mul(keep, g);
            e.add(kg, bm)
        };
        g = if f.nesterov {
            let bm = e.mul(buf_new, mom);
            e.add(bm, g)
        } else {
            buf_new
        };
        buffer = Some((buf, buf_new));
    }
    let neg_lr = e.neg(lr);
    let neg_lr = coeff(e, neg_lr, cd, &shape);
    let upd = e.mul(g, neg_lr);
    let p_new = e.add(p, upd);
    results.push((p, p_new));
    results.extend(buffer);
    finish(e, results, f.found_inf.map(|at| i[at]), dtype, &shape)
}

/// The outputs in the parameter's dtype; with `found_inf`, the old values where it is 1.
fn finish(
    e: &mut Emitter,
    results: Vec<(Value, Value)>,
    found_inf: Option<Value>,
    dtype: DType,
    shape: &[i64],
) -> Result<Vec<Value>, OpError> {
    let skip = found_inf.map(|f| skip_step(e, f, shape));
    Ok(results
        .into_iter()
        .map(|(old, new)| {
            let r = match skip {
                Some(skip) => e.select(skip, old, new),
                None => new,
            };
            e.convert(r, dtype)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use crate::dtype::{DType, ScalarArg, TensorType};
    use crate::{meta, OpId};

    fn t(dtype: DType, shape: &[i64]) -> TensorType {
        TensorType::new(dtype, shape)
    }

    #[test]
    fn adam_outputs_follow_amsgrad() {
        let p = t(DType::F32, &[3, 2]);
        let step = t(DType::F32, &[]);
        let scalars = [ScalarArg::float(1e-3); 5];
        let inputs = [p.clone(), p.clone(), p.clone(), p.clone(), step.clone()];
        let m = meta(OpId::FusedAdam, &inputs, &scalars, &[0, 0, 1, 0, 0, 1, 1]).unwrap();
        assert_eq!(m.outputs.len(), 3);
        assert_eq!(m.scalar_dtypes.as_slice(), &[DType::F64; 5]);
        let mut with_max = inputs.to_vec();
        with_max.push(p.clone());
        with_max.push(t(DType::F32, &[]));
        let m = meta(
            OpId::FusedAdam,
            &with_max,
            &scalars[1..],
            &[1, 0, 0, 1, 0, 0, 1],
        )
        .unwrap();
        assert_eq!(m.outputs.len(), 4);
        assert_eq!(m.outputs[3], p);
        assert_eq!(m.scalar_dtypes.len(), 4);
        let err = meta(OpId::FusedAdam, &inputs, &scalars, &[1, 0, 0, 0, 0, 0, 1]).unwrap_err();
        assert!(
            err.message.contains("announce 6 tensor inputs"),
            "{}",
            err.message
        );
    }

    #[test]
    fn adam_state_must_match_the_parameter() {
        let p = t(DType::F32, &[4]);
        let inputs = [
            p.clone(),
            t(DType::F64, &[4]),
            p.clone(),
            p.clone(),
            t(DType::F32, &[]),
        ];
        let scalars = [ScalarArg::float(0.1); 5];
        let err = meta(OpId::FusedAdam, &inputs, &scalars, &[0, 0, 0, 0, 0, 0, 1]).unwrap_err();
        assert!(err.message.contains("grad must have"), "{}", err.message);
    }

    #[test]
    fn sgd_outputs_the_momentum_buffer_when_given() {
        let p = t(DType::BF16, &[5]);
        let scalars = [ScalarArg::float(0.1); 4];
        let m = meta(
            OpId::FusedSgd,
            &[p.clone(), p.clone()],
            &scalars,
            &[0, 0, 0, 0, 0, 0, 1],
        )
        .unwrap();
        assert_eq!(m.outputs.len(), 1);
        let m = meta(
            OpId::FusedSgd,
            &[p.clone(), p.clone(), p.clone(), t(DType::F32, &[1])],
            &scalars[1..],
            &[1, 0, 1, 1, 1, 0, 0],
        )
        .unwrap();
        assert_eq!(m.outputs.len(), 2);
        assert_eq!(m.outputs[1], p);
    }
}
