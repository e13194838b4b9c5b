//! Reductions over a dim list (`sum`, `mean`, `amax`, `argmax`, `var`, `norm`...), softmax
//! (`_safe_softmax` too) and inclusive scans (`cumsum`, `cumprod`, `logcumsumexp`).

use crate::creation::cast_like_pytorch;
use crate::dtype::{DType, ScalarValue, Shape, TensorType};
use crate::elementwise::{is_nan, k, not_implemented_for};
use crate::emitter::{i64_array, Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout as layout;
use crate::params::{wrap_dim, wrap_dims};
use crate::promote::{result_type, to_float, Operand};
use crate::{LowerArgs, Meta, MetaArgs, OpId, OpRule};

/// The shape after reducing `dims` (kept as size 1 when `keepdim`).
pub fn reduced_shape(shape: &[i64], dims: &[usize], keepdim: bool) -> Shape {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| {
            if !dims.contains(&i) {
                Some(d)
            } else if keepdim {
                Some(1)
            } else {
                None
            }
        })
        .collect()
}

// ---- rules: each op's meta beside its lowering --------------------------------------------

/// `sum` and `prod` over a dim list: an integral input reduces in int64 unless a dtype is given.
pub(crate) struct SumProd;

impl OpRule for SumProd {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let l = layout::ReduceDtypeDims::decode(&a.params)?;
        let dims = wrap_dims(l.dims, x.rank())?;
        let out = l.dtype.unwrap_or(if x.dtype.is_integral(true) {
            DType::I64
        } else {
            x.dtype
        });
        Ok(reduced_meta(x, out, &dims, l.keepdim))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_accumulated(e, a)
    }
}

/// `sum`, `prod` and `mean` over their dim list: each accumulated in its result's dtype.
fn lower_accumulated(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let l = layout::ReduceDtypeDims::decode(&a.params)?;
    lower_reduction(e, a, l.dims, |e, x, dims, out| {
        accumulate(e, x, dims, out, a.op)
    })
}

/// `mean` over a dim list, in a float or complex dtype (its dtype errors before its dims').
pub(crate) struct Mean;

impl OpRule for Mean {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let l = layout::ReduceDtypeDims::decode(&a.params)?;
        let dims = wrap_dims(l.dims, x.rank());
        let out = l.dtype.unwrap_or(x.dtype);
        if !out.is_float() && !out.is_complex() {
            let which = if l.dtype.is_some() {
                "Optional"
            } else {
                "Input"
            };
            return Err(OpError::runtime(format!(
                "mean(): could not infer output dtype. {which} dtype must be either a floating point or complex dtype. Got: {}",
                out.scalar_type_name()
            )));
        }
        Ok(reduced_meta(x, out, &dims?, l.keepdim))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_accumulated(e, a)
    }
}

/// `amax` and `amin` over a dim list, in the input's dtype; NaN propagates.
pub(crate) struct MinMax;

impl OpRule for MinMax {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let l = layout::ReduceDims::decode(&a.params)?;
        let dims = wrap_dims(l.dims, x.rank())?;
        if x.numel() == 0 {
            empty_reduction_error(a.op, &dims, &x.shape)?;
        }
        Ok(reduced_meta(x, x.dtype, &dims, l.keepdim))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let l = layout::ReduceDims::decode(&a.params)?;
        lower_reduction(e, a, l.dims, |e, x, dims, _| {
            min_max_reduce(e, x, dims, a.op == OpId::Amax)
        })
    }
}

/// `argmax` and `argmin`, along a dim or over the flattened input: the first index of the
/// extreme value, as int64.
pub(crate) struct ArgReduce;

impl OpRule for ArgReduce {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let rank = x.rank();
        let layout::ArgReduce { keepdim, dim } = layout::ArgReduce::decode(&a.params)?;
        ensure!(
            x.dtype != DType::Bool,
            "{}(): does not support bool input",
            a.op.name()
        );
        if let Some(dim) = dim {
            let dim = wrap_dim(dim, rank)?;
            if rank > 0 && x.shape[dim] == 0 {
                return Err(OpError::index(format!(
                    "{}(): Expected reduction dim {dim} to have non-zero size.",
                    a.op.name()
                )));
            }
            let dims: Vec<usize> = if rank == 0 { vec![] } else { vec![dim] };
            return Ok(reduced_meta(x, DType::I64, &dims, keepdim));
        }
        if x.numel() == 0 {
            return Err(OpError::index(format!(
                "{}(): Expected reduction dim to be specified for input.numel() == 0.",
                a.op.name()
            )));
        }
        let shape: Shape = if keepdim {
            Shape::from_elem(1, rank)
        } else {
            Shape::new()
        };
        Ok(Meta::single(
            TensorType {
                dtype: DType::I64,
                shape,
            },
            vec![],
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let out = a.out(0).dtype;
        let v = lower_arg_reduce(e, a, a.inputs[0])?;
        Ok(vec![e.convert(v, out)])
    }
}

/// `any` and `all` over a dim list: bool, or uint8 for a uint8 input.
pub(crate) struct AnyAll;

impl OpRule for AnyAll {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let l = layout::ReduceDims::decode(&a.params)?;
        let dims = wrap_dims(l.dims, x.rank())?;
        let out = if x.dtype == DType::U8 {
            DType::U8
        } else {
            DType::Bool
        };
        Ok(reduced_meta(x, out, &dims, l.keepdim))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let l = layout::ReduceDims::decode(&a.params)?;
        lower_reduction(e, a, l.dims, |e, x, dims, _| {
            let b = e.cast(x, DType::Bool);
            let (init, op) = if a.op == OpId::Any {
                (0.0, "stablehlo.or")
            } else {
                (1.0, "stablehlo.and")
            };
            e.reduce_with(b, init, dims, op)
        })
    }
}

/// `var` and `std` over a dim list with a correction, for float inputs (their dtype errors
/// before their dims').
pub(crate) struct VarStd;

impl OpRule for VarStd {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let l = layout::ReduceCorrectionDims::decode(&a.params)?;
        let dims = wrap_dims(l.dims, x.rank());
        ensure!(
            x.dtype.is_float(),
            "std and var only support floating point and complex dtypes"
        );
        Ok(reduced_meta(x, x.dtype, &dims?, l.keepdim))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let l = layout::ReduceCorrectionDims::decode(&a.params)?;
        lower_reduction(e, a, l.dims, |e, x, dims, out| {
            let xc = e.cast(x, out.compute_dtype());
            let var = variance(e, xc, dims, l.correction);
            if a.op == OpId::Std {
                e.sqrt(var)
            } else {
                var
            }
        })
    }
}

/// `logsumexp` over a dim list, in a float dtype.
pub(crate) struct Logsumexp;

impl OpRule for Logsumexp {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let l = layout::ReduceDims::decode(&a.params)?;
        let dims = wrap_dims(l.dims, x.rank())?;
        Ok(reduced_meta(x, to_float(x.dtype), &dims, l.keepdim))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let l = layout::ReduceDims::decode(&a.params)?;
        lower_reduction(e, a, l.dims, |e, x, dims, out| {
            let xc = e.cast(x, out.compute_dtype());
            logsumexp(e, xc, dims)
        })
    }
}

/// `linalg_vector_norm` of a given order over a dim list, for float inputs (its dtype errors
/// before its dims'); an infinite order has no identity, so it refuses empty dims.
pub(crate) struct VectorNorm;

impl OpRule for VectorNorm {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let l = layout::VectorNorm::decode(&a.params)?;
        let dims = wrap_dims(l.dims, x.rank());
        ensure!(
            x.dtype.is_float() || x.dtype.is_complex(),
            "linalg.vector_norm: Expected a floating point or complex tensor as input. Got {}",
            x.dtype.scalar_type_name()
        );
        if let Some(d) = l.dtype {
            ensure!(
                d.is_float() || d.is_complex(),
                "linalg.vector_norm: dtype should be floating point or complex. Got {}",
                d.scalar_type_name()
            );
            let kind = |complex: bool| if complex { "complex" } else { "real" };
            ensure!(
                d.is_complex() == x.dtype.is_complex(),
                "linalg.vector_norm: dtype should be {} for {} inputs, but got {}",
                kind(x.dtype.is_complex()),
                kind(x.dtype.is_complex()),
                d.scalar_type_name()
            );
        }
        // A complex input's norm is its magnitudes' norm, in the parts' dtype.
        let out = l.dtype.unwrap_or(x.dtype).real_part();
        let dims = dims?;
        check_norm_empty(x, &dims, l.ord, l.dims.is_empty())?;
        Ok(reduced_meta(x, out, &dims, l.keepdim))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let l = layout::VectorNorm::decode(&a.params)?;
        lower_reduction(e, a, l.dims, |e, x, dims, out| {
            let xc = if e.dtype(x).is_complex() {
                let complex = l.dtype.unwrap_or(e.dtype(x)).compute_dtype();
                let xc = e.cast(x, complex);
                let real = TensorType::new(complex.real_part(), e.shape(xc));
                e.op("stablehlo.abs", &[xc], "", real)
            } else {
                e.cast(x, out)
            };
            let xc = e.cast(xc, out.compute_dtype());
            vector_norm(e, xc, dims, l.ord)
        })
    }
}

/// `_softmax` and `_log_softmax` along a dim, for float inputs, in the input's type.
pub(crate) struct Softmax;

impl OpRule for Softmax {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let rank = x.rank();
        let l = layout::SoftmaxDim::decode(&a.params)?;
        let dim = wrap_dim(l.dim, rank)?;
        ensure!(
            !l.half_to_float,
            "softmax with half to float conversion is not supported on CPU"
        );
        if !x.dtype.is_float() {
            let base = if a.op == OpId::Softmax {
                "softmax"
            } else {
                "log_softmax"
            };
            let lastdim = if dim + 1 >= rank { "lastdim_" } else { "" };
            return Err(not_implemented_for(
                &format!("{base}_{lastdim}kernel_impl"),
                x.dtype,
            ));
        }
        Ok(Meta::single(x.clone(), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let x = a.inputs[0];
        let out = a.out(0).dtype;
        let dim = wrap_dim(layout::SoftmaxDim::decode(&a.params)?.dim, e.rank(x))?;
        let v = softmax(e, x, dim, a.op == OpId::LogSoftmax);
        Ok(vec![e.convert(v, out)])
    }
}

/// `_safe_softmax`, the softmax of PyTorch's attention decomposition: rows that are all `-inf`
/// give zeros.
pub(crate) struct SafeSoftmax;

impl OpRule for SafeSoftmax {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let l = layout::DimDtype::decode(&a.params)?;
        let dim = wrap_dim(l.dim, x.rank())?;
        let dtype = l.dtype.unwrap_or(x.dtype);
        if !dtype.is_float() {
            let lastdim = if dim + 1 >= x.rank() { "lastdim_" } else { "" };
            return Err(not_implemented_for(
                &format!("softmax_{lastdim}kernel_impl"),
                dtype,
            ));
        }
        Ok(Meta::single(x.with_dtype(dtype), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![safe_softmax(e, a)?])
    }
}

/// `cumsum` and `cumprod` along a dim: an integral input scans in int64 unless a dtype is
/// given.
pub(crate) struct Cumulative;

impl OpRule for Cumulative {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        let l = layout::DimDtype::decode(&a.params)?;
        let dtype = l.dtype.unwrap_or(if x.dtype.is_integral(true) {
            DType::I64
        } else {
            x.dtype
        });
        wrap_dim(l.dim, x.rank())?;
        Ok(Meta::single(x.with_dtype(dtype), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_scan(e, a)
    }
}

/// `logcumsumexp` along a dim, for float inputs, in the input's type.
pub(crate) struct Logcumsumexp;

impl OpRule for Logcumsumexp {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        let x = &a.inputs[0];
        if !x.dtype.is_float() {
            return Err(not_implemented_for("logcumsumexp_out_cpu", x.dtype));
        }
        wrap_dim(layout::Dim::decode(&a.params)?.dim, x.rank())?;
        Ok(Meta::single(x.clone(), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        lower_scan(e, a)
    }
}

/// `isin`: whether each element is among the test elements (a tensor, or a Python number lifted
/// in the common dtype), optionally inverted.
pub(crate) struct Isin;

impl OpRule for Isin {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        let (elements, test) = isin_operands(a)?;
        layout::Invert::decode(&a.params)?;
        let common = result_type(&[elements, test]);
        let scalar_dtypes: Vec<DType> = if a.inputs.len() == 1 {
            vec![common]
        } else {
            vec![]
        };
        Ok(Meta::single(
            a.inputs[0].with_dtype(DType::Bool),
            scalar_dtypes,
        ))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![lower_isin(e, a)?])
    }
}

/// The meta of a reduction of `x` over `dims` to `dtype`.
fn reduced_meta(x: &TensorType, dtype: DType, dims: &[usize], keepdim: bool) -> Meta {
    Meta::single(
        TensorType::new(dtype, &reduced_shape(&x.shape, dims, keepdim)),
        vec![],
    )
}

/// A dim-list reduction of the input over `dims`: `reduce` computes it (given the wrapped dims
/// and the result's dtype), then it is converted to that dtype, its reduced dims kept as size 1
/// where the result keeps them.
fn lower_reduction(
    e: &mut Emitter,
    a: &LowerArgs,
    dims: &[i64],
    reduce: impl FnOnce(&mut Emitter, Value, &[usize], DType) -> Value,
) -> Result<Vec<Value>, OpError> {
    let x = a.inputs[0];
    let out = a.out(0).clone();
    let dims = wrap_dims(dims, e.rank(x))?;
    let keepdim_shape = reduced_shape(e.shape(x), &dims, true);
    let r = reduce(e, x, &dims, out.dtype);
    let r = e.convert(r, out.dtype);
    let r = if out.rank() == keepdim_shape.len() {
        e.reshape(r, &keepdim_shape)
    } else {
        r
    };
    Ok(vec![e.convert(r, out.dtype)])
}

/// `sum`, `prod` or `mean` (`op`) of `x` over `dims` to `out`, accumulated in `out`'s
/// computation dtype (a sum or product first casts to `out`).
fn accumulate(e: &mut Emitter, x: Value, dims: &[usize], out: DType, op: OpId) -> Value {
    let acc = out.compute_dtype();
    let xc = e.cast(x, if op == OpId::Mean { acc } else { out });
    let xc = e.cast(xc, acc);
    let r = if op == OpId::Prod {
        e.reduce_with(xc, 1.0, dims, "stablehlo.multiply")
    } else {
        e.reduce_sum(xc, dims)
    };
    if op == OpId::Mean {
        let count: i64 = dims.iter().map(|&d| e.shape(x)[d]).product();
        let n = k(e, r, count as f64);
        e.div(r, n)
    } else {
        r
    }
}

fn empty_reduction_error(op: OpId, dims: &[usize], shape: &[i64]) -> Result<(), OpError> {
    for &d in dims {
        if shape[d] == 0 {
            return Err(OpError::index(format!(
                "{}(): Expected reduction dim {d} to have non-zero size.",
                op.name()
            )));
        }
    }
    Ok(())
}

fn check_norm_empty(
    x: &TensorType,
    dims: &[usize],
    ord: f64,
    all_dims: bool,
) -> Result<(), OpError> {
    if !(ord.is_infinite() && x.numel() == 0) {
        return Ok(());
    }
    let which = if ord > 0.0 { "inf" } else { "-inf" };
    ensure!(
        !all_dims,
        "linalg.vector_norm cannot compute the {which} norm on an empty tensor because the operation does not have an identity"
    );
    for &d in dims {
        ensure!(
            x.shape[d] != 0,
            "linalg.vector_norm cannot compute the {which} norm on the dimension {d}because this dimension is empty and the operation does not have an identity"
        );
    }
    Ok(())
}

/// `isin`: the elements and test elements promote like a binary op's operands (a Python number
/// as test element is a wrapped scalar); bool inputs are refused, as on the CPU.
fn isin_operands<'a>(a: &'a MetaArgs) -> Result<(Operand<'a>, Operand<'a>), OpError> {
    let test = if a.inputs.len() == 2 {
        a.expect_counts(2..=2, 0..=0)?;
        Operand::Tensor(&a.inputs[1])
    } else {
        a.expect_counts(1..=1, 1..=1)?;
        Operand::Scalar(&a.scalars[0])
    };
    let elements = Operand::Tensor(&a.inputs[0]);
    for dtype in [
        a.inputs[0].dtype,
        a.inputs
            .get(1)
            .map_or_else(|| a.scalars[0].own_dtype(), |t| t.dtype),
    ] {
        ensure!(
            dtype != DType::Bool,
            "Unsupported input type encountered for isin(): {}",
            dtype.scalar_type_name()
        );
    }
    Ok((elements, test))
}

/// Every element against every test element (`elements x test_elements` comparisons, reduced
/// with `or`): no sort, so no data-dependent shapes.
fn lower_isin(e: &mut Emitter, a: &LowerArgs) -> Result<Value, OpError> {
    let x = a.inputs[0];
    let invert = layout::Invert::decode(&a.params)?.invert;
    let shape = e.shape(x).to_vec();
    let (test, common) = match a.inputs.get(1) {
        Some(&t) => {
            let (tx, tt) = (e.ty(x).clone(), e.ty(t).clone());
            (
                t,
                result_type(&[Operand::Tensor(&tx), Operand::Tensor(&tt)]),
            )
        }
        None => (a.scalars[0], a.meta.scalar_dtypes[0]),
    };
    let count: i64 = e.shape(test).iter().product();
    let flat = e.reshape(test, &[count]);
    let flat = e.cast(flat, common);
    let xc = e.cast(x, common);
    let mut wide = shape.clone();
    wide.push(count);
    let rank = shape.len();
    let dims: Vec<usize> = (0..rank).collect();
    let xw = e.broadcast_in_dim(xc, &wide, &dims);
    let tw = e.broadcast_in_dim(flat, &wide, &[rank]);
    let hits = e.compare(Cmp::Eq, xw, tw);
    let found = e.reduce_with(hits, 0.0, &[rank], "stablehlo.or");
    Ok(if invert { e.not(found) } else { found })
}

/// amax/amin; NaN propagates. The body selects NaN explicitly: XLA CPU's vectorized max
/// reduction does not propagate it.
pub(crate) fn min_max_reduce(e: &mut Emitter, x: Value, dims: &[usize], max: bool) -> Value {
    let dtype = e.dtype(x);
    if dtype == DType::Bool {
        let (init, op) = if max {
            (0.0, "stablehlo.or")
        } else {
            (1.0, "stablehlo.and")
        };
        return e.reduce_with(x, init, dims, op);
    }
    let init = match (dtype.is_float(), max) {
        (true, true) => f64::NEG_INFINITY,
        (true, false) => f64::INFINITY,
        (false, true) => dtype.min_value(),
        (false, false) => dtype.max_value(),
    };
    let init = if dtype == DType::I64 {
        e.scalar_constant(
            dtype,
            ScalarValue::Int(if max { i64::MIN } else { i64::MAX }),
        )
    } else {
        e.f64_constant(dtype, init)
    };
    let op = if max {
        "stablehlo.maximum"
    } else {
        "stablehlo.minimum"
    };
    let float = dtype.is_float();
    e.reduce(&[x], &[init], dims, |e, args| {
        let m = e.binary(op, args[0], args[1]);
        if float {
            let a_nan = is_nan(e, args[0]);
            let b_nan = is_nan(e, args[1]);
            let m = e.select(b_nan, args[1], m);
            vec![e.select(a_nan, args[0], m)]
        } else {
            vec![m]
        }
    })[0]
}

/// Sum over `dims`, keeping them as size-1 dims.
pub(crate) fn sum_keepdim(e: &mut Emitter, x: Value, dims: &[usize]) -> Value {
    let shape = reduced_shape(e.shape(x), dims, true);
    let s = e.reduce_sum(x, dims);
    e.reshape(s, &shape)
}

fn max_keepdim(e: &mut Emitter, x: Value, dims: &[usize]) -> Value {
    let shape = reduced_shape(e.shape(x), dims, true);
    let m = min_max_reduce(e, x, dims, true);
    e.reshape(m, &shape)
}

/// The maximum a (log-)softmax or logsumexp shifts by, as a plain `maximum` reduction: XLA CPU
/// fuses that reduction with the rest of the row's work, where the NaN-carrying body of
/// [`min_max_reduce`] splits it into a windowed reduction and a second pass over the input
/// (softmax of 4096x1024: about 3.5x slower). A NaN the plain maximum drops still reaches the
/// result through `x - max` and the sum, so the shift need not carry it.
fn shift_max_keepdim(e: &mut Emitter, x: Value, dims: &[usize]) -> Value {
    let shape = reduced_shape(e.shape(x), dims, true);
    let m = if e.dtype(x).is_float() {
        e.reduce_with(x, f64::NEG_INFINITY, dims, "stablehlo.maximum")
    } else {
        min_max_reduce(e, x, dims, true)
    };
    e.reshape(m, &shape)
}

fn variance(e: &mut Emitter, x: Value, dims: &[usize], correction: f64) -> Value {
    let count: i64 = dims.iter().map(|&d| e.shape(x)[d]).product();
    let shape = e.shape(x).to_vec();
    let sum = sum_keepdim(e, x, dims);
    let n = k(e, sum, count as f64);
    let mean = e.div(sum, n);
    let mean_b = e.broadcast_in_dim(mean, &shape, &(0..shape.len()).collect::<Vec<_>>());
    let centered = e.sub(x, mean_b);
    let sq = e.mul(centered, centered);
    let m2 = e.reduce_sum(sq, dims);
    let divisor = k(e, m2, (count as f64 - correction).max(0.0));
    e.div(m2, divisor)
}

fn logsumexp(e: &mut Emitter, x: Value, dims: &[usize]) -> Value {
    let shape = e.shape(x).to_vec();
    let all: Vec<usize> = (0..shape.len()).collect();
    let m = shift_max_keepdim(e, x, dims);
    // An infinite max would turn x - max into NaN: shift by 0 instead.
    let abs = e.abs(m);
    let inf = e.compare_const(Cmp::Eq, abs, f64::INFINITY);
    let zero = k(e, m, 0.0);
    let m = e.select(inf, zero, m);
    let mb = e.broadcast_in_dim(m, &shape, &all);
    let shifted = e.sub(x, mb);
    let ex = e.exp(shifted);
    let s = e.reduce_sum(ex, dims);
    let l = e.log(s);
    let kept = e.shape(l).to_vec();
    let m_flat = e.reshape(m, &kept);
    e.add(l, m_flat)
}

fn vector_norm(e: &mut Emitter, x: Value, dims: &[usize], ord: f64) -> Value {
    let shape = e.shape(x).to_vec();
    let numel: i64 = shape.iter().product();
    if ord == 2.0 && dims.len() == shape.len() && numel < crate::emitter::TWO_STAGE_SUM_MIN {
        // A small tensor's whole L2 norm as the dot product of the tensor with itself. As a
        // product of squares and a sum, XLA's CPU compiler splits the sum into a window
        // reduction that the squares don't fuse into, so every small tensor's squares are
        // written out (a gradient clip's norm over each gradient); the dot fuses into one loop.
        let all: Vec<usize> = (0..shape.len()).collect();
        let dtype = e.dtype(x);
        // A norm, not a user's product: always at full precision.
        let _exact = crate::scoped_matmul_precision(crate::Precision::Highest);
        let sum = e.dot_general(x, x, &[], &[], &all, &all, dtype);
        return e.sqrt(sum);
    }
    let abs = e.abs(x);
    if ord == 2.0 {
        let sq = e.mul(x, x);
        let s = e.reduce_sum(sq, dims);
        e.sqrt(s)
    } else if ord == 1.0 {
        e.reduce_sum(abs, dims)
    } else if ord == f64::INFINITY {
        min_max_reduce(e, abs, dims, true)
    } else if ord == f64::NEG_INFINITY {
        min_max_reduce(e, abs, dims, false)
    } else if ord == 0.0 {
        let nz = e.compare_const(Cmp::Ne, x, 0.0);
        let dtype = e.dtype(x);
        let f = e.convert(nz, dtype);
        e.reduce_sum(f, dims)
    } else {
        let p = k(e, abs, ord);
        let powed = e.pow(abs, p);
        let s = e.reduce_sum(powed, dims);
        let inv = k(e, s, 1.0 / ord);
        e.pow(s, inv)
    }
}

/// Numerically stable (log-)softmax along `dim`, computed in f32 for bf16/f16.
pub(crate) fn softmax(e: &mut Emitter, x: Value, dim: usize, log: bool) -> Value {
    softmax_and_max(e, x, dim, log, false).0
}

/// Softmax along `dim` and the maximum it shifted by (kept dim, computation dtype; none for a
/// 0-d input). `exact_max`: the maximum carries NaN (a caller reads it), else it is only the
/// shift and may drop one.
pub(crate) fn softmax_and_max(
    e: &mut Emitter,
    x: Value,
    dim: usize,
    log: bool,
    exact_max: bool,
) -> (Value, Option<Value>) {
    let dtype = e.dtype(x);
    let xc = e.cast(x, dtype.compute_dtype());
    let shape = e.shape(xc).to_vec();
    if shape.is_empty() {
        let r = if log { k(e, xc, 0.0) } else { k(e, xc, 1.0) };
        return (e.convert(r, dtype), None);
    }
    let all: Vec<usize> = (0..shape.len()).collect();
    let m = if exact_max {
        max_keepdim(e, xc, &[dim])
    } else {
        shift_max_keepdim(e, xc, &[dim])
    };
    let mb = e.broadcast_in_dim(m, &shape, &all);
    let shifted = e.sub(xc, mb);
    let ex = e.exp(shifted);
    let s = sum_keepdim(e, ex, &[dim]);
    let sb = e.broadcast_in_dim(s, &shape, &all);
    let r = if log {
        let ls = e.log(sb);
        e.sub(shifted, ls)
    } else {
        e.div(ex, sb)
    };
    (e.convert(r, dtype), Some(m))
}

/// argmax/argmin: the first index of the extreme value; NaN counts as the extreme, as in PyTorch.
fn lower_arg_reduce(e: &mut Emitter, a: &LowerArgs, x: Value) -> Result<Value, OpError> {
    let p = &a.params;
    let out = a.out(0).clone();
    let max = a.op == OpId::Argmax;
    let rank = e.rank(x);
    let (x, dim) = match layout::ArgReduce::decode(p)?.dim {
        Some(dim) if rank > 0 => (x, wrap_dim(dim, rank)?),
        _ => {
            let n = e.ty(x).numel();
            (e.reshape(x, &[n]), 0)
        }
    };
    let mut x = x;
    if e.dtype(x) == DType::Bool {
        x = e.convert(x, DType::U8);
    }
    let shape = e.shape(x).to_vec();
    let dtype = e.dtype(x);
    let idx = e.iota(TensorType::new(DType::I64, &shape), dim);
    let init_v = if dtype.is_float() {
        e.f64_constant(
            dtype,
            if max {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            },
        )
    } else if dtype == DType::I64 {
        e.scalar_constant(
            dtype,
            ScalarValue::Int(if max { i64::MIN } else { i64::MAX }),
        )
    } else {
        e.f64_constant(
            dtype,
            if max {
                dtype.min_value()
            } else {
                dtype.max_value()
            },
        )
    };
    let init_i = e.scalar_constant(DType::I64, ScalarValue::Int(0));
    let float = dtype.is_float();
    let r = e.reduce(&[x, idx], &[init_v, init_i], &[dim], |e, args| {
        let (av, ai, bv, bi) = (args[0], args[1], args[2], args[3]);
        let dir = if max { Cmp::Gt } else { Cmp::Lt };
        let mut a_better = e.compare(dir, av, bv);
        let mut equal = e.compare(Cmp::Eq, av, bv);
        if float {
            let a_nan = is_nan(e, av);
            let b_nan = is_nan(e, bv);
            let not_b_nan = e.not(b_nan);
            let nan_wins = e.and(a_nan, not_b_nan);
            a_better = e.or(a_better, nan_wins);
            let both_nan = e.and(a_nan, b_nan);
            equal = e.or(equal, both_nan);
        }
        let a_first = e.compare(Cmp::Lt, ai, bi);
        let tie = e.and(equal, a_first);
        let pick_a = e.or(a_better, tie);
        let v = e.select(pick_a, av, bv);
        let i = e.select(pick_a, ai, bi);
        vec![v, i]
    });
    Ok(e.reshape(r[1], &out.shape))
}
/// Inclusive scans along a dim: `cumsum`, `cumprod` and `logcumsumexp`. Each output reduces
/// the window of the n elements ending at it (the identity padded in front).
fn lower_scan(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let out = a.out(0).clone();
    let x = cast_like_pytorch(e, a.inputs[0], out.dtype);
    if out.rank() == 0 || out.numel() == 0 {
        return Ok(vec![x]);
    }
    let dim = match a.op {
        OpId::Logcumsumexp => layout::Dim::decode(&a.params)?.dim,
        _ => layout::DimDtype::decode(&a.params)?.dim,
    };
    let dim = wrap_dim(dim, out.rank())?;
    let acc = out.dtype.compute_dtype();
    let x = e.convert(x, acc);
    let n = out.shape[dim];
    let window: Vec<i64> = (0..out.rank())
        .map(|d| if d == dim { n } else { 1 })
        .collect();
    let padding: Vec<String> = (0..out.rank())
        .map(|d| format!("[{}, 0]", if d == dim { n - 1 } else { 0 }))
        .collect();
    let op = a.op;
    let identity = match op {
        OpId::Cumprod => 1.0,
        OpId::Logcumsumexp => f64::NEG_INFINITY,
        _ => 0.0,
    };
    let init = e.f64_constant(acc, identity);
    let scalar = TensorType::scalar(acc);
    let region = e.region(&[scalar.clone(), scalar], |e, args| {
        let (l, r) = (args[0], args[1]);
        vec![match op {
            OpId::Cumprod => e.mul(l, r),
            OpId::Logcumsumexp => {
                // max + log1p(exp(-|l - r|)); an infinite max (both -inf, or one +inf) is the
                // answer itself.
                let m = e.max(l, r);
                let d = e.sub(l, r);
                let d = e.abs(d);
                let nd = e.neg(d);
                let ex = e.exp(nd);
                let lp = e.unary("stablehlo.log_plus_one", ex);
                let sum = e.add(m, lp);
                let am = e.abs(m);
                let inf = e.compare_const(Cmp::Eq, am, f64::INFINITY);
                let v = e.select(inf, m, sum);
                // XLA's `maximum` may drop a NaN: carry it explicitly.
                let l_nan = e.compare(Cmp::Ne, l, l);
                let r_nan = e.compare(Cmp::Ne, r, r);
                let nan = e.or(l_nan, r_nan);
                let nan_value = e.add(l, r);
                e.select(nan, nan_value, v)
            }
            _ => e.add(l, r),
        }]
    });
    let attrs = format!(
        "window_dimensions = {}, window_strides = {}, padding = dense<[{}]> : tensor<{}x2xi64>",
        i64_array(&window),
        i64_array(&vec![1; out.rank()]),
        padding.join(", "),
        out.rank()
    );
    let ty = out.with_dtype(acc);
    let r = e.op_with_regions(
        "stablehlo.reduce_window",
        &[x, init],
        &[region],
        &attrs,
        vec![ty],
    )[0];
    Ok(vec![e.convert(r, out.dtype)])
}

fn safe_softmax(e: &mut Emitter, a: &LowerArgs) -> Result<Value, OpError> {
    let out = a.out(0).clone();
    let x = a.inputs[0];
    let rank = e.rank(x);
    let dim = wrap_dim(layout::DimDtype::decode(&a.params)?.dim, rank)?;
    let xd = e.convert(x, out.dtype);
    let (s, row_max) = softmax_and_max(e, xd, dim, false, true);
    if rank == 0 {
        let masked = e.compare_const(Cmp::Eq, x, f64::NEG_INFINITY);
        let zero = k(e, s, 0.0);
        return Ok(e.select(masked, zero, s));
    }
    let rows = match row_max {
        // A row is all -inf exactly when its maximum is -inf (a NaN makes both false): the
        // softmax's own maximum answers it, without another pass over the input.
        Some(m) if e.dtype(x) == out.dtype => {
            let masked = e.compare_const(Cmp::Eq, m, f64::NEG_INFINITY);
            let all: Vec<usize> = (0..rank).collect();
            e.broadcast_in_dim(masked, &out.shape, &all)
        }
        // With a dtype conversion, the input's own -inf decide, as in PyTorch.
        _ => {
            let masked = e.compare_const(Cmp::Eq, x, f64::NEG_INFINITY);
            let all = e.reduce_with(masked, 1.0, &[dim], "stablehlo.and");
            let kept: Vec<usize> = (0..rank).filter(|&d| d != dim).collect();
            e.broadcast_in_dim(all, &out.shape, &kept)
        }
    };
    let zero = k(e, s, 0.0);
    Ok(e.select(rows, zero, s))
}
