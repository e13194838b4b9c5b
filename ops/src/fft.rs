//! Discrete Fourier transforms: ATen's `_fft_c2c`, `_fft_r2c` and `_fft_c2r`, which every
//! `torch.fft` function, `stft` and `istft` compose into, lowered to `stablehlo.fft`.
//!
//! `stablehlo.fft` transforms at most three innermost dims, and its inverse kinds divide by the
//! signal size. PyTorch's primitives take any list of dims and a normalization that applies to
//! either direction, so each transform moves its dims innermost, runs in groups of up to three,
//! moves them back, and scales once at the end.

use crate::dtype::{DType, Shape, TensorType};
use crate::emitter::{i64_array, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout as layout;
use crate::params::wrap_dim;
use crate::{LowerArgs, Meta, MetaArgs, OpId, OpRule, ScalarValue};

/// The most dims one `stablehlo.fft` transforms.
const MAX_FFT_DIMS: usize = 3;

/// `at::native::fft_norm_mode`: what the transform's result is divided by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Normalization {
    None,
    ByRootN,
    ByN,
}

impl Normalization {
    fn divisor(self, signal_numel: i64) -> f64 {
        match self {
            Normalization::None => 1.0,
            Normalization::ByRootN => (signal_numel as f64).sqrt(),
            Normalization::ByN => signal_numel as f64,
        }
    }
}

/// A transform's normalization from its layout's code.
fn normalization(p: &crate::Params, code: i64) -> Result<Normalization, OpError> {
    Ok(match code {
        0 => Normalization::None,
        1 => Normalization::ByRootN,
        2 => Normalization::ByN,
        _ => return Err(p.invalid("normalization must be 0, 1 or 2")),
    })
}

/// The transformed dims, wrapped, in the caller's order (the last one is the halved dim of a
/// real transform); a dim named twice is PyTorch's error, and so is any dim of a 0-d tensor
/// (a signal needs a dim, where `wrap_dim` would take dim 0 or -1 of a scalar).
fn fft_dims(dims: &[i64], rank: usize) -> Result<Vec<usize>, OpError> {
    let mut out: Vec<usize> = Vec::with_capacity(dims.len());
    for &d in dims {
        if rank == 0 {
            return Err(OpError::index(format!(
                "Dimension specified as {d} but tensor has no dimensions; expected a tensor with at least one dimension to transform"
            )));
        }
        let w = wrap_dim(d, rank)?;
        ensure!(!out.contains(&w), "FFT dims must be unique");
        out.push(w);
    }
    Ok(out)
}

fn signal_numel(shape: &[i64], dims: &[usize]) -> i64 {
    dims.iter().map(|&d| shape[d]).product()
}

fn real_transform_dtype(op: OpId, dtype: DType) -> Result<(), OpError> {
    if matches!(dtype, DType::F32 | DType::F64) {
        return Ok(());
    }
    Err(OpError::not_implemented(format!(
        "\"{}\" is not implemented for '{}' on pjrt",
        op.name(),
        dtype.scalar_type_name()
    )))
}

/// The one input of a transform, and its dims wrapped (checked for repeats).
fn input_and_dims<'a>(
    a: &MetaArgs<'a>,
    dims: &[i64],
) -> Result<(&'a TensorType, Vec<usize>), OpError> {
    let x = &a.inputs[0];
    Ok((x, fft_dims(dims, x.rank())?))
}

/// The last transformed dim: a real transform's halved dim.
fn halved_dim(op: OpId, dims: &[usize]) -> Result<usize, OpError> {
    dims.last()
        .copied()
        .ok_or_else(|| OpError::runtime(format!("{}: expected at least one dim", op.name())))
}

/// A transform with nothing to compute: an empty result (zeros), or `x` itself when `identity`
/// (a complex transform over no dims). XLA's FFT wants non-empty signals.
fn trivial(e: &mut Emitter, out: &TensorType, x: Value, identity: bool) -> Option<Value> {
    if out.numel() == 0 {
        Some(e.constant(out.clone(), ScalarValue::Float(0.0)))
    } else if identity {
        Some(x)
    } else {
        None
    }
}

/// `_fft_c2c`: a complex transform, forward or inverse.
pub(crate) struct FftC2c;

impl OpRule for FftC2c {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let l = layout::FftC2c::decode(&a.params)?;
        normalization(&a.params, l.normalization)?;
        let (x, _) = input_and_dims(a, l.dims)?;
        ensure!(
            x.dtype.is_complex(),
            "_fft_c2c: expected a complex input tensor, but got {}",
            x.dtype.scalar_type_name()
        );
        Ok(Meta::single(x.clone(), Vec::new()))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let x = a.inputs[0];
        let l = layout::FftC2c::decode(&a.params)?;
        let norm = normalization(&a.params, l.normalization)?;
        let in_shape = e.shape(x).to_vec();
        let dims = fft_dims(l.dims, in_shape.len())?;
        if let Some(v) = trivial(e, &out, x, dims.is_empty()) {
            return Ok(vec![v]);
        }
        let n = signal_numel(&in_shape, &dims);
        let v = c2c(e, x, &dims, l.forward);
        // XLA's inverse divides by the signal size already.
        let done = if l.forward { 1.0 } else { n as f64 };
        Ok(vec![scale(e, v, done / norm.divisor(n))])
    }
}

/// `_fft_r2c`: the forward transform of a real signal, one-sided (the halved dim) or full.
pub(crate) struct FftR2c;

impl OpRule for FftR2c {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let l = layout::FftR2c::decode(&a.params)?;
        normalization(&a.params, l.normalization)?;
        let (x, dims) = input_and_dims(a, l.dims)?;
        ensure!(
            x.dtype.is_float(),
            "_fft_r2c: expected a real floating point input tensor, but got {}",
            x.dtype.scalar_type_name()
        );
        real_transform_dtype(a.op, x.dtype)?;
        let last = halved_dim(a.op, &dims)?;
        let mut shape = Shape::from_slice(&x.shape);
        if l.onesided {
            shape[last] = x.shape[last] / 2 + 1;
        }
        Ok(Meta::single(
            TensorType::new(x.dtype.to_complex(), &shape),
            Vec::new(),
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let x = a.inputs[0];
        let l = layout::FftR2c::decode(&a.params)?;
        let norm = normalization(&a.params, l.normalization)?;
        let in_shape = e.shape(x).to_vec();
        let dims = fft_dims(l.dims, in_shape.len())?;
        if let Some(v) = trivial(e, &out, x, false) {
            return Ok(vec![v]);
        }
        let n = signal_numel(&in_shape, &dims);
        let v = if l.onesided {
            // The halved dim and up to two more in one real transform, then the rest.
            let split = dims.len().saturating_sub(MAX_FFT_DIMS);
            let (rest, real_group) = dims.split_at(split);
            let mut half = TensorType::new(out.dtype, &in_shape);
            let last = dims[dims.len() - 1];
            half.shape[last] = out.shape[last];
            let v = fft_over(e, x, real_group, "RFFT", &in_shape, &half);
            c2c(e, v, rest, true)
        } else {
            let z = e.convert(x, out.dtype);
            c2c(e, z, &dims, true)
        };
        Ok(vec![scale(e, v, 1.0 / norm.divisor(n))])
    }
}

/// `_fft_c2r`: the inverse transform of a one-sided spectrum to a real signal.
pub(crate) struct FftC2r;

impl OpRule for FftC2r {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let l = layout::FftC2r::decode(&a.params)?;
        normalization(&a.params, l.normalization)?;
        let (x, dims) = input_and_dims(a, l.dims)?;
        ensure!(
            x.dtype.is_complex(),
            "_fft_c2r: expected a complex input tensor, but got {}",
            x.dtype.scalar_type_name()
        );
        real_transform_dtype(a.op, x.dtype.real_part())?;
        let last = halved_dim(a.op, &dims)?;
        let last_dim_size = l.last_dim_size;
        ensure!(
            last_dim_size >= 1,
            "Invalid number of data points ({last_dim_size}) specified"
        );
        let mut shape = Shape::from_slice(&x.shape);
        shape[last] = last_dim_size;
        Ok(Meta::single(
            TensorType::new(x.dtype.real_part(), &shape),
            Vec::new(),
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).clone();
        let x = a.inputs[0];
        let l = layout::FftC2r::decode(&a.params)?;
        let norm = normalization(&a.params, l.normalization)?;
        let in_shape = e.shape(x).to_vec();
        let dims = fft_dims(l.dims, in_shape.len())?;
        if let Some(v) = trivial(e, &out, x, false) {
            return Ok(vec![v]);
        }
        let n = signal_numel(&out.shape, &dims);
        let split = dims.len().saturating_sub(MAX_FFT_DIMS);
        let (rest, real_group) = dims.split_at(split);
        // The inverse complex transforms first, the real one (halved dim innermost) last.
        let v = c2c(e, x, rest, false);
        let last = dims[dims.len() - 1];
        let v = fit_dim(e, v, last, out.shape[last] / 2 + 1);
        let v = fft_over(e, v, real_group, "IRFFT", &out.shape, &out);
        Ok(vec![scale(e, v, n as f64 / norm.divisor(n))])
    }
}

/// One `stablehlo.fft` of `kind` over `dims` of `v` (at most three, the last innermost for the
/// real kinds), giving `out`: the dims are moved innermost and back. `signal` is the shape of
/// the real signal (the input of a real transform, the result of an inverse one).
fn fft_over(
    e: &mut Emitter,
    v: Value,
    dims: &[usize],
    kind: &str,
    signal: &[i64],
    out: &TensorType,
) -> Value {
    let rank = e.rank(v);
    let mut perm: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).collect();
    perm.extend_from_slice(dims);
    let moved = e.transpose(v, &perm);
    let lengths: Vec<i64> = dims.iter().map(|&d| signal[d]).collect();
    let moved_out: Shape = perm.iter().map(|&p| out.shape[p]).collect();
    let ty = TensorType::new(out.dtype, &moved_out);
    let attrs = format!(
        "fft_type = #stablehlo<fft_type {kind}>, fft_length = {}",
        i64_array(&lengths)
    );
    let transformed = e.op("stablehlo.fft", &[moved], &attrs, ty);
    let mut inverse = vec![0; rank];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    e.transpose(transformed, &inverse)
}

/// Complex-to-complex transforms of `v` over `dims`, in groups of up to three.
fn c2c(e: &mut Emitter, mut v: Value, dims: &[usize], forward: bool) -> Value {
    let kind = if forward { "FFT" } else { "IFFT" };
    for group in dims.chunks(MAX_FFT_DIMS) {
        let ty = e.ty(v).clone();
        v = fft_over(e, v, group, kind, &ty.shape, &ty);
    }
    v
}

/// `v` times `factor` (a complex or real value), left alone when the factor is 1.
fn scale(e: &mut Emitter, v: Value, factor: f64) -> Value {
    if factor == 1.0 {
        return v;
    }
    let ty = e.ty(v).clone();
    let c = e.constant(ty, ScalarValue::Float(factor));
    e.mul(v, c)
}

/// `v` cut or zero-padded along `dim` to `size`.
fn fit_dim(e: &mut Emitter, v: Value, dim: usize, size: i64) -> Value {
    let have = e.shape(v)[dim];
    if have > size {
        return e.slice_dim(v, dim, 0, size, 1);
    }
    if have == size {
        return v;
    }
    let rank = e.rank(v);
    let mut high = vec![0; rank];
    high[dim] = size - have;
    let zero = e.scalar_constant(e.dtype(v), ScalarValue::Float(0.0));
    e.pad(v, zero, &vec![0; rank], &high, &vec![0; rank])
}

#[cfg(test)]
mod tests {
    use crate::{meta, DType, ErrorKind, OpId, TensorType};

    fn out(op: OpId, x: TensorType, params: &[i64]) -> TensorType {
        meta(op, &[x], &[], params).unwrap().outputs[0].clone()
    }

    #[test]
    fn result_types_follow_pytorch() {
        let real = TensorType::new(DType::F32, &[4, 6]);
        let z = TensorType::new(DType::C128, &[4, 5]);
        // A onesided real transform halves the last dim it names, here dim 0.
        let r2c = out(OpId::FftR2c, real.clone(), &[0, 1, 1, 0]);
        assert_eq!(r2c, TensorType::new(DType::C64, &[3, 6]));
        let full = out(OpId::FftR2c, real.clone(), &[0, 0, -1]);
        assert_eq!(full, TensorType::new(DType::C64, &[4, 6]));
        let c2r = out(OpId::FftC2r, z.clone(), &[2, 8, 0, -1]);
        assert_eq!(c2r, TensorType::new(DType::F64, &[4, 8]));
        assert_eq!(out(OpId::FftC2c, z.clone(), &[1, 1]), z);
    }

    #[test]
    fn bad_arguments_are_refused() {
        let real = TensorType::new(DType::F32, &[4, 6]);
        let z = TensorType::new(DType::C64, &[4, 5]);
        let err = |op, x: &TensorType, params: &[i64]| {
            meta(op, std::slice::from_ref(x), &[], params).unwrap_err()
        };
        assert!(err(OpId::FftC2c, &real, &[0, 1, 0])
            .message
            .contains("complex input"));
        assert!(err(OpId::FftC2r, &real, &[0, 4, 0])
            .message
            .contains("complex input"));
        assert!(err(OpId::FftR2c, &z, &[0, 1, 0]).message.contains("real"));
        assert_eq!(err(OpId::FftC2c, &z, &[0, 1, 2]).kind, ErrorKind::Index);
        assert!(err(OpId::FftC2c, &z, &[0, 1, 1, -1])
            .message
            .contains("unique"));
        assert!(err(OpId::FftC2r, &z, &[0, 0, 1])
            .message
            .contains("Invalid number of data points (0)"));
        assert!(err(OpId::FftC2c, &z, &[3, 1, 1])
            .message
            .contains("normalization"));
        // Half precision goes to the CPU, which raises PyTorch's own error for it.
        let half = TensorType::new(DType::F16, &[4]);
        assert_eq!(
            err(OpId::FftR2c, &half, &[0, 1, 0]).kind,
            ErrorKind::NotImplemented
        );
    }
}
