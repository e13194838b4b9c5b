"""The ATen overloads whose pjrt kernels are written by hand, one row each, by op family.

`gen_kernels.py` registers every row, as it registers the engine-op rows of its own table: a row
is `(ATen overload, kernel, options)`, in the family whose C++ file holds the kernel (the dict
key: `activation` is `activation.cpp`, which includes the generated
`generated/activation_kernels.inc` where it ends, so the generated code sees the family's own
functions). The generator writes each kernel with the dispatcher's exact C++ signature (from
torchgen), so a kernel whose arguments no longer fit does not compile.

The kernel is either the name of a C++ function, called with the overload's arguments in order,
or a C++ expression of the overload's arguments, by their schema names
(`pad(PadMode::Reflect, 2, self, ints(padding))`). It gives the overload's result.

From a functional row the generator also registers the in-place and `out=` forms PyTorch
defines for it (found, as for the engine rows, by matching argument lists): `out=` writes the
result into `out` (`write_out`: PyTorch's dtype and device checks, resized), in-place copies it
into `self` (`write_in_place`: the result type must cast to `self`'s). A row that names such a
form itself (a kernel that writes in place better than a copy) takes its place.

Options, space-separated:
    only      register the overload alone: no derived in-place or `out=` form
    real      composed for real numbers: a complex `self` runs every form on the CPU, which
              computes it (`run_on_cpu`)
    autograd  registered above autograd too (AutogradPrivateUse1): the composition records
              its own gradients
    over_implicit  the overload is CompositeImplicitAutograd, which a row is refused for (the
              kernel would hide the decomposition autograd differentiates); the device answers
              this one itself

What stays outside the rows (RFC 0019): the boxed CPU fallback and the fallthroughs of other
dispatch keys (backend.cpp, autocast.cpp, their own dispatch mechanics), the autocast op lists
(PyTorch's own), and the operators of the `torch_pjrt` namespace, whose schemas are defined
beside their kernels (growth.cpp, graphs.cpp).
"""

from __future__ import annotations

# (ATen overload, kernel, options) by family (its C++ file).
HAND_WRITTEN: dict[str, list[tuple[str, str, str]]] = {}

# The device's own tensors: storage, views and copies, and batch norm, which also writes the
# running statistics. Each registers its own overload only.
HAND_WRITTEN["backend"] = [
    ("empty.memory_format", "pjrt_empty", "only"),
    ("empty_strided", "pjrt_empty_strided", "only"),
    ("as_strided", "pjrt_as_strided", "only"),
    ("view", "pjrt_view", "only"),
    ("_reshape_alias", "pjrt_reshape_alias", "only"),
    ("resize_", "pjrt_resize_", "only"),
    ("_copy_from", "pjrt_copy_from", "only"),
    ("copy_", "pjrt_copy_", "only"),
    ("_copy_from_and_resize", "pjrt_copy_from_and_resize", "only"),
    ("_local_scalar_dense", "pjrt_local_scalar_dense", "only"),
    ("set_.source_Storage", "pjrt_set_storage", "only"),
    ("set_.source_Storage_storage_offset", "pjrt_set_storage_offset", "only"),
    ("set_.source_Tensor", "pjrt_set_tensor", "only"),
    ("set_", "pjrt_set_empty", "only"),
    # `tensor.data = other` between pjrt and CPU tensors asks the device.
    ("_has_compatible_shallow_copy_type", "pjrt_has_compatible_shallow_copy_type", "only over_implicit"),
    ("native_batch_norm", "pjrt_native_batch_norm", "only"),
    ("_native_batch_norm_legit", "pjrt_batch_norm_legit", "only"),
    ("_native_batch_norm_legit.no_stats", "pjrt_batch_norm_legit_no_stats", "only"),
    ("_batch_norm_with_update", "pjrt_batch_norm_with_update", "only"),
    ("_batch_norm_no_update", "pjrt_batch_norm_no_update", "only"),
    ("batch_norm_backward", "pjrt_batch_norm_backward", ""),
]

HAND_WRITTEN["activation"] = [
    ("leaky_relu", "pjrt_leaky_relu", ""),
    ("leaky_relu_backward", "pjrt_leaky_relu_backward", ""),
    ("elu", "pjrt_elu", ""),
    ("elu_backward", "pjrt_elu_backward", ""),
    ("softplus", "pjrt_softplus", ""),
    ("softplus_backward", "pjrt_softplus_backward", ""),
    ("hardswish", "pjrt_hardswish", ""),
    ("hardswish_backward", "pjrt_hardswish_backward", ""),
    ("hardsigmoid", "pjrt_hardsigmoid", ""),
    ("hardsigmoid_backward", "pjrt_hardsigmoid_backward", ""),
    ("mish", "pjrt_mish", ""),
    ("hardtanh", "pjrt_hardtanh", ""),
    ("hardtanh_backward", "pjrt_hardtanh_backward", ""),
    ("hardshrink_backward", "pjrt_shrink_backward", ""),
    ("softshrink_backward", "pjrt_shrink_backward", ""),
    ("glu", "pjrt_glu", ""),
    ("glu_backward", "pjrt_glu_backward", ""),
    ("logit_backward", "pjrt_logit_backward", ""),
]

HAND_WRITTEN["elementwise"] = [
    ("atan", "pjrt_atan", "real"),
    ("asin", "pjrt_asin", "real"),
    ("acos", "pjrt_acos", "real"),
    ("sinh", "pjrt_sinh", "real"),
    ("cosh", "pjrt_cosh", "real"),
    ("asinh", "pjrt_asinh", "real"),
    ("acosh", "pjrt_acosh", "real"),
    ("atanh", "pjrt_atanh", "real"),
    # `frac` of a complex number: the CPU raises PyTorch's error.
    ("frac", "pjrt_frac", "real"),
    ("sinc", "pjrt_sinc", "real"),
    ("logaddexp", "pjrt_logaddexp", ""),
    ("hypot", "pjrt_hypot", ""),
    ("xlogy.Tensor", "pjrt_xlogy", ""),
    ("xlogy.Scalar_Other", "pjrt_xlogy_scalar_other", ""),
    ("xlogy.Scalar_Self", "pjrt_xlogy_scalar_self", ""),
    ("fmax", "pjrt_fmax", ""),
    ("fmin", "pjrt_fmin", ""),
    ("signbit", "pjrt_signbit", ""),
    ("copysign.Tensor", "pjrt_copysign", ""),
    ("copysign.Scalar", "pjrt_copysign_scalar", ""),
    ("heaviside", "pjrt_heaviside", ""),
    ("isposinf", "pjrt_isinf_signed(self, \"isposinf\", 1)", ""),
    ("isneginf", "pjrt_isinf_signed(self, \"isneginf\", -1)", ""),
    ("special_xlog1py", "pjrt_special_xlog1py", ""),
    ("special_entr", "pjrt_special_entr", ""),
    ("frexp.Tensor", "pjrt_frexp", ""),
    ("special_i1", "pjrt_special_i1", ""),
    ("special_modified_bessel_i1", "pjrt_special_modified_bessel_i1", ""),
    ("special_spherical_bessel_j0", "pjrt_special_spherical_bessel_j0", ""),
    ("special_erfcx", "pjrt_special_erfcx", ""),
    ("special_log_ndtr", "pjrt_special_log_ndtr", ""),
    ("special_ndtri", "pjrt_special_ndtri", ""),
    ("polygamma", "pjrt_polygamma", "real"),
]

HAND_WRITTEN["reduce"] = [
    ("max.dim", "pjrt_max_dim", ""),
    ("min.dim", "pjrt_min_dim", ""),
    ("kthvalue", "pjrt_kthvalue", ""),
    ("median.dim", "pjrt_median_dim", ""),
    ("median", "pjrt_median", ""),
    ("_unique2", "pjrt_unique2", ""),
    ("unique_consecutive", "pjrt_unique_consecutive", ""),
    ("bincount", "pjrt_bincount", ""),
    ("histc", "pjrt_histc", ""),
    ("histogram.bin_ct", "pjrt_histogram_bin_ct", ""),
    ("histogram.bins_tensor", "pjrt_histogram_bins_tensor", ""),
    ("_histogramdd_bin_edges", "pjrt_histogramdd_bin_edges", "only"),
    ("_histogramdd_from_bin_cts", "pjrt_histogramdd_from_bin_cts", ""),
    ("_histogramdd_from_bin_tensors", "pjrt_histogramdd_from_bin_tensors", ""),
    ("var_mean.correction", "pjrt_var_mean", ""),
    ("equal", "pjrt_equal", ""),
    ("_cummax_helper", "pjrt_cummax_helper", ""),
    ("_cummin_helper", "pjrt_cummin_helper", ""),
    ("count_nonzero.dim_IntList", "pjrt_count_nonzero", ""),
    ("aminmax", "pjrt_aminmax", ""),
    ("searchsorted.Tensor", "pjrt_searchsorted", ""),
    ("searchsorted.Scalar", "pjrt_searchsorted_scalar", ""),
    ("bucketize.Tensor", "pjrt_bucketize", ""),
    ("bucketize.Scalar", "pjrt_bucketize_scalar", ""),
    ("nansum", "pjrt_nansum", ""),
    ("nanmedian.dim", "pjrt_nanmedian_dim", ""),
    ("nanmedian", "pjrt_nanmedian", ""),
    ("mode", "pjrt_mode", ""),
]

HAND_WRITTEN["linalg"] = [
    ("addmv", "pjrt_addmv", ""),
    ("linalg_cross", "pjrt_linalg_cross", ""),
    ("_pdist_forward", "pjrt_pdist_forward", "autograd"),
    ("_cdist_forward", "pjrt_cdist_forward", ""),
    ("_cdist_backward", "pjrt_cdist_backward", ""),
    ("_grouped_mm", "pjrt_grouped_mm", ""),
    ("addbmm", "pjrt_addbmm", ""),
    ("_scaled_dot_product_fused_attention_overrideable", "pjrt_sdpa_overrideable", ""),
    (
        "_scaled_dot_product_fused_attention_overrideable_backward",
        "pjrt_sdpa_overrideable_backward",
        "",
    ),
    # Factorizations (engine ops) and what composes from them; complex matrices run on the CPU.
    ("linalg_solve_triangular", "pjrt_linalg_solve_triangular", "real"),
    ("linalg_cholesky_ex", "pjrt_linalg_cholesky_ex", "real"),
    ("cholesky", "pjrt_cholesky", "real"),
    ("_cholesky_solve_helper", "pjrt_cholesky_solve_helper", "real"),
    ("cholesky_inverse", "pjrt_cholesky_inverse", "real"),
    ("linalg_lu_factor_ex", "pjrt_linalg_lu_factor_ex", "real"),
    ("linalg_lu_solve", "pjrt_linalg_lu_solve", "real"),
    ("lu_unpack", "pjrt_lu_unpack", "real"),
    ("linalg_lu", "pjrt_linalg_lu", "real"),
    ("_linalg_solve_ex", "pjrt_linalg_solve_ex", "real"),
    ("linalg_inv_ex", "pjrt_linalg_inv_ex", "real"),
    ("_linalg_det", "pjrt_linalg_det", "real"),
    ("_linalg_slogdet", "pjrt_linalg_slogdet", "real"),
    ("linalg_qr", "pjrt_linalg_qr", "real"),
    ("_linalg_eigh", "pjrt_linalg_eigh", "real"),
    ("_linalg_svd", "pjrt_linalg_svd", "real"),
    ("linalg_lstsq", "pjrt_linalg_lstsq", "real"),
    ("linalg_matrix_exp", "pjrt_linalg_matrix_exp", "real"),
    ("triangular_solve", "pjrt_triangular_solve", "real"),
    ("geqrf", "pjrt_geqrf", "real"),
    ("linalg_householder_product", "pjrt_householder_product", "real"),
    ("ormqr", "pjrt_ormqr", "real"),
]

HAND_WRITTEN["norm"] = [
    ("_weight_norm_interface_backward", "pjrt_weight_norm_interface_backward", ""),
    ("renorm", "pjrt_renorm", "real"),
]

HAND_WRITTEN["embedding"] = [
    ("embedding_renorm_", "pjrt_embedding_renorm_", ""),
    ("_embedding_bag", "pjrt_embedding_bag", ""),
    ("_embedding_bag_forward_only", "pjrt_embedding_bag", ""),
    ("_embedding_bag_backward", "pjrt_embedding_bag_backward", ""),
    ("_embedding_bag_dense_backward", "pjrt_embedding_bag_dense_backward", ""),
    (
        "_embedding_bag_per_sample_weights_backward",
        "pjrt_embedding_bag_per_sample_weights_backward",
        "",
    ),
]

HAND_WRITTEN["conv"] = [
    ("unfold", "at::native::unfold", ""),
    ("im2col", "pjrt_im2col", ""),
    ("col2im", "pjrt_col2im(self, ints(output_size), kernel_size, dilation, padding, stride)", ""),
    ("max_unpool2d", "pjrt_max_unpool(self, indices, ints(output_size), 2)", ""),
    ("max_unpool3d", "pjrt_max_unpool(self, indices, ints(output_size), 3)", ""),
    ("fractional_max_pool2d",
     "fractional_max_pool(\"fractional_max_pool2d\", self, kernel_size, output_size, random_samples, 2)", ""),
    ("fractional_max_pool3d",
     "fractional_max_pool(\"fractional_max_pool3d\", self, kernel_size, output_size, random_samples, 3)", ""),
    ("fractional_max_pool2d_backward", "fractional_max_pool_backward(grad_output, self, indices, 2)", ""),
    ("fractional_max_pool3d_backward", "fractional_max_pool_backward(grad_output, self, indices, 3)", ""),
]

HAND_WRITTEN["creation"] = [
    ("tril_indices", "triangle_indices(true, row, col, offset, dtype, device)", ""),
    ("triu_indices", "triangle_indices(false, row, col, offset, dtype, device)", ""),
]

HAND_WRITTEN["padding"] = [
    (f"{mode}_pad{n}d{suffix}", f"{fn}(PadMode::{kind}, {n}, {args}self, ints(padding))", "")
    for mode, kind, sizes in [("reflection", "Reflect", (1, 2, 3)), ("replication", "Replicate", (1, 2, 3))]
    for n in sizes
    for suffix, fn, args in [("", "pad", ""), ("_backward", "pad_backward", "grad_output, ")]
    # `replication_pad1d` itself is PyTorch's decomposition (torch_pjrt/_decompositions.py).
    if (mode, n, suffix) != ("replication", 1, "")
]


def _upsample_rows() -> list[tuple[str, str, str]]:
    scale_names = {1: ["scales"], 2: ["scales_h", "scales_w"], 3: ["scales_d", "scales_h", "scales_w"]}
    rows = []
    for n, name in [(2, "upsample_nearest2d"), (3, "upsample_nearest3d"),
                    (2, "_upsample_nearest_exact2d"), (3, "_upsample_nearest_exact3d")]:
        exact = "true" if "exact" in name else "false"
        scales = ", ".join(scale_names[n])
        rows.append((name, f'upsample_nearest("{name}", self, ints(output_size), {{{scales}}}, {exact})', ""))
    for n in (1, 2, 3):
        for prefix, exact in [("upsample_nearest", "false"), ("_upsample_nearest_exact", "true")]:
            scales = ", ".join(scale_names[n])
            rows.append((
                f"{prefix}{n}d_backward",
                f"upsample_nearest_backward(grad_output, ints(input_size), {{{scales}}}, {exact})",
                "",
            ))
    # Linear kinds: a function each, as an integer image takes the CPU's own kernel.
    for n, name in [(1, "upsample_linear1d"), (2, "upsample_bilinear2d"), (3, "upsample_trilinear3d"),
                    (2, "upsample_bicubic2d")]:
        cubic = ", true" if "bicubic" in name else ""
        scales = ", ".join(scale_names[n])
        rows.append((name, f"pjrt_{name}", ""))
        rows.append((
            f"{name}_backward",
            f"upsample_linear_backward(grad_output, ints(input_size), align_corners, {{{scales}}}{cubic})",
            "",
        ))
    return rows


HAND_WRITTEN["resample"] = _upsample_rows() + [
    ("grid_sampler_2d", "pjrt_grid_sampler_2d", "autograd"),
    ("grid_sampler_3d", "pjrt_grid_sampler_3d", "autograd"),
    # Antialiased resizes (torchvision's `Resize(antialias=True)` on float images).
    ("_upsample_bilinear2d_aa", "pjrt_upsample_bilinear2d_aa", ""),
    ("_upsample_bicubic2d_aa", "pjrt_upsample_bicubic2d_aa", ""),
    ("_upsample_bilinear2d_aa_backward",
     "upsample_antialias_backward(grad_output, ints(input_size), align_corners, {scales_h, scales_w}, false)", ""),
    ("_upsample_bicubic2d_aa_backward",
     "upsample_antialias_backward(grad_output, ints(input_size), align_corners, {scales_h, scales_w}, true)", ""),
]

HAND_WRITTEN["indexing"] = [
    ("index.Tensor", "pjrt_index", ""),
    ("index.Tensor_out", "pjrt_index_out", ""),
    ("_index_put_impl_", "pjrt_index_put_impl_", ""),
    ("nonzero", "pjrt_nonzero", ""),
    ("nonzero.out", "pjrt_nonzero_out", ""),
    ("nonzero_static", "pjrt_nonzero_static", ""),
    ("masked_select", "pjrt_masked_select", ""),
    ("masked_select.out", "pjrt_masked_select_out", ""),
    ("masked_scatter_", "pjrt_masked_scatter_", ""),
    ("index_add", "pjrt_index_add", ""),
    ("index_add_", "pjrt_index_add_", ""),
    ("index_add.out", "pjrt_index_add_out", ""),
    ("repeat_interleave.Tensor", "pjrt_repeat_interleave", ""),
    ("index_copy", "pjrt_index_copy", ""),
    ("index_fill.int_Tensor", "pjrt_index_fill", ""),
    ("index_fill.int_Scalar", "index_fill_scalar", ""),
    ("scatter_reduce.two", "pjrt_scatter_reduce", ""),
    ("scatter.reduce", "pjrt_scatter_legacy_reduce", ""),
    ("scatter.value_reduce", "pjrt_scatter_value_legacy_reduce", ""),
    ("index_reduce", "pjrt_index_reduce", ""),
    ("take", "pjrt_take", ""),
    # `put` itself is PyTorch's composite over `put_`.
    ("put_", "pjrt_put_", ""),
]

HAND_WRITTEN["random"] = [
    ("uniform_", "pjrt_uniform_", ""),
    ("normal_", "pjrt_normal_", ""),
    ("normal.Tensor_Tensor", "pjrt_normal_tensor_tensor", ""),
    ("rrelu_with_noise", "pjrt_rrelu_with_noise", ""),
    ("rrelu_with_noise_", "pjrt_rrelu_with_noise_", "only"),
    ("rrelu_with_noise_backward", "pjrt_rrelu_with_noise_backward", ""),
    ("random_", "pjrt_random_", ""),
    ("random_.to", "pjrt_random_to", ""),
    ("random_.from", "pjrt_random_from", ""),
    ("bernoulli_.float", "pjrt_bernoulli_float", ""),
    ("bernoulli_.Tensor", "pjrt_bernoulli_tensor", ""),
    ("bernoulli", "pjrt_bernoulli", ""),
    ("bernoulli.p", "pjrt_bernoulli_p", ""),
    ("native_dropout", "pjrt_native_dropout", ""),
    ("native_dropout_backward", "pjrt_native_dropout_backward", ""),
    ("exponential_", "pjrt_exponential_", ""),
    ("geometric_", "pjrt_geometric_", ""),
    ("log_normal_", "pjrt_log_normal_", ""),
    ("cauchy_", "pjrt_cauchy_", ""),
    ("multinomial", "pjrt_multinomial(self, num_samples.expect_int(), replacement, generator)", ""),
    ("randperm", "pjrt_randperm(n, std::nullopt, dtype, device)", ""),
    ("randperm.generator", "pjrt_randperm(n, generator, dtype, device)", ""),
    # Without dtype or device arguments, the result takes `out`'s.
    ("randperm.out", "write_out(pjrt_randperm(n, std::nullopt, out.scalar_type(), out.device()), out)", ""),
    (
        "randperm.generator_out",
        "write_out(pjrt_randperm(n, generator, out.scalar_type(), out.device()), out)",
        "",
    ),
]

HAND_WRITTEN["optim"] = [
    ("_fused_adam_", "pjrt_fused_adam<false, double>", ""),
    ("_fused_adam_.tensor_lr", "pjrt_fused_adam<false, const at::Tensor&>", ""),
    ("_fused_adamw_", "pjrt_fused_adam<true, double>", ""),
    ("_fused_adamw_.tensor_lr", "pjrt_fused_adam<true, const at::Tensor&>", ""),
    ("_fused_sgd_", "pjrt_fused_sgd<double>", ""),
    ("_fused_sgd_.tensor_lr", "pjrt_fused_sgd<const at::Tensor&>", ""),
    ("_amp_foreach_non_finite_check_and_unscale_", "pjrt_amp_non_finite_check_and_unscale_", ""),
    ("_amp_update_scale_", "pjrt_amp_update_scale_", ""),
]

HAND_WRITTEN["rnn"] = [
    ("_thnn_fused_lstm_cell", "pjrt_fused_lstm_cell", ""),
    ("_thnn_fused_lstm_cell_backward_impl", "pjrt_fused_lstm_cell_backward_impl", ""),
    ("_thnn_fused_gru_cell", "pjrt_fused_gru_cell", ""),
    ("_thnn_fused_gru_cell_backward", "pjrt_fused_gru_cell_backward", ""),
]

HAND_WRITTEN["complex"] = [
    ("view_as_real", "at::native::view_as_real", ""),
    ("view_as_complex", "at::native::view_as_complex", ""),
    ("conj_physical.out", "pjrt_conj_physical_out", ""),
    ("conj_physical_", "pjrt_conj_physical_", ""),
    ("complex.out", "pjrt_complex_out", ""),
    ("polar.out", "pjrt_polar_out", ""),
    ("angle", "pjrt_angle", ""),
    ("angle.out", "pjrt_angle_out", ""),
    ("vdot", "pjrt_vdot", ""),
]
