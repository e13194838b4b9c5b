//! The op catalogue's identifiers: stable numeric ids, ATen names and each op's argument layout.

macro_rules! op_catalogue {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, inputs: $inputs:literal, scalars: $scalars:literal, params: $params:literal; )*) => {
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

            /// The static params (`&[i64]`), in order; they are part of the compile cache key.
            pub fn params_layout(self) -> &'static str {
                match self { $(OpId::$variant => $params,)* }
            }
        }
    };
}

op_catalogue! {
    // ---- unary elementwise -------------------------------------------------------------
    Neg = "neg", inputs: "self", scalars: "", params: "";
    Abs = "abs", inputs: "self", scalars: "", params: "";
    Exp = "exp", inputs: "self", scalars: "", params: "";
    Exp2 = "exp2", inputs: "self", scalars: "", params: "";
    Log = "log", inputs: "self", scalars: "", params: "";
    Log2 = "log2", inputs: "self", scalars: "", params: "";
    Log10 = "log10", inputs: "self", scalars: "", params: "";
    Log1p = "log1p", inputs: "self", scalars: "", params: "";
    Expm1 = "expm1", inputs: "self", scalars: "", params: "";
    Sqrt = "sqrt", inputs: "self", scalars: "", params: "";
    Rsqrt = "rsqrt", inputs: "self", scalars: "", params: "";
    Sin = "sin", inputs: "self", scalars: "", params: "";
    Cos = "cos", inputs: "self", scalars: "", params: "";
    Tan = "tan", inputs: "self", scalars: "", params: "";
    Tanh = "tanh", inputs: "self", scalars: "", params: "";
    Sigmoid = "sigmoid", inputs: "self", scalars: "", params: "";
    Relu = "relu", inputs: "self", scalars: "", params: "";
    Gelu = "gelu", inputs: "self", scalars: "", params: "[approximate?: 0 = none (default), 1 = tanh]";
    Silu = "silu", inputs: "self", scalars: "", params: "";
    Erf = "erf", inputs: "self", scalars: "", params: "";
    Floor = "floor", inputs: "self", scalars: "", params: "";
    Ceil = "ceil", inputs: "self", scalars: "", params: "";
    Round = "round", inputs: "self", scalars: "", params: "[decimals?: default 0]";
    Trunc = "trunc", inputs: "self", scalars: "", params: "";
    Sign = "sign", inputs: "self", scalars: "", params: "";
    Reciprocal = "reciprocal", inputs: "self", scalars: "", params: "";
    LogicalNot = "logical_not", inputs: "self", scalars: "", params: "";
    BitwiseNot = "bitwise_not", inputs: "self", scalars: "", params: "";
    IsNan = "isnan", inputs: "self", scalars: "", params: "";
    IsInf = "isinf", inputs: "self", scalars: "", params: "";
    /// Replacements are static: PyTorch's defaults depend on the dtype (its max/min).
    NanToNum = "nan_to_num", inputs: "self", scalars: "",
        params: "[given?: bitmask 1 = nan, 2 = posinf, 4 = neginf; nan: f64 bits; posinf: f64 bits; neginf: f64 bits] (absent = nan->0, +-inf->dtype max/min)";

    // ---- binary elementwise: `other` is inputs[1], or scalars[0] when only one input ----
    Add = "add", inputs: "self, other", scalars: "other (when not an input), alpha?", params: "";
    Sub = "sub", inputs: "self, other", scalars: "other (when not an input), alpha?", params: "";
    /// `other - alpha * self`.
    Rsub = "rsub", inputs: "self, other", scalars: "other (when not an input), alpha?", params: "";
    Mul = "mul", inputs: "self, other", scalars: "other (when not an input)", params: "";
    Div = "div", inputs: "self, other", scalars: "other (when not an input)",
        params: "[rounding_mode?: 0 = true division (default), 1 = trunc, 2 = floor]";
    Remainder = "remainder", inputs: "self, other", scalars: "other (when not an input)", params: "";
    Fmod = "fmod", inputs: "self, other", scalars: "other (when not an input)", params: "";
    /// `self ** exponent`; with a scalar exponent, PyTorch's special cases (2, 3, 0.5, -0.5,
    /// -1, -2) are matched numerically for every value, so the exponent stays a runtime scalar.
    Pow = "pow", inputs: "self, exponent", scalars: "exponent (when not an input)", params: "";
    /// `self ** exponent` with a scalar base.
    PowScalarBase = "pow.Scalar", inputs: "exponent", scalars: "self", params: "";
    Maximum = "maximum", inputs: "self, other", scalars: "other (when not an input)", params: "";
    Minimum = "minimum", inputs: "self, other", scalars: "other (when not an input)", params: "";
    Atan2 = "atan2", inputs: "self, other", scalars: "other (when not an input)", params: "";
    Eq = "eq", inputs: "self, other", scalars: "other (when not an input)", params: "";
    Ne = "ne", inputs: "self, other", scalars: "other (when not an input)", params: "";
    Lt = "lt", inputs: "self, other", scalars: "other (when not an input)", params: "";
    Le = "le", inputs: "self, other", scalars: "other (when not an input)", params: "";
    Gt = "gt", inputs: "self, other", scalars: "other (when not an input)", params: "";
    Ge = "ge", inputs: "self, other", scalars: "other (when not an input)", params: "";
    LogicalAnd = "logical_and", inputs: "self, other", scalars: "other (when not an input)", params: "";
    LogicalOr = "logical_or", inputs: "self, other", scalars: "other (when not an input)", params: "";
    LogicalXor = "logical_xor", inputs: "self, other", scalars: "other (when not an input)", params: "";
    BitwiseAnd = "bitwise_and", inputs: "self, other", scalars: "other (when not an input)", params: "";
    BitwiseOr = "bitwise_or", inputs: "self, other", scalars: "other (when not an input)", params: "";
    BitwiseXor = "bitwise_xor", inputs: "self, other", scalars: "other (when not an input)", params: "";

    // ---- ternary elementwise -----------------------------------------------------------
    Where = "where", inputs: "condition, self?, other?", scalars: "self?, other?",
        params: "[self_kind?, other_kind?]: 1 = tensor (next input), 2 = scalar (next scalar); absent = tensors";
    Clamp = "clamp", inputs: "self, min?, max?", scalars: "min?, max?",
        params: "[min_kind, max_kind]: 0 = absent, 1 = tensor (next input), 2 = scalar (next scalar)";
    Lerp = "lerp", inputs: "self, end, weight?", scalars: "weight (when not an input)", params: "";
    Addcmul = "addcmul", inputs: "self, tensor1, tensor2", scalars: "value? (default 1)", params: "";
    Addcdiv = "addcdiv", inputs: "self, tensor1, tensor2", scalars: "value? (default 1)", params: "";

    // ---- casts, copies and creation ----------------------------------------------------
    Convert = "_to_copy", inputs: "self", scalars: "", params: "[dtype]";
    Clone = "clone", inputs: "self", scalars: "", params: "";
    /// The new value of `self` after `self.copy_(src)`: `src` broadcast and cast to `self`.
    Copy = "copy_", inputs: "self, src", scalars: "", params: "";
    Fill = "fill_", inputs: "self, value? (0-d tensor)", scalars: "value (when not an input)", params: "";
    Full = "full", inputs: "", scalars: "fill_value", params: "[dtype, sizes...]";
    Zeros = "zeros", inputs: "", scalars: "", params: "[dtype, sizes...]";
    Ones = "ones", inputs: "", scalars: "", params: "[dtype, sizes...]";
    Arange = "arange", inputs: "", scalars: "", params: "[dtype, start: f64 bits, end: f64 bits, step: f64 bits]";
    Linspace = "linspace", inputs: "", scalars: "start, end", params: "[dtype, steps]";
    Eye = "eye", inputs: "", scalars: "", params: "[dtype, n, m]";

    // ---- reductions (dims empty = all dims) --------------------------------------------
    Sum = "sum", inputs: "self", scalars: "", params: "[keepdim, dtype (-1 = none), dims...]";
    Mean = "mean", inputs: "self", scalars: "", params: "[keepdim, dtype (-1 = none), dims...]";
    Prod = "prod", inputs: "self", scalars: "", params: "[keepdim, dtype (-1 = none), dims...]";
    Amax = "amax", inputs: "self", scalars: "", params: "[keepdim, dims...]";
    Amin = "amin", inputs: "self", scalars: "", params: "[keepdim, dims...]";
    Argmax = "argmax", inputs: "self", scalars: "", params: "[keepdim, dim?] (no dim = flattened)";
    Argmin = "argmin", inputs: "self", scalars: "", params: "[keepdim, dim?] (no dim = flattened)";
    Any = "any", inputs: "self", scalars: "", params: "[keepdim, dims...]";
    All = "all", inputs: "self", scalars: "", params: "[keepdim, dims...]";
    Var = "var", inputs: "self", scalars: "", params: "[keepdim, correction: f64 bits, dims...]";
    Std = "std", inputs: "self", scalars: "", params: "[keepdim, correction: f64 bits, dims...]";
    Logsumexp = "logsumexp", inputs: "self", scalars: "", params: "[keepdim, dims...]";
    Norm = "linalg_vector_norm", inputs: "self", scalars: "", params: "[keepdim, dtype (-1 = none), ord: f64 bits, dims...]";
    Softmax = "_softmax", inputs: "self", scalars: "", params: "[dim, half_to_float?]";
    LogSoftmax = "_log_softmax", inputs: "self", scalars: "", params: "[dim, half_to_float?]";

    // ---- matrix products ---------------------------------------------------------------
    Mm = "mm", inputs: "self, mat2", scalars: "", params: "";
    Bmm = "bmm", inputs: "self, mat2", scalars: "", params: "";
    /// `beta * self + alpha * (mat1 @ mat2)`.
    Addmm = "addmm", inputs: "self, mat1, mat2", scalars: "beta? (default 1), alpha? (default 1)", params: "";
    Baddbmm = "baddbmm", inputs: "self, batch1, batch2", scalars: "beta? (default 1), alpha? (default 1)", params: "";
    Dot = "dot", inputs: "self, other", scalars: "", params: "";
    Matmul = "matmul", inputs: "self, other", scalars: "", params: "";

    // ---- shape and indexing ------------------------------------------------------------
    Cat = "cat", inputs: "tensors...", scalars: "", params: "[dim]";
    Stack = "stack", inputs: "tensors...", scalars: "", params: "[dim]";
    Flip = "flip", inputs: "self", scalars: "", params: "[dims...]";
    Roll = "roll", inputs: "self", scalars: "", params: "[n, shifts x n, dims x (n or 0)] (no dims = roll the flattened tensor)";
    ConstantPadNd = "constant_pad_nd", inputs: "self", scalars: "value? (default 0)",
        params: "[pad...]: (low, high) pairs from the last dim backwards; negative crops";
    Repeat = "repeat", inputs: "self", scalars: "", params: "[repeats...]";
    Tril = "tril", inputs: "self", scalars: "", params: "[diagonal?: default 0]";
    Triu = "triu", inputs: "self", scalars: "", params: "[diagonal?: default 0]";
    Gather = "gather", inputs: "self, index", scalars: "", params: "[dim]";
    IndexSelect = "index_select", inputs: "self, index", scalars: "", params: "[dim]";
    Scatter = "scatter", inputs: "self, index, src?", scalars: "value (when no src)", params: "[dim]";
    ScatterAdd = "scatter_add", inputs: "self, index, src", scalars: "", params: "[dim]";
    Embedding = "embedding", inputs: "weight, indices", scalars: "", params: "";
    Expand = "expand", inputs: "self", scalars: "", params: "[sizes...] (-1 keeps a size)";
    SumToSize = "sum_to_size", inputs: "self", scalars: "", params: "[sizes...]";
    Reshape = "reshape", inputs: "self", scalars: "", params: "[sizes...] (one -1 is inferred)";
    Permute = "permute", inputs: "self", scalars: "", params: "[dims...]";
    Transpose = "transpose", inputs: "self", scalars: "", params: "[dim0, dim1]";
    Slice = "slice", inputs: "self", scalars: "", params: "[dim, start, end, step] (start/end clamped like Python)";
    Select = "select", inputs: "self", scalars: "", params: "[dim, index]";

    // ---- backward ops ------------------------------------------------------------------
    ThresholdBackward = "threshold_backward", inputs: "grad_output, self", scalars: "threshold", params: "";
    LogSoftmaxBackward = "_log_softmax_backward_data", inputs: "grad_output, output", scalars: "", params: "[dim, input_dtype]";
    SoftmaxBackward = "_softmax_backward_data", inputs: "grad_output, output", scalars: "", params: "[dim, input_dtype]";
    /// Outputs `(output, total_weight)`.
    NllLoss = "nll_loss_forward", inputs: "self, target, weight?", scalars: "",
        params: "[reduction: 0 = none, 1 = mean, 2 = sum, ignore_index]";
    NllLossBackward = "nll_loss_backward", inputs: "grad_output, self, target, total_weight, weight?", scalars: "",
        params: "[reduction: 0 = none, 1 = mean, 2 = sum, ignore_index]";

    // ---- side-effecting ops ------------------------------------------------------------
    /// Outputs a 0-d bool flag (true when the assertion holds) that the engine checks after
    /// running: PyTorch's op has no result, so nothing reads the flag, and it is kept only
    /// because it is side-effecting.
    AssertAsync = "_assert_async", inputs: "self", scalars: "", params: "";

    // ---- random numbers ----------------------------------------------------------------
    // Each draw takes a 64-bit key from the device's generator as a lifted scalar (a new draw
    // never recompiles); the bits come from StableHLO's `rng_bit_generator` (Threefry).
    /// Values in `[from, to)`.
    Uniform = "uniform", inputs: "", scalars: "from, to, key", params: "[dtype, sizes...]";
    /// Normal values (Box-Muller over two uniform draws).
    Normal = "normal", inputs: "", scalars: "mean, std, key", params: "[dtype, sizes...]";
    /// Integers in `[from, to)`; with `full_range`, the 63-bit range `[0, 2^63)` (`to` unused).
    RandomInt = "random_", inputs: "", scalars: "from, to, key", params: "[dtype, full_range, sizes...]";
    /// 1 with probability `p` (a tensor broadcast to `sizes`, or a scalar), else 0.
    Bernoulli = "bernoulli", inputs: "p?", scalars: "p (when not an input), key", params: "[dtype, sizes...]";
    /// Outputs `(input * mask / (1 - p), mask)`, the mask keeping each element with probability
    /// `1 - p`; with `train` 0, `(input, all true)`.
    NativeDropout = "native_dropout", inputs: "input", scalars: "p, key", params: "[train]";
    NativeDropoutBackward = "native_dropout_backward", inputs: "grad_output, mask", scalars: "scale", params: "";

    // ---- convolution and pooling -------------------------------------------------------

    // ---- normalization -----------------------------------------------------------------

    // ---- attention, sorting, indexing and optimizer ops --------------------------------
}

impl OpId {
    pub fn id(self) -> u16 {
        self as u16
    }

    pub fn from_u16(id: u16) -> Option<Self> {
        OpId::ALL.get(id as usize).copied()
    }

    /// Where the op's size params begin (sizes, repeat counts, `eye`'s n and m, `linspace`'s
    /// steps): those belong with the dimensions of a cache key, not with its structure.
    pub fn first_size_param(self) -> Option<usize> {
        match self {
            OpId::Full | OpId::Zeros | OpId::Ones | OpId::Eye | OpId::Linspace => Some(1),
            OpId::Uniform | OpId::Normal | OpId::Bernoulli => Some(1),
            OpId::RandomInt => Some(2),
            OpId::Expand | OpId::SumToSize | OpId::Reshape | OpId::Repeat => Some(0),
            _ => None,
        }
    }

    /// Whether the op must run even when nothing reads its outputs (it checks or changes
    /// state beyond its results).
    pub fn is_side_effecting(self) -> bool {
        matches!(self, OpId::AssertAsync)
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
