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
    Erfinv = "erfinv", inputs: "self", scalars: "", params: "";
    Lgamma = "lgamma", inputs: "self", scalars: "", params: "";
    Digamma = "digamma", inputs: "self", scalars: "", params: "";
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
    /// `self ** exponent`; a scalar exponent stays a runtime scalar, and the values PyTorch's
    /// kernels special-case (2, 3, 0.5, -0.5, -1, -2, 1, 0) pick their own lowering
    /// (`Meta::variant`).
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
    /// `self << other`; shifts of the bit width or more, or negative, give 0 (as PyTorch's).
    BitwiseLeftShift = "bitwise_left_shift", inputs: "self, other", scalars: "other (when not an input)", params: "";
    /// `self >> other`, arithmetic for signed dtypes; out-of-range shifts fill with the sign bit.
    BitwiseRightShift = "bitwise_right_shift", inputs: "self, other", scalars: "other (when not an input)", params: "";

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
    /// `src` combined into `self` at `index` along `dim` with a reduction other than a sum; a
    /// NaN wins in `amax` and `amin`, as in PyTorch's kernels.
    ScatterReduce = "scatter_reduce", inputs: "self, index, src", scalars: "",
        params: "[dim, combiner]: 1 = prod, 2 = amax, 3 = amin";
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
    // Lists in these params are counted: `n, v1 .. vn`.
    /// An N-d convolution, or with `transposed` its adjoint (PyTorch's conv_transpose); PyTorch
    /// has expanded every list to one value per spatial dim.
    Convolution = "convolution_overrideable", inputs: "input, weight, bias?", scalars: "",
        params: "[transposed, groups, stride list, padding list, dilation list, output_padding list]";
    /// Outputs `(grad_input, grad_weight, grad_bias)`; one `output_mask` leaves out is an empty
    /// placeholder.
    ConvolutionBackward = "convolution_backward_overrideable", inputs: "grad_output, input, weight", scalars: "",
        params: "[output_mask: bitmask 1 = input, 2 = weight, 4 = bias, transposed, groups, stride list, padding list, dilation list, output_padding list]";
    /// Outputs `(output, indices)`; an index is the flat position `h * W + w` in its plane.
    MaxPool2dWithIndices = "max_pool2d_with_indices", inputs: "self", scalars: "",
        params: "[ceil_mode, kernel_size list, stride list (empty = kernel_size), padding list, dilation list] (lists of 1 or 2)";
    MaxPool2dWithIndicesBackward = "max_pool2d_with_indices_backward", inputs: "grad_output, self, indices", scalars: "",
        params: "[ceil_mode, kernel_size list, stride list (empty = kernel_size), padding list, dilation list] (lists of 1 or 2)";
    AvgPool2d = "avg_pool2d", inputs: "self", scalars: "",
        params: "[ceil_mode, count_include_pad, kernel_size list, stride list (empty = kernel_size), padding list, divisor_override?] (lists of 1 or 2)";
    AvgPool2dBackward = "avg_pool2d_backward", inputs: "grad_output, self", scalars: "",
        params: "[ceil_mode, count_include_pad, kernel_size list, stride list (empty = kernel_size), padding list, divisor_override?] (lists of 1 or 2)";
    AdaptiveAvgPool2d = "_adaptive_avg_pool2d", inputs: "self", scalars: "", params: "[output_size x 2]";
    AdaptiveAvgPool2dBackward = "_adaptive_avg_pool2d_backward", inputs: "grad_output, self", scalars: "", params: "";

    // ---- normalization -----------------------------------------------------------------
    // Optional inputs are placed by `has_*` presence flags (0 or 1) at the front of the params;
    // a backward op's `output_mask` has bits 1 = input, 2 = weight, 4 = bias (an output off in
    // the mask is zeros).
    /// Outputs `(output, save_mean, save_invstd)`; in evaluation the saved statistics are empty,
    /// as on PyTorch's CPU. The running statistics are updated by `_batch_norm_running_stats`.
    NativeBatchNorm = "native_batch_norm",
        inputs: "input, weight?, bias?, running_mean?, running_var?", scalars: "",
        params: "[has_weight, has_bias, has_running_mean, has_running_var, training, eps: f64 bits]";
    /// The new `(running_mean, running_var)` after a training step of batch norm on `input`
    /// (the running variance takes the unbiased batch variance). PyTorch updates them in place
    /// inside `native_batch_norm`; the kernel writes these outputs into them.
    BatchNormRunningStats = "_batch_norm_running_stats",
        inputs: "input, running_mean, running_var", scalars: "momentum", params: "";
    /// Outputs `(grad_input, grad_weight, grad_bias)`.
    NativeBatchNormBackward = "native_batch_norm_backward",
        inputs: "grad_out, input, weight?, running_mean?, running_var?, save_mean?, save_invstd?", scalars: "",
        params: "[has_weight, has_running_mean, has_running_var, has_save_mean, has_save_invstd, train, eps: f64 bits, output_mask]";
    /// Outputs `(output, mean, rstd)`.
    NativeLayerNorm = "native_layer_norm", inputs: "input, weight?, bias?", scalars: "",
        params: "[has_weight, has_bias, eps: f64 bits, normalized_shape...]";
    NativeLayerNormBackward = "native_layer_norm_backward",
        inputs: "grad_out, input, mean, rstd, weight?, bias?", scalars: "",
        params: "[has_weight, has_bias, output_mask, normalized_shape...]";
    /// Outputs `(output, mean, rstd)`, the statistics shaped `[N, group]`.
    NativeGroupNorm = "native_group_norm", inputs: "input, weight?, bias?", scalars: "",
        params: "[has_weight, has_bias, N, C, HxW, group, eps: f64 bits]";
    NativeGroupNormBackward = "native_group_norm_backward",
        inputs: "grad_out, input, mean, rstd, weight?", scalars: "",
        params: "[has_weight, N, C, HxW, group, output_mask]";
    EmbeddingDenseBackward = "embedding_dense_backward", inputs: "grad_output, indices", scalars: "",
        params: "[num_weights, padding_idx, scale_grad_by_freq]";
    Cumsum = "cumsum", inputs: "self", scalars: "", params: "[dim, dtype (-1 = none)]";
    Cumprod = "cumprod", inputs: "self", scalars: "", params: "[dim, dtype (-1 = none)]";
    Logcumsumexp = "logcumsumexp", inputs: "self", scalars: "", params: "[dim]";
    MaskedFill = "masked_fill", inputs: "self, mask, value? (0-d tensor)",
        scalars: "value (when not an input)", params: "";

    // ---- attention, sorting, indexing and optimizer ops --------------------------------
    // Sorting and advanced indexing. A result size that depends on the data (`count`) is read
    // to the host by the caller first, so each op has a static shape.
    /// Outputs `(values, indices)` sorted along `dim`. Always stable: equal values keep their
    /// order, which is PyTorch's for `stable=True` (and what its CPU kernel gives short rows).
    Sort = "sort", inputs: "self", scalars: "", params: "[dim, descending]";
    /// Outputs `(values, indices)` of the `k` largest (or smallest) along `dim`, in sorted order.
    TopK = "topk", inputs: "self", scalars: "", params: "[k, dim, largest, sorted]";
    /// `[rank, count]` int64 coordinates of the nonzero elements in row-major order: the
    /// transpose of PyTorch's result, which is column-major.
    Nonzero = "nonzero", inputs: "self", scalars: "", params: "[count]";
    /// The `count` elements of `self` where the (broadcast) bool `mask` holds, row-major.
    MaskedSelect = "masked_select", inputs: "self, mask", scalars: "", params: "[count]";
    /// The new `self` after `self.masked_scatter_(mask, source)`.
    MaskedScatter = "masked_scatter_", inputs: "self, mask, source", scalars: "", params: "";
    /// `self[indices]` with integer index tensors selecting along the given dims (the caller
    /// turns bool masks into nonzero coordinates; unindexed dims are taken whole).
    Index = "index", inputs: "self, indices...", scalars: "", params: "[dim of each index...]";
    /// The new `self` after `self[indices] = values` (`+=` with `accumulate`).
    IndexPut = "index_put", inputs: "self, values, indices...", scalars: "",
        params: "[accumulate (2: as 1, with index_add's errors), dim of each index...]";
    // Attention and training: activation gradients, losses and fused optimizer steps.
    /// Softmax whose rows of all `-inf` (fully masked attention rows) give zeros.
    SafeSoftmax = "_safe_softmax", inputs: "self", scalars: "", params: "[dim, dtype (-1 = none)]";
    GeluBackward = "gelu_backward", inputs: "grad_output, self", scalars: "",
        params: "[approximate?: 0 = none (default), 1 = tanh]";
    TanhBackward = "tanh_backward", inputs: "grad_output, output", scalars: "", params: "";
    SigmoidBackward = "sigmoid_backward", inputs: "grad_output, output", scalars: "", params: "";
    /// Outputs `(output, buffer)`, the buffer `exp(-|self|)` as on PyTorch's CPU.
    LogSigmoidForward = "log_sigmoid_forward", inputs: "self", scalars: "", params: "";
    /// Recomputes what it needs from `self`; `buffer` is accepted and unused.
    LogSigmoidBackward = "log_sigmoid_backward", inputs: "grad_output, self, buffer", scalars: "", params: "";
    // Losses: `reduction` is 0 = none, 1 = mean, 2 = sum.
    MseLoss = "mse_loss", inputs: "self, target", scalars: "", params: "[reduction]";
    MseLossBackward = "mse_loss_backward", inputs: "grad_output, self, target", scalars: "", params: "[reduction]";
    SmoothL1Loss = "smooth_l1_loss", inputs: "self, target", scalars: "beta", params: "[reduction]";
    SmoothL1LossBackward = "smooth_l1_loss_backward", inputs: "grad_output, self, target", scalars: "beta",
        params: "[reduction]";
    HuberLoss = "huber_loss", inputs: "self, target", scalars: "delta", params: "[reduction]";
    HuberLossBackward = "huber_loss_backward", inputs: "grad_output, self, target", scalars: "delta",
        params: "[reduction]";
    BinaryCrossEntropy = "binary_cross_entropy", inputs: "self, target, weight?", scalars: "",
        params: "[reduction]";
    BinaryCrossEntropyBackward = "binary_cross_entropy_backward", inputs: "grad_output, self, target, weight?",
        scalars: "", params: "[reduction]";
    /// `nll_loss` over `[N, C, H, W]` with targets `[N, H, W]`; outputs `(output, total_weight)`.
    NllLoss2d = "nll_loss2d_forward", inputs: "self, target, weight?", scalars: "",
        params: "[reduction, ignore_index]";
    NllLoss2dBackward = "nll_loss2d_backward", inputs: "grad_output, self, target, total_weight, weight?",
        scalars: "", params: "[reduction, ignore_index]";
    // Fused optimizer steps, one parameter per call; outputs the new parameter and state.
    /// Adam (AdamW with `adamw`); outputs `(param, exp_avg, exp_avg_sq, max_exp_avg_sq if
    /// amsgrad)`. `state_step` is the already incremented step count; where `found_inf` is 1
    /// nothing changes.
    FusedAdam = "_fused_adam_",
        inputs: "param, grad, exp_avg, exp_avg_sq, state_step, max_exp_avg_sq? (amsgrad), lr? (lr_is_tensor), found_inf? (has_found_inf)",
        scalars: "lr (when not an input), beta1, beta2, weight_decay, eps",
        params: "[amsgrad, maximize, adamw, lr_is_tensor, has_found_inf, weight_decay != 0, |1 - beta1| < 0.5]";
    /// SGD; outputs `(param, momentum_buffer if given)`.
    FusedSgd = "_fused_sgd_",
        inputs: "param, grad, momentum_buffer? (has_momentum_buffer), lr? (lr_is_tensor), found_inf? (has_found_inf)",
        scalars: "lr (when not an input), weight_decay, momentum, dampening",
        params: "[nesterov, maximize, is_first_step, has_momentum_buffer, lr_is_tensor, has_found_inf, weight_decay != 0]";

    // ---- index checks ------------------------------------------------------------------
    /// Whether every index is in range, for the indexing op captured just before it (see
    /// `checks::index_checks`). Side-effecting: outputs the i64 verdict `[bad, first bad
    /// index, size, dim, style]`, which the engine reads at the next materialization point
    /// and turns into PyTorch's error (RFC 0012).
    IndexCheck = "index_check", inputs: "index", scalars: "size? (read at run time instead of param 0: a padded extent's true length)",
        params: "[size, negative_ok, dim, style, ignore? (an index never reported)]";

    // ---- 3-d and adaptive max pooling --------------------------------------------------
    /// Outputs `(output, indices)`; an index is the flat position `(d * H + h) * W + w` in its
    /// volume.
    MaxPool3dWithIndices = "max_pool3d_with_indices", inputs: "self", scalars: "",
        params: "[ceil_mode, kernel_size list, stride list (empty = kernel_size), padding list, dilation list] (lists of 1 or 3)";
    MaxPool3dWithIndicesBackward = "max_pool3d_with_indices_backward", inputs: "grad_output, self, indices", scalars: "",
        params: "[ceil_mode, kernel_size list, stride list (empty = kernel_size), padding list, dilation list] (lists of 1 or 3)";
    AvgPool3d = "avg_pool3d", inputs: "self", scalars: "",
        params: "[ceil_mode, count_include_pad, kernel_size list, stride list (empty = kernel_size), padding list, divisor_override?] (lists of 1 or 3)";
    AvgPool3dBackward = "avg_pool3d_backward", inputs: "grad_output, self", scalars: "",
        params: "[ceil_mode, count_include_pad, kernel_size list, stride list (empty = kernel_size), padding list, divisor_override?] (lists of 1 or 3)";
    /// Outputs `(output, indices)`; an index is the flat position `h * W + w` in its plane.
    AdaptiveMaxPool2d = "adaptive_max_pool2d", inputs: "self", scalars: "", params: "[output_size x 2]";
    AdaptiveMaxPool2dBackward = "adaptive_max_pool2d_backward", inputs: "grad_output, self, indices", scalars: "", params: "";
    /// Whether each element of `elements` equals one of `test_elements` (compared in their
    /// promoted dtype); `invert` negates.
    Isin = "isin", inputs: "elements, test_elements", scalars: "test_elements (when not an input)",
        params: "[invert]";
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
        matches!(self, OpId::AssertAsync | OpId::IndexCheck)
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
