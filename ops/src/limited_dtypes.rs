//! Dtypes PyTorch stores everywhere but computes on with few ops: the wide unsigned integers
//! (uint16, uint32, uint64) and complex32 (`torch.chalf`). Each has a row in [`LIMITED`]: the
//! ops that read and make it, the ops that only read it, and how PyTorch words the error. An op
//! outside its row's lists refuses such an operand or result with `NotImplementedError`, so the
//! plugin runs the call on the CPU, which computes it or raises PyTorch's own error.
//!
//! - Wide unsigned: PyTorch's CPU kernels' "barebones unsigned" set (copies and casts, fills,
//!   comparisons for equality, bitwise logic, products, true division, sums, sorting, joins and
//!   advanced indexing; not `index_select`, `gather`, `masked_select` or `masked_fill`). PyTorch
//!   promotes them with no other integer type: a promotion it refuses raises its `RuntimeError`
//!   ([`note_refused_promotion`]).
//! - complex32: PyTorch's CUDA backend computes few ops on it, in complex64 with each part rounded
//!   to f16 after; the engine does the same (`DType::C32` is complex64 on the device, rounded by
//!   `Emitter::convert`).

use std::cell::Cell;

use crate::{DType, OpError, OpId, TensorType};

/// A dtype (or family of dtypes) with a limited op set.
struct LimitedDtype {
    /// The dtypes of the row.
    dtypes: fn(DType) -> bool,
    /// Ops whose lowering is right for operands and results of these dtypes.
    read_and_made: &'static [OpId],
    /// Ops that read these dtypes into results of another dtype; PyTorch refuses a result of
    /// these dtypes for them.
    read_only: &'static [OpId],
    /// The CPU kernel PyTorch names when asked for a result of these dtypes through a dtype
    /// argument of an op that reads them (`sum(dtype=torch.uint16)`): no operand has the dtype,
    /// so the plugin does not send the call to the CPU, and the engine words PyTorch's error.
    made_by_dtype_argument: &'static [(OpId, &'static str)],
}

/// Checked in this order: the first row whose dtype an op may not take gives the error.
const LIMITED: &[LimitedDtype] = &[
    LimitedDtype {
        dtypes: DType::is_wide_unsigned,
        // Wrapping arithmetic, unsigned comparisons and conversions, as the CPU's kernels.
        read_and_made: &[
            OpId::Mul,
            OpId::BitwiseAnd,
            OpId::BitwiseOr,
            OpId::BitwiseXor,
            OpId::Where,
            OpId::NanToNum,
            OpId::Convert,
            OpId::Clone,
            OpId::Copy,
            OpId::Fill,
            OpId::Full,
            OpId::Zeros,
            OpId::Ones,
            OpId::RandomInt,
            OpId::Cat,
            OpId::Stack,
            OpId::Roll,
            OpId::Repeat,
            OpId::ConstantPadNd,
            OpId::Expand,
            OpId::Reshape,
            OpId::Permute,
            OpId::Transpose,
            OpId::Slice,
            OpId::Select,
            OpId::Sort,
            OpId::Index,
        ],
        // int64 sums, bool comparisons, float quotients.
        read_only: &[
            OpId::Sum,
            OpId::Prod,
            OpId::Cumsum,
            OpId::Any,
            OpId::All,
            OpId::Eq,
            OpId::Ne,
            OpId::Div,
            OpId::IsNan,
            OpId::IsInf,
        ],
        made_by_dtype_argument: &[
            (OpId::Sum, "sum_cpu"),
            (OpId::Prod, "prod_out_cpu"),
            (OpId::Cumsum, "cumsum_out_cpu"),
        ],
    },
    LimitedDtype {
        dtypes: is_complex32,
        read_and_made: &[
            OpId::Add,
            OpId::Sub,
            OpId::Rsub,
            OpId::Mul,
            OpId::Div,
            OpId::Neg,
            OpId::ConjPhysical,
            OpId::Where,
            OpId::Convert,
            OpId::Clone,
            OpId::Copy,
            OpId::Fill,
            OpId::Full,
            OpId::Zeros,
            OpId::Ones,
            OpId::Cat,
            OpId::Stack,
            OpId::Expand,
            OpId::Reshape,
            OpId::Permute,
            OpId::Transpose,
            OpId::Slice,
            OpId::Select,
            // Advanced indexing moves elements (CUDA's kernels take complex32 too); an
            // accumulating `index_put` adds in complex64 and rounds, as every op above.
            OpId::Index,
            OpId::IndexPut,
            OpId::IndexSelect,
            OpId::Roll,
        ],
        // float16 magnitudes, bool comparisons.
        read_only: &[OpId::Abs, OpId::Eq, OpId::Ne],
        made_by_dtype_argument: &[],
    },
];

fn is_complex32(dtype: DType) -> bool {
    dtype == DType::C32
}

impl LimitedDtype {
    fn allows(&self, op: OpId, made: bool) -> bool {
        self.read_and_made.contains(&op) || (!made && self.read_only.contains(&op))
    }

    fn refuse(&self, op: OpId, types: &[TensorType], made: bool) -> Result<(), OpError> {
        if self.allows(op, made) {
            return Ok(());
        }
        let Some(t) = types.iter().find(|t| (self.dtypes)(t.dtype)) else {
            return Ok(());
        };
        let dtype = t.dtype.scalar_type_name();
        let kernel = self
            .made_by_dtype_argument
            .iter()
            .find(|(listed, _)| *listed == op)
            .map(|(_, kernel)| kernel);
        Err(OpError::not_implemented(match kernel {
            Some(kernel) if made => format!("\"{kernel}\" not implemented for '{dtype}'"),
            _ => format!("\"{}\" is not implemented for '{dtype}' on pjrt", op.name()),
        }))
    }
}

/// `NotImplementedError` when `op` reads (`made` false) or makes a tensor of a limited dtype
/// that its row does not list `op` for.
pub(crate) fn refuse(op: OpId, types: &[TensorType], made: bool) -> Result<(), OpError> {
    LIMITED
        .iter()
        .try_for_each(|row| row.refuse(op, types, made))
}

thread_local! {
    /// The first pair of dtypes `promote_types` could not promote during the current meta.
    static REFUSED: Cell<Option<(DType, DType)>> = const { Cell::new(None) };
}

/// Records that `a` and `b` have no promotion in PyTorch (one of them wide unsigned).
pub(crate) fn note_refused_promotion(a: DType, b: DType) {
    REFUSED.with(|r| {
        if r.get().is_none() {
            r.set(Some((a, b)));
        }
    });
}

/// Forgets a refusal left by an earlier computation on this thread.
pub(crate) fn clear_refused_promotion() {
    REFUSED.with(|r| r.set(None));
}

/// PyTorch's error for the first promotion refused since the last clear, if any.
pub(crate) fn take_refused_promotion() -> Result<(), OpError> {
    match REFUSED.with(|r| r.take()) {
        Some((a, b)) => Err(OpError::runtime(format!(
            "Promotion for uint16, uint32, uint64 types is not supported, attempted to promote {} and {}",
            a.scalar_type_name(),
            b.scalar_type_name()
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use crate::{meta, DType, ErrorKind, OpId, ScalarArg, TensorType};

    #[test]
    fn no_op_is_listed_twice_in_a_row() {
        for row in super::LIMITED {
            for op in row.read_only {
                assert!(!row.read_and_made.contains(op), "{op:?}");
            }
            for (op, _) in row.made_by_dtype_argument {
                assert!(row.read_only.contains(op), "{op:?}");
            }
        }
    }

    fn t(dtype: DType, shape: &[i64]) -> TensorType {
        TensorType::new(dtype, shape)
    }

    #[test]
    fn listed_ops_take_wide_unsigned_values_and_others_refuse_them() {
        let u = t(DType::U32, &[3]);
        let m = meta(OpId::Mul, &[u.clone(), u.clone()], &[], &[]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::U32);
        let m = meta(OpId::Sum, std::slice::from_ref(&u), &[], &[0, -1]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::I64);
        let m = meta(OpId::Div, &[u.clone(), u.clone()], &[], &[]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::F32);
        let err = meta(OpId::Add, &[u.clone(), u.clone()], &[], &[]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotImplemented);
        assert_eq!(
            err.message,
            "\"add\" is not implemented for 'UInt32' on pjrt"
        );
        // A sum may read uint16 but not make it, and says so as PyTorch's CPU kernel does.
        let err = meta(
            OpId::Sum,
            &[t(DType::I64, &[3])],
            &[],
            &[0, DType::U16.code() as i64],
        )
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotImplemented);
        assert_eq!(err.message, "\"sum_cpu\" not implemented for 'UInt16'");
    }

    #[test]
    fn promotion_with_other_integers_is_refused_as_pytorch_does() {
        let u = t(DType::U16, &[3]);
        let err = meta(OpId::Mul, &[u.clone(), t(DType::I64, &[3])], &[], &[]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Runtime);
        assert_eq!(
            err.message,
            "Promotion for uint16, uint32, uint64 types is not supported, attempted to promote UInt16 and Long"
        );
        // Floats promote; a 0-d integer tensor and a Python int keep the dimensioned dtype.
        let m = meta(OpId::Mul, &[u.clone(), t(DType::F16, &[3])], &[], &[]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::F16);
        let m = meta(OpId::Mul, &[u.clone(), t(DType::I64, &[])], &[], &[]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::U16);
        let m = meta(
            OpId::Eq,
            std::slice::from_ref(&u),
            &[ScalarArg::int(-1)],
            &[],
        )
        .unwrap();
        assert_eq!(m.outputs[0].dtype, DType::Bool);
        // The refusal does not outlive its op.
        let m = meta(
            OpId::Mul,
            &[t(DType::I64, &[3]), t(DType::I32, &[3])],
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(m.outputs[0].dtype, DType::I64);
    }

    #[test]
    fn listed_ops_take_complex32_and_others_refuse_it() {
        let c = TensorType::new(DType::C32, &[3]);
        let m = meta(OpId::Mul, &[c.clone(), c.clone()], &[], &[]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::C32);
        let m = meta(OpId::Abs, std::slice::from_ref(&c), &[], &[]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::F16);
        let err = meta(OpId::Exp, std::slice::from_ref(&c), &[], &[]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotImplemented);
        assert_eq!(
            err.message,
            "\"exp\" is not implemented for 'ComplexHalf' on pjrt"
        );
    }

    #[test]
    fn float16_with_a_complex_zero_dim_tensor_promotes_to_complex32() {
        let h = TensorType::new(DType::F16, &[3]);
        let z = TensorType::scalar(DType::C64);
        let m = meta(OpId::Add, &[h, z], &[ScalarArg::int(1)], &[]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::C32);
    }
}
