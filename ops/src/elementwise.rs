//! Elementwise ops: unary, binary (tensor-tensor and tensor-scalar), `where`, `clamp`, `lerp`,
//! `addcmul`/`addcdiv`.

use crate::creation::cast_like_pytorch;
use crate::dtype::{DType, ScalarArg, ScalarValue, TensorType};
use crate::emitter::{Cmp, Emitter, Value};
use crate::error::{ensure, OpError};
use crate::param_layout as layout;
use crate::params::{OperandKind, RoundingMode};
use crate::promote::{broadcast_all, broadcast_shapes, check_fits, result_type, to_float, Operand};
use crate::{LowerArgs, Meta, MetaArgs, OpId, OpRule};

pub(crate) fn not_implemented_for(kernel: &str, dtype: DType) -> OpError {
    OpError::not_implemented(format!(
        "\"{kernel}\" not implemented for '{}'",
        dtype.scalar_type_name()
    ))
}

fn operand_shape<'a>(o: &Operand<'a>) -> &'a [i64] {
    match o {
        Operand::Tensor(t) => &t.shape,
        Operand::Scalar(_) => &[],
    }
}

fn operand_dtype(o: &Operand<'_>) -> DType {
    match o {
        Operand::Tensor(t) => t.dtype,
        Operand::Scalar(s) => s.own_dtype(),
    }
}

fn operand_scalar(o: &Operand<'_>) -> Option<ScalarValue> {
    match o {
        Operand::Scalar(s) => Some(s.value),
        Operand::Tensor(_) => None,
    }
}

fn is_comparison(op: OpId) -> bool {
    matches!(
        op,
        OpId::Eq | OpId::Ne | OpId::Lt | OpId::Le | OpId::Gt | OpId::Ge
    )
}

fn is_logical(op: OpId) -> bool {
    matches!(op, OpId::LogicalAnd | OpId::LogicalOr | OpId::LogicalXor)
}

fn is_bitwise(op: OpId) -> bool {
    matches!(
        op,
        OpId::BitwiseAnd
            | OpId::BitwiseOr
            | OpId::BitwiseXor
            | OpId::BitwiseLeftShift
            | OpId::BitwiseRightShift
    )
}

/// Ops that map integers and bools to the default float dtype.
fn is_float_unary(op: OpId) -> bool {
    use OpId::*;
    matches!(
        op,
        Exp | Exp2
            | Log
            | Log2
            | Log10
            | Log1p
            | Expm1
            | Sqrt
            | Rsqrt
            | Sin
            | Cos
            | Tan
            | Tanh
            | Sigmoid
            | Erf
            | Erfc
            | SpecialI1e
            | I0
            | SpecialI0e
            | Erfinv
            | Lgamma
            | Digamma
            | Reciprocal
    )
}

// ---- meta ----------------------------------------------------------------------------------

/// `masked_fill`: `value` (a scalar or a 0-d tensor) where the boolean mask holds, `self`
/// elsewhere, broadcast together.
fn masked_fill_meta(a: &MetaArgs) -> Result<Meta, OpError> {
    let i = a.inputs;
    let (x, mask) = (
        i.first()
            .ok_or_else(|| OpError::runtime("masked_fill: expected self and mask"))?,
        i.get(1)
            .ok_or_else(|| OpError::runtime("masked_fill: expected self and mask"))?,
    );
    if i.len() == 3 {
        a.expect_counts(3..=3, 0..=0)?;
        ensure!(
            i[2].rank() == 0,
            "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with {} dimension(s).",
            i[2].rank()
        );
        // PyTorch refuses a complex value tensor for a real tensor, whatever its value.
        ensure!(
            !i[2].dtype.is_complex() || x.dtype.is_complex(),
            "value cannot be converted to type {} without overflow",
            x.dtype.cpp_type_name()
        );
    } else {
        a.expect_counts(2..=2, 1..=1)?;
    }
    ensure!(
        mask.dtype == DType::Bool,
        "masked_fill_ only supports boolean masks, but got mask with dtype {}",
        mask.dtype.typemeta_name()
    );
    let shape = broadcast_shapes(&mask.shape, &x.shape)?;
    let scalar_dtypes = match a.scalars.first() {
        Some(s) => {
            check_fits(s.value, x.dtype)?;
            vec![x.dtype]
        }
        None => vec![],
    };
    Ok(Meta::single(
        TensorType {
            dtype: x.dtype,
            shape,
        },
        scalar_dtypes,
    ))
}

/// `torch.complex(real, imag)`: the parts must be float tensors of one dtype.
fn complex_meta(a: &MetaArgs) -> Result<Meta, OpError> {
    a.expect_counts(2..=2, 0..=0)?;
    let (re, im) = (&a.inputs[0], &a.inputs[1]);
    let part = |d: DType| matches!(d, DType::F16 | DType::F32 | DType::F64);
    ensure!(
        part(re.dtype) && part(im.dtype),
        "Expected both inputs to be Half, Float or Double tensors but got {} and {}",
        re.dtype.scalar_type_name(),
        im.dtype.scalar_type_name()
    );
    ensure!(
        re.dtype == im.dtype,
        "Expected object of scalar type {} but got scalar type {} for second argument",
        re.dtype.scalar_type_name(),
        im.dtype.scalar_type_name()
    );
    if re.dtype == DType::F16 {
        return Err(not_implemented_for("complex", re.dtype));
    }
    let shape = broadcast_shapes(&re.shape, &im.shape)?;
    Ok(Meta::single(
        TensorType::new(re.dtype.to_complex(), &shape),
        vec![],
    ))
}

fn unary_meta(a: &MetaArgs) -> Result<Meta, OpError> {
    use OpId::*;
    a.expect_counts(1..=1, 0..=0)?;
    let x = &a.inputs[0];
    let d = x.dtype;
    let out = match a.op {
        op if is_float_unary(op) => to_float(d),
        Neg => {
            ensure!(
                d != DType::Bool,
                "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
            );
            d
        }
        Abs if d == DType::Bool => return Err(not_implemented_for("abs_cpu", d)),
        // The magnitude of a complex value is real.
        Abs => d.real_part(),
        Relu => {
            ensure!(d != DType::Bool, "Boolean inputs not supported for relu");
            d
        }
        Gelu if !d.is_float() => return Err(not_implemented_for("GeluKernelImpl", d)),
        Silu if !d.is_float() => return Err(not_implemented_for("silu_cpu", d)),
        Floor | Ceil | Trunc if d == DType::Bool => {
            let kernel = match a.op {
                Floor => "floor_vml_cpu",
                Ceil => "ceil_vml_cpu",
                _ => "trunc_vml_cpu",
            };
            return Err(not_implemented_for(kernel, d));
        }
        Round => {
            let decimals = layout::RoundDecimals::decode(&a.params)?.decimals;
            if decimals != 0 && !d.is_float() {
                return Err(not_implemented_for("round_cpu", d));
            }
            if d == DType::Bool {
                return Err(not_implemented_for("round_vml_cpu", d));
            }
            d
        }
        LogicalNot | IsNan | IsInf => DType::Bool,
        BitwiseNot if d.is_float() => return Err(not_implemented_for("bitwise_not_cpu", d)),
        Gelu => {
            let approximate = layout::GeluApproximate::decode(&a.params)?.approximate;
            if !(0..=1).contains(&approximate) {
                return Err(a.params.invalid("approximate must be 0 (none) or 1 (tanh)"));
            }
            d
        }
        _ => d,
    };
    Ok(Meta::single(x.with_dtype(out), vec![]))
}

/// `(self, other, remaining scalars)` of a binary op.
fn binary_operands<'a>(
    a: &'a MetaArgs,
) -> Result<(Operand<'a>, Operand<'a>, &'a [ScalarArg]), OpError> {
    let max_extra = if matches!(a.op, OpId::Add | OpId::Sub | OpId::Rsub) {
        1
    } else {
        0
    };
    if a.op == OpId::PowScalarBase {
        a.expect_counts(1..=1, 1..=1)?;
        return Ok((
            Operand::Scalar(&a.scalars[0]),
            Operand::Tensor(&a.inputs[0]),
            &[],
        ));
    }
    match a.inputs.len() {
        2 => {
            a.expect_counts(2..=2, 0..=max_extra)?;
            Ok((
                Operand::Tensor(&a.inputs[0]),
                Operand::Tensor(&a.inputs[1]),
                a.scalars,
            ))
        }
        _ => {
            a.expect_counts(1..=1, 1..=1 + max_extra)?;
            Ok((
                Operand::Tensor(&a.inputs[0]),
                Operand::Scalar(&a.scalars[0]),
                &a.scalars[1..],
            ))
        }
    }
}

fn zero_division() -> OpError {
    OpError::runtime("ZeroDivisionError")
}

fn check_alpha(alpha: &ScalarArg, out: DType) -> Result<(), OpError> {
    if out.is_integral(true) {
        ensure!(
            !alpha.value.is_float(),
            "For integral input tensors, argument alpha must not be a floating point number."
        );
    }
    if alpha.value.is_bool() {
        ensure!(
            out == DType::Bool,
            "Boolean alpha only supported for Boolean results."
        );
    }
    Ok(())
}

fn binary_meta(a: &MetaArgs) -> Result<Meta, OpError> {
    use OpId::*;
    let (x, y, rest) = binary_operands(a)?;
    // rsub broadcasts (other, self), which shows in its error message.
    let shape = if a.op == Rsub {
        broadcast_all([operand_shape(&y), operand_shape(&x)])?
    } else {
        broadcast_all([operand_shape(&x), operand_shape(&y)])?
    };
    let common = result_type(&[x, y]);
    let other_value = operand_scalar(&y);
    // An integer division by a zero scalar raises, as on the CPU, unless there is nothing to
    // divide: PyTorch returns an empty result (`torch.triu_indices(3, 0)`'s reference divides
    // its empty ranges by the zero column count).
    let divides_by_zero = common.is_integral(false)
        && other_value.is_some_and(|v| v.is_zero())
        && !shape.contains(&0);
    let both_bool = operand_dtype(&x) == DType::Bool && operand_dtype(&y) == DType::Bool;
    let out = match a.op {
        Add | Sub | Rsub => {
            if a.op != Add {
                ensure!(
                    !both_bool,
                    "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead."
                );
                ensure!(
                    operand_dtype(&x) != DType::Bool && operand_dtype(&y) != DType::Bool,
                    "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
                );
            }
            if let Some(alpha) = rest.first() {
                check_alpha(alpha, common)?;
            }
            common
        }
        Mul | Maximum | Minimum => common,
        Div => match layout::DivRounding::decode(&a.params)?.rounding_mode {
            RoundingMode::True => to_float(common),
            mode => {
                if common == DType::Bool {
                    let kernel = if mode == RoundingMode::Trunc {
                        "div_trunc_cpu"
                    } else {
                        "div_floor_cpu"
                    };
                    return Err(not_implemented_for(kernel, common));
                }
                if divides_by_zero {
                    return Err(zero_division());
                }
                common
            }
        },
        Remainder | Fmod => {
            if common == DType::Bool {
                let kernel = if a.op == Remainder {
                    "remainder_cpu"
                } else {
                    "fmod_cpu"
                };
                return Err(not_implemented_for(kernel, common));
            }
            if divides_by_zero {
                return Err(zero_division());
            }
            common
        }
        Pow | PowScalarBase => {
            // `pow(bool_tensor, True/False)` is a copy / a fill with ones.
            let wrapped_bool_exponent =
                a.op == Pow && matches!(y, Operand::Scalar(s) if s.tensor_dtype.is_none());
            if common == DType::Bool && !wrapped_bool_exponent {
                return Err(not_implemented_for("pow", common));
            }
            if common.is_integral(false) {
                if let Some(v) = other_value {
                    ensure!(
                        v.is_float() || v.as_i64() >= 0,
                        "Integers to negative integer powers are not allowed."
                    );
                }
            }
            common
        }
        Atan2 | SpecialZeta => to_float(common),
        // PyTorch's kernels take float32 and float64 only (integers promoted).
        op if crate::orthogonal::is_orthogonal_polynomial(op) => {
            let float = to_float(common);
            if float.is_reduced_float() {
                return Err(not_implemented_for(
                    &format!("{}_cpu", op.name().trim_start_matches("special_")),
                    float,
                ));
            }
            float
        }
        // PyTorch's kernel takes floating-point values only.
        Nextafter if !common.is_float() => {
            return Err(not_implemented_for("nextafter_cpu", common))
        }
        Nextafter => common,
        op if is_comparison(op) || is_logical(op) => DType::Bool,
        op if is_bitwise(op) => {
            let shift = matches!(op, BitwiseLeftShift | BitwiseRightShift);
            if common.is_float() || (shift && common == DType::Bool) {
                let kernel = match op {
                    BitwiseAnd => "bitwise_and_cpu",
                    BitwiseOr => "bitwise_or_cpu",
                    BitwiseLeftShift => "lshift_cpu",
                    BitwiseRightShift => "rshift_cpu",
                    _ => "bitwise_xor_cpu",
                };
                return Err(not_implemented_for(kernel, common));
            }
            common
        }
        op => return Err(OpError::runtime(format!("{}: not a binary op", op.name()))),
    };
    // How each scalar operand is lifted: the dtype the kernel converts it to.
    let scalar_dtypes: crate::ScalarDTypes = match (a.op, &y) {
        (PowScalarBase, _) => smallvec::smallvec![out.compute_dtype()],
        (_, Operand::Scalar(_)) => {
            let other = match a.op {
                Add | Sub | Rsub | Mul | Div => out.compute_dtype(),
                op if is_logical(op) => operand_dtype(&y),
                _ => common,
            };
            let mut v: crate::ScalarDTypes = smallvec::smallvec![other];
            if !rest.is_empty() {
                v.push(out.compute_dtype());
            }
            v
        }
        _ => rest.iter().map(|_| out.compute_dtype()).collect(),
    };
    let mut meta = Meta::single(TensorType { dtype: out, shape }, scalar_dtypes);
    if a.op == Pow && out.compute_dtype().is_float() {
        if let Operand::Scalar(s) = y {
            meta.variant = PowExponent::of(s.value.as_f64()) as u8;
        }
    }
    Ok(meta)
}

/// How a float tensor is raised to a scalar exponent: PyTorch's kernels special-case these
/// values, and a module that knows the value lets XLA fold `x ** 2` into a product instead of
/// computing `power` and every special case for each element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum PowExponent {
    General = 0,
    Square,
    Cube,
    Sqrt,
    Rsqrt,
    Reciprocal,
    ReciprocalSquare,
    Identity,
    Zero,
}

impl PowExponent {
    const ALL: [PowExponent; 9] = [
        PowExponent::General,
        PowExponent::Square,
        PowExponent::Cube,
        PowExponent::Sqrt,
        PowExponent::Rsqrt,
        PowExponent::Reciprocal,
        PowExponent::ReciprocalSquare,
        PowExponent::Identity,
        PowExponent::Zero,
    ];

    fn of(exponent: f64) -> Self {
        match exponent {
            2.0 => PowExponent::Square,
            3.0 => PowExponent::Cube,
            0.5 => PowExponent::Sqrt,
            -0.5 => PowExponent::Rsqrt,
            -1.0 => PowExponent::Reciprocal,
            -2.0 => PowExponent::ReciprocalSquare,
            1.0 => PowExponent::Identity,
            0.0 => PowExponent::Zero,
            _ => PowExponent::General,
        }
    }

    fn from_variant(variant: u8) -> Result<Self, OpError> {
        Self::ALL
            .get(variant as usize)
            .copied()
            .ok_or_else(|| OpError::runtime(format!("pow: unknown exponent variant {variant}")))
    }
}

/// Resolve the operands of `where`/`clamp`: each optional operand is absent, the next tensor
/// input or the next value scalar.
fn optional_operands<'a>(
    a: &'a MetaArgs,
    first_input: usize,
    kinds: &[OperandKind],
) -> Result<Vec<Option<Operand<'a>>>, OpError> {
    let mut next_input = first_input;
    let mut next_scalar = 0;
    let mut out = Vec::new();
    for kind in kinds {
        out.push(match kind {
            OperandKind::Absent => None,
            OperandKind::Tensor => {
                next_input += 1;
                Some(Operand::Tensor(a.inputs.get(next_input - 1).ok_or_else(
                    || a.params.invalid("more tensor operands than tensor inputs"),
                )?))
            }
            OperandKind::Scalar => {
                next_scalar += 1;
                Some(Operand::Scalar(a.scalars.get(next_scalar - 1).ok_or_else(
                    || a.params.invalid("more scalar operands than value scalars"),
                )?))
            }
        });
    }
    a.expect_counts(next_input..=next_input, next_scalar..=next_scalar)?;
    Ok(out)
}

fn where_kinds(a_inputs: usize, params: &crate::Params) -> Result<[OperandKind; 2], OpError> {
    let (d0, d1) = match a_inputs {
        3 => (OperandKind::Tensor, OperandKind::Tensor),
        2 => (OperandKind::Tensor, OperandKind::Scalar),
        _ => (OperandKind::Scalar, OperandKind::Scalar),
    };
    let p = layout::WhereOperands::decode(params)?;
    Ok([p.self_kind.unwrap_or(d0), p.other_kind.unwrap_or(d1)])
}

fn where_meta(a: &MetaArgs) -> Result<Meta, OpError> {
    ensure!(!a.inputs.is_empty(), "where: expected a condition tensor");
    let kinds = where_kinds(a.inputs.len(), &a.params)?;
    ensure!(
        kinds.iter().all(|k| *k != OperandKind::Absent),
        "where: self and other are required"
    );
    let ops = optional_operands(a, 1, &kinds)?;
    let cond = &a.inputs[0];
    ensure!(
        cond.dtype == DType::Bool || cond.dtype == DType::U8,
        "where expected condition to be a boolean tensor, but got a tensor with dtype {}",
        cond.dtype.scalar_type_name()
    );
    let (x, y) = (ops[0].unwrap(), ops[1].unwrap());
    let shape = broadcast_all([&cond.shape[..], operand_shape(&x), operand_shape(&y)])?;
    let out = result_type(&[x, y]);
    let scalar_dtypes: crate::ScalarDTypes = ops
        .iter()
        .flatten()
        .filter(|o| matches!(o, Operand::Scalar(_)))
        .map(|_| out)
        .collect();
    Ok(Meta::single(
        TensorType { dtype: out, shape },
        scalar_dtypes,
    ))
}

fn clamp_kinds(params: &crate::Params) -> Result<[OperandKind; 2], OpError> {
    let p = layout::ClampBounds::decode(params)?;
    Ok([p.min_kind, p.max_kind])
}

fn clamp_meta(a: &MetaArgs) -> Result<Meta, OpError> {
    ensure!(!a.inputs.is_empty(), "clamp: expected self");
    let kinds = clamp_kinds(&a.params)?;
    let ops = optional_operands(a, 1, &kinds)?;
    ensure!(
        ops.iter().any(|o| o.is_some()),
        "torch.clamp: At least one of 'min' or 'max' must not be None"
    );
    let x = &a.inputs[0];
    // Scalar bounds bind to `clamp(Tensor, Scalar?, Scalar?)`: even a 0-d tensor promotes as
    // a Python number there.
    let as_numbers: Vec<ScalarArg> = a
        .scalars
        .iter()
        .map(|s| ScalarArg::number(s.value))
        .collect();
    let mut next_number = as_numbers.iter();
    let mut all = vec![Operand::Tensor(x)];
    for o in ops.iter().flatten() {
        all.push(match o {
            Operand::Tensor(t) => Operand::Tensor(t),
            Operand::Scalar(_) => Operand::Scalar(next_number.next().unwrap()),
        });
    }
    let out = result_type(&all);
    if out == DType::Bool {
        clamp_bool_check(&ops)?;
    }
    let shape = broadcast_all(all.iter().map(operand_shape))?;
    let scalar_dtypes: crate::ScalarDTypes = ops
        .iter()
        .flatten()
        .filter(|o| matches!(o, Operand::Scalar(_)))
        .map(|_| out)
        .collect();
    Ok(Meta::single(
        TensorType { dtype: out, shape },
        scalar_dtypes,
    ))
}

/// PyTorch computes a bool clamp only for a single tensor bound (as `maximum`/`minimum`); every
/// other bool clamp reaches a kernel without bool support, named in the error.
fn clamp_bool_check(bounds: &[Option<Operand>]) -> Result<(), OpError> {
    let from_tensor = |o: &Operand| match o {
        Operand::Tensor(_) => true,
        Operand::Scalar(s) => s.tensor_dtype.is_some(),
    };
    let kernel = match bounds {
        [Some(b), None] | [None, Some(b)] if from_tensor(b) => return Ok(()),
        [Some(_), None] => "clamp_min_scalar_cpu",
        [None, Some(_)] => "clamp_max_scalar_cpu",
        _ if bounds.iter().flatten().any(from_tensor) => "clamp_cpu",
        _ => "clamp_scalar_cpu",
    };
    Err(not_implemented_for(kernel, DType::Bool))
}

fn lerp_meta(a: &MetaArgs) -> Result<Meta, OpError> {
    let (x, end) = match a.inputs {
        [x, end, ..] => (x, end),
        _ => return Err(OpError::runtime("lerp: expected self and end tensors")),
    };
    let tensor_weight = a.inputs.len() == 3;
    if tensor_weight {
        a.expect_counts(3..=3, 0..=0)?;
    } else {
        a.expect_counts(2..=2, 1..=1)?;
    }
    ensure!(
        x.dtype == end.dtype,
        "expected dtype {} for `end` but got dtype {}",
        x.dtype.typemeta_name(),
        end.dtype.typemeta_name()
    );
    let mut shapes = vec![&x.shape[..], &end.shape[..]];
    if tensor_weight {
        let w = &a.inputs[2];
        ensure!(
            x.dtype == w.dtype,
            "expected dtype {} for `weight` but got dtype {}",
            x.dtype.typemeta_name(),
            w.dtype.typemeta_name()
        );
        shapes.push(&w.shape);
    }
    if !x.dtype.is_float() {
        let kernel = if tensor_weight {
            "lerp_kernel_tensor"
        } else {
            "lerp_kernel_scalar"
        };
        return Err(not_implemented_for(kernel, x.dtype));
    }
    let shape = broadcast_all(shapes)?;
    let scalar_dtypes = if tensor_weight {
        vec![]
    } else {
        vec![x.dtype.compute_dtype()]
    };
    Ok(Meta::single(
        TensorType {
            dtype: x.dtype,
            shape,
        },
        scalar_dtypes,
    ))
}

fn addc_meta(a: &MetaArgs) -> Result<Meta, OpError> {
    a.expect_counts(3..=3, 0..=1)?;
    let [x, t1, t2] = [&a.inputs[0], &a.inputs[1], &a.inputs[2]];
    if a.op == OpId::Addcdiv && t1.dtype.is_integral(true) && t2.dtype.is_integral(true) {
        return Err(OpError::runtime(
            "Integer division with addcdiv is no longer supported, and in a future  release addcdiv will perform a true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as (input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as (input + value * tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter implementation: (input + value * tensor1 / tensor2), for all dtypes.",
        ));
    }
    let ops = [Operand::Tensor(x), Operand::Tensor(t1), Operand::Tensor(t2)];
    let out = result_type(&ops);
    if a.op == OpId::Addcmul && out == DType::Bool {
        return Err(not_implemented_for("addcmul_cpu_out", out));
    }
    let shape = broadcast_all([&x.shape[..], &t1.shape[..], &t2.shape[..]])?;
    let scalar_dtypes: crate::ScalarDTypes =
        a.scalars.iter().map(|_| out.compute_dtype()).collect();
    Ok(Meta::single(
        TensorType { dtype: out, shape },
        scalar_dtypes,
    ))
}

// ---- lowering ------------------------------------------------------------------------------

fn lower_masked_fill(e: &mut Emitter, a: &LowerArgs) -> Value {
    let out = a.out(0).clone();
    let value = a.inputs.get(2).copied().unwrap_or_else(|| a.scalars[0]);
    let value = cast_like_pytorch(e, value, out.dtype);
    let value = e.broadcast_to(value, &out.shape);
    let x = e.broadcast_to(a.inputs[0], &out.shape);
    let m = e.broadcast_to(a.inputs[1], &out.shape);
    e.select(m, value, x)
}

// ---- rules: each op's meta beside its lowering --------------------------------------------

/// The unary ops (`neg` to `nan_to_num` in the catalogue): one input, the result in its shape.
pub(crate) struct Unary;

impl OpRule for Unary {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        unary_meta(a)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![lower_unary(e, a)?])
    }
}

/// The binary ops: arithmetic, comparisons, logical and bitwise ops on two tensors or a tensor
/// and a scalar, broadcast and promoted together.
pub(crate) struct Binary;

impl OpRule for Binary {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        binary_meta(a)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![lower_binary(e, a)?])
    }
}

/// `where(condition, self, other)`, either value a tensor or a scalar.
pub(crate) struct Where;

impl OpRule for Where {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        where_meta(a)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![lower_where(e, a)?])
    }
}

/// `clamp` with optional tensor or scalar bounds.
pub(crate) struct Clamp;

impl OpRule for Clamp {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        clamp_meta(a)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![lower_clamp(e, a)?])
    }
}

/// `lerp` by a tensor or scalar weight.
pub(crate) struct Lerp;

impl OpRule for Lerp {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        lerp_meta(a)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![lower_lerp(e, a)])
    }
}

/// `addcmul` and `addcdiv`: `self + value * (tensor1 op tensor2)`.
pub(crate) struct Addc;

impl OpRule for Addc {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        addc_meta(a)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![lower_addc(e, a)])
    }
}

/// `masked_fill` by a scalar or a 0-d tensor.
pub(crate) struct MaskedFill;

impl OpRule for MaskedFill {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        masked_fill_meta(a)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![lower_masked_fill(e, a)])
    }
}

/// `torch.complex(real, imag)`.
pub(crate) struct Complex;

impl OpRule for Complex {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        complex_meta(a)
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        let shape = a.out(0).shape.clone();
        let re = e.broadcast_to(a.inputs[0], &shape);
        let im = e.broadcast_to(a.inputs[1], &shape);
        Ok(vec![e.complex(re, im)])
    }
}

/// `_conj_physical`: the complex conjugate, in the input's type.
pub(crate) struct ConjPhysical;

impl OpRule for ConjPhysical {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError> {
        a.expect_counts(1..=1, 0..=0)?;
        Ok(Meta::single(a.inputs[0].clone(), vec![]))
    }

    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
        Ok(vec![e.conj(a.inputs[0])])
    }
}

/// Cast `v` to `dtype` (PyTorch semantics) and broadcast it to `shape`.
pub(crate) fn prep(e: &mut Emitter, v: Value, dtype: DType, shape: &[i64]) -> Value {
    let c = e.cast(v, dtype);
    e.broadcast_to(c, shape)
}

/// The float constant `c` shaped like `like`.
pub(crate) fn k(e: &mut Emitter, like: Value, c: f64) -> Value {
    e.full_like(like, c)
}

/// `x` is NaN.
pub(crate) fn is_nan(e: &mut Emitter, x: Value) -> Value {
    e.compare(Cmp::Ne, x, x)
}

/// Round half to even (`std::nearbyint`).
fn round_even(e: &mut Emitter, x: Value) -> Value {
    e.unary("stablehlo.round_nearest_even", x)
}

fn trunc(e: &mut Emitter, x: Value) -> Value {
    let neg = e.compare_const(Cmp::Lt, x, 0.0);
    let c = e.unary("stablehlo.ceil", x);
    let f = e.floor(x);
    e.select(neg, c, f)
}

/// `erf` in f32 or f64 (the input's dtype).
pub(crate) fn erf(e: &mut Emitter, x: Value) -> Value {
    e.unary("chlo.erf", x)
}

/// The Hurwitz zeta function, with PyTorch's values where XLA's differ, in its kernel's order:
/// inf at `x = 1`; NaN for `x < 1` (XLA gives inf where `q` is 0); a pole (inf) at every `q`
/// that is a non-positive integer (XLA gives NaN for odd `x`); and at `x = +inf`, 1 for `q = 1`,
/// inf for `q < 1` and NaN above (XLA gives NaN).
fn zeta(e: &mut Emitter, x: Value, q: Value) -> Value {
    let z = e.binary("chlo.zeta", x, q);
    let q_floor = e.floor(q);
    let q_integral = e.compare(Cmp::Eq, q, q_floor);
    let q_not_positive = e.compare_const(Cmp::Le, q, 0.0);
    // Not `x > 1`: a NaN `x` has the pole too, as in PyTorch's kernel (it only refuses x < 1).
    let x_below_one = e.compare_const(Cmp::Lt, x, 1.0);
    let x_not_below_one = e.not(x_below_one);
    let pole = e.and(q_integral, q_not_positive);
    let pole = e.and(pole, x_not_below_one);
    let inf = k(e, z, f64::INFINITY);
    let nan = k(e, z, f64::NAN);
    let z = e.select(pole, inf, z);
    let z = e.select(x_below_one, nan, z);
    let x_one = e.compare_const(Cmp::Eq, x, 1.0);
    let z = e.select(x_one, inf, z);
    let x_inf = e.compare_const(Cmp::Eq, x, f64::INFINITY);
    let q_one = e.compare_const(Cmp::Eq, q, 1.0);
    let q_below = e.compare_const(Cmp::Lt, q, 1.0);
    let one = k(e, z, 1.0);
    let below_or_nan = e.select(q_below, inf, nan);
    let at_inf = e.select(q_one, one, below_or_nan);
    e.select(x_inf, at_inf, z)
}

/// `digamma` in the input's float dtype; ±0 gives ∓inf (the limit from zero's side), as PyTorch.
fn digamma(e: &mut Emitter, x: Value) -> Value {
    let d = e.unary("chlo.digamma", x);
    let zero = e.compare_const(Cmp::Eq, x, 0.0);
    let one = k(e, x, 1.0);
    let inv = e.div(one, x);
    let negative_zero = e.compare_const(Cmp::Lt, inv, 0.0);
    let pinf = k(e, x, f64::INFINITY);
    let ninf = k(e, x, f64::NEG_INFINITY);
    let at_zero = e.select(negative_zero, pinf, ninf);
    e.select(zero, at_zero, d)
}

/// Where the power series of `I0` gives way to the asymptotic expansion: below it 50 terms of
/// the series reach float64's precision, above it 30 terms of the expansion do.
const BESSEL_I0_SERIES_LIMIT: f64 = 20.0;

/// `I0(x)`, or `exp(-|x|) I0(x)` when `scaled`: `sum (x^2/4)^n / (n!)^2` for `|x| <= 20`, and
/// `exp(|x|) / sqrt(2 pi |x|) * sum c_j / |x|^j` (`c_j = c_{j-1} (2j-1)^2 / (8j)`) above.
fn bessel_i0(e: &mut Emitter, x: Value, scaled: bool) -> Value {
    let ax = e.abs(x);
    let one = k(e, x, 1.0);
    let quarter = k(e, x, 0.25);
    let squared = e.mul(ax, ax);
    let q = e.mul(squared, quarter);
    // Nested (Horner) form, `1 + q/1^2 (1 + q/2^2 (1 + ...))`: a running product of terms lets
    // XLA's simplifier gather the constants into one, `1/(50!)^2`, which underflows to zero in
    // float32 (and `q^50` overflows), giving 0 * inf.
    let mut series = one;
    for n in (1..=50).rev() {
        let factor = k(e, x, 1.0 / (n * n) as f64);
        let step = e.mul(q, factor);
        let scaled = e.mul(step, series);
        series = e.add(one, scaled);
    }
    let inverse = e.div(one, ax);
    let mut expansion = one;
    for j in (1..=30).rev() {
        let factor = k(e, x, ((2 * j - 1) * (2 * j - 1)) as f64 / (8 * j) as f64);
        let step = e.mul(inverse, factor);
        let scaled = e.mul(step, expansion);
        expansion = e.add(one, scaled);
    }
    let two_pi = k(e, x, 2.0 * std::f64::consts::PI);
    let spread = e.mul(two_pi, ax);
    let large = e.compare_const(Cmp::Gt, ax, BESSEL_I0_SERIES_LIMIT);
    if scaled {
        let root = e.sqrt(spread);
        let expansion = e.div(expansion, root);
        let neg = e.neg(ax);
        let decay = e.exp(neg);
        let series = e.mul(series, decay);
        e.select(large, expansion, series)
    } else {
        // exp(|x|) times the scaled value, as PyTorch's kernel computes it: it overflows where
        // exp(|x|) does (float32 past 88.7), and at infinity is inf * 0, NaN.
        let root = e.sqrt(spread);
        let expansion = e.div(expansion, root);
        let growth = e.exp(ax);
        let expansion = e.mul(growth, expansion);
        e.select(large, expansion, series)
    }
}

fn lower_unary(e: &mut Emitter, a: &LowerArgs) -> Result<Value, OpError> {
    use OpId::*;
    let x = a.inputs[0];
    let out = a.out(0).clone();
    let in_dtype = e.dtype(x);
    if !in_dtype.is_float() {
        // Integer and bool special cases.
        match a.op {
            Floor | Ceil | Trunc | Round | NanToNum => return Ok(x),
            IsNan | IsInf => return Ok(e.constant(out, ScalarValue::Bool(false))),
            Abs if in_dtype == DType::U8 => return Ok(x),
            Sign if in_dtype == DType::Bool => return Ok(x),
            Sign if in_dtype == DType::U8 => {
                let pos = e.compare_const(Cmp::Gt, x, 0.0);
                return Ok(e.convert(pos, DType::U8));
            }
            Relu if in_dtype == DType::U8 => return Ok(x),
            _ => {}
        }
    }
    let v = match a.op {
        LogicalNot => return Ok(e.compare_const(Cmp::Eq, x, 0.0)),
        BitwiseNot => return Ok(e.not(x)),
        IsNan => return Ok(is_nan(e, x)),
        IsInf => {
            let abs = e.abs(x);
            return Ok(e.compare_const(Cmp::Eq, abs, f64::INFINITY));
        }
        Neg => return Ok(e.neg(x)),
        // complex32's device parts are f32: its magnitude is rounded to f16 after.
        Abs if in_dtype == DType::C32 => {
            let m = e.op("stablehlo.abs", &[x], "", out.with_dtype(DType::F32));
            return Ok(e.convert(m, DType::F16));
        }
        Abs if in_dtype.is_complex() => return Ok(e.op("stablehlo.abs", &[x], "", out)),
        Abs if !in_dtype.is_float() => return Ok(e.abs(x)),
        Sign if !in_dtype.is_float() => return Ok(e.unary("stablehlo.sign", x)),
        Relu if !in_dtype.is_float() => {
            let zero = k(e, x, 0.0);
            return Ok(e.max(x, zero));
        }
        NanToNum => return lower_nan_to_num(e, a, x),
        _ => {
            let cd = out.dtype.compute_dtype();
            let xc = e.cast(x, cd);
            unary_float(e, a, xc)?
        }
    };
    Ok(e.convert(v, out.dtype))
}

/// Unary float math on `x` (already in the computation dtype).
fn unary_float(e: &mut Emitter, a: &LowerArgs, x: Value) -> Result<Value, OpError> {
    use OpId::*;
    let cd = e.dtype(x);
    Ok(match a.op {
        Abs => e.abs(x),
        Exp => e.exp(x),
        Exp2 => {
            let two = k(e, x, 2.0);
            e.pow(two, x)
        }
        Log => e.log(x),
        Log2 | Log10 => {
            let l = e.log(x);
            let base: f64 = if a.op == Log2 { 2.0 } else { 10.0 };
            let inv = k(e, x, 1.0 / base.ln());
            e.mul(l, inv)
        }
        Log1p => e.unary("stablehlo.log_plus_one", x),
        Expm1 => e.unary("stablehlo.exponential_minus_one", x),
        Sqrt => e.sqrt(x),
        Rsqrt => {
            // PyTorch computes 1 / sqrt(x).
            let s = e.sqrt(x);
            let one = k(e, x, 1.0);
            e.div(one, s)
        }
        Sin => e.unary("stablehlo.sine", x),
        Cos => e.unary("stablehlo.cosine", x),
        Tan => e.unary("stablehlo.tan", x),
        Tanh => e.unary("stablehlo.tanh", x),
        Sigmoid => sigmoid(e, x),
        Relu => {
            let zero = k(e, x, 0.0);
            e.max(x, zero)
        }
        Gelu => gelu(
            e,
            x,
            layout::GeluApproximate::decode(&a.params)?.approximate == 1,
        ),
        Silu => {
            // x / (1 + exp(-x)), as PyTorch.
            let nx = e.neg(x);
            let ex = e.exp(nx);
            let one = k(e, x, 1.0);
            let den = e.add(one, ex);
            e.div(x, den)
        }
        Erf => erf(e, x),
        Erfc => e.unary("chlo.erfc", x),
        SpecialI1e => e.unary("chlo.bessel_i1e", x),
        I0 => bessel_i0(e, x, false),
        SpecialI0e => bessel_i0(e, x, true),
        Erfinv => e.unary("chlo.erf_inv", x),
        Lgamma => e.unary("chlo.lgamma", x),
        Digamma => digamma(e, x),
        Floor => e.floor(x),
        Ceil => e.unary("stablehlo.ceil", x),
        Trunc => trunc(e, x),
        Round => {
            let decimals = layout::RoundDecimals::decode(&a.params)?.decimals;
            if decimals == 0 {
                round_even(e, x)
            } else {
                let scale = k(e, x, 10f64.powi(decimals.unsigned_abs() as i32));
                if decimals > 0 {
                    let m = e.mul(x, scale);
                    let r = round_even(e, m);
                    e.div(r, scale)
                } else {
                    let d = e.div(x, scale);
                    let r = round_even(e, d);
                    e.mul(r, scale)
                }
            }
        }
        Sign => {
            // (0 < x) - (x < 0): NaN maps to 0, as PyTorch.
            let pos = e.compare_const(Cmp::Gt, x, 0.0);
            let neg = e.compare_const(Cmp::Lt, x, 0.0);
            let p = e.convert(pos, cd);
            let n = e.convert(neg, cd);
            e.sub(p, n)
        }
        Reciprocal => {
            let one = k(e, x, 1.0);
            e.div(one, x)
        }
        op => {
            return Err(OpError::runtime(format!(
                "{}: no float lowering",
                op.name()
            )))
        }
    })
}

pub(crate) fn sigmoid(e: &mut Emitter, x: Value) -> Value {
    e.unary("stablehlo.logistic", x)
}

fn gelu(e: &mut Emitter, x: Value, tanh_approximation: bool) -> Value {
    let half = k(e, x, 0.5);
    let one = k(e, x, 1.0);
    if tanh_approximation {
        // 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
        let beta = k(e, x, (2.0 / std::f64::consts::PI).sqrt());
        let kappa = k(e, x, 0.044715);
        let x2 = e.mul(x, x);
        let x3 = e.mul(x2, x);
        let kx3 = e.mul(kappa, x3);
        let inner = e.add(x, kx3);
        let scaled = e.mul(beta, inner);
        let t = e.unary("stablehlo.tanh", scaled);
        let one_t = e.add(one, t);
        let hx = e.mul(half, x);
        e.mul(hx, one_t)
    } else {
        // x * 0.5 * (1 + erf(x / sqrt(2)))
        let inv_sqrt2 = k(e, x, std::f64::consts::FRAC_1_SQRT_2);
        let xs = e.mul(x, inv_sqrt2);
        let er = erf(e, xs);
        let one_e = e.add(one, er);
        let hx = e.mul(x, half);
        e.mul(hx, one_e)
    }
}

fn lower_nan_to_num(e: &mut Emitter, a: &LowerArgs, x: Value) -> Result<Value, OpError> {
    let dtype = e.dtype(x);
    let p = layout::NanToNum::decode(&a.params)?;
    let value = |bit: i64, given: f64, default: f64| {
        if p.given & bit != 0 {
            given
        } else {
            default
        }
    };
    let nan = value(1, p.nan, 0.0);
    let posinf = value(2, p.posinf, dtype.max_value());
    let neginf = value(4, p.neginf, dtype.min_value());
    let isnan = is_nan(e, x);
    let ispos = e.compare_const(Cmp::Eq, x, f64::INFINITY);
    let isneg = e.compare_const(Cmp::Eq, x, f64::NEG_INFINITY);
    let nan_v = k(e, x, nan);
    let pos_v = k(e, x, posinf);
    let neg_v = k(e, x, neginf);
    let r = e.select(isneg, neg_v, x);
    let r = e.select(ispos, pos_v, r);
    Ok(e.select(isnan, nan_v, r))
}

/// The lowered `(self, other, remaining scalars)` of a binary op.
fn lowered_operands<'a>(a: &'a LowerArgs) -> (Value, Value, &'a [Value]) {
    if a.op == OpId::PowScalarBase {
        (a.scalars[0], a.inputs[0], &[])
    } else if a.inputs.len() == 2 {
        (a.inputs[0], a.inputs[1], a.scalars)
    } else {
        (a.inputs[0], a.scalars[0], &a.scalars[1..])
    }
}

fn lower_binary(e: &mut Emitter, a: &LowerArgs) -> Result<Value, OpError> {
    use OpId::*;
    let out = a.out(0).clone();
    let shape = out.shape.clone();
    let (x, y, rest) = lowered_operands(a);
    if is_logical(a.op) {
        let xb = prep(e, x, DType::Bool, &shape);
        let yb = prep(e, y, DType::Bool, &shape);
        return Ok(match a.op {
            LogicalAnd => e.and(xb, yb),
            LogicalOr => e.or(xb, yb),
            _ => e.xor(xb, yb),
        });
    }
    if is_comparison(a.op) {
        // Compare in the promoted dtype of the operands.
        let common = if a.inputs.len() == 2 {
            let (tx, ty) = (e.ty(x).clone(), e.ty(y).clone());
            result_type(&[Operand::Tensor(&tx), Operand::Tensor(&ty)])
        } else {
            a.meta.scalar_dtypes[0]
        };
        let xc = prep(e, x, common, &shape);
        let yc = prep(e, y, common, &shape);
        let dir = match a.op {
            Eq => Cmp::Eq,
            Ne => Cmp::Ne,
            Lt => Cmp::Lt,
            Le => Cmp::Le,
            Gt => Cmp::Gt,
            _ => Cmp::Ge,
        };
        return Ok(e.compare(dir, xc, yc));
    }
    let cd = out.dtype.compute_dtype();
    let xc = prep(e, x, cd, &shape);
    let yc = prep(e, y, cd, &shape);
    let alpha = rest.first().map(|&s| prep(e, s, cd, &shape));
    let r = match a.op {
        Add | Sub | Rsub => {
            let (lhs, rhs) = if a.op == Rsub { (yc, xc) } else { (xc, yc) };
            let rhs = match alpha {
                Some(al) if cd == DType::Bool => e.and(rhs, al),
                Some(al) => e.mul(rhs, al),
                None => rhs,
            };
            match (a.op, cd) {
                (Add, DType::Bool) => e.or(lhs, rhs),
                (Add, _) => e.add(lhs, rhs),
                _ => e.sub(lhs, rhs),
            }
        }
        Mul if cd == DType::Bool => e.and(xc, yc),
        Mul => e.mul(xc, yc),
        Maximum if cd == DType::Bool => e.or(xc, yc),
        Minimum if cd == DType::Bool => e.and(xc, yc),
        // XLA CPU's fast min/max returns the first operand when the second is NaN; PyTorch's
        // propagate a NaN from either side.
        Maximum | Minimum if cd.is_float() => {
            let m = if a.op == Maximum {
                e.max(xc, yc)
            } else {
                e.min(xc, yc)
            };
            let y_nan = is_nan(e, yc);
            let m = e.select(y_nan, yc, m);
            let x_nan = is_nan(e, xc);
            e.select(x_nan, xc, m)
        }
        Maximum => e.max(xc, yc),
        Minimum => e.min(xc, yc),
        Div => {
            // PyTorch's CPU kernels compute a rounded bf16/f16 division in the reduced dtype,
            // rounding after every step, unless the divisor is a single value (then in f32).
            let divisor_numel = (a.inputs.len() == 2).then(|| e.ty(a.inputs[1]).numel());
            let stepwise = (out.dtype.is_reduced_float() && divisor_numel.is_some_and(|n| n > 1))
                .then_some(out.dtype);
            match layout::DivRounding::decode(&a.params)?.rounding_mode {
                RoundingMode::True => e.div(xc, yc),
                RoundingMode::Trunc if cd.is_float() => {
                    let q = e.div(xc, yc);
                    let q = round_through(e, q, stepwise);
                    trunc(e, q)
                }
                RoundingMode::Trunc => e.div(xc, yc),
                RoundingMode::Floor => floor_divide(e, xc, yc, stepwise),
            }
        }
        Remainder => remainder(e, xc, yc),
        Fmod => e.rem(xc, yc),
        Pow if cd == DType::Bool => {
            // x ** True == x; x ** False == True.
            let not_y = e.not(yc);
            e.or(xc, not_y)
        }
        Pow | PowScalarBase => {
            if cd.is_float() {
                if a.op == Pow && a.inputs.len() == 1 {
                    pow_scalar_exponent(e, xc, yc, PowExponent::from_variant(a.meta.variant)?)
                } else {
                    e.pow(xc, yc)
                }
            } else {
                int_pow(e, xc, yc)
            }
        }
        Atan2 => e.binary("stablehlo.atan2", xc, yc),
        SpecialZeta => zeta(e, xc, yc),
        op if crate::orthogonal::is_orthogonal_polynomial(op) => {
            crate::orthogonal::orthogonal_polynomial(e, op, xc, yc)
        }
        Nextafter => e.binary("chlo.next_after", xc, yc),
        BitwiseAnd => e.and(xc, yc),
        BitwiseOr => e.or(xc, yc),
        BitwiseXor => e.xor(xc, yc),
        // StableHLO's shifts read the amount as unsigned, so a negative amount is out of range
        // too: left shifts give 0 and arithmetic right shifts the sign, as PyTorch's kernels.
        BitwiseLeftShift => e.binary("stablehlo.shift_left", xc, yc),
        BitwiseRightShift if cd == DType::U8 => e.binary("stablehlo.shift_right_logical", xc, yc),
        BitwiseRightShift => e.binary("stablehlo.shift_right_arithmetic", xc, yc),
        op => return Err(OpError::runtime(format!("{}: not a binary op", op.name()))),
    };
    Ok(e.convert(r, out.dtype))
}

/// `v` rounded to `dtype` and back, when given: one step of arithmetic carried out in a reduced
/// float dtype.
fn round_through(e: &mut Emitter, v: Value, dtype: Option<DType>) -> Value {
    match dtype {
        Some(d) => {
            let compute = e.dtype(v);
            let r = e.convert(v, d);
            e.convert(r, compute)
        }
        None => v,
    }
}

/// Python's floor division (`torch.div(..., rounding_mode="floor")`), as PyTorch computes it.
/// With `stepwise`, every intermediate is rounded to that reduced float dtype, as PyTorch's CPU
/// kernel does for bf16/f16 tensors.
pub(crate) fn floor_divide(e: &mut Emitter, a: Value, b: Value, stepwise: Option<DType>) -> Value {
    let dtype = e.dtype(a);
    if dtype.is_float() {
        // mod = fmod(a, b); div = (a - mod) / b; if mod != 0 and sign(b) != sign(mod): div -= 1;
        // floordiv = floor(div) (+1 if div - floor(div) > 0.5); div == 0 -> copysign(0, a / b);
        // b == 0 -> a / b.
        let md = e.rem(a, b);
        let a_m = e.sub(a, md);
        let a_m = round_through(e, a_m, stepwise);
        let div = e.div(a_m, b);
        let div = round_through(e, div, stepwise);
        let mod_nz = e.compare_const(Cmp::Ne, md, 0.0);
        let b_neg = e.compare_const(Cmp::Lt, b, 0.0);
        let m_neg = e.compare_const(Cmp::Lt, md, 0.0);
        let signs_differ = e.xor(b_neg, m_neg);
        let adjust = e.and(mod_nz, signs_differ);
        let one = k(e, a, 1.0);
        let div_m1 = e.sub(div, one);
        let div_m1 = round_through(e, div_m1, stepwise);
        let div = e.select(adjust, div_m1, div);
        let fl = e.floor(div);
        let frac = e.sub(div, fl);
        let frac = round_through(e, frac, stepwise);
        let big = e.compare_const(Cmp::Gt, frac, 0.5);
        let fl_p1 = e.add(fl, one);
        let fl_p1 = round_through(e, fl_p1, stepwise);
        let floordiv = e.select(big, fl_p1, fl);
        let q = e.div(a, b);
        let q = round_through(e, q, stepwise);
        let zero = k(e, a, 0.0);
        let signed_zero = copysign(e, zero, q);
        let div_zero = e.compare_const(Cmp::Eq, div, 0.0);
        let r = e.select(div_zero, signed_zero, floordiv);
        let b_zero = e.compare_const(Cmp::Eq, b, 0.0);
        e.select(b_zero, q, r)
    } else if dtype == DType::U8 {
        e.div(a, b)
    } else {
        // Truncating quotient, minus one when the signs differ and the division is inexact.
        let q = e.div(a, b);
        let r = e.rem(a, b);
        let a_neg = e.compare_const(Cmp::Lt, a, 0.0);
        let b_neg = e.compare_const(Cmp::Lt, b, 0.0);
        let differ = e.xor(a_neg, b_neg);
        let r_nz = e.compare_const(Cmp::Ne, r, 0.0);
        let adjust = e.and(differ, r_nz);
        let one = k(e, a, 1.0);
        let q_m1 = e.sub(q, one);
        e.select(adjust, q_m1, q)
    }
}

/// `copysign(mag, sign)` for floats: the magnitude of `mag` with the sign bit of `sign`.
pub(crate) fn copysign(e: &mut Emitter, mag: Value, sign: Value) -> Value {
    let dtype = e.dtype(mag);
    let bits = match dtype.size_bytes() {
        2 => DType::I16,
        4 => DType::I32,
        _ => DType::I64,
    };
    let ty = e.ty(mag).with_dtype(bits);
    let mb = e.op("stablehlo.bitcast_convert", &[mag], "", ty.clone());
    let sb = e.op("stablehlo.bitcast_convert", &[sign], "", ty.clone());
    let sign_mask = e.constant(
        ty.clone(),
        ScalarValue::Int(i64::MIN >> (64 - 8 * dtype.size_bytes())),
    );
    let mag_mask = e.not(sign_mask);
    let m = e.and(mb, mag_mask);
    let s = e.and(sb, sign_mask);
    let r = e.or(m, s);
    let out_ty = e.ty(mag).clone();
    e.op("stablehlo.bitcast_convert", &[r], "", out_ty)
}

/// Python's modulo: the result has the divisor's sign.
pub(crate) fn remainder(e: &mut Emitter, a: Value, b: Value) -> Value {
    let m = e.rem(a, b);
    if e.dtype(a) == DType::U8 {
        return m;
    }
    let m_nz = e.compare_const(Cmp::Ne, m, 0.0);
    let m_neg = e.compare_const(Cmp::Lt, m, 0.0);
    let b_neg = e.compare_const(Cmp::Lt, b, 0.0);
    let differ = e.xor(m_neg, b_neg);
    let adjust = e.and(m_nz, differ);
    let mb = e.add(m, b);
    e.select(adjust, mb, m)
}

/// `x ** y` for a scalar exponent `y`, lifted to a runtime value: the special values PyTorch's
/// kernels compute another way were picked at capture (see [`PowExponent`]), so only a general
/// exponent reaches `power`.
fn pow_scalar_exponent(e: &mut Emitter, x: Value, y: Value, exponent: PowExponent) -> Value {
    match exponent {
        PowExponent::General => e.pow(x, y),
        PowExponent::Square => e.mul(x, x),
        PowExponent::Cube => {
            let sq = e.mul(x, x);
            e.mul(sq, x)
        }
        PowExponent::Sqrt => e.sqrt(x),
        PowExponent::Rsqrt => {
            let sqrt = e.sqrt(x);
            let one = k(e, x, 1.0);
            e.div(one, sqrt)
        }
        PowExponent::Reciprocal => {
            let one = k(e, x, 1.0);
            e.div(one, x)
        }
        PowExponent::ReciprocalSquare => {
            let sq = e.mul(x, x);
            let one = k(e, x, 1.0);
            e.div(one, sq)
        }
        PowExponent::Identity => x,
        PowExponent::Zero => k(e, x, 1.0),
    }
}

/// Integer power by squaring semantics; negative exponents give 0 except for bases 1 and -1.
fn int_pow(e: &mut Emitter, x: Value, y: Value) -> Value {
    let p = e.pow(x, y);
    if e.dtype(x) == DType::U8 {
        return p;
    }
    let one = k(e, x, 1.0);
    let zero = k(e, x, 0.0);
    let minus_one = k(e, x, -1.0);
    let y_neg = e.compare(Cmp::Lt, y, zero);
    let base_one = e.compare(Cmp::Eq, x, one);
    let base_m1 = e.compare(Cmp::Eq, x, minus_one);
    let two = k(e, x, 2.0);
    let parity = e.rem(y, two);
    let odd = e.compare(Cmp::Ne, parity, zero);
    let m1_pow = e.select(odd, minus_one, one);
    let neg = e.select(base_m1, m1_pow, zero);
    let neg = e.select(base_one, one, neg);
    e.select(y_neg, neg, p)
}

fn lower_where(e: &mut Emitter, a: &LowerArgs) -> Result<Value, OpError> {
    let out = a.out(0).clone();
    let kinds = where_kinds(a.inputs.len(), &a.params)?;
    let (mut ni, mut ns) = (1, 0);
    let mut vals = Vec::new();
    for kind in kinds {
        if kind == OperandKind::Tensor {
            vals.push(a.inputs[ni]);
            ni += 1;
        } else {
            vals.push(a.scalars[ns]);
            ns += 1;
        }
    }
    let cond = prep(e, a.inputs[0], DType::Bool, &out.shape);
    let x = prep(e, vals[0], out.dtype, &out.shape);
    let y = prep(e, vals[1], out.dtype, &out.shape);
    Ok(e.select(cond, x, y))
}

fn lower_clamp(e: &mut Emitter, a: &LowerArgs) -> Result<Value, OpError> {
    let out = a.out(0).clone();
    let cd = out.dtype.compute_dtype();
    let kinds = clamp_kinds(&a.params)?;
    let (mut ni, mut ns) = (1, 0);
    let mut bounds = Vec::new();
    for kind in kinds {
        bounds.push(match kind {
            OperandKind::Absent => None,
            OperandKind::Tensor => {
                ni += 1;
                Some(a.inputs[ni - 1])
            }
            OperandKind::Scalar => {
                ns += 1;
                Some(a.scalars[ns - 1])
            }
        });
    }
    let mut x = prep(e, a.inputs[0], cd, &out.shape);
    // min(max(x, lo), hi), NaN-propagating as PyTorch's clamp: a NaN bound gives NaN, which
    // XLA CPU's max and min do not (they return the other operand). On bool, max is `or`, min
    // `and`.
    if let Some(lo) = bounds[0] {
        let lo = prep(e, lo, cd, &out.shape);
        x = if cd == DType::Bool {
            e.or(x, lo)
        } else {
            let clamped = e.max(x, lo);
            nan_from(e, lo, clamped, cd)
        };
    }
    if let Some(hi) = bounds[1] {
        let hi = prep(e, hi, cd, &out.shape);
        x = if cd == DType::Bool {
            e.and(x, hi)
        } else {
            let clamped = e.min(x, hi);
            nan_from(e, hi, clamped, cd)
        };
    }
    Ok(e.convert(x, out.dtype))
}

/// `value`, or `bound` where `bound` is NaN (float dtypes only).
fn nan_from(e: &mut Emitter, bound: Value, value: Value, dtype: DType) -> Value {
    if !dtype.is_float() {
        return value;
    }
    let nan = is_nan(e, bound);
    e.select(nan, bound, value)
}

fn lower_lerp(e: &mut Emitter, a: &LowerArgs) -> Value {
    let out = a.out(0).clone();
    let cd = out.dtype.compute_dtype();
    let w = if a.inputs.len() == 3 {
        a.inputs[2]
    } else {
        a.scalars[0]
    };
    let s = prep(e, a.inputs[0], cd, &out.shape);
    let t = prep(e, a.inputs[1], cd, &out.shape);
    let w = prep(e, w, cd, &out.shape);
    // PyTorch: |w| < 0.5 ? self + w * (end - self) : end - (end - self) * (1 - w).
    let diff = e.sub(t, s);
    let wd = e.mul(w, diff);
    let low = e.add(s, wd);
    let one = k(e, w, 1.0);
    let one_w = e.sub(one, w);
    let d1w = e.mul(diff, one_w);
    let high = e.sub(t, d1w);
    let aw = e.abs(w);
    let small = e.compare_const(Cmp::Lt, aw, 0.5);
    let r = e.select(small, low, high);
    e.convert(r, out.dtype)
}

fn lower_addc(e: &mut Emitter, a: &LowerArgs) -> Value {
    let out = a.out(0).clone();
    let cd = out.dtype.compute_dtype();
    let x = prep(e, a.inputs[0], cd, &out.shape);
    let t1 = prep(e, a.inputs[1], cd, &out.shape);
    let t2 = prep(e, a.inputs[2], cd, &out.shape);
    let prod = if a.op == OpId::Addcmul {
        e.mul(t1, t2)
    } else {
        e.div(t1, t2)
    };
    let scaled = match a.scalars.first() {
        Some(&v) => {
            let v = prep(e, v, cd, &out.shape);
            e.mul(v, prod)
        }
        None => prod,
    };
    let r = e.add(x, scaled);
    e.convert(r, out.dtype)
}
