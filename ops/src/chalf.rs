//! complex32 (`torch.chalf`): PyTorch's CUDA backend computes few ops on it, in complex64 with
//! each part rounded to f16 after; the engine does the same (`DType::C32` is complex64 on the
//! device, rounded by `Emitter::convert`). An op outside these lists refuses a complex32 operand
//! or result with `NotImplementedError`, so the plugin runs the call on the CPU, which computes
//! it or raises PyTorch's own error.

use crate::{DType, OpError, OpId, TensorType};

/// Ops that read complex32 operands and make complex32 results.
const READ_AND_MADE: &[OpId] = &[
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
];

/// Ops that read complex32 operands into results of another dtype (float16 magnitudes, bool
/// comparisons).
const READ_ONLY: &[OpId] = &[OpId::Abs, OpId::Eq, OpId::Ne];

/// `NotImplementedError` when `op` reads (`made` false) or makes a complex32 tensor it is not
/// listed for.
pub(crate) fn refuse(op: OpId, types: &[TensorType], made: bool) -> Result<(), OpError> {
    let listed = READ_AND_MADE.contains(&op) || (!made && READ_ONLY.contains(&op));
    if listed || !types.iter().any(|t| t.dtype == DType::C32) {
        return Ok(());
    }
    Err(OpError::not_implemented(format!(
        "\"{}\" is not implemented for 'ComplexHalf' on pjrt",
        op.name()
    )))
}

#[cfg(test)]
mod tests {
    use crate::{meta, DType, ErrorKind, OpId, ScalarArg, TensorType};

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
