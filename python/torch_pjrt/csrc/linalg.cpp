// Products and distances composed from device ops (RFC 0019): `addmv` (and so `mv` and
// matrix-vector `matmul`), `linalg_cross`, `cdist`'s direct form with its gradient, the
// grouped matrix products of a mixture of experts (`aten::_grouped_mm`, RFC 0029), and
// `scaled_dot_product_attention` as the engine's one attention op (RFC 0050).
#include <ATen/ATen.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

#include "pjrt_backend.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <tuple>

namespace torch_pjrt {
namespace {

// ----- matrix-vector product --------------------------------------------------------------------

at::Tensor pjrt_addmv(
    const at::Tensor& self,
    const at::Tensor& mat,
    const at::Tensor& vec,
    const at::Scalar& beta_given,
    const at::Scalar& alpha_given) {
  // For integer operands PyTorch converts alpha and beta to the integer type (0.6 becomes 0).
  bool integral = at::isIntegralType(mat.scalar_type(), /*includeBool=*/true);
  at::Scalar beta = integral ? at::Scalar(beta_given.toLong()) : beta_given;
  at::Scalar alpha = integral ? at::Scalar(alpha_given.toLong()) : alpha_given;
  TORCH_CHECK(
      mat.dim() == 2 && vec.dim() == 1,
      "vector + matrix @ vector expected, got ",
      self.dim(),
      ", ",
      mat.dim(),
      ", ",
      vec.dim());
  TORCH_CHECK(
      mat.size(1) == vec.size(0) && (self.dim() == 0 || self.numel() == 1 || self.size(-1) == mat.size(0)),
      "size mismatch, got input (",
      self.dim() == 0 ? 1 : self.size(-1),
      "), mat (",
      mat.size(0),
      "x",
      mat.size(1),
      "), vec (",
      vec.size(0),
      ")");
  at::Tensor product = at::mm(mat, vec.unsqueeze(1)).squeeze(1);
  if (!alpha.equal(1)) {
    product = product * alpha;
  }
  // As in PyTorch, a zero beta ignores `self` (its NaNs included). The result keeps the
  // operands' dtype: integer products scaled by a float alpha or beta are cast back.
  at::ScalarType dtype = mat.scalar_type();
  if (beta.equal(0)) {
    return product.to(dtype);
  }
  return (beta.equal(1) ? self + product : self * beta + product).to(dtype);
}

at::Tensor pjrt_linalg_cross(const at::Tensor& self, const at::Tensor& other, int64_t dim) {
  TORCH_CHECK(
      self.scalar_type() == other.scalar_type(),
      "linalg.cross: expected both inputs to have the same dtype, but input has dtype ",
      self.scalar_type(),
      " and other has dtype ",
      other.scalar_type());
  TORCH_CHECK(
      self.dim() == other.dim(),
      "linalg.cross: inputs must have the same number of dimensions.");
  std::vector<int64_t> shape = at::infer_size(self.sizes(), other.sizes());
  int64_t d = c10::maybe_wrap_dim(dim, static_cast<int64_t>(shape.size()));
  TORCH_CHECK(
      self.size(d) == 3 && other.size(d) == 3,
      "linalg.cross: inputs dimension ",
      dim,
      " must have length 3. Got ",
      self.size(d),
      " and ",
      other.size(d));
  at::Tensor a = self.expand(shape);
  at::Tensor b = other.expand(shape);
  // Component i is a[i+1] b[i+2] - a[i+2] b[i+1] (indices mod 3).
  return at::roll(a, -1, d) * at::roll(b, -2, d) - at::roll(a, -2, d) * at::roll(b, -1, d);
}

// ----- distances --------------------------------------------------------------------------------

void check_cdist(const at::Tensor& x1, const at::Tensor& x2, double p) {
  TORCH_CHECK(
      at::isFloatingType(x1.scalar_type()),
      "cdist only supports floating-point dtypes, X1 got: ",
      x1.scalar_type());
  TORCH_CHECK(
      at::isFloatingType(x2.scalar_type()),
      "cdist only supports floating-point dtypes, X2 got: ",
      x2.scalar_type());
  TORCH_CHECK(p >= 0, "cdist only supports non-negative p values");
  TORCH_CHECK(x1.dim() >= 2, "cdist only supports at least 2D tensors, X1 got: ", x1.dim(), "D");
  TORCH_CHECK(x2.dim() >= 2, "cdist only supports at least 2D tensors, X2 got: ", x2.dim(), "D");
  TORCH_CHECK(
      x1.size(-1) == x2.size(-1),
      "X1 and X2 must have the same number of columns. X1: ",
      x1.size(-1),
      " X2: ",
      x2.size(-1));
}

// The p-norm distance of every row of x1 to every row of x2, from the differences (the direct
// computation PyTorch's `_cdist_forward` makes; the matrix-product form for p = 2 and large
// inputs is decided earlier, in `cdist`, and composes from other ops).
at::Tensor pjrt_cdist_forward(
    const at::Tensor& x1, const at::Tensor& x2, double p, std::optional<int64_t> compute_mode) {
  check_cdist(x1, x2, p);
  at::Tensor diff = x1.unsqueeze(-2) - x2.unsqueeze(-3);
  return at::linalg_vector_norm(diff, p, {-1});
}

at::Tensor pjrt_cdist_backward(
    const at::Tensor& grad,
    const at::Tensor& x1,
    const at::Tensor& x2,
    double p,
    const at::Tensor& cdist) {
  at::Tensor diff = x1.unsqueeze(-2) - x2.unsqueeze(-3);
  at::Tensor dist = cdist.unsqueeze(-1);
  at::Tensor term;
  if (p == 0.0) {
    return at::zeros_like(x1);
  } else if (p == 1.0) {
    term = at::sign(diff);
  } else if (std::isinf(p)) {
    term = at::sign(diff) * (at::abs(diff) == dist);
  } else if (p == 2.0) {
    term = at::where(dist == 0, at::zeros_like(diff), diff / dist);
  } else {
    term = at::where(
        dist == 0,
        at::zeros_like(diff),
        at::sign(diff) * at::pow(at::abs(diff), p - 1) / at::pow(dist, p - 1));
  }
  return (grad.unsqueeze(-1) * term).sum(-2);
}

// ----- grouped matrix products -------------------------------------------------------------------

// Grouped matrix products on pjrt (`torch.nn.functional.grouped_mm`, `aten::_grouped_mm`): the
// experts of a mixture of experts, each multiplying the rows routed to it. PyTorch's own kernel
// for other devices slices the rows at offsets it reads on the host, so every routing gives
// products of new sizes: a program per size on pjrt. Here every group's product runs over all
// rows and a mask made on the device from the offsets keeps each row's own group, so the
// program depends on the shapes alone. It costs one product per group (the groups' count times
// the work); selecting with `where`, not multiplying by the mask, keeps another group's
// infinities and NaNs out of a row.

// `[groups, n]` bools: position `i` belongs to group `g` when `offs[g - 1] <= i < offs[g]`
// (`offs` holds each group's cumulative end). Positions past the last end belong to none.
at::Tensor group_membership(const at::Tensor& offs, int64_t n) {
  const at::Tensor ends = offs.to(at::kLong);
  const at::Tensor positions = at::arange(n, ends.options());
  // How many groups end at or before each position: its group.
  const at::Tensor group = ends.unsqueeze(1).le(positions.unsqueeze(0)).sum(0);
  const at::Tensor ids = at::arange(offs.size(0), ends.options());
  return ids.unsqueeze(1).eq(group.unsqueeze(0));
}

at::Tensor grouped_mm_in(
    const at::Tensor& self,
    const at::Tensor& mat2,
    const std::optional<at::Tensor>& offs,
    const std::optional<at::Tensor>& bias);

at::Tensor pjrt_grouped_mm(
    const at::Tensor& self,
    const at::Tensor& mat2,
    const std::optional<at::Tensor>& offs,
    const std::optional<at::Tensor>& bias,
    std::optional<at::ScalarType> out_dtype) {
  // A wider result dtype (bfloat16 operands, float32 out): the products run in it.
  if (out_dtype.has_value() && *out_dtype != self.scalar_type()) {
    const auto wide = [&](const at::Tensor& t) { return t.to(*out_dtype); };
    std::optional<at::Tensor> wide_bias;
    if (bias.has_value()) {
      wide_bias = wide(*bias);
    }
    return grouped_mm_in(wide(self), wide(mat2), offs, wide_bias);
  }
  return grouped_mm_in(self, mat2, offs, bias);
}

at::Tensor grouped_mm_in(
    const at::Tensor& self,
    const at::Tensor& mat2,
    const std::optional<at::Tensor>& offs,
    const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(
      (self.dim() == 2 || self.dim() == 3) && (mat2.dim() == 2 || mat2.dim() == 3),
      "grouped_mm: expected 2-d or 3-d operands, got ",
      self.dim(),
      "-d and ",
      mat2.dim(),
      "-d");
  TORCH_CHECK(
      self.scalar_type() == mat2.scalar_type(),
      "grouped_mm: expected both operands to have the same dtype, got ",
      self.scalar_type(),
      " and ",
      mat2.scalar_type());
  const bool batched = self.dim() == 3 && mat2.dim() == 3;
  TORCH_CHECK(
      batched != offs.has_value(),
      batched ? "grouped_mm: offs must not be given when both operands are 3-d"
              : "grouped_mm: offs must be given unless both operands are 3-d");
  if (batched) {
    TORCH_CHECK(!bias.has_value(), "grouped_mm: a bias is supported on pjrt for 2-d by 3-d operands only");
    TORCH_CHECK(self.size(0) == mat2.size(0), "grouped_mm: batched dimension has to match");
    return at::bmm(self, mat2);
  }
  const at::Tensor& ends = *offs;
  TORCH_CHECK(
      ends.dim() == 1 && (ends.scalar_type() == at::kInt || ends.scalar_type() == at::kLong),
      "grouped_mm: offs must be a 1-d int32 tensor, got a ",
      ends.dim(),
      "-d ",
      ends.scalar_type(),
      " tensor");
  const int64_t groups = ends.size(0);
  const at::Tensor zero = at::zeros({}, self.options());
  TORCH_CHECK(
      !bias.has_value() || (self.dim() == 2 && mat2.dim() == 3),
      "grouped_mm: a bias is supported on pjrt for 2-d by 3-d operands only, got ",
      self.dim(),
      "-d by ",
      mat2.dim(),
      "-d");
  if (self.dim() == 2 && mat2.dim() == 3) {
    // Rows of `self` in groups: row i times `mat2[group(i)]`.
    TORCH_CHECK(groups == mat2.size(0), "grouped_mm: matrix batch sizes have to match");
    const at::Tensor keep = group_membership(ends, self.size(0)).unsqueeze(2);
    at::Tensor each = at::bmm(self.unsqueeze(0).expand({groups, -1, -1}), mat2);
    if (bias.has_value()) {
      // One bias row per group, added to that group's rows.
      TORCH_CHECK(
          bias->dim() == 2 && bias->size(0) == groups && bias->size(1) == mat2.size(2),
          "grouped_mm: expected a bias of shape [",
          groups,
          ", ",
          mat2.size(2),
          "], got ",
          bias->sizes());
      each = each + bias->unsqueeze(1);
    }
    return at::where(keep, each, zero).sum(0);
  }
  if (self.dim() == 2) {
    // The contracted dimension in groups: one product per group over its part of it.
    const at::Tensor member = group_membership(ends, self.size(1));
    const at::Tensor lhs = at::where(member.unsqueeze(1), self.unsqueeze(0), zero);
    const at::Tensor rhs = at::where(member.unsqueeze(2), mat2.unsqueeze(0), zero);
    return at::bmm(lhs, rhs);
  }
  // Columns of `mat2` in groups: column j of `self[group(j)]`'s product.
  TORCH_CHECK(groups == self.size(0), "grouped_mm: matrix batch sizes have to match");
  const at::Tensor keep = group_membership(ends, mat2.size(1)).unsqueeze(1);
  const at::Tensor each = at::bmm(self, mat2.unsqueeze(0).expand({groups, -1, -1}));
  return at::where(keep, each, zero).sum(0);
}

// ----- attention ---------------------------------------------------------------------------------

// `scaled_dot_product_attention` asks `_fused_sdp_choice_stub` which kernel to run. On pjrt the
// answer is the engine's attention op (PyTorch's `overrideable` slot) wherever that op computes
// what PyTorch's math composition does: one captured op instead of a dozen, and one program in
// Strict. PyTorch's math composition runs the rest: gradients, dropout, nested, complex or empty tensors, tensors other than 4-d, heads that differ without
// `enable_gqa`, masks of another dtype or that do not broadcast (where the composition raises
// PyTorch's own errors), and whenever `torch.nn.attention.sdpa_kernel` leaves `OVERRIDEABLE`
// out. The op's backward (a direct call's gradients) has no gradient of its own, as CUDA's flash
// kernels'.
int64_t pjrt_fused_sdp_choice(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask,
    double dropout_p,
    bool /*is_causal*/,
    std::optional<double> /*scale*/,
    bool enable_gqa) {
  constexpr auto math = static_cast<int64_t>(at::SDPBackend::math);
  if (!at::globalContext().userEnabledOverrideableSDP() || dropout_p != 0.0) {
    return math;
  }
  const bool has_mask = attn_mask.has_value() && attn_mask->defined();
  // Gradients: the composition saves the softmax for its backward, where the engine's backward
  // op computes it again (an extra product): measured slower at every size tried (RFC 0050).
  const bool wants_grad = query.requires_grad() || key.requires_grad() ||
      value.requires_grad() || (has_mask && attn_mask->requires_grad());
  if (at::GradMode::is_enabled() && wants_grad) {
    return math;
  }
  // Tensors a tracer holds (torch.compile's fake and functional tensors) take the composition:
  // a compiled graph is one program whatever its op count, and the tracer lays out elementwise
  // results as PyTorch's CPU kernels do, which the engine's contiguous results would not match
  // in the views it records after the kernel.
  const c10::DispatchKeySet traced(
      {c10::DispatchKey::Python, c10::DispatchKey::Functionalize});
  for (const at::Tensor* t : {&query, &key, &value}) {
    if (!is_pjrt(*t) || t->is_nested() || t->key_set().has_any(traced) ||
        !at::isFloatingType(t->scalar_type()) || t->scalar_type() != query.scalar_type() ||
        t->numel() == 0) {
      return math;
    }
  }
  // 4-d, as PyTorch's meta function for the kernel (what torch.compile traces with) takes.
  const int64_t rank = query.dim();
  if (rank != 4 || key.dim() != rank || value.dim() != rank || key.size(-1) != query.size(-1) ||
      value.size(-2) != key.size(-2)) {
    return math;
  }
  for (int64_t d = 0; d < rank - 2; ++d) {
    const bool grouped_heads = enable_gqa && d == rank - 3 && key.size(d) > 0 &&
        query.size(d) % key.size(d) == 0;
    if (key.size(d) != value.size(d) || (query.size(d) != key.size(d) && !grouped_heads)) {
      return math;
    }
  }
  if (has_mask) {
    const at::Tensor& mask = *attn_mask;
    if (!is_pjrt(mask) || mask.is_nested() || mask.dim() > rank ||
        (mask.scalar_type() != at::kBool && mask.scalar_type() != query.scalar_type())) {
      return math;
    }
    // Broadcast to the scores, `[*, heads, L, S]`.
    for (int64_t i = 1; i <= mask.dim(); ++i) {
      const int64_t scores = i == 1 ? key.size(-2) : query.size(-i);
      if (mask.size(-i) != scores && mask.size(-i) != 1) {
        return math;
      }
    }
  }
  return static_cast<int64_t>(at::SDPBackend::overrideable);
}

// PyTorch's meta function for the attention kernel lays the output out like the query (dims in
// the order of its strides); the engine's results are contiguous. An output whose query is laid
// out otherwise is made contiguous in that dim order and viewed back: a transposed query (how
// models split heads) gets an output its transpose back reads without a copy, and code that
// relies on the meta layout finds it. A `contiguous` rather than a copy into a new tensor keeps a
// padded result padded (a growing sequence's bucket).
at::Tensor laid_out_like(const at::Tensor& like, at::Tensor result) {
  if (!result.defined() || like.is_contiguous() || like.dim() != result.dim()) {
    return result;
  }
  std::vector<int64_t> order(like.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return like.stride(a) > like.stride(b);
  });
  if (std::is_sorted(order.begin(), order.end())) {
    return result;
  }
  std::vector<int64_t> back(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    back[order[i]] = static_cast<int64_t>(i);
  }
  return result.permute(order).contiguous().permute(back);
}

std::tuple<
    at::Tensor,
    at::Tensor,
    at::Tensor,
    at::Tensor,
    c10::SymInt,
    c10::SymInt,
    at::Tensor,
    at::Tensor,
    at::Tensor>
pjrt_sdpa_overrideable(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& attn_bias,
    double dropout_p,
    bool is_causal,
    bool return_debug_mask,
    std::optional<double> scale) {
  TORCH_CHECK(
      dropout_p == 0.0 && !return_debug_mask,
      "_scaled_dot_product_fused_attention_overrideable: pjrt's attention op takes no dropout ",
      "and returns no debug mask (got dropout_p=",
      dropout_p,
      ", return_debug_mask=",
      return_debug_mask,
      "); torch.nn.functional.scaled_dot_product_attention runs PyTorch's math composition ",
      "for those");
  static const auto op = engine_op(ops::_scaled_dot_product_fused_attention_overrideable);
  const bool has_bias = attn_bias.has_value() && attn_bias->defined();
  OpCall c(
      op,
      "aten::_scaled_dot_product_fused_attention_overrideable",
      {.is_causal = is_causal,
       .has_attn_bias = has_bias,
       .has_scale = scale.has_value(),
       .scale = scale.value_or(0.0)});
  c.input(query);
  c.input(key);
  c.input(value);
  if (has_bias) {
    c.input(*attn_bias);
  }
  std::vector<at::Tensor> r = c.run_functional_n(2);
  // What the flash kernels return for their backward (sequence offsets, a dropout seed): the
  // engine's op needs none, so they are empty.
  const auto none = [&] { return at::empty({0}, query.options().dtype(at::kLong)); };
  return std::make_tuple(
      laid_out_like(query, std::move(r[0])),
      std::move(r[1]),
      none(),
      none(),
      c10::SymInt(query.size(-2)),
      c10::SymInt(key.size(-2)),
      none(),
      none(),
      none());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pjrt_sdpa_overrideable_backward(
    const at::Tensor& grad_out,
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const at::Tensor& attn_bias,
    std::array<bool, 4> grad_input_mask,
    const at::Tensor& out,
    const at::Tensor& /*logsumexp*/,
    const at::Tensor& /*cum_seq_q*/,
    const at::Tensor& /*cum_seq_k*/,
    c10::SymInt /*max_q*/,
    c10::SymInt /*max_k*/,
    double dropout_p,
    bool is_causal,
    const at::Tensor& /*philox_seed*/,
    const at::Tensor& /*philox_offset*/,
    std::optional<double> scale) {
  TORCH_CHECK(
      dropout_p == 0.0,
      "_scaled_dot_product_fused_attention_overrideable_backward: pjrt's attention op takes no ",
      "dropout (got dropout_p=",
      dropout_p,
      ")");
  static const auto op = engine_op(ops::_scaled_dot_product_fused_attention_overrideable_backward);
  const bool has_bias = attn_bias.defined();
  const bool bias_grad = has_bias && grad_input_mask[3];
  OpCall c(
      op,
      "aten::_scaled_dot_product_fused_attention_overrideable_backward",
      {.is_causal = is_causal,
       .has_attn_bias = has_bias,
       .has_scale = scale.has_value(),
       .scale = scale.value_or(0.0),
       .bias_grad = bias_grad});
  c.input(grad_out);
  c.input(query);
  c.input(key);
  c.input(value);
  c.input(out);
  if (has_bias) {
    c.input(attn_bias);
  }
  std::vector<at::Tensor> r = c.run_functional_n(bias_grad ? 4 : 3);
  // Gradients nobody asked for are dropped here, so the engine never computes them.
  const auto asked = [&](size_t i) { return grad_input_mask[i] ? std::move(r[i]) : at::Tensor(); };
  // Contiguous, unlike the meta function's gradients (laid out like the inputs): only eager
  // code reaches this kernel (tracers take the composition), and a transposition here would be
  // one more copy of each gradient on its way back through the caller's views.
  at::Tensor grad_query = asked(0);
  at::Tensor grad_key = asked(1);
  at::Tensor grad_value = asked(2);
  return std::make_tuple(
      std::move(grad_query),
      std::move(grad_key),
      std::move(grad_value),
      bias_grad ? std::move(r[3]) : at::Tensor());
}

// `addbmm`: `beta * self + alpha * sum_i batch1[i] @ batch2[i]`, as one product: the batches laid
// side by side along the contracted dimension, so `addmm` gives the sum and `beta`'s rules.
at::Tensor pjrt_addbmm(
    const at::Tensor& self,
    const at::Tensor& batch1,
    const at::Tensor& batch2,
    const at::Scalar& beta,
    const at::Scalar& alpha) {
  TORCH_CHECK(batch1.dim() == 3, "batch1 must be a 3D tensor");
  TORCH_CHECK(batch2.dim() == 3, "batch2 must be a 3D tensor");
  TORCH_CHECK(
      batch1.size(0) == batch2.size(0),
      "batch1 and batch2 must have same number of batches, got ",
      batch1.size(0),
      " and ",
      batch2.size(0));
  TORCH_CHECK(
      batch1.size(2) == batch2.size(1),
      "Incompatible matrix sizes for bmm (",
      batch1.size(1),
      "x",
      batch1.size(2),
      " and ",
      batch2.size(1),
      "x",
      batch2.size(2),
      ")");
  const int64_t contracted = batch1.size(0) * batch1.size(2);
  const at::Tensor left = batch1.transpose(0, 1).reshape({batch1.size(1), contracted});
  const at::Tensor right = batch2.reshape({contracted, batch2.size(2)});
  return at::addmm(self, left, right, beta, alpha);
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/linalg_kernels.inc"

}  // namespace torch_pjrt

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_pjrt::pjrt_fused_sdp_choice)
}  // namespace at::native
