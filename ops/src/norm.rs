//! Normalization ops: batch, layer and group norm, forward and backward, and batch norm's
//! running statistics.
//!
//! Statistics follow PyTorch's CPU kernels: mean and biased variance in the computation dtype
//! (f32 for bf16/f16), `rstd = 1 / sqrt(var + eps)`, the unbiased variance for running stats.

use crate::dtype::{DType, Shape, TensorType};
use crate::elementwise::{k, not_implemented_for};
use crate::emitter::{Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout as layout;
use crate::params::wrap_dim;
use crate::reduce::sum_keepdim;
use crate::{LowerArgs, Meta, MetaArgs, MetaOutputs, OpId, OpRule};

// ---- argument helpers ---------------------------------------------------------------------

/// The optional inputs after the `required` ones, placed by their presence flags.
fn optional<T: Copy>(
    op: OpId,
    inputs: &[T],
    required: usize,
    present: &[bool],
) -> Result<Vec<Option<T>>, OpError> {
    let expected = required + present.iter().filter(|&&f| f).count();
    ensure!(
        inputs.len() == expected,
        "{}: the presence flags in the params announce {expected} tensor inputs ({}), got {}",
        op.name(),
        op.inputs_layout(),
        inputs.len()
    );
    let mut next = required;
    Ok(present
        .iter()
        .map(|&f| {
            f.then(|| {
                next += 1;
                inputs[next - 1]
            })
        })
        .collect())
}

/// PyTorch's CPU rule for normalization parameters: a parameter whose dtype differs from the
/// input's is allowed only as f32 beside a bf16/f16 input ("mixed type"), and then statistics are
/// kept in f32. Returns the dtype of the statistics and parameter gradients.
/// Which of batch norm backward's optional inputs are present, in input order.
fn batch_norm_backward_presence(l: &layout::BatchNormBackward) -> [bool; 5] {
    [
        l.has_weight,
        l.has_running_mean,
        l.has_running_var,
        l.has_save_mean,
        l.has_save_invstd,
    ]
}

fn param_dtype(input: DType, params: &[Option<&TensorType>]) -> Result<DType, OpError> {
    let mixed = params.iter().flatten().any(|t| t.dtype != input);
    if !mixed {
        return Ok(input);
    }
    for t in params.iter().flatten() {
        ensure!(
            t.dtype == DType::F32,
            "mixed dtype (CPU): expect parameter to have scalar type of Float"
        );
    }
    ensure!(
        input.is_reduced_float(),
        "mixed dtype (CPU): all inputs must share same datatype."
    );
    Ok(DType::F32)
}

fn float_only(kernel: &str, dtype: DType) -> Result<(), OpError> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(not_implemented_for(kernel, dtype))
    }
}

/// Dim 1 of a batch-norm input: its channels.
fn channels(x: &TensorType) -> Result<i64, OpError> {
    Ok(x.shape[wrap_dim(1, x.rank())?])
}

fn check_numel(name: &str, t: Option<&TensorType>, n: i64) -> Result<(), OpError> {
    if let Some(t) = t {
        ensure!(
            t.numel() == n,
            "{name} should contain {n} elements not {}",
            t.numel()
        );
    }
    Ok(())
}

fn same_shape(op: OpId, grad: &TensorType, x: &TensorType) -> Result<(), OpError> {
    ensure!(
        grad.shape == x.shape,
        "{}: grad_out has shape {:?} but input has shape {:?}",
        op.name(),
        grad.shape.as_slice(),
        x.shape.as_slice()
    );
    Ok(())
}

fn three(a: TensorType, b: TensorType, c: TensorType) -> Meta {
    Meta::of_outputs(MetaOutputs::from_vec(vec![a, b, c]))
}

/// Group norm's `N, C, HxW, group` params, checked against the input as PyTorch does.
fn group_dims([n, c, hxw, group]: [i64; 4], x: &TensorType) -> Result<[i64; 4], OpError> {
    ensure!(
        group > 0,
        "Expected num groups to be greater than 0, got {group}"
    );
    ensure!(
        c % group == 0,
        "Expected number of channels in input to be divisible by num_groups, but got input of shape {:?} and num_groups={group}",
        x.shape.as_slice()
    );
    ensure!(
        n >= 0
            && c >= 0
            && hxw >= 0
            && n.checked_mul(c).and_then(|nc| nc.checked_mul(hxw)) == Some(x.numel()),
        "Expected X.numel() == N * C * HxW to be true, but got false.  (Could this error message be improved?  If so, please report an enhancement request to PyTorch.)"
    );
    Ok([n, c, hxw, group])
}

fn group_param(name: &str, t: Option<&TensorType>, c: i64, x: &TensorType) -> Result<(), OpError> {
    if let Some(t) = t {
        ensure!(
            t.rank() == 1 && t.numel() == c,
            "Expected {name} to be a vector of size equal to the number of channels in input, but got {name} of shape {:?} and input of shape {:?}",
            t.shape.as_slice(),
            x.shape.as_slice()
        );
    }
    Ok(())
}

/// Layer norm's normalized shape, checked against the input; returns the first normalized dim.
fn layer_axis(x: &TensorType, normalized: &[i64]) -> Result<usize, OpError> {
    ensure!(
        !normalized.is_empty(),
        "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, but got normalized_shape = []"
    );
    let fits =
        x.rank() >= normalized.len() && x.shape[x.rank() - normalized.len()..] == *normalized;
    if !fits {
        let dims: Vec<String> = normalized.iter().map(|d| d.to_string()).collect();
        return Err(OpError::runtime(format!(
            "Given normalized_shape={normalized:?}, expected input with shape [*, {}], but got input of size{:?}",
            dims.join(", "),
            x.shape.as_slice()
        )));
    }
    Ok(x.rank() - normalized.len())
}

fn layer_param(name: &str, t: Option<&TensorType>, normalized: &[i64]) -> Result<(), OpError> {
    if let Some(t) = t {
        ensure!(
            t.shape.as_slice() == normalized,
            "Expected {name} to be of same shape as normalized_shape, but got {name} of shape {:?} and normalized_shape = {normalized:?}",
            t.shape.as_slice()
        );
    }
    Ok(())
}

// ---- rules: each op's meta beside its lowering --------------------------------------------

/// `native_batch_norm`: the normalized input and the saved mean and inverse std (empty in
/// evaluation mode).
pub(crate) struct NativeBatchNorm;

impl OpRule for NativeBatchNorm {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let p = &a.params;
        let i = a.inputs;
        a.expect_counts(1..=5, 0..=0)?;
        let l = layout::BatchNorm::decode(p)?;
        let present = [
            l.has_weight,
            l.has_bias,
            l.has_running_mean,
            l.has_running_var,
        ];
        let opt = optional(a.op, &i.iter().collect::<Vec<_>>(), 1, &present)?;
        let (x, [w, b, rm, rv]) = (&i[0], [opt[0], opt[1], opt[2], opt[3]]);
        let training = l.training;
        let c = channels(x)?;
        if rm.is_some() != rv.is_some() {
            return Err(OpError::value(
                "running_mean and running_var must either both be None or neither be None",
            ));
        }
        check_numel("weight", w, c)?;
        check_numel("bias", b, c)?;
        check_numel("running_mean", rm, c)?;
        check_numel("running_var", rv, c)?;
        let pd = param_dtype(x.dtype, &[w, b, rm, rv])?;
        float_only("batch_norm", x.dtype)?;
        let saved: &[i64] = if training {
            ensure!(
                x.numel() > 0,
                "input tensor must have at least one element, but got input_sizes = {:?}",
                x.shape.as_slice()
            );
            &[c]
        } else {
            ensure!(
                rm.is_some(),
                "native_batch_norm: running_mean and running_var must be defined in evaluation mode"
            );
            &[0]
        };
        let stat = TensorType::new(pd, saved);
        Ok(three(x.clone(), stat.clone(), stat))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_batch_norm(e, a)
    }
}

/// `_batch_norm_running_stats`: the running mean and variance after a training step.
pub(crate) struct BatchNormRunningStats;

impl OpRule for BatchNormRunningStats {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let i = a.inputs;
        a.expect_counts(3..=3, 1..=1)?;
        let (x, rm, rv) = (&i[0], &i[1], &i[2]);
        let c = channels(x)?;
        check_numel("running_mean", Some(rm), c)?;
        check_numel("running_var", Some(rv), c)?;
        param_dtype(x.dtype, &[Some(rm), Some(rv)])?;
        float_only("batch_norm", x.dtype)?;
        Ok(Meta {
            outputs: MetaOutputs::from_vec(vec![rm.clone(), rv.clone()]),
            scalar_dtypes: smallvec::smallvec![rm.dtype.compute_dtype()],
            variant: 0,
            float_default: None,
            matmul_precision: None,
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_running_stats(e, a)
    }
}

/// `native_batch_norm_backward`: the gradients of the input, weight and bias.
pub(crate) struct NativeBatchNormBackward;

impl OpRule for NativeBatchNormBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let p = &a.params;
        let i = a.inputs;
        a.expect_counts(2..=7, 0..=0)?;
        let l = layout::BatchNormBackward::decode(p)?;
        let opt = optional(
            a.op,
            &i.iter().collect::<Vec<_>>(),
            2,
            &batch_norm_backward_presence(&l),
        )?;
        let (g, x) = (&i[0], &i[1]);
        let [w, rm, rv, sm, si] = [opt[0], opt[1], opt[2], opt[3], opt[4]];
        let train = l.train;
        same_shape(a.op, g, x)?;
        let c = channels(x)?;
        check_numel("weight", w, c)?;
        // The statistics a mode does not use may be empty (as eval-mode forward saves them).
        let (mean, var, which) = if train {
            (sm, si, "save_mean and save_invstd")
        } else {
            (rm, rv, "running_mean and running_var")
        };
        ensure!(
            mean.is_some() && var.is_some(),
            "native_batch_norm_backward: {which} must be defined when train={train}"
        );
        check_numel("mean", mean, c)?;
        check_numel("var", var, c)?;
        let pd = param_dtype(x.dtype, &[w, rm, rv, sm, si])?;
        float_only("batch_norm_backward_cpu", x.dtype)?;
        let gw = match w {
            Some(w) => w.with_dtype(pd),
            None => TensorType::new(pd, &[c]),
        };
        Ok(three(x.clone(), gw.clone(), gw))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_batch_norm_backward(e, a)
    }
}

/// `native_layer_norm`: the normalized input, its mean and its inverse std.
pub(crate) struct NativeLayerNorm;

impl OpRule for NativeLayerNorm {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let p = &a.params;
        let i = a.inputs;
        a.expect_counts(1..=3, 0..=0)?;
        let l = layout::LayerNorm::decode(p)?;
        let present = [l.has_weight, l.has_bias];
        let opt = optional(a.op, &i.iter().collect::<Vec<_>>(), 1, &present)?;
        let (x, w, b) = (&i[0], opt[0], opt[1]);
        let normalized = l.normalized_shape;
        ensure!(
            !normalized.is_empty(),
            "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, but got normalized_shape = []"
        );
        layer_param("weight", w, normalized)?;
        layer_param("bias", b, normalized)?;
        let axis = layer_axis(x, normalized)?;
        let pd = param_dtype(x.dtype, &[w, b])?;
        float_only("LayerNormKernelImpl", x.dtype)?;
        let mut stat_shape: Shape = x.shape[..axis].iter().copied().collect();
        stat_shape.extend(std::iter::repeat_n(1, normalized.len()));
        let stat = TensorType::new(pd, &stat_shape);
        Ok(three(x.clone(), stat.clone(), stat))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_layer_norm(e, a)
    }
}

/// `native_layer_norm_backward`: the gradients of the input, weight and bias.
pub(crate) struct NativeLayerNormBackward;

impl OpRule for NativeLayerNormBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let p = &a.params;
        let i = a.inputs;
        a.expect_counts(4..=6, 0..=0)?;
        let l = layout::LayerNormBackward::decode(p)?;
        let present = [l.has_weight, l.has_bias];
        let opt = optional(a.op, &i.iter().collect::<Vec<_>>(), 4, &present)?;
        let (g, x, mean, rstd) = (&i[0], &i[1], &i[2], &i[3]);
        let (w, b) = (opt[0], opt[1]);
        let normalized = l.normalized_shape;
        same_shape(a.op, g, x)?;
        let axis = layer_axis(x, normalized)?;
        layer_param("weight", w, normalized)?;
        layer_param("bias", b, normalized)?;
        let rows: i64 = x.shape[..axis].iter().product();
        for (name, t) in [("mean", mean), ("rstd", rstd)] {
            ensure!(
                t.numel() == rows,
                "native_layer_norm_backward: {name} should contain {rows} elements not {}",
                t.numel()
            );
        }
        float_only("LayerNormBackwardKernelImpl", x.dtype)?;
        let grad_of = |t: Option<&TensorType>| {
            t.cloned()
                .unwrap_or_else(|| TensorType::new(x.dtype, normalized))
        };
        Ok(three(x.clone(), grad_of(w), grad_of(b)))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_layer_norm_backward(e, a)
    }
}

/// `native_group_norm`: the normalized input, its mean and its inverse std per group.
pub(crate) struct NativeGroupNorm;

impl OpRule for NativeGroupNorm {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let p = &a.params;
        let i = a.inputs;
        a.expect_counts(1..=3, 0..=0)?;
        let l = layout::GroupNorm::decode(p)?;
        let present = [l.has_weight, l.has_bias];
        let opt = optional(a.op, &i.iter().collect::<Vec<_>>(), 1, &present)?;
        let (x, w, b) = (&i[0], opt[0], opt[1]);
        let [n, c, _, group] = group_dims([l.n, l.c, l.hxw, l.group], x)?;
        group_param("weight", w, c, x)?;
        group_param("bias", b, c, x)?;
        let pd = param_dtype(x.dtype, &[w, b])?;
        float_only("GroupNormKernelImpl", x.dtype)?;
        let stat = TensorType::new(pd, &[n, group]);
        Ok(three(x.clone(), stat.clone(), stat))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_group_norm(e, a)
    }
}

/// `native_group_norm_backward`: the gradients of the input, weight and bias.
pub(crate) struct NativeGroupNormBackward;

impl OpRule for NativeGroupNormBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let p = &a.params;
        let i = a.inputs;
        a.expect_counts(4..=5, 0..=0)?;
        let l = layout::GroupNormBackward::decode(p)?;
        let opt = optional(a.op, &i.iter().collect::<Vec<_>>(), 4, &[l.has_weight])?;
        let (g, x, mean, rstd, w) = (&i[0], &i[1], &i[2], &i[3], opt[0]);
        let [n, c, _, group] = group_dims([l.n, l.c, l.hxw, l.group], x)?;
        same_shape(a.op, g, x)?;
        group_param("weight", w, c, x)?;
        // With no channels (C = 0) any positive group count divides C, and N * group may
        // overflow.
        let Some(stats) = n.checked_mul(group) else {
            return Err(OpError::runtime(format!(
                "native_group_norm_backward: mean and rstd should contain N * group = {n} * {group} elements, more than int64 holds; expected a group count that divides the {c} channels"
            )));
        };
        for (name, t) in [("mean", mean), ("rstd", rstd)] {
            ensure!(
                t.numel() == stats,
                "native_group_norm_backward: {name} should contain {stats} elements not {}",
                t.numel()
            );
        }
        float_only("GroupNormBackwardKernelImpl", x.dtype)?;
        let gw = w.cloned().unwrap_or_else(|| TensorType::new(x.dtype, &[c]));
        Ok(three(x.clone(), gw.clone(), gw))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_group_norm_backward(e, a)
    }
}

// ---- lowering helpers -----------------------------------------------------------------------

/// `v` broadcast to `shape`, its dims landing on `dims`.
pub(crate) fn bcast(e: &mut Emitter, v: Value, shape: &[i64], dims: &[usize]) -> Value {
    e.broadcast_in_dim(v, shape, dims)
}

/// A per-channel vector (any shape of `c` elements) in `dtype`, broadcast along `dim` of `shape`.
fn per_channel(e: &mut Emitter, v: Value, dtype: DType, shape: &[i64], dim: usize) -> Value {
    let v = e.convert(v, dtype);
    let c = shape[dim];
    let v = e.reshape(v, &[c]);
    bcast(e, v, shape, &[dim])
}

/// A keepdim statistic (1s on `dims`) broadcast back to `shape`.
fn expand_kept(e: &mut Emitter, v: Value, shape: &[i64]) -> Value {
    let all: Vec<usize> = (0..shape.len()).collect();
    bcast(e, v, shape, &all)
}

/// Mean over `dims` (kept as size 1) and `x` minus it; `count` is the number of reduced elements.
fn centered(e: &mut Emitter, x: Value, dims: &[usize], count: i64) -> (Value, Value) {
    let shape = e.shape(x).to_vec();
    let sum = sum_keepdim(e, x, dims);
    let n = k(e, sum, count as f64);
    let mean = e.div(sum, n);
    let mean_b = expand_kept(e, mean, &shape);
    (mean, e.sub(x, mean_b))
}

/// `1 / sqrt(var + eps)`.
fn rstd_of(e: &mut Emitter, var: Value, eps: f64) -> Value {
    let eps = k(e, var, eps);
    let s = e.add(var, eps);
    let s = e.sqrt(s);
    let one = k(e, s, 1.0);
    e.div(one, s)
}

/// Biased mean and `rstd` over `dims` (both keepdim) and the centered input.
fn moments(e: &mut Emitter, x: Value, dims: &[usize], eps: f64) -> (Value, Value, Value) {
    let count: i64 = dims.iter().map(|&d| e.shape(x)[d]).product();
    let (mean, xm) = centered(e, x, dims, count);
    let sq = e.mul(xm, xm);
    let ss = sum_keepdim(e, sq, dims);
    let n = k(e, ss, count as f64);
    let var = e.div(ss, n);
    (mean, rstd_of(e, var, eps), xm)
}

/// Zeros of `ty`, for an output switched off in a backward op's mask.
pub(crate) fn zeros(e: &mut Emitter, ty: &TensorType) -> Value {
    e.constant(ty.clone(), crate::ScalarValue::Int(0))
}

/// The input-gradient core shared by layer and group norm: with `xhat` normalized over `dims`
/// and `gw` the gradient times the weight, `rstd * (gw - mean(gw) - xhat * mean(gw * xhat))`.
fn norm_input_grad(
    e: &mut Emitter,
    gw: Value,
    xhat: Value,
    rstd_b: Value,
    dims: &[usize],
) -> Value {
    let shape = e.shape(gw).to_vec();
    let count: i64 = dims.iter().map(|&d| shape[d]).product();
    let inv_n = 1.0 / count.max(1) as f64;
    let s1 = sum_keepdim(e, gw, dims);
    let gx = e.mul(gw, xhat);
    let s2 = sum_keepdim(e, gx, dims);
    let c = k(e, s1, inv_n);
    let m1 = e.mul(s1, c);
    let m2 = e.mul(s2, c);
    let m1 = expand_kept(e, m1, &shape);
    let m2 = expand_kept(e, m2, &shape);
    let t = e.mul(xhat, m2);
    let d = e.sub(gw, m1);
    let d = e.sub(d, t);
    e.mul(rstd_b, d)
}

// ---- lowering -------------------------------------------------------------------------------

/// The reduction dims of batch norm: every dim but the channels (dim 1).
fn batch_dims(rank: usize) -> Vec<usize> {
    (0..rank).filter(|&d| d != 1).collect()
}

fn lower_batch_norm(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let l = layout::BatchNorm::decode(&a.params)?;
    let present = [
        l.has_weight,
        l.has_bias,
        l.has_running_mean,
        l.has_running_var,
    ];
    let opt = optional(a.op, a.inputs, 1, &present)?;
    let (w, b, rm, rv) = (opt[0], opt[1], opt[2], opt[3]);
    let (training, eps) = (l.training, l.eps);
    let (out, stat) = (a.out(0).clone(), a.out(1).clone());
    let cd = out.dtype.compute_dtype();
    let x = e.convert(a.inputs[0], cd);
    let shape = e.shape(x).to_vec();
    let dims = batch_dims(shape.len());
    let (xm, scale, saved) = if training {
        let (mean, rstd, xm) = moments(e, x, &dims, eps);
        let c = shape[1];
        let m = e.reshape(mean, &[c]);
        let r = e.reshape(rstd, &[c]);
        let saved = [e.convert(m, stat.dtype), e.convert(r, stat.dtype)];
        (xm, expand_kept(e, rstd, &shape), saved)
    } else {
        let (rm, rv) = (rm.expect("meta checked"), rv.expect("meta checked"));
        let mean = per_channel(e, rm, cd, &shape, 1);
        let var = per_channel(e, rv, cd, &shape, 1);
        let xm = e.sub(x, mean);
        let empty = [zeros(e, &stat), zeros(e, &stat)];
        (xm, rstd_of(e, var, eps), empty)
    };
    let mut y = e.mul(xm, scale);
    if let Some(w) = w {
        let w = per_channel(e, w, cd, &shape, 1);
        y = e.mul(y, w);
    }
    if let Some(b) = b {
        let b = per_channel(e, b, cd, &shape, 1);
        y = e.add(y, b);
    }
    Ok(vec![e.convert(y, out.dtype), saved[0], saved[1]])
}

fn lower_running_stats(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let (rm_ty, rv_ty) = (a.out(0).clone(), a.out(1).clone());
    // Meta allows f32 statistics beside a bf16/f16 input only: one computation dtype fits both.
    let cd = rm_ty.dtype.compute_dtype();
    let x = e.convert(a.inputs[0], cd);
    let shape = e.shape(x).to_vec();
    let dims = batch_dims(shape.len());
    let c = shape[1];
    let n: i64 = dims.iter().map(|&d| shape[d]).product();
    let (mean, xm) = centered(e, x, &dims, n);
    let sq = e.mul(xm, xm);
    let var_sum = e.reduce_sum(sq, &dims);
    let mean = e.reshape(mean, &[c]);
    let denom = k(e, var_sum, (n - 1) as f64);
    let unbiased = e.div(var_sum, denom);
    let momentum = e.convert(a.scalars[0], cd);
    let momentum = e.broadcast_in_dim(momentum, &[c], &[]);
    let one = k(e, momentum, 1.0);
    let keep = e.sub(one, momentum);
    let blend = |e: &mut Emitter, old: Value, new: Value, ty: &TensorType| {
        let old = e.convert(old, cd);
        let old = e.reshape(old, &[c]);
        let fresh = e.mul(momentum, new);
        let kept = e.mul(keep, old);
        let r = e.add(fresh, kept);
        let r = e.reshape(r, &ty.shape);
        e.convert(r, ty.dtype)
    };
    let new_mean = blend(e, a.inputs[1], mean, &rm_ty);
    let new_var = blend(e, a.inputs[2], unbiased, &rv_ty);
    Ok(vec![new_mean, new_var])
}

fn lower_batch_norm_backward(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let l = layout::BatchNormBackward::decode(&a.params)?;
    let opt = optional(a.op, a.inputs, 2, &batch_norm_backward_presence(&l))?;
    let (w, rm, rv, sm, si) = (opt[0], opt[1], opt[2], opt[3], opt[4]);
    let (train, eps, m) = (l.train, l.eps, l.output_mask);
    let (gi_ty, gw_ty) = (a.out(0).clone(), a.out(1).clone());
    let cd = gi_ty.dtype.compute_dtype();
    let g = e.convert(a.inputs[0], cd);
    let x = e.convert(a.inputs[1], cd);
    let shape = e.shape(x).to_vec();
    let dims = batch_dims(shape.len());
    let c = shape[1];
    let n: i64 = dims.iter().map(|&d| shape[d]).product();
    let (mean, invstd) = if train {
        let mean = e.convert(sm.expect("meta checked"), cd);
        let invstd = e.convert(si.expect("meta checked"), cd);
        (e.reshape(mean, &[c]), e.reshape(invstd, &[c]))
    } else {
        let mean = e.convert(rm.expect("meta checked"), cd);
        let var = e.convert(rv.expect("meta checked"), cd);
        let var = e.reshape(var, &[c]);
        (e.reshape(mean, &[c]), rstd_of(e, var, eps))
    };
    let mean_b = bcast(e, mean, &shape, &[1]);
    let xm = e.sub(x, mean_b);
    let sum_dy = e.reduce_sum(g, &dims);
    let gxm = e.mul(g, xm);
    let dot = e.reduce_sum(gxm, &dims);
    let grad_input = if m[0] {
        let scale = match w {
            Some(w) => {
                let w = e.convert(w, cd);
                let w = e.reshape(w, &[c]);
                e.mul(invstd, w)
            }
            None => invstd,
        };
        let scale_b = bcast(e, scale, &shape, &[1]);
        let gi = if train {
            // dx = (dy - mean(dy) - (x - mean) * dot * invstd^2 / n) * invstd * w
            let inv_n = k(e, dot, 1.0 / n as f64);
            let proj = e.mul(dot, invstd);
            let proj = e.mul(proj, invstd);
            let proj = e.mul(proj, inv_n);
            let grad_mean = e.mul(sum_dy, inv_n);
            let proj_b = bcast(e, proj, &shape, &[1]);
            let grad_mean_b = bcast(e, grad_mean, &shape, &[1]);
            let t = e.mul(xm, proj_b);
            let d = e.sub(g, grad_mean_b);
            let d = e.sub(d, t);
            e.mul(d, scale_b)
        } else {
            e.mul(g, scale_b)
        };
        e.convert(gi, gi_ty.dtype)
    } else {
        zeros(e, &gi_ty)
    };
    let grad_weight = if m[1] {
        let gw = e.mul(dot, invstd);
        let gw = e.reshape(gw, &gw_ty.shape);
        e.convert(gw, gw_ty.dtype)
    } else {
        zeros(e, &gw_ty)
    };
    let grad_bias = if m[2] {
        let gb = e.reshape(sum_dy, &gw_ty.shape);
        e.convert(gb, gw_ty.dtype)
    } else {
        zeros(e, &gw_ty)
    };
    Ok(vec![grad_input, grad_weight, grad_bias])
}

/// A parameter of layer norm's normalized shape, broadcast over the trailing dims of `shape`.
fn trailing(e: &mut Emitter, v: Value, dtype: DType, shape: &[i64]) -> Value {
    let v = e.convert(v, dtype);
    e.broadcast_to(v, shape)
}

fn lower_layer_norm(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let l = layout::LayerNorm::decode(&a.params)?;
    let opt = optional(a.op, a.inputs, 1, &[l.has_weight, l.has_bias])?;
    let (eps, normalized) = (l.eps, l.normalized_shape);
    let (out, stat) = (a.out(0).clone(), a.out(1).clone());
    let cd = out.dtype.compute_dtype();
    let x = e.convert(a.inputs[0], cd);
    let shape = e.shape(x).to_vec();
    let axis = shape.len() - normalized.len();
    let dims: Vec<usize> = (axis..shape.len()).collect();
    let (mean, rstd, xm) = moments(e, x, &dims, eps);
    let rstd_b = expand_kept(e, rstd, &shape);
    let mut y = e.mul(xm, rstd_b);
    if let Some(w) = opt[0] {
        let w = trailing(e, w, cd, &shape);
        y = e.mul(y, w);
    }
    if let Some(b) = opt[1] {
        let b = trailing(e, b, cd, &shape);
        y = e.add(y, b);
    }
    Ok(vec![
        e.convert(y, out.dtype),
        e.convert(mean, stat.dtype),
        e.convert(rstd, stat.dtype),
    ])
}

fn lower_layer_norm_backward(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let l = layout::LayerNormBackward::decode(&a.params)?;
    let opt = optional(a.op, a.inputs, 4, &[l.has_weight, l.has_bias])?;
    let (m, normalized) = (l.output_mask, l.normalized_shape);
    let (gi_ty, gw_ty, gb_ty) = (a.out(0).clone(), a.out(1).clone(), a.out(2).clone());
    let cd = gi_ty.dtype.compute_dtype();
    let g = e.convert(a.inputs[0], cd);
    let x = e.convert(a.inputs[1], cd);
    let shape = e.shape(x).to_vec();
    let axis = shape.len() - normalized.len();
    let mut kept: Shape = shape[..axis].iter().copied().collect();
    kept.extend(std::iter::repeat_n(1, normalized.len()));
    let stat = |e: &mut Emitter, v: Value| {
        let v = e.convert(v, cd);
        let v = e.reshape(v, &kept);
        expand_kept(e, v, &shape)
    };
    let mean_b = stat(e, a.inputs[2]);
    let rstd_b = stat(e, a.inputs[3]);
    let xm = e.sub(x, mean_b);
    let xhat = e.mul(xm, rstd_b);
    let rows: Vec<usize> = (0..axis).collect();
    let grad_input = if m[0] {
        let gw = match opt[0] {
            Some(w) => {
                let w = trailing(e, w, cd, &shape);
                e.mul(g, w)
            }
            None => g,
        };
        let dims: Vec<usize> = (axis..shape.len()).collect();
        let gi = norm_input_grad(e, gw, xhat, rstd_b, &dims);
        e.convert(gi, gi_ty.dtype)
    } else {
        zeros(e, &gi_ty)
    };
    let grad_weight = if m[1] {
        let gx = e.mul(g, xhat);
        let s = e.reduce_sum(gx, &rows);
        e.convert(s, gw_ty.dtype)
    } else {
        zeros(e, &gw_ty)
    };
    let grad_bias = if m[2] {
        let s = e.reduce_sum(g, &rows);
        e.convert(s, gb_ty.dtype)
    } else {
        zeros(e, &gb_ty)
    };
    Ok(vec![grad_input, grad_weight, grad_bias])
}

fn lower_group_norm(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let l = layout::GroupNorm::decode(&a.params)?;
    let opt = optional(a.op, a.inputs, 1, &[l.has_weight, l.has_bias])?;
    let [n, c, hxw, group] = [l.n, l.c, l.hxw, l.group];
    let eps = l.eps;
    let (out, stat) = (a.out(0).clone(), a.out(1).clone());
    let cd = out.dtype.compute_dtype();
    let x = e.convert(a.inputs[0], cd);
    let grouped = e.reshape(x, &[n, group, (c / group) * hxw]);
    let (mean, rstd, xm) = moments(e, grouped, &[2], eps);
    let rstd_b = expand_kept(e, rstd, &[n, group, (c / group) * hxw]);
    let xhat = e.mul(xm, rstd_b);
    let shape = [n, c, hxw];
    let mut y = e.reshape(xhat, &shape);
    if let Some(w) = opt[0] {
        let w = per_channel(e, w, cd, &shape, 1);
        y = e.mul(y, w);
    }
    if let Some(b) = opt[1] {
        let b = per_channel(e, b, cd, &shape, 1);
        y = e.add(y, b);
    }
    let y = e.reshape(y, &out.shape);
    let mean = e.reshape(mean, &[n, group]);
    let rstd = e.reshape(rstd, &[n, group]);
    Ok(vec![
        e.convert(y, out.dtype),
        e.convert(mean, stat.dtype),
        e.convert(rstd, stat.dtype),
    ])
}

fn lower_group_norm_backward(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let l = layout::GroupNormBackward::decode(&a.params)?;
    let opt = optional(a.op, a.inputs, 4, &[l.has_weight])?;
    let [n, c, hxw, group] = [l.n, l.c, l.hxw, l.group];
    let m = l.output_mask;
    let (gi_ty, gw_ty) = (a.out(0).clone(), a.out(1).clone());
    let cd = gi_ty.dtype.compute_dtype();
    let d = c / group;
    let shape = [n, group, d, hxw];
    let g = e.convert(a.inputs[0], cd);
    let g = e.reshape(g, &shape);
    let x = e.convert(a.inputs[1], cd);
    let x = e.reshape(x, &shape);
    let stat = |e: &mut Emitter, v: Value| {
        let v = e.convert(v, cd);
        let v = e.reshape(v, &[n, group]);
        bcast(e, v, &shape, &[0, 1])
    };
    let mean_b = stat(e, a.inputs[2]);
    let rstd_b = stat(e, a.inputs[3]);
    let xm = e.sub(x, mean_b);
    let xhat = e.mul(xm, rstd_b);
    let grad_input = if m[0] {
        let gw = match opt[0] {
            Some(w) => {
                let w = e.convert(w, cd);
                let w = e.reshape(w, &[group, d]);
                let w = bcast(e, w, &shape, &[1, 2]);
                e.mul(g, w)
            }
            None => g,
        };
        let gi = norm_input_grad(e, gw, xhat, rstd_b, &[2, 3]);
        let gi = e.reshape(gi, &gi_ty.shape);
        e.convert(gi, gi_ty.dtype)
    } else {
        zeros(e, &gi_ty)
    };
    let per_channel_sum = |e: &mut Emitter, v: Value| {
        let s = e.reduce_sum(v, &[0, 3]);
        let s = e.reshape(s, &gw_ty.shape);
        e.convert(s, gw_ty.dtype)
    };
    let grad_weight = if m[1] {
        let gx = e.mul(g, xhat);
        per_channel_sum(e, gx)
    } else {
        zeros(e, &gw_ty)
    };
    let grad_bias = if m[2] {
        per_channel_sum(e, g)
    } else {
        zeros(e, &gw_ty)
    };
    Ok(vec![grad_input, grad_weight, grad_bias])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{dtype_param, f64_param};
    use crate::{lower_single, meta, ErrorKind, ScalarArg};

    fn t(dtype: DType, shape: &[i64]) -> TensorType {
        TensorType::new(dtype, shape)
    }

    fn f32s(shape: &[i64]) -> TensorType {
        t(DType::F32, shape)
    }

    fn types(m: &Meta) -> Vec<(DType, Vec<i64>)> {
        m.outputs
            .iter()
            .map(|o| (o.dtype, o.shape.to_vec()))
            .collect()
    }

    fn err(op: OpId, inputs: &[TensorType], scalars: &[ScalarArg], params: &[i64]) -> String {
        meta(op, inputs, scalars, params).unwrap_err().message
    }

    fn eps() -> i64 {
        f64_param(1e-5)
    }

    #[test]
    fn batch_norm_shapes_and_dtypes() {
        let x = f32s(&[4, 3, 5]);
        let c = f32s(&[3]);
        let inputs = [x.clone(), c.clone(), c.clone(), c.clone(), c.clone()];
        let m = meta(OpId::NativeBatchNorm, &inputs, &[], &[1, 1, 1, 1, 1, eps()]).unwrap();
        assert_eq!(
            types(&m),
            [
                (DType::F32, vec![4, 3, 5]),
                (DType::F32, vec![3]),
                (DType::F32, vec![3])
            ]
        );
        // Evaluation saves empty statistics, as PyTorch's CPU kernel does.
        let m = meta(OpId::NativeBatchNorm, &inputs, &[], &[1, 1, 1, 1, 0, eps()]).unwrap();
        assert_eq!(types(&m)[1], (DType::F32, vec![0]));
        // bf16 input with f32 parameters keeps f32 statistics; without parameters, bf16.
        let xb = t(DType::BF16, &[4, 3]);
        let m = meta(
            OpId::NativeBatchNorm,
            &[xb.clone(), c.clone()],
            &[],
            &[1, 0, 0, 0, 1, eps()],
        )
        .unwrap();
        assert_eq!(types(&m)[0].0, DType::BF16);
        assert_eq!(types(&m)[1].0, DType::F32);
        let m = meta(OpId::NativeBatchNorm, &[xb], &[], &[0, 0, 0, 0, 1, eps()]).unwrap();
        assert_eq!(types(&m)[1].0, DType::BF16);
    }

    #[test]
    fn batch_norm_errors_read_like_pytorch() {
        let x = f32s(&[4, 3, 5]);
        let p = |w, rm, rv, training| vec![w, 0, rm, rv, training, eps()];
        assert_eq!(
            err(
                OpId::NativeBatchNorm,
                &[x.clone(), f32s(&[4])],
                &[],
                &p(1, 0, 0, 1)
            ),
            "weight should contain 3 elements not 4"
        );
        let e = meta(
            OpId::NativeBatchNorm,
            &[x.clone(), f32s(&[3])],
            &[],
            &p(0, 1, 0, 1),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Value);
        assert_eq!(
            err(OpId::NativeBatchNorm, &[f32s(&[3])], &[], &p(0, 0, 0, 1)),
            "Dimension out of range (expected to be in range of [-1, 0], but got 1)"
        );
        assert_eq!(
            err(OpId::NativeBatchNorm, &[f32s(&[0, 3])], &[], &p(0, 0, 0, 1)),
            "input tensor must have at least one element, but got input_sizes = [0, 3]"
        );
        let e = meta(
            OpId::NativeBatchNorm,
            &[t(DType::I64, &[4, 3])],
            &[],
            &p(0, 0, 0, 1),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotImplemented);
        assert_eq!(e.message, "\"batch_norm\" not implemented for 'Long'");
        assert_eq!(
            err(
                OpId::NativeBatchNorm,
                &[x.clone(), t(DType::F64, &[3])],
                &[],
                &p(1, 0, 0, 1)
            ),
            "mixed dtype (CPU): expect parameter to have scalar type of Float"
        );
        assert_eq!(
            err(
                OpId::NativeBatchNorm,
                &[t(DType::F64, &[4, 3]), f32s(&[3])],
                &[],
                &p(1, 0, 0, 1)
            ),
            "mixed dtype (CPU): all inputs must share same datatype."
        );
        assert!(err(
            OpId::NativeBatchNorm,
            std::slice::from_ref(&x),
            &[],
            &p(0, 0, 0, 0)
        )
        .contains("evaluation mode"));
        // The presence flags must agree with the inputs.
        assert!(err(OpId::NativeBatchNorm, &[x], &[], &p(1, 0, 0, 1)).contains("presence flags"));
    }

    #[test]
    fn running_stats_and_batch_norm_backward() {
        let x = f32s(&[4, 3, 5]);
        let c = f32s(&[3]);
        let m = meta(
            OpId::BatchNormRunningStats,
            &[x.clone(), c.clone(), c.clone()],
            &[ScalarArg::float(0.1)],
            &[],
        )
        .unwrap();
        assert_eq!(m.outputs.len(), 2);
        assert_eq!(m.scalar_dtypes.as_slice(), [DType::F32]);
        // Eval-mode backward reads the running statistics; the saved ones are empty.
        let empty = f32s(&[0]);
        let inputs = [
            x.clone(),
            x.clone(),
            c.clone(),
            c.clone(),
            c.clone(),
            empty.clone(),
            empty,
        ];
        let m = meta(
            OpId::NativeBatchNormBackward,
            &inputs,
            &[],
            &[1, 1, 1, 1, 1, 0, eps(), 7],
        )
        .unwrap();
        assert_eq!(
            types(&m),
            [
                (DType::F32, vec![4, 3, 5]),
                (DType::F32, vec![3]),
                (DType::F32, vec![3])
            ]
        );
        // Training needs the saved statistics.
        let e = err(
            OpId::NativeBatchNormBackward,
            &[x.clone(), x.clone()],
            &[],
            &[0, 0, 0, 0, 0, 1, eps(), 1],
        );
        assert!(e.contains("save_mean and save_invstd"), "{e}");
        // The weight gradient has the weight's shape.
        let w = f32s(&[3, 1]);
        let m = meta(
            OpId::NativeBatchNormBackward,
            &[x.clone(), x, w, c.clone(), c],
            &[],
            &[1, 0, 0, 1, 1, 1, eps(), 7],
        )
        .unwrap();
        assert_eq!(types(&m)[1].1, vec![3, 1]);
    }

    #[test]
    fn layer_norm_meta() {
        let x = f32s(&[4, 3, 5]);
        let m = meta(
            OpId::NativeLayerNorm,
            &[x.clone(), f32s(&[3, 5]), f32s(&[3, 5])],
            &[],
            &[1, 1, eps(), 3, 5],
        )
        .unwrap();
        assert_eq!(
            types(&m),
            [
                (DType::F32, vec![4, 3, 5]),
                (DType::F32, vec![4, 1, 1]),
                (DType::F32, vec![4, 1, 1])
            ]
        );
        let xb = t(DType::BF16, &[2, 5]);
        let m = meta(
            OpId::NativeLayerNorm,
            &[xb.clone(), f32s(&[5])],
            &[],
            &[0, 1, eps(), 5],
        )
        .unwrap();
        assert_eq!(types(&m)[1], (DType::F32, vec![2, 1]));
        let m = meta(OpId::NativeLayerNorm, &[xb], &[], &[0, 0, eps(), 5]).unwrap();
        assert_eq!(types(&m)[2].0, DType::BF16);
        assert_eq!(
            err(OpId::NativeLayerNorm, std::slice::from_ref(&x), &[], &[0, 0, eps(), 6]),
            "Given normalized_shape=[6], expected input with shape [*, 6], but got input of size[4, 3, 5]"
        );
        assert_eq!(
            err(OpId::NativeLayerNorm, std::slice::from_ref(&x), &[], &[0, 0, eps(), 2, 4, 3, 5]),
            "Given normalized_shape=[2, 4, 3, 5], expected input with shape [*, 2, 4, 3, 5], but got input of size[4, 3, 5]"
        );
        assert_eq!(
            err(OpId::NativeLayerNorm, &[x.clone(), f32s(&[4])], &[], &[1, 0, eps(), 5]),
            "Expected weight to be of same shape as normalized_shape, but got weight of shape [4] and normalized_shape = [5]"
        );
        assert_eq!(
            err(OpId::NativeLayerNorm, &[x.clone(), f32s(&[4])], &[], &[0, 1, eps(), 5]),
            "Expected bias to be of same shape as normalized_shape, but got bias of shape [4] and normalized_shape = [5]"
        );
        assert!(err(OpId::NativeLayerNorm, &[x], &[], &[0, 0, eps()])
            .starts_with("Expected normalized_shape to be at least 1-dimensional"));
        assert_eq!(
            err(
                OpId::NativeLayerNorm,
                &[t(DType::I64, &[4, 5])],
                &[],
                &[0, 0, eps(), 5]
            ),
            "\"LayerNormKernelImpl\" not implemented for 'Long'"
        );
    }

    #[test]
    fn layer_norm_backward_meta() {
        let x = t(DType::BF16, &[4, 5]);
        let stat = f32s(&[4, 1]);
        let w = f32s(&[5]);
        let m = meta(
            OpId::NativeLayerNormBackward,
            &[
                x.clone(),
                x.clone(),
                stat.clone(),
                stat.clone(),
                w.clone(),
                w,
            ],
            &[],
            &[1, 1, 7, 5],
        )
        .unwrap();
        assert_eq!(
            types(&m),
            [
                (DType::BF16, vec![4, 5]),
                (DType::F32, vec![5]),
                (DType::F32, vec![5])
            ]
        );
        let e = err(
            OpId::NativeLayerNormBackward,
            &[x.clone(), x, f32s(&[3, 1]), stat],
            &[],
            &[0, 0, 1, 5],
        );
        assert!(e.contains("mean should contain 4 elements not 3"), "{e}");
    }

    #[test]
    fn group_norm_meta() {
        let x = f32s(&[4, 6, 5]);
        let c = f32s(&[6]);
        let m = meta(
            OpId::NativeGroupNorm,
            &[x.clone(), c.clone(), c.clone()],
            &[],
            &[1, 1, 4, 6, 5, 3, eps()],
        )
        .unwrap();
        assert_eq!(
            types(&m),
            [
                (DType::F32, vec![4, 6, 5]),
                (DType::F32, vec![4, 3]),
                (DType::F32, vec![4, 3])
            ]
        );
        let xb = t(DType::BF16, &[4, 6, 5]);
        let m = meta(
            OpId::NativeGroupNorm,
            &[xb, c],
            &[],
            &[1, 0, 4, 6, 5, 3, eps()],
        )
        .unwrap();
        assert_eq!(types(&m)[1].0, DType::F32);
        assert_eq!(
            err(OpId::NativeGroupNorm, std::slice::from_ref(&x), &[], &[0, 0, 4, 6, 5, 4, eps()]),
            "Expected number of channels in input to be divisible by num_groups, but got input of shape [4, 6, 5] and num_groups=4"
        );
        assert_eq!(
            err(
                OpId::NativeGroupNorm,
                std::slice::from_ref(&x),
                &[],
                &[0, 0, 4, 6, 5, 0, eps()]
            ),
            "Expected num groups to be greater than 0, got 0"
        );
        assert!(err(
            OpId::NativeGroupNorm,
            std::slice::from_ref(&x),
            &[],
            &[0, 0, 5, 6, 5, 3, eps()]
        )
        .starts_with("Expected X.numel() == N * C * HxW to be true"));
        assert_eq!(
            err(OpId::NativeGroupNorm, &[x.clone(), f32s(&[4])], &[], &[1, 0, 4, 6, 5, 3, eps()]),
            "Expected weight to be a vector of size equal to the number of channels in input, but got weight of shape [4] and input of shape [4, 6, 5]"
        );
        let m = meta(
            OpId::NativeGroupNormBackward,
            &[
                x.clone(),
                x.clone(),
                f32s(&[4, 3]),
                f32s(&[4, 3]),
                f32s(&[6]),
            ],
            &[],
            &[1, 4, 6, 5, 3, 7],
        )
        .unwrap();
        assert_eq!(types(&m)[1], (DType::F32, vec![6]));
        assert_eq!(
            err(
                OpId::NativeGroupNorm,
                &[t(DType::I32, &[4, 6])],
                &[],
                &[0, 0, 4, 6, 1, 3, eps()]
            ),
            "\"GroupNormKernelImpl\" not implemented for 'Int'"
        );
    }

    #[test]
    fn embedding_backward_cumsum_and_masked_fill_meta() {
        let g = f32s(&[2, 3, 4]);
        let idx = t(DType::I64, &[2, 3]);
        let m = meta(
            OpId::EmbeddingDenseBackward,
            &[g.clone(), idx.clone()],
            &[],
            &[10, -1, 1],
        )
        .unwrap();
        assert_eq!(types(&m), [(DType::F32, vec![10, 4])]);
        assert_eq!(
            err(OpId::EmbeddingDenseBackward, &[g.clone(), idx.with_dtype(DType::F32)], &[], &[10, -1, 0]),
            "Expected tensor for argument #2 'indices' to have one of the following scalar types: Long, Int; but got torch.FloatTensor instead (while checking arguments for embedding_backward)"
        );
        assert_eq!(
            err(
                OpId::EmbeddingDenseBackward,
                &[g.clone(), t(DType::I64, &[3])],
                &[],
                &[10, -1, 0]
            ),
            "shape '[3, 4]' is invalid for input of size 24"
        );

        let none = dtype_param(None);
        let cs = |x: TensorType, dim: i64, dtype: i64| {
            types(&meta(OpId::Cumsum, &[x], &[], &[dim, dtype]).unwrap())[0].clone()
        };
        assert_eq!(cs(t(DType::Bool, &[3]), 0, none), (DType::I64, vec![3]));
        assert_eq!(cs(t(DType::I32, &[3]), 0, none), (DType::I64, vec![3]));
        assert_eq!(
            cs(t(DType::BF16, &[3, 2]), -1, none),
            (DType::BF16, vec![3, 2])
        );
        assert_eq!(
            cs(f32s(&[3]), 0, dtype_param(Some(DType::F64))),
            (DType::F64, vec![3])
        );
        assert_eq!(cs(f32s(&[]), -1, none), (DType::F32, vec![]));
        assert_eq!(
            err(OpId::Cumsum, &[f32s(&[3, 4])], &[], &[2, none]),
            "Dimension out of range (expected to be in range of [-2, 1], but got 2)"
        );

        let x = f32s(&[3, 4]);
        let mask = t(DType::Bool, &[3, 4]);
        let m = meta(
            OpId::MaskedFill,
            &[f32s(&[4]), mask.clone()],
            &[ScalarArg::float(1.0)],
            &[],
        )
        .unwrap();
        assert_eq!(types(&m), [(DType::F32, vec![3, 4])]);
        assert_eq!(m.scalar_dtypes.as_slice(), [DType::F32]);
        assert_eq!(
            err(
                OpId::MaskedFill,
                &[x.clone(), mask.with_dtype(DType::U8)],
                &[ScalarArg::int(1)],
                &[]
            ),
            "masked_fill_ only supports boolean masks, but got mask with dtype unsigned char"
        );
        assert_eq!(
            err(OpId::MaskedFill, &[x.clone(), mask.clone(), f32s(&[1])], &[], &[]),
            "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with 1 dimension(s)."
        );
        assert_eq!(
            err(
                OpId::MaskedFill,
                &[t(DType::U8, &[3]), t(DType::Bool, &[3])],
                &[ScalarArg::int(300)],
                &[]
            ),
            "value cannot be converted to type uint8_t without overflow"
        );
        assert_eq!(
            err(OpId::MaskedFill, &[x, t(DType::Bool, &[5])], &[ScalarArg::int(1)], &[]),
            "The size of tensor a (5) must match the size of tensor b (4) at non-singleton dimension 1"
        );
    }

    /// Every op lowers to a module whose results have the types meta promised, including
    /// masked-off backward outputs, f16 inputs and empty shapes.
    #[test]
    fn lowerings_match_meta() {
        let x = f32s(&[4, 3, 5]);
        let xh = t(DType::F16, &[4, 3, 5]);
        let c = f32s(&[3]);
        type Case = (OpId, Vec<TensorType>, Vec<ScalarArg>, Vec<i64>);
        let cases: Vec<Case> = vec![
            (
                OpId::NativeBatchNorm,
                vec![x.clone(), c.clone(), c.clone()],
                vec![],
                vec![1, 1, 0, 0, 1, eps()],
            ),
            (
                OpId::NativeBatchNorm,
                vec![xh.clone(), c.clone(), c.clone()],
                vec![],
                vec![0, 0, 1, 1, 0, eps()],
            ),
            (
                OpId::BatchNormRunningStats,
                vec![xh.clone(), c.clone(), c.clone()],
                vec![ScalarArg::float(0.1)],
                vec![],
            ),
            (
                OpId::NativeBatchNormBackward,
                vec![x.clone(), x.clone(), c.clone(), c.clone(), c.clone()],
                vec![],
                vec![1, 0, 0, 1, 1, 1, eps(), 5],
            ),
            (
                OpId::NativeLayerNorm,
                vec![xh.clone(), f32s(&[5])],
                vec![],
                vec![1, 0, eps(), 5],
            ),
            (
                OpId::NativeLayerNormBackward,
                vec![x.clone(), x.clone(), f32s(&[4, 3, 1]), f32s(&[4, 3, 1])],
                vec![],
                vec![0, 0, 3, 5],
            ),
            (
                OpId::NativeGroupNorm,
                vec![x.clone(), c.clone()],
                vec![],
                vec![1, 0, 4, 3, 5, 3, eps()],
            ),
            (
                OpId::NativeGroupNormBackward,
                vec![x.clone(), x.clone(), f32s(&[4, 1]), f32s(&[4, 1])],
                vec![],
                vec![0, 4, 3, 5, 1, 7],
            ),
            (
                OpId::EmbeddingDenseBackward,
                vec![t(DType::BF16, &[2, 3, 4]), t(DType::I32, &[2, 3])],
                vec![],
                vec![7, 0, 1],
            ),
            (
                OpId::EmbeddingDenseBackward,
                vec![t(DType::I64, &[0, 4]), t(DType::I64, &[0])],
                vec![],
                vec![7, -1, 1],
            ),
            (
                OpId::Cumsum,
                vec![t(DType::Bool, &[3, 4])],
                vec![],
                vec![1, -1],
            ),
            (
                OpId::Cumsum,
                vec![t(DType::F32, &[0, 4])],
                vec![],
                vec![1, -1],
            ),
            (
                OpId::MaskedFill,
                vec![f32s(&[4]), t(DType::Bool, &[3, 4]), t(DType::F64, &[])],
                vec![],
                vec![],
            ),
        ];
        for (op, inputs, scalars, params) in cases {
            let (text, _) = lower_single(op, &inputs, &scalars, &params)
                .unwrap_or_else(|e| panic!("{op}: {e}"));
            assert!(text.contains("func.func public @main"), "{op}");
        }
    }
}
