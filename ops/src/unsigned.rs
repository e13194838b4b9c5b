//! uint16, uint32 and uint64: PyTorch stores them everywhere but computes on them with few ops
//! (its CPU kernels' "barebones unsigned" set: copies and casts, fills, comparisons for
//! equality, bitwise logic, products, true division, sums, sorting, joins and advanced
//! indexing; not `index_select`, `gather`, `masked_select` or `masked_fill`) and
//! promotes them with no other integer type. The engine follows it: an op outside these lists
//! refuses a wide unsigned operand or result with `NotImplementedError`, so the plugin runs the
//! call on the CPU, which raises PyTorch's own error for it (or computes it, where a later
//! PyTorch supports it); a promotion PyTorch refuses raises its `RuntimeError`.

use std::cell::Cell;

use crate::{DType, OpError, OpId, TensorType};

/// Ops whose lowering is right for wide unsigned operands and results (wrapping arithmetic,
/// unsigned comparisons and conversions, as the CPU's kernels).
const READ_AND_MADE: &[OpId] = &[
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
];

/// Ops that read wide unsigned operands into results of another dtype (int64 sums, bool
/// comparisons, float quotients); PyTorch refuses a wide unsigned result for them (`sum(dtype=
/// torch.uint16)`).
const READ_ONLY: &[OpId] = &[
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
];

/// Whether `op` may read wide unsigned operands.
pub fn reads_wide_unsigned(op: OpId) -> bool {
    READ_AND_MADE.contains(&op) || READ_ONLY.contains(&op)
}

/// Whether `op` may make wide unsigned results.
pub fn makes_wide_unsigned(op: OpId) -> bool {
    READ_AND_MADE.contains(&op)
}

/// PyTorch's message for a kernel without a dtype, when `op` reads (`made` false) or makes a
/// wide unsigned tensor it is not listed for.
pub(crate) fn refuse(op: OpId, types: &[TensorType], made: bool) -> Result<(), OpError> {
    let allowed = if made {
        makes_wide_unsigned(op)
    } else {
        reads_wide_unsigned(op)
    };
    if allowed {
        return Ok(());
    }
    let Some(t) = types.iter().find(|t| t.dtype.is_wide_unsigned()) else {
        return Ok(());
    };
    let dtype = t.dtype.scalar_type_name();
    Err(OpError::not_implemented(
        match cpu_kernel_made_by_dtype_argument(op) {
            Some(kernel) if made => format!("\"{kernel}\" not implemented for '{dtype}'"),
            _ => format!("\"{}\" is not implemented for '{dtype}' on pjrt", op.name()),
        },
    ))
}

/// The CPU kernel PyTorch names when asked for a wide unsigned result through a dtype argument
/// of an op that reads them (`sum(dtype=torch.uint16)`): no operand is unsigned, so the plugin
/// does not send the call to the CPU, and the engine words PyTorch's error itself.
fn cpu_kernel_made_by_dtype_argument(op: OpId) -> Option<&'static str> {
    match op {
        OpId::Sum => Some("sum_cpu"),
        OpId::Prod => Some("prod_out_cpu"),
        OpId::Cumsum => Some("cumsum_out_cpu"),
        _ => None,
    }
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
}
