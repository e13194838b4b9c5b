//! The op catalogue: one row per op with everything the engine knows about it besides its meta
//! and lowering — stable numeric id, ATen name, the family module that computes it, its argument
//! layout (its static params by a typed layout of `param_layout`) and its facts (pointwise, size
//! params, side effects, index checks, product operands, cheap to recompute, exact `out=`
//! dtype). Every row names its family, so no op falls into one by default.

use std::marker::PhantomData;

use smallvec::SmallVec;

use crate::param_layout::{LayoutType, ParamLayout};
use crate::{
    activation, backward, checks, conv, creation, elementwise, factor, fft, indexing, linalg, loss,
    norm, optim, random, reduce, shape, OpRule,
};

/// Which module of this crate computes an op's meta and lowering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    Elementwise,
    Creation,
    /// Reductions, softmax and scans along a dimension.
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
    /// Discrete Fourier transforms.
    Spectral,
}

/// An op's facts, written once in its catalogue row; what a row leaves out takes the value
/// [`OpFacts::of`] gives its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpFacts {
    pub family: Family,
    /// Computes each output element from the matching input elements (or moves elements
    /// without arithmetic), so XLA may fuse it into each of its consumers. Elementwise ops are.
    pub pointwise: bool,
    /// The first size param (sizes, repeat counts, `eye`'s n and m, `linspace`'s steps): those
    /// belong with the dimensions of a cache key, not with its structure.
    pub size_params_from: Option<usize>,
    /// Must run even when nothing reads its outputs (it checks or changes state beyond them).
    pub side_effecting: bool,
    /// Reads integer indices that `checks::index_checks` guards.
    pub index_checks: bool,
    /// Inputs from this one on are matrix operands of a product: XLA reads them inside the
    /// product and never duplicates that read into the product's consumers.
    pub product_operands_from: Option<usize>,
    /// Not pointwise, yet cheap to compute again and the same every time, so a region may
    /// recompute its result for a late reader instead of holding it (layer and group norms).
    pub cheap_to_recompute: bool,
    /// An `out=` or in-place destination must have the result's dtype exactly (PyTorch's
    /// same-dtype unary ops: `neg`, `floor`…), where other ops cast into any dtype the result
    /// can be cast to.
    pub out_dtype_exact: bool,
    /// Meta and lowering are right for complex operands and results. Any other op refuses
    /// complex values with `NotImplementedError` (the plugin then runs it on the CPU), so a
    /// lowering written for real numbers never computes a complex result.
    pub complex: bool,
}

impl OpFacts {
    /// The facts of an op of `family` whose row states none.
    pub const fn of(family: Family) -> OpFacts {
        OpFacts {
            family,
            pointwise: matches!(family, Family::Elementwise),
            size_params_from: None,
            side_effecting: false,
            index_checks: false,
            product_operands_from: None,
            cheap_to_recompute: false,
            out_dtype_exact: false,
            complex: false,
        }
    }
}

macro_rules! op_catalogue {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, family: $family:ident, rule: $rule:expr, inputs: $inputs:literal, scalars: $scalars:literal, params: $params:ident $(, facts: { $($fact:ident: $value:expr),* $(,)? })?; )*) => {
        /// Every op the catalogue knows. The numeric ids are stable: new ops are appended.
        #[repr(u16)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpId {
            $( $(#[$doc])* $variant, )*
        }

        impl OpId {
            /// All ops, in id order.
            pub const ALL: &'static [OpId] = &[$(OpId::$variant),*];

            /// The ATen name of the op (`add`, `_softmax`, `nll_loss_forward`).
            pub fn name(self) -> &'static str {
                match self { $(OpId::$variant => $name,)* }
            }

            /// The tensor inputs, in order (`?` marks an optional one).
            pub fn inputs_layout(self) -> &'static str {
                match self { $(OpId::$variant => $inputs,)* }
            }

            /// The value scalars, in order; each is lifted to a runtime 0-d argument.
            pub fn scalars_layout(self) -> &'static str {
                match self { $(OpId::$variant => $scalars,)* }
            }

            /// The static params' layout (`&[i64]`, part of the compile cache key): names and
            /// kinds in order, decoded by the layout's struct.
            pub const fn param_layout(self) -> ParamLayout {
                match self { $(OpId::$variant => ParamLayout::$params,)* }
            }

            /// The meta and lowering of the op, from its row.
            pub(crate) fn rule(self) -> &'static dyn OpRule {
                match self { $(OpId::$variant => &$rule,)* }
            }

            /// The op's facts, from its row.
            pub const fn facts(self) -> OpFacts {
                match self {
                    $(OpId::$variant => OpFacts {
                        $($($fact: $value,)*)?
                        ..OpFacts::of(Family::$family)
                    },)*
                }
            }
        }

        /// Every op typed by its row's param layout (`typed::Slice`): a caller in Rust that
        /// makes an op builds its params through that layout's struct, so another layout's
        /// struct, a field left out or a field misnamed does not compile.
        #[allow(non_upper_case_globals)]
        pub mod typed {
            use super::{OpId, TypedOp};
            use crate::param_layout::of;
            $( pub const $variant: TypedOp<of::$params> = TypedOp::new(OpId::$variant); )*
        }
    };
}

/// An op whose params have the layout `L` (made by the catalogue, [`typed`], or checked
/// against the op's row, [`TypedOp::of`]).
///
/// ```
/// use ops::{param_layout as layout, typed, OpId};
/// let slice = typed::Slice.encode(layout::SliceRange { dim: 0, start: 1, end: 4, step: 1 });
/// assert_eq!((slice.op, slice.params.as_slice()), (OpId::Slice, &[0, 1, 4, 1][..]));
/// ```
///
/// Another layout's struct does not compile:
///
/// ```compile_fail
/// use ops::{param_layout as layout, typed};
/// typed::Slice.encode(layout::SelectIndex { dim: 0, index: 1 });
/// ```
pub struct TypedOp<L> {
    op: OpId,
    layout: PhantomData<L>,
}

impl<L> Clone for TypedOp<L> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<L> Copy for TypedOp<L> {}

impl<L: LayoutType> TypedOp<L> {
    const fn new(op: OpId) -> Self {
        TypedOp {
            op,
            layout: PhantomData,
        }
    }

    /// `op`, when its row names the layout `L`.
    pub fn of(op: OpId) -> Option<Self> {
        (op.param_layout() == L::LAYOUT).then(|| TypedOp::new(op))
    }

    pub const fn op(self) -> OpId {
        self.op
    }

    /// The op with `fields` encoded in its layout's order.
    pub fn encode(self, fields: L::Fields<'_>) -> EncodedOp {
        let mut params = SmallVec::new();
        L::encode_into(&fields, &mut params);
        EncodedOp {
            op: self.op,
            params,
        }
    }
}

/// An op and its params, encoded by the op's layout ([`TypedOp::encode`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedOp {
    pub op: OpId,
    pub params: SmallVec<[i64; 6]>,
}

op_catalogue! {
    // ---- unary elementwise -------------------------------------------------------------
    Neg = "neg", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { complex: true, out_dtype_exact: true };
    Abs = "abs", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { complex: true, out_dtype_exact: true };
    Exp = "exp", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { complex: true };
    Exp2 = "exp2", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Log = "log", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { complex: true };
    Log2 = "log2", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Log10 = "log10", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Log1p = "log1p", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Expm1 = "expm1", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Sqrt = "sqrt", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { complex: true };
    Rsqrt = "rsqrt", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Sin = "sin", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { complex: true };
    Cos = "cos", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { complex: true };
    Tan = "tan", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Tanh = "tanh", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { complex: true };
    Sigmoid = "sigmoid", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Relu = "relu", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Gelu = "gelu", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: GeluApproximate;
    Silu = "silu", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Erf = "erf", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Erfinv = "erfinv", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Lgamma = "lgamma", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Digamma = "digamma", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    Floor = "floor", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { out_dtype_exact: true };
    Ceil = "ceil", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { out_dtype_exact: true };
    Round = "round", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: RoundDecimals, facts: { out_dtype_exact: true };
    Trunc = "trunc", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { out_dtype_exact: true };
    Sign = "sign", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { out_dtype_exact: true };
    Reciprocal = "reciprocal", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { complex: true };
    LogicalNot = "logical_not", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    BitwiseNot = "bitwise_not", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None, facts: { out_dtype_exact: true };
    IsNan = "isnan", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    IsInf = "isinf", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    /// Replacements are static: PyTorch's defaults depend on the dtype (its max/min).
    NanToNum = "nan_to_num", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "",
        params: NanToNum, facts: { out_dtype_exact: true };

    // ---- binary elementwise: `other` is inputs[1], or scalars[0] when only one input ----
    Add = "add", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input), alpha?", params: None, facts: { complex: true };
    Sub = "sub", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input), alpha?", params: None, facts: { complex: true };
    /// `other - alpha * self`.
    Rsub = "rsub", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input), alpha?", params: None, facts: { complex: true };
    Mul = "mul", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None, facts: { complex: true };
    Div = "div", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)",
        params: DivRounding, facts: { complex: true };
    Remainder = "remainder", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    Fmod = "fmod", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    /// `self ** exponent`; a scalar exponent stays a runtime scalar, and the values PyTorch's
    /// kernels special-case (2, 3, 0.5, -0.5, -1, -2, 1, 0) pick their own lowering
    /// (`Meta::variant`).
    Pow = "pow", family: Elementwise, rule: elementwise::Binary, inputs: "self, exponent", scalars: "exponent (when not an input)", params: None;
    /// `self ** exponent` with a scalar base.
    PowScalarBase = "pow.Scalar", family: Elementwise, rule: elementwise::Binary, inputs: "exponent", scalars: "self", params: None;
    Maximum = "maximum", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    Minimum = "minimum", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    Atan2 = "atan2", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    Eq = "eq", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None, facts: { complex: true };
    Ne = "ne", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None, facts: { complex: true };
    Lt = "lt", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    Le = "le", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    Gt = "gt", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    Ge = "ge", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    LogicalAnd = "logical_and", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    LogicalOr = "logical_or", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    LogicalXor = "logical_xor", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    BitwiseAnd = "bitwise_and", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    BitwiseOr = "bitwise_or", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    BitwiseXor = "bitwise_xor", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    /// `self << other`; shifts of the bit width or more, or negative, give 0 (as PyTorch's).
    BitwiseLeftShift = "bitwise_left_shift", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    /// `self >> other`, arithmetic for signed dtypes; out-of-range shifts fill with the sign bit.
    BitwiseRightShift = "bitwise_right_shift", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;

    // ---- ternary elementwise -----------------------------------------------------------
    Where = "where", family: Elementwise, rule: elementwise::Where, inputs: "condition, self?, other?", scalars: "self?, other?",
        params: WhereOperands, facts: { complex: true };
    Clamp = "clamp", family: Elementwise, rule: elementwise::Clamp, inputs: "self, min?, max?", scalars: "min?, max?",
        params: ClampBounds;
    Lerp = "lerp", family: Elementwise, rule: elementwise::Lerp, inputs: "self, end, weight?", scalars: "weight (when not an input)", params: None;
    Addcmul = "addcmul", family: Elementwise, rule: elementwise::Addc, inputs: "self, tensor1, tensor2", scalars: "value? (default 1)", params: None;
    Addcdiv = "addcdiv", family: Elementwise, rule: elementwise::Addc, inputs: "self, tensor1, tensor2", scalars: "value? (default 1)", params: None;

    // ---- casts, copies and creation ----------------------------------------------------
    Convert = "_to_copy", family: Creation, rule: creation::Convert, inputs: "self", scalars: "", params: ConvertTo, facts: { complex: true, pointwise: true };
    Clone = "clone", family: Creation, rule: creation::CloneOp, inputs: "self", scalars: "", params: None, facts: { complex: true, pointwise: true };
    /// The new value of `self` after `self.copy_(src)`: `src` broadcast and cast to `self`.
    Copy = "copy_", family: Creation, rule: creation::CopyOp, inputs: "self, src", scalars: "", params: None, facts: { complex: true, pointwise: true };
    Fill = "fill_", family: Creation, rule: creation::Fill, inputs: "self, value? (0-d tensor)", scalars: "value (when not an input)", params: None, facts: { complex: true };
    Full = "full", family: Creation, rule: creation::Full, inputs: "", scalars: "fill_value", params: Creation, facts: { complex: true, size_params_from: Some(1) };
    Zeros = "zeros", family: Creation, rule: creation::Constant(0), inputs: "", scalars: "", params: Creation, facts: { complex: true, size_params_from: Some(1) };
    Ones = "ones", family: Creation, rule: creation::Constant(1), inputs: "", scalars: "", params: Creation, facts: { complex: true, size_params_from: Some(1) };
    Arange = "arange", family: Creation, rule: creation::Arange, inputs: "", scalars: "", params: ArangeRange;
    Linspace = "linspace", family: Creation, rule: creation::Linspace, inputs: "", scalars: "start, end", params: LinspaceSteps, facts: { complex: true, size_params_from: Some(1) };
    Eye = "eye", family: Creation, rule: creation::Eye, inputs: "", scalars: "", params: EyeSizes, facts: { complex: true, size_params_from: Some(1) };

    // ---- reductions (dims empty = all dims) --------------------------------------------
    Sum = "sum", family: Reduce, rule: reduce::SumProd, inputs: "self", scalars: "", params: ReduceDtypeDims, facts: { complex: true };
    Mean = "mean", family: Reduce, rule: reduce::Mean, inputs: "self", scalars: "", params: ReduceDtypeDims, facts: { complex: true };
    Prod = "prod", family: Reduce, rule: reduce::SumProd, inputs: "self", scalars: "", params: ReduceDtypeDims, facts: { complex: true };
    Amax = "amax", family: Reduce, rule: reduce::MinMax, inputs: "self", scalars: "", params: ReduceDims;
    Amin = "amin", family: Reduce, rule: reduce::MinMax, inputs: "self", scalars: "", params: ReduceDims;
    Argmax = "argmax", family: Reduce, rule: reduce::ArgReduce, inputs: "self", scalars: "", params: ArgReduce;
    Argmin = "argmin", family: Reduce, rule: reduce::ArgReduce, inputs: "self", scalars: "", params: ArgReduce;
    Any = "any", family: Reduce, rule: reduce::AnyAll, inputs: "self", scalars: "", params: ReduceDims;
    All = "all", family: Reduce, rule: reduce::AnyAll, inputs: "self", scalars: "", params: ReduceDims;
    Var = "var", family: Reduce, rule: reduce::VarStd, inputs: "self", scalars: "", params: ReduceCorrectionDims;
    Std = "std", family: Reduce, rule: reduce::VarStd, inputs: "self", scalars: "", params: ReduceCorrectionDims;
    Logsumexp = "logsumexp", family: Reduce, rule: reduce::Logsumexp, inputs: "self", scalars: "", params: ReduceDims;
    Norm = "linalg_vector_norm", family: Reduce, rule: reduce::VectorNorm, inputs: "self", scalars: "", params: VectorNorm, facts: { complex: true };
    Softmax = "_softmax", family: Reduce, rule: reduce::Softmax, inputs: "self", scalars: "", params: SoftmaxDim;
    LogSoftmax = "_log_softmax", family: Reduce, rule: reduce::Softmax, inputs: "self", scalars: "", params: SoftmaxDim;

    // ---- matrix products ---------------------------------------------------------------
    Mm = "mm", family: Linalg, rule: linalg::Mm, inputs: "self, mat2", scalars: "", params: None, facts: { complex: true, product_operands_from: Some(0) };
    Bmm = "bmm", family: Linalg, rule: linalg::Bmm, inputs: "self, mat2", scalars: "", params: None, facts: { complex: true, product_operands_from: Some(0) };
    /// `beta * self + alpha * (mat1 @ mat2)`.
    Addmm = "addmm", family: Linalg, rule: linalg::AddProduct, inputs: "self, mat1, mat2", scalars: "beta? (default 1), alpha? (default 1)", params: None, facts: { product_operands_from: Some(1) };
    Baddbmm = "baddbmm", family: Linalg, rule: linalg::AddProduct, inputs: "self, batch1, batch2", scalars: "beta? (default 1), alpha? (default 1)", params: None, facts: { product_operands_from: Some(1) };
    Dot = "dot", family: Linalg, rule: linalg::Dot, inputs: "self, other", scalars: "", params: None, facts: { complex: true, product_operands_from: Some(0) };
    Matmul = "matmul", family: Linalg, rule: linalg::Matmul, inputs: "self, other", scalars: "", params: None, facts: { complex: true, product_operands_from: Some(0) };
    /// `A X = B` (or `X A = B`) for triangular `A`, batch dims broadcast.
    SolveTriangular = "linalg_solve_triangular", family: Linalg, rule: linalg::SolveTriangular, inputs: "self, B", scalars: "", params: SolveTriangular;

    // ---- shape and indexing ------------------------------------------------------------
    Cat = "cat", family: Shape, rule: shape::Cat, inputs: "tensors...", scalars: "", params: Dim, facts: { complex: true };
    Stack = "stack", family: Shape, rule: shape::Stack, inputs: "tensors...", scalars: "", params: Dim, facts: { complex: true };
    Flip = "flip", family: Shape, rule: shape::Flip, inputs: "self", scalars: "", params: Dims, facts: { complex: true };
    Roll = "roll", family: Shape, rule: shape::Roll, inputs: "self", scalars: "", params: RollShifts, facts: { complex: true };
    ConstantPadNd = "constant_pad_nd", family: Shape, rule: shape::ConstantPad, inputs: "self", scalars: "value? (default 0)",
        params: PadWidths, facts: { complex: true };
    Repeat = "repeat", family: Shape, rule: shape::Repeat, inputs: "self", scalars: "", params: Repeats, facts: { complex: true, size_params_from: Some(0) };
    Tril = "tril", family: Shape, rule: shape::TrilTriu, inputs: "self", scalars: "", params: Diagonal;
    Triu = "triu", family: Shape, rule: shape::TrilTriu, inputs: "self", scalars: "", params: Diagonal;
    Gather = "gather", family: Shape, rule: shape::Gather, inputs: "self, index", scalars: "", params: Dim, facts: { complex: true, index_checks: true };
    IndexSelect = "index_select", family: Shape, rule: shape::IndexSelect, inputs: "self, index", scalars: "", params: Dim, facts: { complex: true, index_checks: true };
    Scatter = "scatter", family: Shape, rule: shape::Scatter, inputs: "self, index, src?", scalars: "value (when no src)", params: Dim, facts: { index_checks: true };
    ScatterAdd = "scatter_add", family: Shape, rule: shape::Scatter, inputs: "self, index, src", scalars: "", params: Dim, facts: { index_checks: true };
    /// `src` combined into `self` at `index` along `dim` with a reduction other than a sum; a
    /// NaN wins in `amax` and `amin`, as in PyTorch's kernels.
    ScatterReduce = "scatter_reduce", family: Shape, rule: shape::Scatter, inputs: "self, index, src", scalars: "",
        params: ScatterCombine, facts: { index_checks: true };
    Embedding = "embedding", family: Shape, rule: shape::Embedding, inputs: "weight, indices", scalars: "", params: None, facts: { index_checks: true };
    Expand = "expand", family: Shape, rule: shape::Expand, inputs: "self", scalars: "", params: Sizes, facts: { complex: true, pointwise: true, size_params_from: Some(0) };
    SumToSize = "sum_to_size", family: Shape, rule: shape::SumToSize, inputs: "self", scalars: "", params: Sizes, facts: { size_params_from: Some(0) };
    Reshape = "reshape", family: Shape, rule: shape::Reshape, inputs: "self", scalars: "", params: Sizes, facts: { complex: true, pointwise: true, size_params_from: Some(0) };
    Permute = "permute", family: Shape, rule: shape::Permute, inputs: "self", scalars: "", params: Dims, facts: { complex: true, pointwise: true };
    Transpose = "transpose", family: Shape, rule: shape::Transpose, inputs: "self", scalars: "", params: TransposeDims, facts: { complex: true, pointwise: true };
    Slice = "slice", family: Shape, rule: shape::Slice, inputs: "self", scalars: "", params: SliceRange, facts: { complex: true, pointwise: true };
    Select = "select", family: Shape, rule: shape::Select, inputs: "self", scalars: "", params: SelectIndex, facts: { complex: true, pointwise: true };

    // ---- backward ops ------------------------------------------------------------------
    ThresholdBackward = "threshold_backward", family: Backward, rule: backward::ThresholdBackward, inputs: "grad_output, self", scalars: "threshold", params: None, facts: { pointwise: true };
    LogSoftmaxBackward = "_log_softmax_backward_data", family: Backward, rule: backward::SoftmaxBackward, inputs: "grad_output, output", scalars: "", params: SoftmaxBackwardDim;
    SoftmaxBackward = "_softmax_backward_data", family: Backward, rule: backward::SoftmaxBackward, inputs: "grad_output, output", scalars: "", params: SoftmaxBackwardDim;
    /// Outputs `(output, total_weight)`.
    NllLoss = "nll_loss_forward", family: Loss, rule: loss::NllLoss, inputs: "self, target, weight?", scalars: "",
        params: NllLossReduction, facts: { index_checks: true };
    NllLossBackward = "nll_loss_backward", family: Loss, rule: loss::NllLossBackward, inputs: "grad_output, self, target, total_weight, weight?", scalars: "",
        params: NllLossReduction;

    // ---- side-effecting ops ------------------------------------------------------------
    /// Outputs a 0-d bool flag (true when the assertion holds) that the engine checks after
    /// running: PyTorch's op has no result, so nothing reads the flag, and it is kept only
    /// because it is side-effecting.
    AssertAsync = "_assert_async", family: Check, rule: checks::AssertAsync, inputs: "self", scalars: "", params: None, facts: { side_effecting: true };

    // ---- random numbers ----------------------------------------------------------------
    // Each draw takes a 64-bit key from the device's generator as a lifted scalar (a new draw
    // never recompiles); the bits hash a counter with the key (SplitMix64, RFC 0010).
    /// Values in `[from, to)`.
    Uniform = "uniform", family: Random, rule: random::Uniform, inputs: "", scalars: "from, to, key", params: Creation, facts: { size_params_from: Some(1) };
    /// Normal values (Box-Muller over two uniform draws).
    Normal = "normal", family: Random, rule: random::Normal, inputs: "", scalars: "mean, std, key", params: Creation, facts: { size_params_from: Some(1) };
    /// Integers in `[from, to)`; with `full_range`, the 63-bit range `[0, 2^63)` (`to` unused).
    RandomInt = "random_", family: Random, rule: random::RandomInt, inputs: "", scalars: "from, to, key", params: RandomIntDraw, facts: { size_params_from: Some(2) };
    /// 1 with probability `p` (a tensor broadcast to `sizes`, or a scalar), else 0.
    Bernoulli = "bernoulli", family: Random, rule: random::Bernoulli, inputs: "p?", scalars: "p (when not an input), key", params: Creation, facts: { size_params_from: Some(1) };
    /// Outputs `(input * mask / (1 - p), mask)`, the mask keeping each element with probability
    /// `1 - p`; with `train` 0, `(input, all true)`.
    NativeDropout = "native_dropout", family: Random, rule: random::NativeDropout, inputs: "input", scalars: "p, key", params: DropoutTrain;
    NativeDropoutBackward = "native_dropout_backward", family: Random, rule: random::NativeDropoutBackward, inputs: "grad_output, mask", scalars: "scale", params: None;

    // ---- convolution and pooling -------------------------------------------------------
    // Lists in these params are counted: `n, v1 .. vn`.
    /// An N-d convolution, or with `transposed` its adjoint (PyTorch's conv_transpose); PyTorch
    /// has expanded every list to one value per spatial dim.
    Convolution = "convolution_overrideable", family: Conv, rule: conv::Convolution, inputs: "input, weight, bias?", scalars: "",
        params: Convolution, facts: { product_operands_from: Some(0) };
    /// Outputs `(grad_input, grad_weight, grad_bias)`; one `output_mask` leaves out is an empty
    /// placeholder.
    ConvolutionBackward = "convolution_backward_overrideable", family: Conv, rule: conv::ConvolutionBackward, inputs: "grad_output, input, weight", scalars: "",
        params: ConvolutionBackward, facts: { product_operands_from: Some(0) };
    /// Outputs `(output, indices)`; an index is the flat position `h * W + w` in its plane.
    MaxPool2dWithIndices = "max_pool2d_with_indices", family: Conv, rule: conv::MaxPool, inputs: "self", scalars: "",
        params: MaxPool;
    MaxPool2dWithIndicesBackward = "max_pool2d_with_indices_backward", family: Conv, rule: conv::MaxPoolBackward, inputs: "grad_output, self, indices", scalars: "",
        params: MaxPool;
    AvgPool2d = "avg_pool2d", family: Conv, rule: conv::AvgPool, inputs: "self", scalars: "",
        params: AvgPool;
    AvgPool2dBackward = "avg_pool2d_backward", family: Conv, rule: conv::AvgPoolBackward, inputs: "grad_output, self", scalars: "",
        params: AvgPool;
    AdaptiveAvgPool2d = "_adaptive_avg_pool2d", family: Conv, rule: conv::AdaptiveAvgPool, inputs: "self", scalars: "", params: AdaptiveOutputSize;
    AdaptiveAvgPool2dBackward = "_adaptive_avg_pool2d_backward", family: Conv, rule: conv::AdaptiveAvgPoolBackward, inputs: "grad_output, self", scalars: "", params: None;

    // ---- normalization -----------------------------------------------------------------
    // Optional inputs are placed by `has_*` presence flags (0 or 1) at the front of the params;
    // a backward op's `output_mask` has bits 1 = input, 2 = weight, 4 = bias (an output off in
    // the mask is zeros).
    /// Outputs `(output, save_mean, save_invstd)`; in evaluation the saved statistics are empty,
    /// as on PyTorch's CPU. The running statistics are updated by `_batch_norm_running_stats`.
    NativeBatchNorm = "native_batch_norm", family: Normalization, rule: norm::NativeBatchNorm,
        inputs: "input, weight?, bias?, running_mean?, running_var?", scalars: "",
        params: BatchNorm;
    /// The new `(running_mean, running_var)` after a training step of batch norm on `input`
    /// (the running variance takes the unbiased batch variance). PyTorch updates them in place
    /// inside `native_batch_norm`; the kernel writes these outputs into them.
    BatchNormRunningStats = "_batch_norm_running_stats", family: Normalization, rule: norm::BatchNormRunningStats,
        inputs: "input, running_mean, running_var", scalars: "momentum", params: None;
    /// Outputs `(grad_input, grad_weight, grad_bias)`.
    NativeBatchNormBackward = "native_batch_norm_backward", family: Normalization, rule: norm::NativeBatchNormBackward,
        inputs: "grad_out, input, weight?, running_mean?, running_var?, save_mean?, save_invstd?", scalars: "",
        params: BatchNormBackward;
    /// Outputs `(output, mean, rstd)`.
    NativeLayerNorm = "native_layer_norm", family: Normalization, rule: norm::NativeLayerNorm, inputs: "input, weight?, bias?", scalars: "",
        params: LayerNorm, facts: { cheap_to_recompute: true };
    NativeLayerNormBackward = "native_layer_norm_backward", family: Normalization, rule: norm::NativeLayerNormBackward,
        inputs: "grad_out, input, mean, rstd, weight?, bias?", scalars: "",
        params: LayerNormBackward;
    /// Outputs `(output, mean, rstd)`, the statistics shaped `[N, group]`.
    NativeGroupNorm = "native_group_norm", family: Normalization, rule: norm::NativeGroupNorm, inputs: "input, weight?, bias?", scalars: "",
        params: GroupNorm, facts: { cheap_to_recompute: true };
    NativeGroupNormBackward = "native_group_norm_backward", family: Normalization, rule: norm::NativeGroupNormBackward,
        inputs: "grad_out, input, mean, rstd, weight?", scalars: "",
        params: GroupNormBackward;
    EmbeddingDenseBackward = "embedding_dense_backward", family: Backward, rule: backward::EmbeddingDenseBackward, inputs: "grad_output, indices", scalars: "",
        params: EmbeddingBackward;
    Cumsum = "cumsum", family: Reduce, rule: reduce::Cumulative, inputs: "self", scalars: "", params: DimDtype;
    Cumprod = "cumprod", family: Reduce, rule: reduce::Cumulative, inputs: "self", scalars: "", params: DimDtype;
    Logcumsumexp = "logcumsumexp", family: Reduce, rule: reduce::Logcumsumexp, inputs: "self", scalars: "", params: Dim;
    MaskedFill = "masked_fill", family: Elementwise, rule: elementwise::MaskedFill, inputs: "self, mask, value? (0-d tensor)",
        scalars: "value (when not an input)", params: None, facts: { complex: true };

    // ---- attention, sorting, indexing and optimizer ops --------------------------------
    // Sorting and advanced indexing. A result size that depends on the data (`count`) is read
    // to the host by the caller first, so each op has a static shape.
    /// Outputs `(values, indices)` sorted along `dim`. Always stable: equal values keep their
    /// order, which is PyTorch's for `stable=True` (and what its CPU kernel gives short rows).
    Sort = "sort", family: Indexing, rule: indexing::Sort, inputs: "self", scalars: "", params: SortDim;
    /// Outputs `(values, indices)` of the `k` largest (or smallest) along `dim`, in sorted order.
    TopK = "topk", family: Indexing, rule: indexing::TopK, inputs: "self", scalars: "", params: TopK;
    /// `[rank, count]` int64 coordinates of the nonzero elements in row-major order: the
    /// transpose of PyTorch's result, which is column-major.
    Nonzero = "nonzero", family: Indexing, rule: indexing::Nonzero, inputs: "self", scalars: "", params: Count, facts: { complex: true };
    /// The `count` elements of `self` where the (broadcast) bool `mask` holds, row-major.
    MaskedSelect = "masked_select", family: Indexing, rule: indexing::MaskedSelect, inputs: "self, mask", scalars: "", params: Count, facts: { complex: true };
    /// The new `self` after `self.masked_scatter_(mask, source)`.
    MaskedScatter = "masked_scatter_", family: Indexing, rule: indexing::MaskedScatter, inputs: "self, mask, source", scalars: "", params: None, facts: { complex: true };
    /// `self[indices]` with integer index tensors selecting along the given dims (the caller
    /// turns bool masks into nonzero coordinates; unindexed dims are taken whole).
    Index = "index", family: Indexing, rule: indexing::Index, inputs: "self, indices...", scalars: "", params: IndexedDims, facts: { complex: true, index_checks: true };
    /// The new `self` after `self[indices] = values` (`+=` with `accumulate`).
    IndexPut = "index_put", family: Indexing, rule: indexing::IndexPut, inputs: "self, values, indices...", scalars: "",
        params: IndexPutDims, facts: { complex: true, index_checks: true };
    // Attention and training: activation gradients, losses and fused optimizer steps.
    /// Softmax whose rows of all `-inf` (fully masked attention rows) give zeros.
    SafeSoftmax = "_safe_softmax", family: Reduce, rule: reduce::SafeSoftmax, inputs: "self", scalars: "", params: DimDtype;
    GeluBackward = "gelu_backward", family: Activation, rule: activation::GeluBackward, inputs: "grad_output, self", scalars: "",
        params: GeluApproximate, facts: { pointwise: true };
    TanhBackward = "tanh_backward", family: Activation, rule: activation::TanhBackward, inputs: "grad_output, output", scalars: "", params: None, facts: { pointwise: true };
    SigmoidBackward = "sigmoid_backward", family: Activation, rule: activation::SigmoidBackward, inputs: "grad_output, output", scalars: "", params: None, facts: { pointwise: true };
    /// Outputs `(output, buffer)`, the buffer `exp(-|self|)` as on PyTorch's CPU.
    LogSigmoidForward = "log_sigmoid_forward", family: Activation, rule: activation::LogSigmoidForward, inputs: "self", scalars: "", params: None;
    /// Recomputes what it needs from `self`; `buffer` is accepted and unused.
    LogSigmoidBackward = "log_sigmoid_backward", family: Activation, rule: activation::LogSigmoidBackward, inputs: "grad_output, self, buffer", scalars: "", params: None;
    // Losses: `reduction` is 0 = none, 1 = mean, 2 = sum.
    MseLoss = "mse_loss", family: Loss, rule: loss::PointwiseLoss, inputs: "self, target", scalars: "", params: LossReduction;
    MseLossBackward = "mse_loss_backward", family: Loss, rule: loss::PointwiseLossBackward, inputs: "grad_output, self, target", scalars: "", params: LossReduction;
    SmoothL1Loss = "smooth_l1_loss", family: Loss, rule: loss::PointwiseLoss, inputs: "self, target", scalars: "beta", params: LossReduction;
    SmoothL1LossBackward = "smooth_l1_loss_backward", family: Loss, rule: loss::PointwiseLossBackward, inputs: "grad_output, self, target", scalars: "beta",
        params: LossReduction;
    HuberLoss = "huber_loss", family: Loss, rule: loss::PointwiseLoss, inputs: "self, target", scalars: "delta", params: LossReduction;
    HuberLossBackward = "huber_loss_backward", family: Loss, rule: loss::PointwiseLossBackward, inputs: "grad_output, self, target", scalars: "delta",
        params: LossReduction;
    BinaryCrossEntropy = "binary_cross_entropy", family: Loss, rule: loss::BinaryCrossEntropy, inputs: "self, target, weight?", scalars: "",
        params: LossReduction;
    BinaryCrossEntropyBackward = "binary_cross_entropy_backward", family: Loss, rule: loss::BinaryCrossEntropyBackward, inputs: "grad_output, self, target, weight?",
        scalars: "", params: LossReduction;
    /// `nll_loss` over `[N, C, H, W]` with targets `[N, H, W]`; outputs `(output, total_weight)`.
    NllLoss2d = "nll_loss2d_forward", family: Loss, rule: loss::NllLoss2d, inputs: "self, target, weight?", scalars: "",
        params: NllLossReduction, facts: { index_checks: true };
    NllLoss2dBackward = "nll_loss2d_backward", family: Loss, rule: loss::NllLoss2dBackward, inputs: "grad_output, self, target, total_weight, weight?",
        scalars: "", params: NllLossReduction;
    // Fused optimizer steps, one parameter per call; outputs the new parameter and state.
    /// Adam (AdamW with `adamw`); outputs `(param, exp_avg, exp_avg_sq, max_exp_avg_sq if
    /// amsgrad)`. `state_step` is the already incremented step count; where `found_inf` is 1
    /// nothing changes.
    FusedAdam = "_fused_adam_", family: Optim, rule: optim::FusedAdam,
        inputs: "param, grad, exp_avg, exp_avg_sq, state_step, max_exp_avg_sq? (amsgrad), lr? (lr_is_tensor), found_inf? (has_found_inf)",
        scalars: "lr (when not an input), beta1, beta2, weight_decay, eps",
        params: FusedAdamFlags;
    /// SGD; outputs `(param, momentum_buffer if given)`.
    FusedSgd = "_fused_sgd_", family: Optim, rule: optim::FusedSgd,
        inputs: "param, grad, momentum_buffer? (has_momentum_buffer), lr? (lr_is_tensor), found_inf? (has_found_inf)",
        scalars: "lr (when not an input), weight_decay, momentum, dampening",
        params: FusedSgdFlags;

    // ---- index checks ------------------------------------------------------------------
    /// Whether every index is in range, for the indexing op captured just before it (see
    /// `checks::index_checks`). Side-effecting: outputs the i64 verdict `[bad, first bad
    /// index, size, dim, style]`, which the engine reads at the next materialization point
    /// and turns into PyTorch's error (RFC 0012).
    IndexCheck = "index_check", family: Check, rule: checks::IndexCheckOp, inputs: "index", scalars: "size? (read at run time instead of param 0: a padded extent's true length)",
        params: IndexBounds, facts: { side_effecting: true };

    // ---- 3-d and adaptive max pooling --------------------------------------------------
    /// Outputs `(output, indices)`; an index is the flat position `(d * H + h) * W + w` in its
    /// volume.
    MaxPool3dWithIndices = "max_pool3d_with_indices", family: Conv, rule: conv::MaxPool, inputs: "self", scalars: "",
        params: MaxPool;
    MaxPool3dWithIndicesBackward = "max_pool3d_with_indices_backward", family: Conv, rule: conv::MaxPoolBackward, inputs: "grad_output, self, indices", scalars: "",
        params: MaxPool;
    AvgPool3d = "avg_pool3d", family: Conv, rule: conv::AvgPool, inputs: "self", scalars: "",
        params: AvgPool;
    AvgPool3dBackward = "avg_pool3d_backward", family: Conv, rule: conv::AvgPoolBackward, inputs: "grad_output, self", scalars: "",
        params: AvgPool;
    /// Outputs `(output, indices)`; an index is the flat position `h * W + w` in its plane.
    AdaptiveMaxPool2d = "adaptive_max_pool2d", family: Conv, rule: conv::AdaptiveMaxPool, inputs: "self", scalars: "", params: AdaptiveOutputSize;
    AdaptiveMaxPool2dBackward = "adaptive_max_pool2d_backward", family: Conv, rule: conv::AdaptiveMaxPoolBackward, inputs: "grad_output, self, indices", scalars: "", params: None;
    /// Whether each element of `elements` equals one of `test_elements` (compared in their
    /// promoted dtype); `invert` negates.
    Isin = "isin", family: Reduce, rule: reduce::Isin, inputs: "elements, test_elements", scalars: "test_elements (when not an input)",
        params: Invert;

    // ---- complex numbers ---------------------------------------------------------------
    /// `torch.complex(real, imag)`: two float tensors of one dtype, broadcast together.
    Complex = "complex", family: Elementwise, rule: elementwise::Complex, inputs: "real, imag", scalars: "", params: None, facts: { complex: true };
    /// The complex conjugate as stored values (no conjugate bit); a real tensor's copy.
    ConjPhysical = "_conj_physical", family: Elementwise, rule: elementwise::ConjPhysical, inputs: "self", scalars: "", params: None, facts: { complex: true };

    // ---- discrete Fourier transforms ---------------------------------------------------
    // `normalization` is at::native's fft_norm_mode: 0 = none, 1 = by 1/sqrt(n), 2 = by 1/n,
    // with n the signal size (the real signal's for the real transforms), in either direction.
    /// A complex-to-complex transform over `dims` (none: a copy).
    FftC2c = "_fft_c2c", family: Spectral, rule: fft::FftC2c, inputs: "self", scalars: "", params: FftC2c, facts: { complex: true };
    /// The forward transform of a real tensor over `dims`; with `onesided` the last of `dims`
    /// keeps `n / 2 + 1` frequencies.
    FftR2c = "_fft_r2c", family: Spectral, rule: fft::FftR2c, inputs: "self", scalars: "", params: FftR2c, facts: { complex: true };
    /// The inverse transform to a real tensor over `dims` whose last dim becomes
    /// `last_dim_size` long (reading its first `last_dim_size / 2 + 1` frequencies).
    FftC2r = "_fft_c2r", family: Spectral, rule: fft::FftC2r, inputs: "self", scalars: "", params: FftC2r, facts: { complex: true };

    // ---- repeat_interleave -------------------------------------------------------------
    /// `torch.repeat_interleave(repeats)`: each position `i` of the 1-d int32/int64 `repeats`
    /// written `repeats[i]` times, `total` elements in all (the caller reads the sum from the
    /// data, or takes the user's `output_size`); positions past the true total hold the last
    /// position. Of `repeats`' dtype.
    RepeatInterleave = "repeat_interleave", family: Indexing, rule: indexing::RepeatInterleave, inputs: "repeats", scalars: "", params: Count;
    /// Whether `repeats` has no negative element and sums to `total` (a user's `output_size`,
    /// which the op trusted). Side-effecting: outputs an `index_check`-shaped verdict (style
    /// `NegativeRepeats` or `RepeatsTotal`), read at the next materialization point.
    RepeatsCheck = "repeats_check", family: Check, rule: checks::RepeatsCheck, inputs: "repeats", scalars: "total", params: None, facts: { side_effecting: true };

    // ---- attention ---------------------------------------------------------------------
    /// `softmax(query @ key^T * scale + mask) @ value` in one op, with each row's logsumexp
    /// (`scaled_dot_product_attention` at PrivateUse1, RFC 0050).
    Attention = "_scaled_dot_product_fused_attention_overrideable", family: Linalg, rule: linalg::Attention, inputs: "query, key, value, attn_bias?", scalars: "", params: Attention;
    /// The query's, key's and value's gradients of `Attention`, and the mask's when asked.
    AttentionBackward = "_scaled_dot_product_fused_attention_overrideable_backward", family: Linalg, rule: linalg::AttentionBackward, inputs: "grad_out, query, key, value, out, attn_bias?", scalars: "", params: AttentionBackward;

    // ---- unary elementwise, continued ---------------------------------------------------
    /// `1 - erf(x)`, computed without the cancellation of that difference in the tail.
    Erfc = "erfc", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    /// The exponentially scaled modified Bessel function of the first kind, order one:
    /// `exp(-|x|) I1(x)`.
    SpecialI1e = "special_i1e", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;

    // ---- binary elementwise, continued --------------------------------------------------
    /// The Hurwitz zeta function `zeta(x, q)`.
    SpecialZeta = "special_zeta", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;
    /// The next float after `self` towards `other`.
    Nextafter = "nextafter", family: Elementwise, rule: elementwise::Binary, inputs: "self, other", scalars: "other (when not an input)", params: None;

    // ---- matrix factorizations -----------------------------------------------------------
    /// The Cholesky factor and LAPACK's `info` of each symmetric positive-definite matrix.
    Cholesky = "linalg_cholesky_ex", family: Linalg, rule: factor::Cholesky, inputs: "self", scalars: "", params: Cholesky;
    /// LU with partial pivoting: the packed factors, the 1-based pivots and LAPACK's `info`.
    LuFactor = "linalg_lu_factor_ex", family: Linalg, rule: factor::LuFactor, inputs: "A", scalars: "", params: LuFactor;
    /// The row order that LU's pivots make (`lu_unpack`'s permutation, `lu_solve`'s row gather).
    LuPermutation = "lu_permutation", family: Linalg, rule: factor::LuPermutation, inputs: "pivots", scalars: "", params: LuPermutation;
    /// `A = Q R` by Householder reflections.
    Qr = "linalg_qr", family: Linalg, rule: factor::Qr, inputs: "A", scalars: "", params: Qr;
    /// Eigenvalues and eigenvectors of symmetric matrices.
    Eigh = "_linalg_eigh", family: Linalg, rule: factor::Eigh, inputs: "A", scalars: "", params: Eigh;
    /// LAPACK's `geqrf`: the Householder vectors below R's diagonal, and their scalars.
    Geqrf = "geqrf", family: Linalg, rule: factor::Geqrf, inputs: "self", scalars: "", params: None;
    /// LAPACK's `orgqr`: the product of the Householder reflectors `geqrf` packs.
    HouseholderProduct = "linalg_householder_product", family: Linalg, rule: factor::HouseholderProduct, inputs: "input, tau", scalars: "", params: None;

    // ---- unary elementwise, continued --------------------------------------------------
    /// The modified Bessel function of the first kind, order zero.
    I0 = "i0", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;
    /// `exp(-|x|) I0(x)`.
    SpecialI0e = "special_i0e", family: Elementwise, rule: elementwise::Unary, inputs: "self", scalars: "", params: None;

    // ---- matrix factorizations, continued ----------------------------------------------
    /// The singular value decomposition `A = U diag(S) Vh`, singular values descending.
    Svd = "_linalg_svd", family: Linalg, rule: factor::Svd, inputs: "A", scalars: "", params: Svd;

    // ---- orthogonal polynomials (binary elementwise: points and degrees) ----------------
    /// Chebyshev polynomials of the first kind `T_n(x)`.
    SpecialChebyshevPolynomialT = "special_chebyshev_polynomial_t", family: Elementwise, rule: elementwise::Binary, inputs: "x, n", scalars: "n (when not an input)", params: None, facts: { pointwise: false };
    /// Chebyshev polynomials of the second kind `U_n(x)`.
    SpecialChebyshevPolynomialU = "special_chebyshev_polynomial_u", family: Elementwise, rule: elementwise::Binary, inputs: "x, n", scalars: "n (when not an input)", params: None, facts: { pointwise: false };
    /// Chebyshev polynomials of the third kind `V_n(x)`.
    SpecialChebyshevPolynomialV = "special_chebyshev_polynomial_v", family: Elementwise, rule: elementwise::Binary, inputs: "x, n", scalars: "n (when not an input)", params: None, facts: { pointwise: false };
    /// Chebyshev polynomials of the fourth kind `W_n(x)`.
    SpecialChebyshevPolynomialW = "special_chebyshev_polynomial_w", family: Elementwise, rule: elementwise::Binary, inputs: "x, n", scalars: "n (when not an input)", params: None, facts: { pointwise: false };
    /// `T_n(2x - 1)`.
    SpecialShiftedChebyshevPolynomialT = "special_shifted_chebyshev_polynomial_t", family: Elementwise, rule: elementwise::Binary, inputs: "x, n", scalars: "n (when not an input)", params: None, facts: { pointwise: false };
    /// `U_n(2x - 1)`.
    SpecialShiftedChebyshevPolynomialU = "special_shifted_chebyshev_polynomial_u", family: Elementwise, rule: elementwise::Binary, inputs: "x, n", scalars: "n (when not an input)", params: None, facts: { pointwise: false };
    /// `V_n(2x - 1)`.
    SpecialShiftedChebyshevPolynomialV = "special_shifted_chebyshev_polynomial_v", family: Elementwise, rule: elementwise::Binary, inputs: "x, n", scalars: "n (when not an input)", params: None, facts: { pointwise: false };
    /// `W_n(2x - 1)`.
    SpecialShiftedChebyshevPolynomialW = "special_shifted_chebyshev_polynomial_w", family: Elementwise, rule: elementwise::Binary, inputs: "x, n", scalars: "n (when not an input)", params: None, facts: { pointwise: false };
    /// The physicists' Hermite polynomials `H_n(x)`.
    SpecialHermitePolynomialH = "special_hermite_polynomial_h", family: Elementwise, rule: elementwise::Binary, inputs: "x, n", scalars: "n (when not an input)", params: None, facts: { pointwise: false };
    /// The probabilists' Hermite polynomials `He_n(x)`.
    SpecialHermitePolynomialHe = "special_hermite_polynomial_he", family: Elementwise, rule: elementwise::Binary, inputs: "x, n", scalars: "n (when not an input)", params: None, facts: { pointwise: false };
    /// Laguerre polynomials `L_n(x)`.
    SpecialLaguerrePolynomialL = "special_laguerre_polynomial_l", family: Elementwise, rule: elementwise::Binary, inputs: "x, n", scalars: "n (when not an input)", params: None, facts: { pointwise: false };
    /// Legendre polynomials `P_n(x)`.
    SpecialLegendrePolynomialP = "special_legendre_polynomial_p", family: Elementwise, rule: elementwise::Binary, inputs: "x, n", scalars: "n (when not an input)", params: None, facts: { pointwise: false };
}

impl OpId {
    pub fn id(self) -> u16 {
        self as u16
    }

    pub fn from_u16(id: u16) -> Option<Self> {
        OpId::ALL.get(id as usize).copied()
    }

    /// The module that computes the op's meta and lowering.
    pub const fn family(self) -> Family {
        self.facts().family
    }

    /// See [`OpFacts::pointwise`].
    pub const fn is_pointwise(self) -> bool {
        self.facts().pointwise
    }

    /// See [`OpFacts::size_params_from`].
    pub const fn first_size_param(self) -> Option<usize> {
        self.facts().size_params_from
    }

    /// See [`OpFacts::side_effecting`].
    pub const fn is_side_effecting(self) -> bool {
        self.facts().side_effecting
    }

    /// See [`OpFacts::index_checks`].
    pub const fn has_index_checks(self) -> bool {
        self.facts().index_checks
    }

    /// Whether input `k` is a matrix operand of a product ([`OpFacts::product_operands_from`]).
    pub const fn is_product_operand(self, k: usize) -> bool {
        match self.facts().product_operands_from {
            Some(from) => k >= from,
            None => false,
        }
    }

    /// Whether a region may compute the op's result again for a late reader: pointwise ops
    /// and those [`OpFacts::cheap_to_recompute`] names (never random draws).
    pub const fn is_recomputable(self) -> bool {
        let facts = self.facts();
        facts.pointwise || facts.cheap_to_recompute
    }

    pub fn from_name(name: &str) -> Option<Self> {
        OpId::ALL.iter().copied().find(|op| op.name() == name)
    }
}

impl std::fmt::Display for OpId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
