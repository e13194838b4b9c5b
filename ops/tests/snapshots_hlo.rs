//! Snapshots of the StableHLO text each op lowers to, so lowering changes show up in review.

use ops::{f64_param, lower_single, DType, OpId, ScalarArg, TensorType};

fn t(dtype: DType, shape: &[i64]) -> TensorType {
    TensorType::new(dtype, shape)
}

fn text(op: OpId, inputs: &[TensorType], scalars: &[ScalarArg], params: &[i64]) -> String {
    lower_single(op, inputs, scalars, params)
        .unwrap_or_else(|e| panic!("{op}: {e}"))
        .0
}

macro_rules! snapshot {
    ($name:ident, $op:expr, $inputs:expr, $scalars:expr, $params:expr) => {
        #[test]
        fn $name() {
            insta::assert_snapshot!(text($op, &$inputs, &$scalars, &$params));
        }
    };
}

snapshot!(
    add_alpha_broadcast,
    OpId::Add,
    [t(DType::F32, &[2, 3]), t(DType::F32, &[3])],
    [ScalarArg::float(2.0)],
    []
);
snapshot!(
    mul_bf16_scalar,
    OpId::Mul,
    [t(DType::BF16, &[4])],
    [ScalarArg::float(0.5)],
    []
);
snapshot!(
    div_floor_int,
    OpId::Div,
    [t(DType::I32, &[4]), t(DType::I32, &[4])],
    [],
    [2]
);
// NaN bounds propagate: clamp(x, lo, hi) with both bounds tensors (operand kinds 1, 1).
snapshot!(
    clamp_tensor_bounds,
    OpId::Clamp,
    [
        t(DType::F64, &[3]),
        t(DType::F64, &[3]),
        t(DType::F64, &[3])
    ],
    [],
    [1, 1]
);
snapshot!(
    pow_scalar_exponent,
    OpId::Pow,
    [t(DType::F32, &[3])],
    [ScalarArg::float(2.0)],
    []
);
snapshot!(
    pow_general_exponent,
    OpId::Pow,
    [t(DType::F32, &[3])],
    [ScalarArg::float(1.7)],
    []
);
snapshot!(
    lt_int_float_scalar,
    OpId::Lt,
    [t(DType::I64, &[3])],
    [ScalarArg::float(0.5)],
    []
);
snapshot!(gelu_tanh, OpId::Gelu, [t(DType::F32, &[3])], [], [1]);
snapshot!(
    where_scalar_other,
    OpId::Where,
    [t(DType::Bool, &[2, 2]), t(DType::F32, &[2])],
    [ScalarArg::float(0.0)],
    []
);
snapshot!(
    clamp_min_max,
    OpId::Clamp,
    [t(DType::F32, &[3])],
    [ScalarArg::float(-1.0), ScalarArg::float(1.0)],
    [2, 2]
);
snapshot!(
    convert_f32_to_u8,
    OpId::Convert,
    [t(DType::F32, &[3])],
    [],
    [DType::U8.code() as i64]
);
snapshot!(
    arange_f32,
    OpId::Arange,
    [],
    [],
    [
        DType::F32.code() as i64,
        f64_param(0.0),
        f64_param(2.0),
        f64_param(0.5)
    ]
);
snapshot!(
    sum_long_two_stages,
    OpId::Sum,
    [t(DType::F32, &[2, 4100])],
    [],
    [0, -1, 1]
);
snapshot!(
    sum_bf16_dim,
    OpId::Sum,
    [t(DType::BF16, &[2, 3])],
    [],
    [1, -1, 1]
);
snapshot!(
    argmax_dim,
    OpId::Argmax,
    [t(DType::F32, &[2, 3])],
    [],
    [0, 1]
);
snapshot!(
    log_softmax,
    OpId::LogSoftmax,
    [t(DType::F32, &[2, 3])],
    [],
    [1, 0]
);
snapshot!(
    matmul_batched,
    OpId::Matmul,
    [t(DType::F32, &[2, 1, 2, 3]), t(DType::F32, &[5, 3, 4])],
    [],
    []
);
snapshot!(
    addmm,
    OpId::Addmm,
    [
        t(DType::F32, &[4]),
        t(DType::F32, &[2, 3]),
        t(DType::F32, &[3, 4])
    ],
    [ScalarArg::float(1.0), ScalarArg::float(1.0)],
    []
);
snapshot!(
    solve_triangular_upper_left_batch_broadcast,
    OpId::SolveTriangular,
    [t(DType::F64, &[3, 4, 4]), t(DType::F64, &[2, 1, 4, 5])],
    [],
    [1, 1, 0]
);
snapshot!(
    cat_promotes,
    OpId::Cat,
    [t(DType::F32, &[2, 3]), t(DType::I32, &[2, 1])],
    [],
    [1]
);
snapshot!(
    gather_dim1,
    OpId::Gather,
    [t(DType::F32, &[2, 3]), t(DType::I64, &[2, 2])],
    [],
    [1]
);
snapshot!(
    scatter_add_dim0,
    OpId::ScatterAdd,
    [
        t(DType::F32, &[2, 3]),
        t(DType::I64, &[2, 3]),
        t(DType::F32, &[2, 3])
    ],
    [],
    [0]
);
snapshot!(
    constant_pad_crop,
    OpId::ConstantPadNd,
    [t(DType::F32, &[2, 3])],
    [ScalarArg::float(0.0)],
    [1, -1]
);
snapshot!(
    nll_loss_mean,
    OpId::NllLoss,
    [t(DType::F32, &[2, 3]), t(DType::I64, &[2])],
    [],
    [1, -100]
);
// The gradient is written at each kept target class and zeros elsewhere (a select, not a
// product with the mask: a mean over no kept target divides by zero).
snapshot!(
    nll_loss_backward_mean,
    OpId::NllLossBackward,
    [
        t(DType::F32, &[]),
        t(DType::F32, &[2, 3]),
        t(DType::I64, &[2]),
        t(DType::F32, &[])
    ],
    [],
    [1, -100]
);
// Complex values: a real Python scalar lifted as a complex one, the real magnitude, the parts
// put together, the conjugate, a complex sum and a complex product.
snapshot!(
    add_complex_real_scalar,
    OpId::Add,
    [t(DType::C64, &[3])],
    [ScalarArg::float(2.0)],
    []
);
snapshot!(abs_complex, OpId::Abs, [t(DType::C128, &[3])], [], []);
snapshot!(
    complex_from_parts,
    OpId::Complex,
    [t(DType::F32, &[2, 3]), t(DType::F32, &[3])],
    [],
    []
);
snapshot!(
    conj_physical,
    OpId::ConjPhysical,
    [t(DType::C64, &[3])],
    [],
    []
);
snapshot!(
    sum_complex,
    OpId::Sum,
    [t(DType::C64, &[2, 3])],
    [],
    [0, -1, 1]
);
snapshot!(
    mm_complex,
    OpId::Mm,
    [t(DType::C64, &[2, 3]), t(DType::C64, &[3, 4])],
    [],
    []
);
// A complex linspace between real bounds (the real linspace in float32, then made complex) and a
// complex identity.
snapshot!(
    linspace_complex,
    OpId::Linspace,
    [],
    [ScalarArg::float(-2.0), ScalarArg::float(3.0)],
    [DType::C64.code() as i64, 5]
);
snapshot!(
    eye_complex,
    OpId::Eye,
    [],
    [],
    [DType::C128.code() as i64, 2, 3]
);
// Discrete Fourier transforms: an inverse complex transform over a middle and an outer dim
// (moved innermost and back; XLA's own 1/n undone for normalization none), a onesided real
// transform whose halved dim is named first, an inverse real transform over four dims (one
// complex step, then the real one), and a padded pair of frequencies.
snapshot!(
    fft_c2c_inverse_unnormalized,
    OpId::FftC2c,
    [t(DType::C64, &[2, 3, 4])],
    [],
    [0, 0, 1, 0]
);
snapshot!(
    fft_r2c_onesided_by_root_n,
    OpId::FftR2c,
    [t(DType::F32, &[4, 6])],
    [],
    [1, 1, 1, 0]
);
snapshot!(
    fft_c2r_four_dims_by_n,
    OpId::FftC2r,
    [t(DType::C128, &[2, 2, 3, 2, 3])],
    [],
    [2, 4, 1, 2, 3, 4]
);
snapshot!(
    constant_pad_complex,
    OpId::ConstantPadNd,
    [t(DType::C64, &[3])],
    [ScalarArg::float(0.0)],
    [0, 2]
);
// repeat_interleave's positions for int32 repeats, and the check of a given output_size.
snapshot!(
    repeat_interleave_int32,
    OpId::RepeatInterleave,
    [t(DType::I32, &[3])],
    [],
    [5]
);
snapshot!(
    repeats_check,
    OpId::RepeatsCheck,
    [t(DType::I64, &[3])],
    [ScalarArg::int(5)],
    []
);
snapshot!(
    adaptive_avg_pool2d_tiling_windows,
    OpId::AdaptiveAvgPool2d,
    [t(DType::F32, &[1, 2, 4, 6])],
    [],
    [2, 3]
);
snapshot!(
    adaptive_avg_pool2d_overlapping_windows,
    OpId::AdaptiveAvgPool2d,
    [t(DType::F32, &[1, 5, 3])],
    [],
    [3, 2]
);
snapshot!(
    adaptive_avg_pool2d_backward_overlapping_windows,
    OpId::AdaptiveAvgPool2dBackward,
    [t(DType::F32, &[1, 3, 2]), t(DType::F32, &[1, 5, 3])],
    [],
    []
);
// Grouped-query attention (4 query heads over 2 key heads) with a causal mask and a bool mask.
snapshot!(
    attention_grouped_causal_bool_mask,
    OpId::Attention,
    [
        t(DType::F32, &[1, 4, 3, 8]),
        t(DType::F32, &[1, 2, 5, 8]),
        t(DType::F32, &[1, 2, 5, 8]),
        t(DType::Bool, &[3, 5])
    ],
    [],
    [1, 1, 0, f64_param(0.0)]
);
// Its gradients, grouped heads summed back, with a float mask's gradient.
snapshot!(
    attention_backward_grouped_float_mask,
    OpId::AttentionBackward,
    [
        t(DType::F32, &[1, 4, 3, 8]),
        t(DType::F32, &[1, 4, 3, 8]),
        t(DType::F32, &[1, 2, 5, 8]),
        t(DType::F32, &[1, 2, 5, 8]),
        t(DType::F32, &[1, 4, 3, 8]),
        t(DType::F32, &[1, 1, 3, 5])
    ],
    [],
    [0, 1, 0, f64_param(0.0), 1]
);
// erfc in the tail, where 1 - erf(x) would cancel to zero.
snapshot!(erfc_f32, OpId::Erfc, [t(DType::F32, &[4])], [], []);
snapshot!(
    special_i1e_bf16,
    OpId::SpecialI1e,
    [t(DType::BF16, &[4])],
    [],
    []
);
// An integer q promotes to the default float dtype.
snapshot!(
    special_zeta_int_q,
    OpId::SpecialZeta,
    [t(DType::F32, &[3]), t(DType::I64, &[3])],
    [],
    []
);
snapshot!(
    nextafter_f64,
    OpId::Nextafter,
    [t(DType::F64, &[2]), t(DType::F64, &[2])],
    [],
    []
);
// The upper factor, from the transposed input's lower factor; info from the diagonal.
snapshot!(
    cholesky_upper_batch,
    OpId::Cholesky,
    [t(DType::F32, &[2, 3, 3])],
    [],
    [1]
);
// One `stablehlo.while` step per column: pivot search, row swap, multipliers, update.
snapshot!(
    lu_factor_pivoted_wide,
    OpId::LuFactor,
    [t(DType::F64, &[3, 4])],
    [],
    [1]
);
snapshot!(
    lu_permutation_batch,
    OpId::LuPermutation,
    [t(DType::I32, &[2, 3])],
    [],
    [4]
);
// "complete" of a tall matrix: the reflectors zero-padded to a square Q.
snapshot!(
    qr_complete_tall,
    OpId::Qr,
    [t(DType::F32, &[4, 3])],
    [],
    [1]
);
snapshot!(
    eigh_lower_vectors,
    OpId::Eigh,
    [t(DType::F64, &[3, 3])],
    [],
    [0, 1]
);
// float32 points recur in float64, to the largest degree.
snapshot!(
    laguerre_polynomial_float32,
    OpId::SpecialLaguerrePolynomialL,
    [t(DType::F32, &[3]), t(DType::F32, &[3])],
    [],
    []
);
snapshot!(
    svd_wide_reduced,
    OpId::Svd,
    [t(DType::F32, &[2, 3, 5])],
    [],
    [0, 1]
);
snapshot!(
    svd_tall_values_only,
    OpId::Svd,
    [t(DType::F64, &[4, 2])],
    [],
    [0, 0]
);
snapshot!(
    householder_product_batch,
    OpId::HouseholderProduct,
    [t(DType::F32, &[2, 4, 3]), t(DType::F32, &[2, 2])],
    [],
    []
);
// The power series below |x| = 20 and the asymptotic expansion above, unrolled.
snapshot!(
    special_i0e_f32,
    OpId::SpecialI0e,
    [t(DType::F32, &[3])],
    [],
    []
);
