//! The ATen op catalogue: per-op meta (shapes, dtype promotion, broadcasting) and StableHLO lowering.
//!
//! Each op is identified by an [`OpId`] and called with tensor inputs, value scalars (lifted to
//! runtime 0-d arguments, so a changed value never recompiles) and static params (part of the
//! compile cache key; see [`OpId::params_layout`]). [`meta`] computes output types and raises
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
mod indexing;
mod linalg;
mod loss;
mod norm;
pub mod op_id;
mod optim;
pub mod padding;
pub mod params;
pub mod promote;
mod random;
mod reduce;
mod shape;

pub use dtype::{DType, ScalarArg, ScalarValue, Shape, TensorType};
pub use emitter::{Cmp, Emitter, Value};
pub use error::{ErrorKind, OpError};
pub use op_id::OpId;
pub use params::{dtype_param, f64_param, Params};

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
}

/// Inline lists: meta runs for every captured op, and most ops have one output and at most a
/// couple of scalars, so these never touch the heap on the hot path.
pub type MetaOutputs = smallvec::SmallVec<[TensorType; 1]>;
pub type ScalarDTypes = smallvec::SmallVec<[DType; 2]>;

impl Meta {
    pub fn single(output: TensorType, scalar_dtypes: impl Into<ScalarDTypes>) -> Self {
        Meta {
            outputs: smallvec::smallvec![output],
            scalar_dtypes: scalar_dtypes.into(),
            variant: 0,
        }
    }
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Elementwise,
    Creation,
    Reduce,
    Linalg,
    Shape,
    Backward,
    Check,
    Random,
    Normalization,
    Conv,
    Indexing,
    Activation,
    Loss,
    Optim,
}

impl OpId {
    /// Whether the op computes each output element from the matching input elements (or moves
    /// elements without arithmetic), so XLA may fuse it into each of its consumers, reading
    /// its inputs there.
    pub fn is_pointwise(self) -> bool {
        use OpId::*;
        family(self) == Family::Elementwise
            || matches!(
                self,
                Convert
                    | Clone
                    | Copy
                    | Expand
                    | Reshape
                    | Permute
                    | Transpose
                    | Slice
                    | Select
                    | ThresholdBackward
                    | GeluBackward
                    | TanhBackward
                    | SigmoidBackward
                    | MaskedFill
            )
    }
}

fn family(op: OpId) -> Family {
    use OpId::*;
    match op {
        Convert | Clone | Copy | Fill | Full | Zeros | Ones | Arange | Linspace | Eye => {
            Family::Creation
        }
        Sum | Mean | Prod | Amax | Amin | Argmax | Argmin | Any | All | Var | Std | Logsumexp
        | Norm | Softmax | LogSoftmax | Isin => Family::Reduce,
        Mm | Bmm | Addmm | Baddbmm | Dot | Matmul => Family::Linalg,
        Cat | Stack | Flip | Roll | ConstantPadNd | Repeat | Tril | Triu | Gather | IndexSelect
        | Scatter | ScatterAdd | ScatterReduce | Embedding | Expand | SumToSize | Reshape
        | Permute | Transpose | Slice | Select => Family::Shape,
        ThresholdBackward | LogSoftmaxBackward | SoftmaxBackward | NllLoss | NllLossBackward => {
            Family::Backward
        }
        AssertAsync | IndexCheck => Family::Check,
        // random numbers
        Uniform | Normal | RandomInt | Bernoulli | NativeDropout | NativeDropoutBackward => {
            Family::Random
        }
        // convolution and pooling
        Convolution
        | ConvolutionBackward
        | MaxPool2dWithIndices
        | MaxPool2dWithIndicesBackward
        | AvgPool2d
        | AvgPool2dBackward
        | AdaptiveAvgPool2d
        | AdaptiveAvgPool2dBackward
        | MaxPool3dWithIndices
        | MaxPool3dWithIndicesBackward
        | AvgPool3d
        | AvgPool3dBackward
        | AdaptiveMaxPool2d
        | AdaptiveMaxPool2dBackward => Family::Conv,
        // normalization
        NativeBatchNorm
        | BatchNormRunningStats
        | NativeBatchNormBackward
        | NativeLayerNorm
        | NativeLayerNormBackward
        | NativeGroupNorm
        | NativeGroupNormBackward
        | EmbeddingDenseBackward
        | Cumsum
        | Cumprod
        | Logcumsumexp
        | MaskedFill => Family::Normalization,
        // attention, sorting, indexing and optimizer ops
        Sort | TopK | Nonzero | MaskedSelect | MaskedScatter | Index | IndexPut => Family::Indexing,
        SafeSoftmax | GeluBackward | TanhBackward | SigmoidBackward | LogSigmoidForward
        | LogSigmoidBackward => Family::Activation,
        MseLoss
        | MseLossBackward
        | SmoothL1Loss
        | SmoothL1LossBackward
        | HuberLoss
        | HuberLossBackward
        | BinaryCrossEntropy
        | BinaryCrossEntropyBackward
        | NllLoss2d
        | NllLoss2dBackward => Family::Loss,
        FusedAdam | FusedSgd => Family::Optim,
        _ => Family::Elementwise,
    }
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
    match family(op) {
        Family::Elementwise => elementwise::meta(&args),
        Family::Creation => creation::meta(&args),
        Family::Reduce => reduce::meta(&args),
        Family::Linalg => linalg::meta(&args),
        Family::Shape => shape::meta(&args),
        Family::Backward => backward::meta(&args),
        Family::Check => checks::meta(&args),
        Family::Random => random::meta(&args),
        Family::Normalization => norm::meta(&args),
        Family::Conv => conv::meta(&args),
        Family::Indexing => indexing::meta(&args),
        Family::Activation => activation::meta(&args),
        Family::Loss => loss::meta(&args),
        Family::Optim => optim::meta(&args),
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
    let outs = match family(op) {
        Family::Elementwise => elementwise::lower(e, &args),
        Family::Creation => creation::lower(e, &args),
        Family::Reduce => reduce::lower(e, &args),
        Family::Linalg => linalg::lower(e, &args),
        Family::Shape => shape::lower(e, &args),
        Family::Backward => backward::lower(e, &args),
        Family::Check => checks::lower(e, &args),
        Family::Random => random::lower(e, &args),
        Family::Normalization => norm::lower(e, &args),
        Family::Conv => conv::lower(e, &args),
        Family::Indexing => indexing::lower(e, &args),
        Family::Activation => activation::lower(e, &args),
        Family::Loss => loss::lower(e, &args),
        Family::Optim => optim::lower(e, &args),
    }?;
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
