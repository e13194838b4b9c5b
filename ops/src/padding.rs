//! Ops on padded operands: tensors whose device buffer holds a bucket of elements along some
//! dimensions, of which only the first `len` (a runtime scalar) are the tensor's.
//!
//! A padded value's padding is unspecified: an op never reads it as a value. An op is run at
//! the padded sizes and stays exact when, along each padded dimension, it either computes each
//! position from the same positions of its inputs (elementwise ops, a product's free and batch
//! dimensions, reductions over other dimensions), computes position `i` from positions `<= i`
//! only (cumulative sums), or combines positions in a way the right fill makes blind to the
//! padding (a sum over zeros, a max over `-inf`, a product contracting over zeros). [`plan`]
//! says which, per op, and [`lower_padded`] masks the inputs that need a fill and runs the op's
//! ordinary lowering at the padded sizes. All padded dimensions of one op share one length
//! (the one growing extent of a sequence); an append along it ([`lower_append`]) makes a longer
//! one.

use crate::param_layout::{self as layout, ParamLayout};
use crate::{
    meta, Cmp, DType, Emitter, Meta, OpError, OpId, Params, ScalarArg, ScalarValue, TensorType,
    Value,
};
use smallvec::SmallVec;

/// Dimensions of one operand that are padded (empty: the operand is exact).
pub type PaddedDims = SmallVec<[usize; 2]>;

/// What an op's padding must hold before the op reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PadFill {
    Zero,
    One,
    /// `-inf` for floats, the smallest value for integers.
    Lowest,
    /// `+inf` for floats, the largest value for integers.
    Highest,
}

/// How an op treats one padded dimension of one input.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Along {
    /// Each output position along it comes from the same position of the inputs.
    Independent,
    /// Output position `i` reads input positions `<= i` only.
    Prefix,
    /// Positions are combined; the padding must hold this fill first.
    Combined(PadFill),
    /// Positions are combined, and the op itself leaves those past the length out (an
    /// attention's key positions, masked from every row's scores): read as it is.
    Masked,
    /// Padding cannot be made exact for this op here.
    Unsupported,
}

/// How one op runs on padded operands.
#[derive(Clone, Debug, PartialEq)]
pub struct PaddedPlan {
    /// The op's meta at the padded sizes: what the lowering emits.
    pub meta: Meta,
    /// The buffer size of the padded dimensions.
    pub bucket: i64,
    /// The op's outputs at the true sizes: what PyTorch sees.
    pub true_outputs: crate::MetaOutputs,
    /// Per input: its padded dimensions.
    pub inputs: SmallVec<[PaddedDims; 3]>,
    /// Per input: the fill its padding needs first, or `None` when it is read as it is.
    pub fills: SmallVec<[Option<PadFill>; 3]>,
    /// Per output: its padded dimensions (empty when the output is exact, e.g. a product
    /// contracting over the padded dimension).
    pub outputs: SmallVec<[PaddedDims; 1]>,
}

/// Whether and how `op` runs with `padded[i]` dimensions of input `i` holding `bucket`
/// elements, of which the first `len` (each such dimension's size in `inputs`, the true
/// types) are the tensor's. `Ok(None)`: not exactly, so the caller must run it on exact values.
pub fn plan(
    op: OpId,
    inputs: &[TensorType],
    padded: &[PaddedDims],
    bucket: i64,
    scalars: &[ScalarArg],
    params: &[i64],
) -> Result<Option<PaddedPlan>, OpError> {
    debug_assert_eq!(inputs.len(), padded.len());
    let mut len = None;
    for (ty, dims) in inputs.iter().zip(padded) {
        for &d in dims {
            let Some(&size) = ty.shape.get(d) else {
                return Ok(None);
            };
            if len.is_some_and(|l| l != size) {
                return Ok(None);
            }
            len = Some(size);
        }
    }
    let Some(len) = len else {
        return Ok(None);
    };
    plan_at(op, inputs, padded, bucket, len, scalars, params)
}

/// [`plan`] for an extent of true length `len`. A padded dimension of size `k * len` (`k > 1`)
/// is the extent merged with the `k` positions of the dimensions outside it (a `[batch,
/// length]` value read as `[batch * length]`, as a linear layer reads its input): its buffer
/// holds `k` runs of `bucket` elements, each masked as a padded dimension is; an op that reads
/// a prefix along it (a cumulative sum) is refused.
pub fn plan_at(
    op: OpId,
    inputs: &[TensorType],
    padded: &[PaddedDims],
    bucket: i64,
    len: i64,
    scalars: &[ScalarArg],
    params: &[i64],
) -> Result<Option<PaddedPlan>, OpError> {
    debug_assert_eq!(inputs.len(), padded.len());
    if len < 1 || len > bucket {
        return Ok(None);
    }
    // Per input and padded dimension: how many runs of the extent it holds.
    let mut outers: SmallVec<[SmallVec<[i64; 2]>; 3]> = SmallVec::new();
    let mut any = false;
    for (ty, dims) in inputs.iter().zip(padded) {
        let mut runs = SmallVec::new();
        for &d in dims {
            let Some(&size) = ty.shape.get(d) else {
                return Ok(None);
            };
            if size % len != 0 {
                return Ok(None);
            }
            runs.push(size / len);
            any = true;
        }
        outers.push(runs);
    }
    if !any {
        return Ok(None);
    }
    let mut fills: SmallVec<[Option<PadFill>; 3]> = SmallVec::new();
    for (i, (ty, dims)) in inputs.iter().zip(padded).enumerate() {
        let mut fill = None;
        for (&d, &runs) in dims.iter().zip(&outers[i]) {
            let how = along(op, params, i, ty.shape.len(), d);
            // Runs of the extent are masked run by run; a prefix would reach across runs.
            if runs > 1 && how == Along::Prefix {
                return Ok(None);
            }
            // A true index into rows that merge the extent with the dimensions outside it (row
            // `r` of `[batch * length]`) is not the padded value's row (`r / length` runs of
            // the bucket, then `r % length`): an indexed table must be read exact.
            if runs > 1 && i == 0 && matches!(op, OpId::Gather | OpId::Index | OpId::IndexSelect) {
                return Ok(None);
            }
            // The op's own mask covers one run of the extent.
            if runs > 1 && how == Along::Masked {
                return Ok(None);
            }
            match how {
                Along::Independent | Along::Prefix | Along::Masked => {}
                Along::Combined(f) => {
                    if fill.is_some_and(|g| g != f) {
                        return Ok(None);
                    }
                    fill = Some(f);
                }
                Along::Unsupported => return Ok(None),
            }
        }
        fills.push(fill);
    }
    let at = |size: i64| -> SmallVec<[TensorType; 3]> {
        inputs
            .iter()
            .zip(padded)
            .zip(&outers)
            .map(|((ty, dims), runs)| {
                let mut shape = ty.shape.clone();
                for (&d, &k) in dims.iter().zip(runs) {
                    shape[d] = k * size;
                }
                TensorType::new(ty.dtype, &shape)
            })
            .collect()
    };
    let exact = meta(op, inputs, scalars, params)?;
    let Ok(at_bucket) = meta(op, &at(bucket), scalars, params) else {
        return Ok(None);
    };
    // A second size tells the output dimensions that follow the extent even when the
    // length fills the bucket.
    let Ok(at_probe) = meta(op, &at(bucket + 1), scalars, params) else {
        return Ok(None);
    };
    if at_bucket.variant != exact.variant
        || at_bucket.outputs.len() != exact.outputs.len()
        || at_probe.outputs.len() != exact.outputs.len()
    {
        return Ok(None);
    }
    let mut outputs = SmallVec::new();
    for ((t, p), q) in exact
        .outputs
        .iter()
        .zip(&at_bucket.outputs)
        .zip(&at_probe.outputs)
    {
        if t.dtype != p.dtype || t.shape.len() != p.shape.len() || q.shape.len() != p.shape.len() {
            return Ok(None);
        }
        let mut dims = PaddedDims::new();
        for d in 0..t.shape.len() {
            let follows = p.shape[d] != q.shape[d];
            // Only the shared extent may differ from the exact sizes, and only as the padding
            // (of `runs` merged runs of it).
            let runs = q.shape[d] - p.shape[d];
            if follows && (runs < 1 || p.shape[d] != runs * bucket || t.shape[d] != runs * len) {
                return Ok(None);
            }
            if !follows && p.shape[d] != t.shape[d] {
                return Ok(None);
            }
            if follows {
                dims.push(d);
            }
        }
        outputs.push(dims);
    }
    Ok(Some(PaddedPlan {
        inputs: padded.iter().cloned().collect(),
        bucket,
        true_outputs: exact.outputs,
        meta: at_bucket,
        fills,
        outputs,
    }))
}

/// Normalize a possibly negative dim param against `rank`.
fn norm_dim(dim: i64, rank: usize) -> Option<usize> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    (0..r).contains(&d).then_some(d as usize)
}

/// Whether a dim-list reduction reduces `dim` (an empty list reduces them all).
fn reduced(p: &Params, rank: usize, dim: usize) -> bool {
    let dims = match p.op().param_layout() {
        ParamLayout::ReduceDims => layout::ReduceDims::decode(p).map(|l| l.dims),
        ParamLayout::ReduceDtypeDims => layout::ReduceDtypeDims::decode(p).map(|l| l.dims),
        ParamLayout::ReduceCorrectionDims => {
            layout::ReduceCorrectionDims::decode(p).map(|l| l.dims)
        }
        _ => return false,
    };
    match dims {
        Ok(dims) => dims.is_empty() || dims.iter().any(|&d| norm_dim(d, rank) == Some(dim)),
        Err(_) => false,
    }
}

/// The one dim an op works along, for the layouts that name one.
fn working_dim(p: &Params) -> Option<i64> {
    match p.op().param_layout() {
        ParamLayout::Dim => layout::Dim::decode(p).ok().map(|l| l.dim),
        ParamLayout::DimDtype => layout::DimDtype::decode(p).ok().map(|l| l.dim),
        ParamLayout::SoftmaxDim => layout::SoftmaxDim::decode(p).ok().map(|l| l.dim),
        ParamLayout::SoftmaxBackwardDim => {
            layout::SoftmaxBackwardDim::decode(p).ok().map(|l| l.dim)
        }
        ParamLayout::ArgReduce => layout::ArgReduce::decode(p).ok().and_then(|l| l.dim),
        _ => None,
    }
}

/// How many trailing dims a layer norm (or its backward op) normalizes over.
fn normalized_rank(p: &Params) -> usize {
    let shape = match p.op() {
        OpId::NativeLayerNorm => layout::LayerNorm::decode(p).map(|l| l.normalized_shape),
        _ => layout::LayerNormBackward::decode(p).map(|l| l.normalized_shape),
    };
    shape.map_or(0, |s| s.len())
}

/// How `op` treats dimension `dim` of input `input` (of rank `rank`).
fn along(op: OpId, params: &[i64], input: usize, rank: usize, dim: usize) -> Along {
    use OpId::*;
    let params = Params::new(op, params);
    let op_dim = || working_dim(&params).and_then(|d| norm_dim(d, rank));
    let reduce_with = |fill: PadFill| {
        if reduced(&params, rank, dim) {
            Along::Combined(fill)
        } else {
            Along::Independent
        }
    };
    match op {
        // Moving or relabelling ops whose params are sizes or positions: the view machinery's.
        Expand | Reshape | Permute | Transpose | Slice | Select => Along::Unsupported,
        _ if op.is_pointwise() => Along::Independent,
        Sum => reduce_with(PadFill::Zero),
        Prod => reduce_with(PadFill::One),
        Amax => reduce_with(PadFill::Lowest),
        Amin => reduce_with(PadFill::Highest),
        Any => reduce_with(PadFill::Zero),
        All => reduce_with(PadFill::One),
        Logsumexp => reduce_with(PadFill::Lowest),
        // A mean or a variance counts the padding.
        Mean => reduce_with(PadFill::Zero).independent_or_unsupported(),
        Var | Std => reduce_with(PadFill::Zero).independent_or_unsupported(),
        Argmax | Argmin => match op_dim() {
            // Without a dim the index is into the flattened padded tensor.
            None => Along::Unsupported,
            Some(d) if d != dim => Along::Independent,
            // True positions come first, so a tie keeps the true index.
            Some(_) => Along::Combined(if op == Argmax {
                PadFill::Lowest
            } else {
                PadFill::Highest
            }),
        },
        Softmax | LogSoftmax | SafeSoftmax => match op_dim() {
            Some(d) if d == dim => Along::Combined(PadFill::Lowest),
            Some(_) => Along::Independent,
            None => Along::Unsupported,
        },
        Cumsum | Cumprod | Logcumsumexp => match op_dim() {
            Some(d) if d == dim => Along::Prefix,
            Some(_) => Along::Independent,
            None => Along::Unsupported,
        },
        // [n, k] x [k, m]: the contracted dimension is the first operand's last and the
        // second's first (after the batch dimension for bmm).
        Mm | Bmm => {
            let batch = usize::from(op == Bmm);
            let contracted = if input == 0 { batch + 1 } else { batch };
            if dim == contracted {
                Along::Combined(PadFill::Zero)
            } else {
                Along::Independent
            }
        }
        // bias + [n, k] x [k, m]: the bias is added elementwise (broadcast).
        Addmm => match input {
            0 => Along::Independent,
            1 if dim == 1 => Along::Combined(PadFill::Zero),
            2 if dim == 0 => Along::Combined(PadFill::Zero),
            1 | 2 => Along::Independent,
            _ => Along::Unsupported,
        },
        // Along another dimension every input must be padded alike (meta checks the sizes).
        Cat => match op_dim() {
            Some(d) if d != dim => Along::Independent,
            _ => Along::Unsupported,
        },
        NativeLayerNorm => {
            let normalized = normalized_rank(&params);
            if input == 0 && dim + normalized < rank {
                Along::Independent
            } else {
                Along::Unsupported
            }
        }
        // Padded indices pick row 0 (it exists when the table is not empty); the picked rows
        // are the padding of the result.
        Embedding if input == 1 => Along::Combined(PadFill::Zero),
        // grad_input = output * (grad - sum(grad * output)): both zero in the padding.
        SoftmaxBackward => match op_dim() {
            Some(d) if d == dim => Along::Combined(PadFill::Zero),
            Some(_) => Along::Independent,
            None => Along::Unsupported,
        },
        // grad_input = grad - exp(output) * sum(grad): the sum needs the grad zero there.
        LogSoftmaxBackward => match op_dim() {
            Some(d) if d == dim && input == 0 => Along::Combined(PadFill::Zero),
            Some(_) => Along::Independent,
            None => Along::Unsupported,
        },
        // Rows of a layer norm's backward: the weight's and bias's gradients sum over rows,
        // so every row operand is zero in the padding (a zero row adds nothing, even through
        // its normalized value (0 - 0) * 0).
        NativeLayerNormBackward if input < 4 => {
            let normalized = normalized_rank(&params);
            if dim + normalized < rank {
                Along::Combined(PadFill::Zero)
            } else {
                Along::Unsupported
            }
        }
        // The gradient rows of padded positions add nothing once zero, at row 0.
        EmbeddingDenseBackward => Along::Combined(PadFill::Zero),
        // Indexing with true indices reads true positions only, whatever dimension of `self`
        // is padded; padded indices read as 0 and their results are the output's padding.
        Gather | Index if input == 0 => Along::Independent,
        Gather | Index => Along::Combined(PadFill::Zero),
        // The engine's check of the indices an indexing op read: a padded index reads as 0.
        IndexCheck => Along::Combined(PadFill::Zero),
        // Membership of each element on its own; padded test elements would be candidates.
        Isin if input == 0 => Along::Independent,
        // A triangle keeps or zeroes each element by its row and column alone, and true
        // positions keep their indices as long as no run of the extent precedes them.
        Tril | Triu if dim + 2 >= rank => Along::Prefix,
        Tril | Triu => Along::Independent,
        // `self[indices] += values` (and `index_add`): a padded position's index reads as 0
        // and its value as zero, so it adds nothing. Without accumulating it would write.
        IndexPut
            if input >= 1
                && layout::IndexPutDims::decode(&params).is_ok_and(|l| l.accumulate != 0) =>
        {
            Along::Combined(PadFill::Zero)
        }
        IndexSelect if input == 1 => Along::Combined(PadFill::Zero),
        // Attention: query rows (and a mask's rows) are independent; key positions (and a
        // mask's columns) are left out of the scores past the length; the value's padding is
        // zero, since a left-out position's weight is zero and `0 * NaN` is not.
        Attention => match (input, rank - dim) {
            (0, 2) | (3, 2) => Along::Independent,
            (1, 2) | (3, 1) => Along::Masked,
            (2, 2) => Along::Combined(PadFill::Zero),
            _ => Along::Unsupported,
        },
        // Its gradients: every padded row and column of every input is zero, so the padding
        // adds nothing to the products over rows and columns (`dV = P^T dO`, `dK = dS^T Q`,
        // `dQ = dS K`), and the lowering leaves key positions past the length out of the
        // softmax it computes again.
        AttentionBackward => match (input, rank - dim) {
            (0..=5, 2) | (5, 1) => Along::Combined(PadFill::Zero),
            _ => Along::Unsupported,
        },
        IndexSelect if input == 0 => match op_dim() {
            Some(d) if d != dim => Along::Independent,
            _ => Along::Unsupported,
        },
        // Pointwise ops, which the guard above answers: listed so that every op is placed
        // here, a new one included.
        Neg
        | Abs
        | Exp
        | Exp2
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
        | Relu
        | Gelu
        | Silu
        | Erf
        | Erfc
        | SpecialI1e
        | I0
        | SpecialI0e
        | Erfinv
        | Lgamma
        | Digamma
        | Floor
        | Ceil
        | Round
        | Trunc
        | Sign
        | Reciprocal
        | LogicalNot
        | BitwiseNot
        | IsNan
        | IsInf
        | NanToNum
        | Add
        | Sub
        | Rsub
        | Mul
        | Div
        | Remainder
        | Fmod
        | Pow
        | PowScalarBase
        | Maximum
        | Minimum
        | Atan2
        | SpecialZeta
        | Nextafter
        | Eq
        | Ne
        | Lt
        | Le
        | Gt
        | Ge
        | LogicalAnd
        | LogicalOr
        | LogicalXor
        | BitwiseAnd
        | BitwiseOr
        | BitwiseXor
        | BitwiseLeftShift
        | BitwiseRightShift
        | Where
        | Clamp
        | Lerp
        | Addcmul
        | Addcdiv
        | Convert
        | Clone
        | Copy
        | ThresholdBackward
        | MaskedFill
        | GeluBackward
        | TanhBackward
        | SigmoidBackward
        | Complex
        | ConjPhysical => Along::Independent,
        // The other inputs of the ops above, and the ops a padded extent does not pass
        // through yet.
        Fill
        | Full
        | Zeros
        | Ones
        | Arange
        | Linspace
        | Eye
        | Norm
        | Baddbmm
        | Dot
        | Matmul
        | SolveTriangular
        | Cholesky
        | LuFactor
        | LuPermutation
        | Qr
        | Eigh
        | Svd
        // A loop to the largest degree, padding's included.
        | SpecialChebyshevPolynomialT | SpecialChebyshevPolynomialU | SpecialChebyshevPolynomialV
        | SpecialChebyshevPolynomialW | SpecialShiftedChebyshevPolynomialT
        | SpecialShiftedChebyshevPolynomialU | SpecialShiftedChebyshevPolynomialV
        | SpecialShiftedChebyshevPolynomialW | SpecialHermitePolynomialH | SpecialHermitePolynomialHe
        | SpecialLaguerrePolynomialL | SpecialLegendrePolynomialP
        | Geqrf
        | HouseholderProduct
        | Stack
        | Flip
        | Roll
        | ConstantPadNd
        | Repeat
        | IndexSelect
        | Scatter
        | ScatterAdd
        | ScatterReduce
        | Embedding
        | SumToSize
        | NllLoss
        | NllLossBackward
        | AssertAsync
        | Uniform
        | Normal
        | RandomInt
        | Bernoulli
        | NativeDropout
        | NativeDropoutBackward
        | Convolution
        | ConvolutionBackward
        | MaxPool2dWithIndices
        | MaxPool2dWithIndicesBackward
        | AvgPool2d
        | AvgPool2dBackward
        | AdaptiveAvgPool2d
        | AdaptiveAvgPool2dBackward
        | NativeBatchNorm
        | BatchNormRunningStats
        | NativeBatchNormBackward
        | NativeLayerNormBackward
        | NativeGroupNorm
        | NativeGroupNormBackward
        | Sort
        | TopK
        | Nonzero
        | MaskedSelect
        | MaskedScatter
        | IndexPut
        | LogSigmoidForward
        | LogSigmoidBackward
        | MseLoss
        | MseLossBackward
        | SmoothL1Loss
        | SmoothL1LossBackward
        | HuberLoss
        | HuberLossBackward
        | BinaryCrossEntropy
        | BinaryCrossEntropyBackward
        | NllLoss2d
        | NllLoss2dBackward
        | FusedAdam
        | FusedSgd
        | MaxPool3dWithIndices
        | MaxPool3dWithIndicesBackward
        | AvgPool3d
        | AvgPool3dBackward
        | AdaptiveMaxPool2d
        | AdaptiveMaxPool2dBackward
        | Isin
        | FftC2c
        | FftR2c
        | FftC2r
        | RepeatInterleave
        | RepeatsCheck => Along::Unsupported,
    }
}

impl Along {
    /// A combination that the padding would change: only independence is exact.
    fn independent_or_unsupported(self) -> Along {
        match self {
            Along::Independent => Along::Independent,
            _ => Along::Unsupported,
        }
    }
}

/// A boolean mask of `shape`, true where every dimension in `dims` is below `len` (a 0-d
/// integer value). A dimension larger than `bucket` holds runs of it (the extent merged with
/// the dimensions outside it): its position within the run is compared.
pub fn in_bounds(e: &mut Emitter, shape: &[i64], dims: &[usize], len: Value, bucket: i64) -> Value {
    let len = e.convert(len, DType::I32);
    let len = e.broadcast_in_dim(len, shape, &[]);
    let mut mask: Option<Value> = None;
    for &d in dims {
        let mut pos = e.iota(TensorType::new(DType::I32, shape), d);
        if shape[d] > bucket {
            let run = e.constant(TensorType::new(DType::I32, shape), ScalarValue::Int(bucket));
            pos = e.rem(pos, run);
        }
        let inside = e.compare(Cmp::Lt, pos, len);
        mask = Some(match mask {
            Some(m) => e.and(m, inside),
            None => inside,
        });
    }
    mask.unwrap_or_else(|| e.constant(TensorType::new(DType::Bool, shape), ScalarValue::Bool(true)))
}

/// `v` with its padding along `dims` replaced by `fill`.
pub fn fill_padding(
    e: &mut Emitter,
    v: Value,
    dims: &[usize],
    len: Value,
    bucket: i64,
    fill: PadFill,
) -> Value {
    let shape = e.shape(v).to_vec();
    let dtype = e.dtype(v);
    let value = match (fill, dtype) {
        (PadFill::Zero, DType::Bool) => ScalarValue::Bool(false),
        (PadFill::One, DType::Bool) => ScalarValue::Bool(true),
        (PadFill::Lowest, DType::Bool) => ScalarValue::Bool(false),
        (PadFill::Highest, DType::Bool) => ScalarValue::Bool(true),
        (PadFill::Zero, _) => ScalarValue::Int(0),
        (PadFill::One, _) => ScalarValue::Int(1),
        (PadFill::Lowest, d) if d.is_float() => ScalarValue::Float(f64::NEG_INFINITY),
        (PadFill::Highest, d) if d.is_float() => ScalarValue::Float(f64::INFINITY),
        (PadFill::Lowest, DType::I64) => ScalarValue::Int(i64::MIN),
        (PadFill::Highest, DType::I64) => ScalarValue::Int(i64::MAX),
        (PadFill::Lowest, d) => ScalarValue::Int(d.min_value() as i64),
        (PadFill::Highest, d) => ScalarValue::Int(d.max_value() as i64),
    };
    let filler = e.constant(TensorType::new(dtype, &shape), value);
    let mask = in_bounds(e, &shape, dims, len, bucket);
    e.select(mask, v, filler)
}

/// Lower `op` on padded `inputs` (at the padded sizes) by `plan`; `len` is the true length of
/// the padded extent, a 0-d integer value. The outputs are padded as `plan.outputs` says.
pub fn lower_padded(
    op: OpId,
    e: &mut Emitter,
    inputs: &[Value],
    len: Value,
    scalars: &[Value],
    params: &[i64],
    plan: &PaddedPlan,
) -> Result<Vec<Value>, OpError> {
    let filled: SmallVec<[Value; 3]> = inputs
        .iter()
        .zip(&plan.inputs)
        .zip(&plan.fills)
        .map(|((&v, dims), fill)| match fill {
            Some(f) => fill_padding(e, v, dims, len, plan.bucket, *f),
            None => v,
        })
        .collect();
    let padded_input = |i: usize| plan.inputs.get(i).is_some_and(|dims| !dims.is_empty());
    if op == OpId::Attention && padded_input(1) {
        let params = Params::new(op, params);
        let key_len = Some((len, plan.bucket));
        return crate::linalg::lower_attention(e, &filled, &params, &plan.meta, key_len);
    }
    if op == OpId::AttentionBackward && padded_input(2) {
        let params = Params::new(op, params);
        let key_len = Some((len, plan.bucket));
        return crate::linalg::lower_attention_backward(e, &filled, &params, &plan.meta, key_len);
    }
    crate::lower(op, e, &filled, scalars, params, &plan.meta)
}

/// `a` with zeros after its elements along `dim` up to `bucket` (none when it holds as many).
pub fn pad_to_bucket(e: &mut Emitter, a: Value, dim: usize, bucket: i64) -> Value {
    let a_shape = e.shape(a).to_vec();
    let rank = a_shape.len();
    let grow = bucket - a_shape[dim];
    if grow <= 0 {
        return a;
    }
    let zero = e.scalar_constant(e.dtype(a), ScalarValue::Int(0));
    let mut high = vec![0; rank];
    high[dim] = grow;
    e.pad(a, zero, &vec![0; rank], &high, &vec![0; rank])
}

/// The append `cat([a, b], dim)` along the padded extent: `a` holds `a_len` (a 0-d integer
/// value) true elements along `dim` in a buffer of `a_bucket` or fewer (an exact `a`), `b` is
/// exact; the result holds `a_len + b`'s size true elements in a buffer of `out_bucket`. The
/// padding is unspecified, like every padded value's.
pub fn lower_append(
    e: &mut Emitter,
    a: Value,
    b: Value,
    dim: usize,
    a_len: Value,
    out_bucket: i64,
) -> Value {
    let dtype = e.dtype(a);
    let b = e.convert(b, dtype);
    let a = pad_to_bucket(e, a, dim, out_bucket);
    let out_shape = e.shape(a).to_vec();
    let rank = out_shape.len();
    let index_ty = TensorType::scalar(DType::I32);
    let zero = e.scalar_constant(DType::I32, ScalarValue::Int(0));
    let start = e.convert(a_len, DType::I32);
    let starts: Vec<Value> = (0..rank)
        .map(|d| if d == dim { start } else { zero })
        .collect();
    debug_assert!(starts.iter().all(|&s| *e.ty(s) == index_ty));
    let zeros = e.constant(TensorType::new(dtype, &out_shape), ScalarValue::Int(0));
    let mut operands = vec![zeros, b];
    operands.extend_from_slice(&starts);
    let placed = e.op(
        "stablehlo.dynamic_update_slice",
        &operands,
        "",
        TensorType::new(dtype, &out_shape),
    );
    let keep = in_bounds(e, &out_shape, &[dim], a_len, out_bucket);
    e.select(keep, a, placed)
}

/// The bucket a padded extent of `len` elements is kept in: the next power of two, at least
/// 16. Powers of two keep a sequence growing to `n` at `log2(n)` programs per op, and waste at
/// most half of each buffer.
pub fn bucket(len: i64) -> i64 {
    let len = len.max(1) as u64;
    (len.next_power_of_two() as i64).max(16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;

    fn f32s(shape: &[i64]) -> TensorType {
        TensorType::new(DType::F32, shape)
    }

    #[test]
    fn buckets_are_powers_of_two_from_sixteen() {
        assert_eq!(
            [1, 15, 16, 17, 100, 128, 129].map(bucket),
            [16, 16, 16, 32, 128, 128, 256]
        );
    }

    #[test]
    fn elementwise_ops_keep_the_padding_where_it_was() {
        let a = f32s(&[2, 5]);
        let b = f32s(&[1, 5]);
        let p = plan(
            OpId::Add,
            &[a, b],
            &[smallvec![1], smallvec![1]],
            8,
            &[],
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.fills.as_slice(), &[None, None]);
        assert_eq!(p.outputs.as_slice(), &[PaddedDims::from_slice(&[1])]);
        assert_eq!(p.meta.outputs[0].shape.as_slice(), &[2, 8]);
    }

    #[test]
    fn a_length_that_fills_the_bucket_is_still_padded() {
        let a = f32s(&[2, 8]);
        let p = plan(OpId::Exp, &[a], &[smallvec![1]], 8, &[], &[])
            .unwrap()
            .unwrap();
        assert_eq!(p.outputs.as_slice(), &[PaddedDims::from_slice(&[1])]);
    }

    #[test]
    fn a_product_contracting_over_the_padding_is_exact_and_fills_zeros() {
        let a = f32s(&[2, 1, 5]);
        let b = f32s(&[2, 5, 3]);
        let p = plan(
            OpId::Bmm,
            &[a, b],
            &[smallvec![2], smallvec![1]],
            8,
            &[],
            &[],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            p.fills.as_slice(),
            &[Some(PadFill::Zero), Some(PadFill::Zero)]
        );
        assert!(p.outputs[0].is_empty());
    }

    #[test]
    fn softmax_over_the_padding_fills_minus_infinity() {
        let a = f32s(&[2, 5]);
        let p = plan(
            OpId::Softmax,
            std::slice::from_ref(&a),
            &[smallvec![1]],
            8,
            &[],
            &[-1, 0],
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.fills.as_slice(), &[Some(PadFill::Lowest)]);
        let q = plan(OpId::Softmax, &[a], &[smallvec![1]], 8, &[], &[0, 0])
            .unwrap()
            .unwrap();
        assert_eq!(q.fills.as_slice(), &[None]);
    }

    #[test]
    fn ops_the_padding_would_change_are_refused() {
        let a = f32s(&[2, 5]);
        let refused = |op, params: &[i64]| {
            plan(
                op,
                std::slice::from_ref(&a),
                &[smallvec![1]],
                8,
                &[],
                params,
            )
            .unwrap()
            .is_none()
        };
        assert!(refused(OpId::Mean, &[0, -1, 1]));
        assert!(refused(OpId::Reshape, &[10]));
        // A mean over the other dimension is exact.
        assert!(!refused(OpId::Mean, &[0, -1, 0]));
        // Two padded dimensions of different lengths are not one extent.
        let b = f32s(&[5, 6]);
        let two = plan(OpId::Neg, &[b], &[smallvec![0, 1]], 8, &[], &[]).unwrap();
        assert!(two.is_none());
    }

    #[test]
    fn a_table_whose_rows_merge_runs_of_the_extent_is_not_indexed_padded() {
        // `[2 * 12, 32]` rows of a `[2, 12, 32]` value padded to 16: true row 13 is padded row
        // 17, so indices into the rows cannot read the padded value.
        let rows = f32s(&[24, 32]);
        let index = TensorType::new(DType::I64, &[24]);
        let indexed = |op, params: &[i64]| {
            plan_at(
                op,
                &[rows.clone(), index.clone()],
                &[smallvec![0], PaddedDims::new()],
                16,
                12,
                &[],
                params,
            )
            .unwrap()
        };
        assert!(indexed(OpId::Index, &[0]).is_none());
        assert!(indexed(OpId::IndexSelect, &[0]).is_none());
        // One run (the extent alone) keeps true rows at their positions: indexed padded.
        let one_run = plan_at(
            OpId::Index,
            &[f32s(&[12, 32]), index.clone()],
            &[smallvec![0], PaddedDims::new()],
            16,
            12,
            &[],
            &[0],
        )
        .unwrap();
        assert!(one_run.is_some());
    }
}
