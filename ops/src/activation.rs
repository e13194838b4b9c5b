//! Activation gradients training needs (`gelu`, `tanh`, `sigmoid`, `log_sigmoid`).
//!
//! Formulas follow PyTorch's CPU kernels, in the computation dtype (f32 for bf16/f16).

use crate::dtype::TensorType;
use crate::elementwise::{erf, k, not_implemented_for, prep};
use crate::emitter::{Cmp, Emitter, Value};
use crate::error::OpError;
use crate::param_layout as layout;
use crate::promote::{broadcast_all, result_type, Operand};
use crate::{LowerArgs, Meta, MetaArgs, MetaOutputs, OpId, OpRule};

/// The CPU kernel name PyTorch's dtype error names.
fn kernel_name(op: OpId) -> &'static str {
    match op {
        OpId::GeluBackward => "GeluBackwardKernelImpl",
        OpId::TanhBackward => "tanh_backward_cpu",
        OpId::SigmoidBackward => "sigmoid_backward_cpu",
        _ => "log_sigmoid_cpu",
    }
}

/// A TensorIterator-style binary result: promoted dtype (floats only), broadcast shape.
fn binary_float(a: &MetaArgs) -> Result<TensorType, OpError> {
    let (g, x) = (&a.inputs[0], &a.inputs[1]);
    let dtype = result_type(&[Operand::Tensor(g), Operand::Tensor(x)]);
    if !dtype.is_float() {
        return Err(not_implemented_for(kernel_name(a.op), dtype));
    }
    let shape = broadcast_all([&g.shape[..], &x.shape[..]])?;
    Ok(TensorType { dtype, shape })
}

/// The gradients of one input, `(grad_output, x)`, promoted and broadcast.
fn binary_gradient_meta(a: &MetaArgs) -> Result<Meta, OpError> {
    a.expect_counts(2..=2, 0..=0)?;
    Ok(Meta::single(binary_float(a)?, vec![]))
}

/// `(grad_output, x)` in the computation dtype, broadcast to the result, into `gradient`'s
/// formula; the result in the output dtype.
fn lower_binary_gradient(
    e: &mut Emitter,
    a: &LowerArgs,
    gradient: impl FnOnce(&mut Emitter, Value, Value) -> Value,
) -> Result<Vec<Value>, OpError> {
    let out = a.out(0).clone();
    let cd = out.dtype.compute_dtype();
    let g = prep(e, a.inputs[0], cd, &out.shape);
    let x = prep(e, a.inputs[1], cd, &out.shape);
    let r = gradient(e, g, x);
    Ok(vec![e.convert(r, out.dtype)])
}

/// `gelu_backward`, exact or with the tanh approximation.
pub(crate) struct GeluBackward;

impl OpRule for GeluBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(2..=2, 0..=0)?;
        if !(0..=1).contains(&layout::GeluApproximate::decode(&a.params)?.approximate) {
            return Err(a.params.invalid("approximate must be 0 (none) or 1 (tanh)"));
        }
        binary_gradient_meta(a)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let tanh_approximation = layout::GeluApproximate::decode(&a.params)?.approximate == 1;
        lower_binary_gradient(e, a, |e, g, x| gelu_backward(e, g, x, tanh_approximation))
    }
}

/// `tanh_backward` from tanh's output `y`: `g * (1 - y * y)`.
pub(crate) struct TanhBackward;

impl OpRule for TanhBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        binary_gradient_meta(a)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_binary_gradient(e, a, |e, g, y| {
            let y2 = e.mul(y, y);
            let one = k(e, y, 1.0);
            let d = e.sub(one, y2);
            e.mul(g, d)
        })
    }
}

/// `sigmoid_backward` from sigmoid's output `y`: `g * (1 - y) * y`.
pub(crate) struct SigmoidBackward;

impl OpRule for SigmoidBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        binary_gradient_meta(a)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_binary_gradient(e, a, |e, g, y| {
            let one = k(e, y, 1.0);
            let d = e.sub(one, y);
            let gd = e.mul(g, d);
            e.mul(gd, y)
        })
    }
}

/// `log_sigmoid_forward`: the result and the buffer `exp(-|x|)`.
pub(crate) struct LogSigmoidForward;

impl OpRule for LogSigmoidForward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        if !x.dtype.is_float() {
            return Err(not_implemented_for("log_sigmoid_cpu", x.dtype));
        }
        let mut outputs = MetaOutputs::new();
        outputs.push(x.clone());
        outputs.push(x.clone());
        Ok(Meta::of_outputs(outputs))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let x = e.convert(a.inputs[0], out.dtype.compute_dtype());
        let (y, z) = log_sigmoid(e, x);
        Ok(vec![e.convert(y, out.dtype), e.convert(z, out.dtype)])
    }
}

/// `log_sigmoid_backward`; its buffer input is not read.
pub(crate) struct LogSigmoidBackward;

impl OpRule for LogSigmoidBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(3..=3, 0..=0)?;
        Ok(Meta::single(binary_float(a)?, vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_binary_gradient(e, a, |e, g, x| {
            // g * (max_deriv - sign * z / (1 + z)) with z = exp(-|x|), recomputed from x so
            // the result does not depend on how the buffer was produced.
            let neg = e.compare_const(Cmp::Lt, x, 0.0);
            let one = k(e, x, 1.0);
            let zero = k(e, x, 0.0);
            let minus_one = k(e, x, -1.0);
            let max_deriv = e.select(neg, one, zero);
            let sign = e.select(neg, one, minus_one);
            let ax = e.abs(x);
            let nax = e.neg(ax);
            let z = e.exp(nax);
            let den = e.add(one, z);
            let q = e.div(z, den);
            let sq = e.mul(sign, q);
            let d = e.sub(max_deriv, sq);
            e.mul(g, d)
        })
    }
}

/// `log(sigmoid(x))` as `min(x, 0) - log1p(exp(-|x|))`, and the buffer `exp(-|x|)`.
fn log_sigmoid(e: &mut Emitter, x: Value) -> (Value, Value) {
    let zero = k(e, x, 0.0);
    let min_x = e.min(x, zero);
    let ax = e.abs(x);
    let nax = e.neg(ax);
    let z = e.exp(nax);
    let l = e.unary("stablehlo.log_plus_one", z);
    (e.sub(min_x, l), z)
}

/// GELU's gradient `g * d(x)`, shaped for a fused training step. Two values stand in for `x`
/// and for the product; they equal them wherever `g` is a number, and where `g` is NaN the
/// gradient is NaN either way:
/// - `x`, or 0 where `g` is NaN: XLA can neither compute the derivative before `g` exists nor
///   merge its `erf` and `exp` with the forward pass's. Without it, the step computed them
///   during the forward pass and held them until the backward pass.
/// - the product divided by 1, or by 0 where `g` is NaN: a division is one of the operations XLA
///   won't copy into each reader, so the gradient is computed once, `erf` and `exp` inside, and
///   the bias gradient and the products read it. Without it, XLA copied the cheap product into
///   both readers and kept `erf` and `exp` as two buffers of their own.
///
/// Op by op, neither changes anything but a few instructions per element.
fn gelu_backward(e: &mut Emitter, g: Value, x: Value, tanh_approximation: bool) -> Value {
    let number = e.compare(Cmp::Eq, g, g);
    let zero = k(e, x, 0.0);
    let one = k(e, x, 1.0);
    let x = e.select(number, x, zero);
    let unit = e.select(number, one, zero);
    let gradient = gelu_gradient(e, g, x, tanh_approximation);
    e.div(gradient, unit)
}

/// PyTorch's gelu gradient, exact (erf) or with the tanh approximation.
fn gelu_gradient(e: &mut Emitter, g: Value, x: Value, tanh_approximation: bool) -> Value {
    let half = k(e, x, 0.5);
    let one = k(e, x, 1.0);
    if tanh_approximation {
        let beta = std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5;
        let kappa = 0.044715;
        let x2 = e.mul(x, x);
        let x3 = e.mul(x2, x);
        let kappa_v = k(e, x, kappa);
        let kx3 = e.mul(kappa_v, x3);
        let inner = e.add(x, kx3);
        let beta_v = k(e, x, beta);
        let inner = e.mul(beta_v, inner);
        let t = e.unary("stablehlo.tanh", inner);
        let left = e.mul(half, x);
        let right = e.add(one, t);
        let left_derivative = e.mul(half, right);
        let t2 = e.mul(t, t);
        let tanh_derivative = e.sub(one, t2);
        let kappa3 = k(e, x, 3.0 * kappa);
        let kx2 = e.mul(kappa3, x2);
        let poly = e.add(one, kx2);
        let inner_derivative = e.mul(beta_v, poly);
        let lt = e.mul(left, tanh_derivative);
        let right_derivative = e.mul(lt, inner_derivative);
        let d = e.add(left_derivative, right_derivative);
        e.mul(g, d)
    } else {
        // cdf = 0.5 * (1 + erf(x / sqrt(2))); pdf = exp(-x^2 / 2) / sqrt(2 pi)
        let alpha = k(e, x, std::f64::consts::FRAC_1_SQRT_2);
        let xs = e.mul(x, alpha);
        let er = erf(e, xs);
        let one_e = e.add(one, er);
        let cdf = e.mul(half, one_e);
        let x2 = e.mul(x, x);
        let minus_half = k(e, x, -0.5);
        let m = e.mul(minus_half, x2);
        let ex = e.exp(m);
        let beta = std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2 * 0.5;
        let beta_v = k(e, x, beta);
        let pdf = e.mul(ex, beta_v);
        let xp = e.mul(x, pdf);
        let d = e.add(cdf, xp);
        e.mul(g, d)
    }
}

/// Softmax along `dim` (after casting to the requested dtype), with rows whose inputs are all
/// `-inf` (fully masked attention rows) giving zeros instead of NaN.
#[cfg(test)]
mod tests {
    use crate::dtype::{DType, TensorType};
    use crate::{meta, OpId};

    fn t(dtype: DType, shape: &[i64]) -> TensorType {
        TensorType::new(dtype, shape)
    }

    #[test]
    fn gradients_promote_and_broadcast() {
        let m = meta(
            OpId::TanhBackward,
            &[t(DType::F64, &[3]), t(DType::F32, &[2, 3])],
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(m.outputs[0], t(DType::F64, &[2, 3]));
        let m = meta(
            OpId::GeluBackward,
            &[t(DType::F32, &[4]), t(DType::F32, &[4])],
            &[],
            &[1],
        )
        .unwrap();
        assert_eq!(m.outputs[0], t(DType::F32, &[4]));
        let err = meta(
            OpId::SigmoidBackward,
            &[t(DType::I64, &[4]), t(DType::I64, &[4])],
            &[],
            &[],
        )
        .unwrap_err();
        assert_eq!(
            err.message,
            "\"sigmoid_backward_cpu\" not implemented for 'Long'"
        );
    }

    #[test]
    fn log_sigmoid_has_an_output_and_a_buffer() {
        let m = meta(OpId::LogSigmoidForward, &[t(DType::F16, &[2, 5])], &[], &[]).unwrap();
        assert_eq!(m.outputs.len(), 2);
        assert_eq!(m.outputs[1], t(DType::F16, &[2, 5]));
        let m = meta(
            OpId::LogSigmoidBackward,
            &[t(DType::F32, &[]), t(DType::F32, &[2]), t(DType::F32, &[2])],
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(m.outputs[0], t(DType::F32, &[2]));
    }

    #[test]
    fn safe_softmax_takes_the_requested_dtype() {
        let x = t(DType::I64, &[2, 3]);
        let m = meta(OpId::SafeSoftmax, std::slice::from_ref(&x), &[], &[-1, 7]).unwrap();
        assert_eq!(m.outputs[0], t(DType::F64, &[2, 3]));
        let err = meta(OpId::SafeSoftmax, &[x], &[], &[0, -1]).unwrap_err();
        assert_eq!(
            err.message,
            "\"softmax_kernel_impl\" not implemented for 'Long'"
        );
    }
}
