//! PyTorch's type promotion (`torch.result_type`) and broadcasting rules.

use crate::dtype::{DType, ScalarArg, Shape, TensorType};
use crate::error::OpError;

/// `torch.promote_types`: the smallest dtype both values fit in.
pub fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    match (a, b) {
        // PyTorch promotes uint16, uint32 and uint64 only to floats; `ops::meta` raises its
        // error for any other pair after the op's meta (see `crate::limited_dtypes`).
        (x, y) if x.is_wide_unsigned() || y.is_wide_unsigned() => {
            if x.is_float() {
                x
            } else if y.is_float() {
                y
            } else {
                crate::limited_dtypes::note_refused_promotion(a, b);
                a
            }
        }
        (Bool, x) | (x, Bool) => x,
        // A complex dtype wide enough for both: complex64 with float64 is complex128, complex32
        // with float32 or bfloat16 is complex64, with float16 or an integer complex32.
        (x, y) if x.is_complex() || y.is_complex() => {
            let wider = |d: DType| matches!(d, C64 | F32 | BF16);
            if x == C128 || y == C128 || x == F64 || y == F64 {
                C128
            } else if wider(x) || wider(y) {
                C64
            } else {
                C32
            }
        }
        (F16, BF16) | (BF16, F16) => F32,
        (x, y) if x.is_float() && y.is_float() => float_rank_max(x, y),
        (x, y) if x.is_float() => {
            let _ = y;
            x
        }
        (x, y) if y.is_float() => {
            let _ = x;
            y
        }
        // Both integral.
        (U8, I8) | (I8, U8) => I16,
        (U8, x) | (x, U8) => x,
        (x, y) => {
            if x.size_bytes() >= y.size_bytes() {
                x
            } else {
                y
            }
        }
    }
}

fn float_rank_max(x: DType, y: DType) -> DType {
    let rank = |d: DType| match d {
        DType::F16 | DType::BF16 => 0,
        DType::F32 => 1,
        _ => 2,
    };
    if rank(x) >= rank(y) {
        x
    } else {
        y
    }
}

/// One operand of a type-promoting op.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    Tensor(&'a TensorType),
    Scalar(&'a ScalarArg),
}

/// `c10::ResultTypeState`: the running promotion over dimensioned tensors, 0-d tensors and
/// wrapped numbers, each kept apart.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResultTypeState {
    dim_result: Option<DType>,
    zero_dim_result: Option<DType>,
    wrapped_result: Option<DType>,
}

fn promote_opt(a: Option<DType>, b: DType) -> Option<DType> {
    Some(match a {
        None => b,
        Some(a) => promote_types(a, b),
    })
}

/// The higher-priority result wins unless the lower one is of a higher category.
fn combine_categories(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    let Some(h) = higher else { return lower };
    if h.is_complex() {
        return Some(h);
    }
    if let Some(l) = lower.filter(|l| l.is_complex()) {
        // A float keeps its width in the complex result; an integer takes the complex dtype.
        // (`c10::toComplexType`: float16 gives complex32.)
        return Some(match h {
            DType::F16 => DType::C32,
            h if h.is_float() => h.to_complex(),
            _ => l,
        });
    }
    if h.is_float() {
        return Some(h);
    }
    match lower {
        Some(l) if h == DType::Bool || l.is_float() => Some(promote_types(h, l)),
        _ => Some(h),
    }
}

impl ResultTypeState {
    pub fn tensor(mut self, t: &TensorType) -> Self {
        if t.rank() == 0 {
            self.zero_dim_result = promote_opt(self.zero_dim_result, t.dtype);
        } else {
            self.dim_result = promote_opt(self.dim_result, t.dtype);
        }
        self
    }

    pub fn scalar(mut self, s: &ScalarArg) -> Self {
        match s.tensor_dtype {
            Some(d) => self.zero_dim_result = promote_opt(self.zero_dim_result, d),
            None => self.wrapped_result = promote_opt(self.wrapped_result, s.own_dtype()),
        }
        self
    }

    pub fn operand(self, o: Operand<'_>) -> Self {
        match o {
            Operand::Tensor(t) => self.tensor(t),
            Operand::Scalar(s) => self.scalar(s),
        }
    }

    pub fn result(self) -> Option<DType> {
        combine_categories(
            self.dim_result,
            combine_categories(self.zero_dim_result, self.wrapped_result),
        )
    }
}

/// `torch.result_type` over a list of operands.
pub fn result_type(operands: &[Operand<'_>]) -> DType {
    operands
        .iter()
        .fold(ResultTypeState::default(), |s, o| s.operand(*o))
        .result()
        .unwrap_or_else(DType::default_float)
}

/// Integer and bool results of "float ops" (true division, sqrt, ...) become the default dtype.
pub fn to_float(d: DType) -> DType {
    if d.is_float() || d.is_complex() {
        d
    } else {
        DType::default_float()
    }
}

/// Broadcast two shapes, with PyTorch's error message.
pub fn broadcast_shapes(a: &[i64], b: &[i64]) -> Result<Shape, OpError> {
    let n = a.len().max(b.len());
    let mut out = Shape::from_elem(1, n);
    for i in 0..n {
        let da = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let db = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(OpError::runtime(format!(
                "The size of tensor a ({da}) must match the size of tensor b ({db}) at non-singleton dimension {i}"
            )));
        };
    }
    Ok(out)
}

/// Broadcast all tensor operands' shapes (scalars are 0-d).
pub fn broadcast_all<'a>(shapes: impl IntoIterator<Item = &'a [i64]>) -> Result<Shape, OpError> {
    let mut out = Shape::new();
    for s in shapes {
        // Same shapes and 0-d operands, the common cases, need no new shape.
        if s.is_empty() || s == out.as_slice() {
            continue;
        }
        out = if out.is_empty() {
            Shape::from_slice(s)
        } else {
            broadcast_shapes(&out, s)?
        };
    }
    Ok(out)
}

/// Whether PyTorch's `checked_convert` accepts storing `value` in `dtype` (as `fill_` and
/// `full` check): floats must be finite and in range for integers, in range (or infinite/NaN)
/// for floats; negative integers down to `-max` may wrap into unsigned types.
pub fn fits_in(value: crate::dtype::ScalarValue, dtype: DType) -> bool {
    use crate::dtype::ScalarValue;
    match value {
        ScalarValue::Bool(_) => true,
        _ if dtype == DType::Bool => true,
        ScalarValue::Int(i) if dtype.is_integral(false) => {
            let max = dtype.max_value() as i128;
            let i = i as i128;
            if !dtype.is_signed_int() {
                i <= max && -i <= max
            } else {
                i >= dtype.min_value() as i128 && i <= max
            }
        }
        ScalarValue::Int(i) => (i as f64).abs() <= dtype.max_value(),
        ScalarValue::Float(f) => {
            if dtype.is_float() || dtype.is_complex() {
                !f.is_finite() || (f >= dtype.min_value() && f <= dtype.max_value())
            } else {
                f.is_finite() && f >= dtype.min_value() && f <= dtype.max_value()
            }
        }
    }
}

/// PyTorch's overflow error for a value that does not fit `dtype`.
pub fn check_fits(value: crate::dtype::ScalarValue, dtype: DType) -> Result<(), OpError> {
    if fits_in(value, dtype) {
        Ok(())
    } else {
        Err(OpError::runtime(format!(
            "value cannot be converted to type {} without overflow",
            dtype.cpp_type_name()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::ScalarValue;

    #[test]
    fn integer_results_of_float_ops_take_the_scoped_default() {
        let int = TensorType::new(DType::I64, &[2]);
        assert_eq!(to_float(DType::I64), DType::F32);
        {
            let _f64 = crate::scoped_default_float(DType::F64);
            assert_eq!(to_float(DType::I64), DType::F64);
            assert_eq!(to_float(DType::F16), DType::F16);
            assert_eq!(ScalarArg::float(2.5).own_dtype(), DType::F64);
            let m = crate::meta(crate::OpId::Sqrt, std::slice::from_ref(&int), &[], &[]).unwrap();
            assert_eq!(m.outputs[0].dtype, DType::F64);
            assert_eq!(m.float_default, Some(DType::F64));
            // An integer tensor times a Python float, and compared with one.
            let scalar = [ScalarArg::float(2.5)];
            let m = crate::meta(crate::OpId::Mul, std::slice::from_ref(&int), &scalar, &[]);
            assert_eq!(m.unwrap().outputs[0].dtype, DType::F64);
        }
        // The guard restores float32, and float32 metas record nothing.
        assert_eq!(to_float(DType::Bool), DType::F32);
        let m = crate::meta(crate::OpId::Sqrt, &[int], &[], &[]).unwrap();
        assert_eq!((m.outputs[0].dtype, m.float_default), (DType::F32, None));
    }

    #[test]
    fn promotion_lattice() {
        assert_eq!(promote_types(DType::U8, DType::I8), DType::I16);
        assert_eq!(promote_types(DType::BF16, DType::F16), DType::F32);
        assert_eq!(promote_types(DType::I64, DType::F16), DType::F16);
        assert_eq!(promote_types(DType::Bool, DType::U8), DType::U8);
    }

    #[test]
    fn complex_promotion() {
        assert_eq!(promote_types(DType::C64, DType::F64), DType::C128);
        assert_eq!(promote_types(DType::F16, DType::C64), DType::C64);
        assert_eq!(promote_types(DType::I64, DType::C64), DType::C64);
        assert_eq!(promote_types(DType::C64, DType::C128), DType::C128);
        assert_eq!(promote_types(DType::F16, DType::C32), DType::C32);
        assert_eq!(promote_types(DType::I64, DType::C32), DType::C32);
        assert_eq!(promote_types(DType::BF16, DType::C32), DType::C64);
        assert_eq!(promote_types(DType::F32, DType::C32), DType::C64);
        assert_eq!(promote_types(DType::C32, DType::F64), DType::C128);
        let f64_tensor = TensorType::new(DType::F64, &[3]);
        let i32_tensor = TensorType::new(DType::I32, &[3]);
        let c64_zero_d = TensorType::scalar(DType::C64);
        // A 0-d complex operand raises the category, keeping the float operand's width.
        assert_eq!(
            result_type(&[Operand::Tensor(&f64_tensor), Operand::Tensor(&c64_zero_d)]),
            DType::C128
        );
        assert_eq!(
            result_type(&[Operand::Tensor(&i32_tensor), Operand::Tensor(&c64_zero_d)]),
            DType::C64
        );
        let c128 = TensorType::new(DType::C128, &[3]);
        let zero_d_f32 = ScalarArg::tensor(ScalarValue::Float(1.0), DType::F32);
        assert_eq!(
            result_type(&[Operand::Tensor(&c128), Operand::Scalar(&zero_d_f32)]),
            DType::C128
        );
    }

    #[test]
    fn dimensioned_tensors_win_within_a_category() {
        let t = TensorType::new(DType::I32, &[3]);
        let zero_d = ScalarArg::tensor(ScalarValue::Float(1.0), DType::F64);
        let number = ScalarArg::float(1.0);
        assert_eq!(
            result_type(&[Operand::Tensor(&t), Operand::Scalar(&zero_d)]),
            DType::F64
        );
        assert_eq!(
            result_type(&[Operand::Tensor(&t), Operand::Scalar(&number)]),
            DType::F32
        );
        assert_eq!(
            result_type(&[Operand::Tensor(&t), Operand::Scalar(&ScalarArg::int(5))]),
            DType::I32
        );
    }

    #[test]
    fn broadcast_error_reads_like_pytorch() {
        let err = broadcast_shapes(&[2, 3], &[4]).unwrap_err();
        assert_eq!(
            err.message,
            "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1"
        );
    }
}
