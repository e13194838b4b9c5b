//! The ATen op catalogue: per-op meta (shapes, dtype promotion, broadcasting) and StableHLO lowering.
//!
//! Each op is identified by an [`OpId`] and called with tensor inputs, value scalars (lifted to
//! runtime 0-d arguments, so a changed value never recompiles) and static params (part of the
//! compile cache key; see [`OpId::param_layout`]). [`meta`] computes output types and raises
//! PyTorch's errors; [`lower`] emits StableHLO through an [`Emitter`].

mod activation;
mod backward;
pub mod checks;
mod conv;
mod creation;
pub mod dtype;
mod elementwise;
pub mod emitter;
pub mod error;
mod factor;
mod fft;
mod indexing;
mod limited_dtypes;
mod linalg;
mod loss;
mod norm;
pub mod op_id;
mod optim;
mod orthogonal;
pub mod padding;
pub mod param_layout;
pub mod params;
pub mod precision;
pub mod promote;
mod random;
mod reduce;
mod shape;

pub use dtype::{scoped_default_float, DType, ScalarArg, ScalarValue, Shape, TensorType};
pub use emitter::{Cmp, Emitter, Value};
pub use error::{ErrorKind, OpError};
pub use op_id::{typed, EncodedOp, Family, OpFacts, OpId, TypedOp};
pub use param_layout::{FieldDecl, FieldKind, LayoutType, ParamLayout};
pub use params::{dtype_param, f64_param, Params};
pub use precision::{scoped_matmul_precision, Precision};

/// The result of [`meta`]: output types, and the dtype each value scalar is lifted as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    pub outputs: MetaOutputs,
    /// The computation dtype of each value scalar, in `scalars` order (e.g. f32 for bf16 math).
    pub scalar_dtypes: ScalarDTypes,
    /// A lowering picked from a value scalar's value at capture (0 = the general one), e.g.
    /// `x ** 2` as a product. It is part of the region key: a value that picks another variant
    /// compiles another module, any other change of the value does not.
    pub variant: u8,
    /// PyTorch's default float dtype when it was not float32 as this meta ran (it may pick
    /// result and scalar dtypes, so it is part of the region key).
    pub float_default: Option<DType>,
    /// The float32 product precision when it was not `Highest` as the meta of a product or
    /// convolution op ran with a float32 input (it picks the lowering's `precision_config`, so
    /// it is part of the region key).
    pub matmul_precision: Option<Precision>,
}

/// Inline lists: meta runs for every captured op, and most ops have one output and at most a
/// couple of scalars, so these never touch the heap on the hot path.
pub type MetaOutputs = smallvec::SmallVec<[TensorType; 1]>;
pub type ScalarDTypes = smallvec::SmallVec<[DType; 2]>;

impl Meta {
    /// Several outputs, no scalars, nothing else set.
    pub fn of_outputs(outputs: MetaOutputs) -> Self {
        Meta {
            outputs,
            scalar_dtypes: ScalarDTypes::new(),
            variant: 0,
            float_default: None,
            matmul_precision: None,
        }
    }

    pub fn single(output: TensorType, scalar_dtypes: impl Into<ScalarDTypes>) -> Self {
        Meta {
            outputs: smallvec::smallvec![output],
            scalar_dtypes: scalar_dtypes.into(),
            variant: 0,
            float_default: None,
            matmul_precision: None,
        }
    }
}

/// A rule's meta of a single output and no scalars.
pub(crate) fn single(t: TensorType) -> Result<Meta, OpError> {
    Ok(Meta::single(t, vec![]))
}

/// The arguments of one op, as meta sees them.
pub(crate) struct MetaArgs<'a> {
    pub op: OpId,
    pub inputs: &'a [TensorType],
    pub scalars: &'a [ScalarArg],
    pub params: Params<'a>,
}

impl MetaArgs<'_> {
    /// Check the number of tensor inputs and value scalars against the op's layout.
    pub fn expect_counts(
        &self,
        inputs: std::ops::RangeInclusive<usize>,
        scalars: std::ops::RangeInclusive<usize>,
    ) -> Result<(), OpError> {
        if !inputs.contains(&self.inputs.len()) || !scalars.contains(&self.scalars.len()) {
            return Err(OpError::runtime(format!(
                "{}: expected tensor inputs ({}) and value scalars ({}), got {} tensor input(s) and {} scalar(s)",
                self.op.name(),
                self.op.inputs_layout(),
                self.op.scalars_layout(),
                self.inputs.len(),
                self.scalars.len()
            )));
        }
        Ok(())
    }
}

/// The arguments of one op, as lowering sees them.
pub(crate) struct LowerArgs<'a> {
    pub op: OpId,
    pub inputs: &'a [Value],
    pub scalars: &'a [Value],
    pub params: Params<'a>,
    pub meta: &'a Meta,
}

impl LowerArgs<'_> {
    pub fn out(&self, i: usize) -> &TensorType {
        &self.meta.outputs[i]
    }
}

/// An op's meta and lowering, side by side: each catalogue row names the rule that computes its
/// op (`rule: creation::Arange`), so an op without one does not compile.
pub(crate) trait OpRule: Sync {
    fn meta(&self, a: &MetaArgs) -> Result<Meta, OpError>;
    fn lower(&self, e: &mut Emitter, a: &LowerArgs) -> Result<Vec<Value>, OpError>;
}

/// Output types of `op` (with PyTorch's broadcasting and type promotion) and the lifted dtype of
/// each value scalar; raises PyTorch's errors, including value-dependent ones.
pub fn meta(
    op: OpId,
    inputs: &[TensorType],
    scalars: &[ScalarArg],
    params: &[i64],
) -> Result<Meta, OpError> {
    let args = MetaArgs {
        op,
        inputs,
        scalars,
        params: Params::new(op, params),
    };
    refuse_complex(op, inputs)?;
    limited_dtypes::refuse(op, inputs, false)?;
    limited_dtypes::clear_refused_promotion();
    let meta = op.rule().meta(&args);
    limited_dtypes::take_refused_promotion()?;
    let mut meta = meta?;
    check_output_sizes(op, &meta.outputs)?;
    refuse_complex(op, &meta.outputs)?;
    limited_dtypes::refuse(op, &meta.outputs, true)?;
    let default = DType::default_float();
    meta.float_default = (default != DType::F32).then_some(default);
    let precision = Precision::current();
    if precision != Precision::Highest
        && matches!(op.family(), Family::Linalg | Family::Conv)
        && inputs.iter().any(|t| t.dtype == DType::F32)
    {
        meta.matmul_precision = Some(precision);
    }
    Ok(meta)
}

/// PyTorch's checks on a tensor it creates: every size non-negative, the element count and the
/// byte count within int64. Sizes from user input (repeat counts, expand sizes, pads) reach the
/// outputs, and lowering and execution read the outputs' element and byte counts.
fn check_output_sizes(op: OpId, outputs: &[TensorType]) -> Result<(), OpError> {
    for t in outputs {
        if let Some(&d) = t.shape.iter().find(|&&d| d < 0) {
            return Err(OpError::runtime(format!(
                "Trying to create tensor with negative dimension {d}: {:?}",
                &t.shape[..]
            )));
        }
        let Some(numel) = t.shape.iter().try_fold(1i64, |n, &d| n.checked_mul(d)) else {
            return Err(OpError::runtime(format!(
                "{}: the result's sizes {:?} hold more than {} elements (numel: integer multiplication overflow); expected sizes whose product fits in int64",
                op.name(),
                &t.shape[..],
                i64::MAX
            )));
        };
        let itemsize = t.dtype.size_bytes() as i64;
        if numel.checked_mul(itemsize).is_none() {
            return Err(OpError::runtime(format!(
                "Storage size calculation overflowed with sizes={:?}; expected sizes whose {} elements of {itemsize} bytes ({}) take at most {} bytes",
                &t.shape[..],
                numel,
                t.dtype.scalar_type_name(),
                i64::MAX
            )));
        }
    }
    Ok(())
}

/// PyTorch's message for an op its kernel does not implement for a dtype, when `op` reads or
/// makes a complex tensor and its lowering is not known to be right for complex values
/// ([`OpFacts::complex`]).
fn refuse_complex(op: OpId, types: &[TensorType]) -> Result<(), OpError> {
    if op.facts().complex {
        return Ok(());
    }
    match types.iter().find(|t| t.dtype.is_complex()) {
        Some(t) => Err(OpError::not_implemented(format!(
            "\"{}\" is not implemented for '{}' on pjrt",
            op.name(),
            t.dtype.scalar_type_name()
        ))),
        None => Ok(()),
    }
}

/// Emit `op` into `e`. `inputs` have the types given to [`meta`]; each of `scalars` is a 0-d
/// value of dtype `meta.scalar_dtypes[i]`. Returns one value per `meta.outputs`.
pub fn lower(
    op: OpId,
    e: &mut Emitter,
    inputs: &[Value],
    scalars: &[Value],
    params: &[i64],
    meta: &Meta,
) -> Result<Vec<Value>, OpError> {
    let args = LowerArgs {
        op,
        inputs,
        scalars,
        params: Params::new(op, params),
        meta,
    };
    let _default = scoped_default_float(meta.float_default.unwrap_or(DType::F32));
    let _precision = scoped_matmul_precision(meta.matmul_precision.unwrap_or_default());
    let outs = op.rule().lower(e, &args)?;
    debug_assert_eq!(outs.len(), meta.outputs.len());
    for (v, ty) in outs.iter().zip(&meta.outputs) {
        if e.ty(*v) != ty {
            return Err(OpError::runtime(format!(
                "{}: lowering produced {} where meta promised {} (a bug in the op catalogue)",
                op.name(),
                e.ty(*v),
                ty
            )));
        }
    }
    Ok(outs)
}

/// The one-op module used for op-by-op execution: its arguments are the inputs, then one 0-d
/// argument per value scalar (of dtype `scalar_dtypes[i]`).
pub fn lower_single(
    op: OpId,
    inputs: &[TensorType],
    scalars: &[ScalarArg],
    params: &[i64],
) -> Result<(String, Meta), OpError> {
    let m = meta(op, inputs, scalars, params)?;
    let mut e = Emitter::new();
    let input_values: Vec<Value> = inputs.iter().map(|t| e.argument(t.clone())).collect();
    let scalar_values: Vec<Value> = m
        .scalar_dtypes
        .iter()
        .map(|&d| e.argument(TensorType::scalar(d)))
        .collect();
    let outs = lower(op, &mut e, &input_values, &scalar_values, params, &m)?;
    Ok((e.finish(&outs), m))
}

#[cfg(test)]
mod catalogue_tests {
    use super::*;

    /// The family module an op's row names computes it: asked about the op (with arguments it
    /// refuses), it answers with the op's own error, never with "not a <family> op".
    #[test]
    fn every_op_is_computed_by_the_family_its_row_names() {
        let scalar = TensorType::scalar(DType::F32);
        for &op in OpId::ALL {
            for inputs in [vec![], vec![scalar.clone(); 6]] {
                let asked = std::panic::catch_unwind(|| meta(op, &inputs, &[], &[]));
                if let Ok(Err(e)) = asked {
                    assert!(
                        !e.message.starts_with(&format!("{}: not ", op.name())),
                        "{op:?} is filed under {:?}, whose module does not know it: {}",
                        op.family(),
                        e.message
                    );
                }
            }
        }
    }

    #[test]
    fn complex_values_reach_only_the_ops_that_compute_them() {
        let z = TensorType::new(DType::C64, &[3]);
        let x = TensorType::new(DType::F32, &[3]);
        // An op lowered for real numbers refuses complex inputs, and complex results.
        let e = meta(OpId::Erf, std::slice::from_ref(&z), &[], &[]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotImplemented);
        assert_eq!(
            e.message,
            "\"erf\" is not implemented for 'ComplexFloat' on pjrt"
        );
        let range = [
            DType::C64.code() as i64,
            crate::f64_param(0.0),
            crate::f64_param(3.0),
            crate::f64_param(1.0),
        ];
        let e = meta(OpId::Arange, &[], &[], &range);
        assert_eq!(e.unwrap_err().kind, ErrorKind::NotImplemented);
        // A complex identity, and a complex linspace between real bounds (lifted in its parts'
        // dtype).
        let m = meta(OpId::Eye, &[], &[], &[DType::C64.code() as i64, 2, 2]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::C64);
        let bounds = [ScalarArg::float(-1.0), ScalarArg::int(2)];
        let m = meta(
            OpId::Linspace,
            &[],
            &bounds,
            &[DType::C128.code() as i64, 4],
        )
        .unwrap();
        assert_eq!(m.outputs[0].dtype, DType::C128);
        assert_eq!(m.scalar_dtypes.as_slice(), [DType::F64, DType::F64]);
        // The magnitude is real; a complex product of a complex and a real tensor is complex.
        let m = meta(OpId::Abs, std::slice::from_ref(&z), &[], &[]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::F32);
        let m = meta(OpId::Mul, &[z.clone(), x.clone()], &[], &[]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::C64);
        let m = meta(OpId::Zeros, &[], &[], &[DType::C128.code() as i64, 2]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::C128);
        // torch.complex takes two float tensors of one dtype.
        let m = meta(OpId::Complex, &[x.clone(), x.clone()], &[], &[]).unwrap();
        assert_eq!(m.outputs[0].dtype, DType::C64);
        let x64 = TensorType::new(DType::F64, &[3]);
        assert!(meta(OpId::Complex, &[x, x64], &[], &[]).is_err());
    }

    #[test]
    fn facts_follow_the_rows() {
        assert!(OpId::Add.is_pointwise() && OpId::Add.is_recomputable());
        assert!(OpId::Reshape.is_pointwise());
        assert!(!OpId::Sum.is_pointwise());
        assert!(OpId::NativeLayerNorm.is_recomputable() && !OpId::NativeLayerNorm.is_pointwise());
        assert!(!OpId::Uniform.is_recomputable());
        assert_eq!(OpId::RandomInt.first_size_param(), Some(2));
        assert!(OpId::IndexCheck.is_side_effecting() && !OpId::Add.is_side_effecting());
        assert!(OpId::Gather.has_index_checks() && !OpId::Cat.has_index_checks());
        assert!(!OpId::Addmm.is_product_operand(0) && OpId::Addmm.is_product_operand(1));
        assert!(OpId::Mm.is_product_operand(0));
        assert_eq!(OpId::Cumsum.family(), Family::Reduce);
        assert_eq!(OpId::MaskedFill.family(), Family::Elementwise);
        assert_eq!(OpId::NllLoss.family(), Family::Loss);
    }
}
