//! Random numbers: uniform, normal, integer and Bernoulli draws, and dropout.
//!
//! Every draw takes its generator key as the last value scalar: a lifted 0-d `i64`, so the same
//! draw with a new key (every call advances the generator) reuses the compiled program. The bits
//! hash a counter with the key (SplitMix64, `Emitter::random_words`): integer arithmetic that every PJRT
//! backend implements the same way, so a seed gives the same numbers on CPU, GPU and TPU.

use crate::dtype::{DType, ScalarValue, TensorType};
use crate::elementwise::not_implemented_for;
use crate::emitter::{Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout as layout;
use crate::promote::broadcast_shapes;
use crate::{LowerArgs, Meta, MetaArgs, OpRule};

/// The dtype uniform values are drawn in for results of `dtype`: f64 keeps 53 random bits,
/// everything else 24 (f32's mantissa; f16 and bf16 results are rounded from it).
fn draw_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

fn check_sizes(sizes: &[i64]) -> Result<(), OpError> {
    if let Some(&bad) = sizes.iter().find(|&&s| s < 0) {
        return Err(OpError::runtime(format!(
            "Trying to create tensor with negative dimension {bad}: {sizes:?}"
        )));
    }
    Ok(())
}

/// `uniform` and `normal` draws: a float result of the layout's dtype and sizes, and its two
/// parameters lifted in its computation dtype.
fn float_draw_meta(
    a: &MetaArgs,
    check: impl FnOnce(DType) -> Result<(), OpError>,
) -> Result<Meta, OpError> {
    a.expect_counts(0..=0, 3..=3)?;
    let layout::Creation { dtype, sizes } = layout::Creation::decode(&a.params)?;
    check_sizes(sizes)?;
    check(dtype)?;
    let compute = dtype.compute_dtype();
    Ok(Meta::single(
        TensorType::new(dtype, sizes),
        vec![compute, compute, DType::I64],
    ))
}

/// `uniform`: values in `[from, to)`.
pub(crate) struct Uniform;

impl OpRule for Uniform {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        float_draw_meta(a, |dtype| {
            if !dtype.is_float() {
                return Err(not_implemented_for("check_uniform_bounds", dtype));
            }
            let (from, to) = (a.scalars[0].value.as_f64(), a.scalars[1].value.as_f64());
            // As PyTorch's check: NaN bounds fail it too.
            if from.is_nan() || to.is_nan() || from > to {
                return Err(OpError::runtime(format!(
                    "uniform_ expects to return a [from, to) range, but found from={from} > \
                     to={to}"
                )));
            }
            Ok(())
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let key = key(a)?;
        if out.numel() == 0 {
            return Ok(vec![zeros(e, &out)]);
        }
        let draw = draw_dtype(out.dtype);
        let u = uniform01(e, key, &out.shape, draw);
        let from = e.convert(a.scalars[0], draw);
        let to = e.convert(a.scalars[1], draw);
        let range = e.sub(to, from);
        let range = e.broadcast_to(range, &out.shape);
        let from = e.broadcast_to(from, &out.shape);
        let scaled = e.mul(u, range);
        let v = e.add(scaled, from);
        Ok(vec![e.convert(v, out.dtype)])
    }
}

/// `normal`: values of a mean and a standard deviation.
pub(crate) struct Normal;

impl OpRule for Normal {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        float_draw_meta(a, |dtype| {
            if !dtype.is_float() {
                return Err(not_implemented_for("normal_kernel_cpu", dtype));
            }
            let std = a.scalars[1].value.as_f64();
            if std.is_nan() || std < 0.0 {
                return Err(OpError::runtime(format!(
                    "normal expects std >= 0.0, but found std {std}"
                )));
            }
            Ok(())
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let key = key(a)?;
        if out.numel() == 0 {
            return Ok(vec![zeros(e, &out)]);
        }
        // Box-Muller: two uniform draws per value; 1 - u keeps the logarithm finite.
        let draw = draw_dtype(out.dtype);
        let mut pair_shape = vec![2];
        pair_shape.extend_from_slice(&out.shape);
        let u = uniform01(e, key, &pair_shape, draw);
        let rest = out.rank();
        let first = e.slice_dim(u, 0, 0, 1, 1);
        let first = e.reshape(first, &out.shape);
        let second = e.slice_dim(u, 0, 1, 2, 1);
        let second = e.reshape(second, &out.shape);
        let one = e.full_like(first, 1.0);
        let u1 = e.sub(one, first);
        let log = e.log(u1);
        let minus_two_log = e.binary_const("stablehlo.multiply", log, -2.0);
        let radius = e.sqrt(minus_two_log);
        let angle = e.binary_const("stablehlo.multiply", second, std::f64::consts::TAU);
        let cos = e.unary("stablehlo.cosine", angle);
        let z = e.mul(radius, cos);
        debug_assert_eq!(e.rank(z), rest);
        let mean = e.convert(a.scalars[0], draw);
        let std = e.convert(a.scalars[1], draw);
        let std = e.broadcast_to(std, &out.shape);
        let mean = e.broadcast_to(mean, &out.shape);
        let scaled = e.mul(z, std);
        let v = e.add(scaled, mean);
        Ok(vec![e.convert(v, out.dtype)])
    }
}

/// `random_`: integers in `[from, to)`, or every non-negative i64 (`full_range`).
pub(crate) struct RandomInt;

impl OpRule for RandomInt {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(0..=0, 3..=3)?;
        let layout::RandomIntDraw {
            dtype,
            full_range,
            sizes,
        } = layout::RandomIntDraw::decode(&a.params)?;
        check_sizes(sizes)?;
        if !full_range {
            let (from, to) = (a.scalars[0].value.as_i64(), a.scalars[1].value.as_i64());
            ensure!(
                from < to,
                "random_ expects 'from' to be less than 'to', but got from={from} >= to={to}"
            );
        }
        Ok(Meta::single(
            TensorType::new(dtype, sizes),
            vec![DType::I64, DType::I64, DType::I64],
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let key = key(a)?;
        if out.numel() == 0 {
            return Ok(vec![zeros(e, &out)]);
        }
        let words = e.random_words(key, &out.shape, true);
        let mask = e.constant(
            TensorType::new(DType::I64, &out.shape),
            ScalarValue::Int(i64::MAX),
        );
        let bits = e.and(words, mask);
        let v = if layout::RandomIntDraw::decode(&a.params)?.full_range {
            bits
        } else {
            // PyTorch's own reduction: the word modulo the range, plus `from`.
            let range = e.sub(a.scalars[1], a.scalars[0]);
            let range = e.broadcast_to(range, &out.shape);
            let from = e.broadcast_to(a.scalars[0], &out.shape);
            let offset = e.rem(bits, range);
            e.add(offset, from)
        };
        Ok(vec![e.cast(v, out.dtype)])
    }
}

/// `bernoulli`: ones with a probability given as a tensor or as a value scalar.
pub(crate) struct Bernoulli;

impl OpRule for Bernoulli {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(0..=1, 1..=2)?;
        let layout::Creation { dtype, sizes } = layout::Creation::decode(&a.params)?;
        check_sizes(sizes)?;
        let out = TensorType::new(dtype, sizes);
        match a.inputs.first() {
            Some(probs) => {
                a.expect_counts(1..=1, 1..=1)?;
                if !probs.dtype.is_float() {
                    return Err(not_implemented_for("bernoulli_tensor_cpu_p_", probs.dtype));
                }
                let b = broadcast_shapes(sizes, &probs.shape)?;
                ensure!(
                    b.as_slice() == sizes,
                    "bernoulli_: the probabilities of shape {:?} can't be broadcast to the \
                     result's shape {sizes:?}",
                    probs.shape.as_slice()
                );
                Ok(Meta::single(out, vec![DType::I64]))
            }
            None => {
                a.expect_counts(0..=0, 2..=2)?;
                let prob = a.scalars[0].value.as_f64();
                ensure!(
                    (0.0..=1.0).contains(&prob),
                    "bernoulli_ expects p to be in [0, 1], but got p={prob}"
                );
                Ok(Meta::single(out, vec![draw_dtype(dtype), DType::I64]))
            }
        }
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let key = key(a)?;
        if out.numel() == 0 {
            return Ok(vec![zeros(e, &out)]);
        }
        let (probs, draw) = match a.inputs.first() {
            Some(&probs) => {
                let draw = if e.dtype(probs) == DType::F64 || out.dtype == DType::F64 {
                    DType::F64
                } else {
                    DType::F32
                };
                let probs = e.convert(probs, draw);
                (e.broadcast_to(probs, &out.shape), draw)
            }
            None => {
                let draw = e.dtype(a.scalars[0]);
                (e.broadcast_to(a.scalars[0], &out.shape), draw)
            }
        };
        let u = uniform01(e, key, &out.shape, draw);
        let hit = e.compare(Cmp::Lt, u, probs);
        Ok(vec![e.convert(hit, out.dtype)])
    }
}

/// `native_dropout`: the scaled kept values and the mask of the kept ones.
pub(crate) struct NativeDropout;

impl OpRule for NativeDropout {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 2..=2)?;
        let input = &a.inputs[0];
        ensure!(
            input.dtype.is_float(),
            "native_dropout: expected a floating-point input, got {}",
            input.dtype.scalar_type_name()
        );
        let prob = a.scalars[0].value.as_f64();
        ensure!(
            (0.0..=1.0).contains(&prob),
            "dropout probability has to be between 0 and 1, but got {prob}"
        );
        layout::DropoutTrain::decode(&a.params)?;
        Ok(Meta {
            outputs: smallvec::smallvec![input.clone(), input.with_dtype(DType::Bool)],
            scalar_dtypes: smallvec::smallvec![input.dtype.compute_dtype(), DType::I64],
            variant: 0,
            float_default: None,
            matmul_precision: None,
        })
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let key = key(a)?;
        let input = a.inputs[0];
        let mask_ty = out.with_dtype(DType::Bool);
        if !layout::DropoutTrain::decode(&a.params)?.train {
            let all = e.constant(mask_ty, ScalarValue::Bool(true));
            return Ok(vec![input, all]);
        }
        if out.numel() == 0 {
            let none = e.constant(mask_ty, ScalarValue::Bool(false));
            return Ok(vec![input, none]);
        }
        let compute = out.dtype.compute_dtype();
        let u = uniform01(e, key, &out.shape, draw_dtype(compute));
        let p = a.scalars[0];
        let one = e.full_like(p, 1.0);
        let keep_prob = e.sub(one, p);
        let keep_prob_draw = e.convert(keep_prob, draw_dtype(compute));
        let keep_prob_b = e.broadcast_to(keep_prob_draw, &out.shape);
        let keep = e.compare(Cmp::Lt, u, keep_prob_b);
        // A select, not a multiply by the mask: with p = 1 the scale is infinite.
        let scale = e.div(one, keep_prob);
        let scale = e.broadcast_to(scale, &out.shape);
        let x = e.convert(input, compute);
        let scaled = e.mul(x, scale);
        let zero = e.full_like(scaled, 0.0);
        let kept = e.select(keep, scaled, zero);
        let output = e.convert(kept, out.dtype);
        Ok(vec![output, keep])
    }
}

/// `native_dropout_backward`: `grad * mask * scale`.
pub(crate) struct NativeDropoutBackward;

impl OpRule for NativeDropoutBackward {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(2..=2, 1..=1)?;
        let (grad, mask) = (&a.inputs[0], &a.inputs[1]);
        ensure!(
            mask.dtype == DType::Bool,
            "Mask should be Bool Scalar Type{}",
            mask.dtype.scalar_type_name()
        );
        let b = broadcast_shapes(&grad.shape, &mask.shape)?;
        ensure!(
            b == grad.shape,
            "native_dropout_backward: mask of shape {:?} doesn't match the gradient's {:?}",
            mask.shape.as_slice(),
            grad.shape.as_slice()
        );
        // PyTorch computes `grad * mask * scale`: the float scale promotes an integer or
        // bool gradient to the default float dtype.
        let dtype = if grad.dtype.is_float() {
            grad.dtype
        } else {
            DType::default_float()
        };
        Ok(Meta::single(
            grad.with_dtype(dtype),
            vec![dtype.compute_dtype()],
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let compute = out.dtype.compute_dtype();
        let grad = e.convert(a.inputs[0], compute);
        let mask = e.broadcast_to(a.inputs[1], &out.shape);
        let mask = e.convert(mask, compute);
        let scale = e.broadcast_to(a.scalars[0], &out.shape);
        let masked = e.mul(grad, mask);
        let v = e.mul(masked, scale);
        Ok(vec![e.convert(v, out.dtype)])
    }
}

/// Uniform values in `[0, 1)` of `shape`, in `dtype` (f32 or f64): the top 24 (53) bits of each
/// random word scaled by 2^-24 (2^-53), so every value is exact and below 1.
fn uniform01(e: &mut Emitter, key: Value, shape: &[i64], dtype: DType) -> Value {
    let (wide, keep_bits) = if dtype == DType::F64 {
        (true, 53)
    } else {
        (false, 24)
    };
    let words = e.random_words(key, shape, wide);
    let word_bits = if wide { 64 } else { 32 };
    let shift = e.full_like(words, (word_bits - keep_bits) as f64);
    let top = e.binary("stablehlo.shift_right_logical", words, shift);
    let as_float = e.convert(top, dtype);
    e.binary_const("stablehlo.multiply", as_float, (-(keep_bits as f64)).exp2())
}

fn zeros(e: &mut Emitter, ty: &TensorType) -> Value {
    e.constant(ty.clone(), ScalarValue::Int(0))
}

/// A draw's generator key: its last value scalar.
fn key(a: &LowerArgs) -> Result<Value, OpError> {
    a.scalars
        .last()
        .copied()
        .ok_or_else(|| OpError::runtime("random op without a generator key"))
}
