//! Casts, copies, fills and creation ops (`full`, `zeros`, `ones`, `arange`, `linspace`, `eye`).

use crate::dtype::{DType, ScalarValue, TensorType};
use crate::emitter::{Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout as layout;
use crate::promote::{broadcast_shapes, check_fits};
use crate::{LowerArgs, Meta, MetaArgs, OpRule};

/// `_to_copy` to another dtype, with PyTorch's casts.
pub(crate) struct Convert;

impl OpRule for Convert {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let dtype = layout::ConvertTo::decode(&a.params)?.dtype;
        Ok(Meta::single(a.inputs[0].with_dtype(dtype), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![cast_like_pytorch(e, a.inputs[0], a.out(0).dtype)])
    }
}

/// `clone`: the same value.
pub(crate) struct CloneOp;

impl OpRule for CloneOp {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        Ok(Meta::single(a.inputs[0].clone(), vec![]))
    }

    fn lower(&self, _: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![a.inputs[0]])
    }
}

/// The new value of `self` after `self.copy_(src)`.
pub(crate) struct CopyOp;

impl OpRule for CopyOp {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(2..=2, 0..=0)?;
        let (dst, src) = (&a.inputs[0], &a.inputs[1]);
        let b = broadcast_shapes(&dst.shape, &src.shape)?;
        ensure!(
            b == dst.shape,
            "output with shape {:?} doesn't match the broadcast shape {:?}",
            dst.shape.as_slice(),
            b.as_slice()
        );
        Ok(Meta::single(dst.clone(), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0);
        let src = cast_like_pytorch(e, a.inputs[1], out.dtype);
        Ok(vec![e.broadcast_to(src, &out.shape)])
    }
}

/// `fill_` with a value scalar or a 0-d tensor.
pub(crate) struct Fill;

impl OpRule for Fill {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let dst = a
            .inputs
            .first()
            .ok_or_else(|| OpError::runtime("fill_: expected self"))?;
        if a.inputs.len() == 2 {
            a.expect_counts(2..=2, 0..=0)?;
            ensure!(
                a.inputs[1].rank() == 0,
                "fill_ only supports 0-dimension value tensor but got tensor with {} dimensions.",
                a.inputs[1].rank()
            );
            return Ok(Meta::single(dst.clone(), vec![]));
        }
        a.expect_counts(1..=1, 1..=1)?;
        check_fits(a.scalars[0].value, dst.dtype)?;
        Ok(Meta::single(dst.clone(), vec![dst.dtype]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let value = if a.inputs.len() == 2 {
            a.inputs[1]
        } else {
            a.scalars[0]
        };
        Ok(vec![broadcast_value(e, value, a.out(0))])
    }
}

/// `full`: a new tensor of one value scalar.
pub(crate) struct Full;

impl OpRule for Full {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let layout::Creation { dtype, sizes } = layout::Creation::decode(&a.params)?;
        check_sizes(sizes)?;
        a.expect_counts(0..=0, 1..=1)?;
        check_fits(a.scalars[0].value, dtype)?;
        Ok(Meta::single(TensorType::new(dtype, sizes), vec![dtype]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![broadcast_value(e, a.scalars[0], a.out(0))])
    }
}

/// `zeros` (`Constant(0)`) and `ones` (`Constant(1)`).
pub(crate) struct Constant(pub i64);

impl OpRule for Constant {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let layout::Creation { dtype, sizes } = layout::Creation::decode(&a.params)?;
        check_sizes(sizes)?;
        a.expect_counts(0..=0, 0..=0)?;
        Ok(Meta::single(TensorType::new(dtype, sizes), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![e.constant(a.out(0).clone(), ScalarValue::Int(self.0))])
    }
}

pub(crate) struct Arange;

impl OpRule for Arange {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(0..=0, 0..=0)?;
        let layout::ArangeRange {
            dtype,
            start,
            end,
            step,
        } = layout::ArangeRange::decode(&a.params)?;
        let n = arange_len(dtype, start, end, step)?;
        Ok(Meta::single(TensorType::new(dtype, &[n]), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0);
        let acc = arange_acc(out.dtype);
        let n = out.shape[0];
        let idx = e.iota(TensorType::new(acc, &[n]), 0);
        let range = layout::ArangeRange::decode(&a.params)?;
        let (start, step) = if acc == DType::I64 {
            (
                ScalarValue::Int(range.start as i64),
                ScalarValue::Int(range.step as i64),
            )
        } else {
            (
                ScalarValue::Float(range.start),
                ScalarValue::Float(range.step),
            )
        };
        let start = e.constant(TensorType::new(acc, &[n]), start);
        let step = e.constant(TensorType::new(acc, &[n]), step);
        let scaled = e.mul(step, idx);
        let v = e.add(start, scaled);
        Ok(vec![cast_like_pytorch(e, v, out.dtype)])
    }
}

pub(crate) struct Linspace;

impl OpRule for Linspace {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(0..=0, 2..=2)?;
        let layout::LinspaceSteps { dtype, steps } = layout::LinspaceSteps::decode(&a.params)?;
        if dtype == DType::Bool {
            return Err(crate::elementwise::not_implemented_for(
                "linspace_cpu",
                dtype,
            ));
        }
        ensure!(steps >= 0, "number of steps must be non-negative");
        // A complex linspace between real bounds (complex bounds run on the CPU) has the real
        // linspace as its real part and 0 as its imaginary part, as PyTorch's complex kernel
        // computes each part on its own.
        let bounds = dtype.real_part();
        Ok(Meta::single(
            TensorType::new(dtype, &[steps]),
            vec![bounds, bounds],
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![lower_linspace(e, a, a.out(0))])
    }
}

pub(crate) struct Eye;

impl OpRule for Eye {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(0..=0, 0..=0)?;
        let layout::EyeSizes { dtype, n, m } = layout::EyeSizes::decode(&a.params)?;
        ensure!(n >= 0, "n must be greater or equal to 0, got {n}");
        ensure!(m >= 0, "m must be greater or equal to 0, got {m}");
        Ok(Meta::single(TensorType::new(dtype, &[n, m]), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0);
        let ty = TensorType::new(DType::I64, &out.shape);
        let rows = e.iota(ty.clone(), 0);
        let cols = e.iota(ty, 1);
        let diag = e.compare(Cmp::Eq, rows, cols);
        Ok(vec![e.cast(diag, out.dtype)])
    }
}

/// A fill value (a value scalar or a 0-d tensor) cast and broadcast to `out`.
fn broadcast_value(e: &mut Emitter, value: Value, out: &TensorType) -> Value {
    let value = cast_like_pytorch(e, value, out.dtype);
    e.broadcast_to(value, &out.shape)
}

fn check_sizes(sizes: &[i64]) -> Result<(), OpError> {
    if let Some(&bad) = sizes.iter().find(|&&s| s < 0) {
        return Err(OpError::runtime(format!(
            "Trying to create tensor with negative dimension {bad}: {sizes:?}"
        )));
    }
    Ok(())
}

/// The accumulation dtype `arange` computes its values in (PyTorch's CPU `acc_type`).
fn arange_acc(dtype: DType) -> DType {
    match dtype {
        DType::F32 | DType::F64 => DType::F64,
        DType::F16 | DType::BF16 => DType::F32,
        _ => DType::I64,
    }
}

/// Number of elements of `arange(start, end, step)`, with PyTorch's checks.
pub fn arange_len(dtype: DType, start: f64, end: f64, step: f64) -> Result<i64, OpError> {
    // int64 converts the bounds to integers first; other dtypes check them as doubles.
    let (s, e, st) = if dtype == DType::I64 {
        (start.trunc(), end.trunc(), step.trunc())
    } else {
        (start, end, step)
    };
    if st == 0.0 {
        let message = "step must be nonzero";
        return Err(if step != 0.0 {
            OpError::value(message)
        } else {
            OpError::runtime(message)
        });
    }
    ensure!(
        s.is_finite() && e.is_finite(),
        "unsupported range: {s} -> {e}"
    );
    ensure!(
        (st > 0.0 && e >= s) || (st < 0.0 && e <= s),
        "upper bound and lower bound inconsistent with step sign"
    );
    let size = if dtype == DType::I64 {
        let (s, e, st) = (s as i64, e as i64, st as i64);
        let sgn = st.signum();
        (e - s + st - sgn) / st
    } else {
        ((end - start) / step).ceil() as i64
    };
    ensure!(size >= 0, "invalid size, possible overflow?");
    Ok(size)
}

/// A cast with PyTorch's semantics on x86 CPUs: to bool is `x != 0`; floats truncate toward
/// zero, narrow integers go through int64 (int32 and uint16 through int32) and wrap, and NaN or
/// out-of-range values become the "integer indefinite" value (the minimum of int32/int64), as
/// the x86 conversion does. uint64 takes the compilers' two-step conversion: values from 2^63 on
/// are converted less 2^63 and get the top bit back.
pub fn cast_like_pytorch(e: &mut Emitter, v: Value, to: DType) -> Value {
    let from = e.dtype(v);
    if !(from.is_float() && to.is_integral(false)) {
        return e.cast(v, to);
    }
    if to == DType::U64 {
        let top = 2f64.powi(63);
        let low_half = truncate_like_x86(e, v, DType::I64);
        let shifted = e.binary_const("stablehlo.subtract", v, top);
        let high_half = truncate_like_x86(e, shifted, DType::I64);
        let top_bit = e.constant(e.ty(high_half).clone(), ScalarValue::Int(i64::MIN));
        let high_half = e.xor(high_half, top_bit);
        // NaN compares false, so it takes the first step, as on x86.
        let high = e.compare_const(Cmp::Ge, v, top);
        let r = e.select(high, high_half, low_half);
        return e.convert(r, to);
    }
    let wide = if matches!(to, DType::I32 | DType::U16) {
        DType::I32
    } else {
        DType::I64
    };
    let r = truncate_like_x86(e, v, wide);
    e.convert(r, to)
}

/// Float `v` truncated to the integer `wide` (int32 or int64), NaN and out-of-range values
/// becoming the integer indefinite value.
fn truncate_like_x86(e: &mut Emitter, v: Value, wide: DType) -> Value {
    let bits = 8 * wide.size_bytes() as i32;
    let converted = e.convert(v, wide);
    let limit = 2f64.powi(bits - 1);
    let lo = e.compare_const(Cmp::Ge, v, -limit);
    let hi = e.compare_const(Cmp::Lt, v, limit);
    let in_range = e.and(lo, hi);
    let indefinite = e.constant(
        e.ty(converted).clone(),
        ScalarValue::Int(i64::MIN >> (64 - bits)),
    );
    e.select(in_range, converted, indefinite)
}

fn lower_linspace(e: &mut Emitter, a: &LowerArgs, out: &TensorType) -> Value {
    let steps = out.shape[0];
    let dtype = out.dtype;
    // Float outputs compute in their own dtype (f32 for bf16/f16), complex ones in their parts'
    // dtype; integer outputs in f64.
    let computes_in_own_parts = dtype.is_float() || dtype.is_complex();
    let step_t = if computes_in_own_parts {
        dtype.real_part().compute_dtype()
    } else {
        DType::F64
    };
    let vec_ty = TensorType::new(step_t, &[steps]);
    let start = e.convert(a.scalars[0], step_t);
    let end = e.convert(a.scalars[1], step_t);
    if steps <= 1 {
        let v = e.broadcast_to(start, &[steps]);
        return cast_like_pytorch(e, v, dtype);
    }
    // PyTorch's CPU kernel computes half types in their own arithmetic: every operation's result
    // is rounded to float16/bfloat16. Rounding after each f32 operation gives the same bits.
    let round = |e: &mut Emitter, v: Value| -> Value {
        if !matches!(dtype, DType::F16 | DType::BF16) {
            return v;
        }
        let narrow = e.convert(v, dtype);
        // The barrier keeps XLA from folding the f32 → half → f32 round trip away.
        let narrow = e.opaque(narrow);
        e.convert(narrow, step_t)
    };
    let start = round(e, start);
    let end = round(e, end);
    let span = e.sub(end, start);
    let span = round(e, span);
    // PyTorch divides; a reciprocal multiply is an ulp off, which integer outputs truncate.
    let denom = e.f64_constant(step_t, (steps - 1) as f64);
    let denom = e.opaque(denom);
    let denom = round(e, denom);
    let step = e.div(span, denom);
    let step = round(e, step);
    let idx_i = e.iota(TensorType::new(DType::I64, &[steps]), 0);
    let idx_exact = e.convert(idx_i, step_t);
    let idx = round(e, idx_exact);
    let start_b = e.broadcast_to(start, &[steps]);
    let end_b = e.broadcast_to(end, &[steps]);
    let step_b = e.broadcast_to(step, &[steps]);
    // idx < steps / 2: start + step * idx; else end - step * (steps - idx - 1).
    let fwd_off = e.mul(step_b, idx);
    let fwd_off = round(e, fwd_off);
    let fwd = e.add(start_b, fwd_off);
    let last = e.constant(vec_ty, ScalarValue::Float((steps - 1) as f64));
    // `steps - idx - 1` is integer arithmetic in PyTorch: from the exact index, then rounded.
    let rev_idx = e.sub(last, idx_exact);
    let rev_idx = round(e, rev_idx);
    let rev_off = e.mul(step_b, rev_idx);
    let rev_off = round(e, rev_off);
    let bwd = e.sub(end_b, rev_off);
    let halfway = e.constant(
        TensorType::new(DType::I64, &[steps]),
        ScalarValue::Int(steps / 2),
    );
    let first_half = e.compare(Cmp::Lt, idx_i, halfway);
    let v = e.select(first_half, fwd, bwd);
    if computes_in_own_parts {
        e.convert(v, dtype)
    } else {
        cast_like_pytorch(e, v, dtype)
    }
}
