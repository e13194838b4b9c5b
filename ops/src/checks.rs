//! Assertion ops: side-effecting checks whose verdict the engine reads after running them.

use crate::emitter::Emitter;
use crate::{DType, LowerArgs, Meta, MetaArgs, OpError, OpId, ScalarValue, TensorType, Value};

pub(crate) fn meta(a: &MetaArgs) -> Result<Meta, OpError> {
    match a.op {
        OpId::AssertAsync => {
            a.expect_counts(1..=1, 0..=0)?;
            let numel = a.inputs[0].numel();
            if numel == 0 {
                return Err(OpError::runtime(
                    "Boolean value of Tensor with no values is ambiguous",
                ));
            }
            if numel > 1 {
                return Err(OpError::runtime(
                    "Boolean value of Tensor with more than one value is ambiguous",
                ));
            }
            Ok(Meta::single(TensorType::scalar(DType::Bool), Vec::new()))
        }
        other => Err(OpError::runtime(format!(
            "{} is not a check op",
            other.name()
        ))),
    }
}

pub(crate) fn lower(e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError> {
    let x = e.reshape(a.inputs[0], &[]);
    let zero = e.scalar_constant(e.dtype(x), ScalarValue::Int(0));
    Ok(vec![e.compare(crate::Cmp::Ne, x, zero)])
}
