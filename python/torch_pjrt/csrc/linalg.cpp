// Products and distances composed from device ops (RFC 0019): `addmv` (and so `mv` and
// matrix-vector `matmul`), `linalg_cross`, `cdist`'s direct form with its gradient, the
// grouped matrix products of a mixture of experts (`aten::_grouped_mm`, RFC 0029), and
// `scaled_dot_product_attention` as the engine's one attention op (RFC 0050).
#include <ATen/ATen.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/LinearAlgebraUtils.h>
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
// `_pdist_forward`: the p-norm distance of every pair of rows i < j, pairs in row-major order.
// Registered above autograd: the gradient follows the row gather and the norm, zero where two
// rows are equal, as PyTorch's `_pdist_backward`.
at::Tensor pjrt_pdist_forward(const at::Tensor& self, double p) {
  TORCH_CHECK(self.is_contiguous(), "_pdist_forward requires contiguous input");
  // As PyTorch's kernels: float32 and float64 only.
  TORCH_CHECK_NOT_IMPLEMENTED(
      !at::isReducedFloatingType(self.scalar_type()),
      "\"pdist\" not implemented for '", c10::toString(self.scalar_type()), "'");
  const int64_t n = self.size(0);
  if (n <= 1) {
    // No pairs; still an output of `self` for autograd, as PyTorch's.
    return self.reshape({-1}).narrow(0, 0, 0).clone();
  }
  const at::Tensor pairs = at::triu_indices(n, n, 1, self.options().dtype(at::kLong));
  const at::Tensor gap = self.index_select(0, pairs[0]) - self.index_select(0, pairs[1]);
  const at::Tensor distance = at::linalg_vector_norm(gap, p, at::IntArrayRef{1});
  if (p == 0) {
    // The count of differing coordinates has a zero gradient, which `vector_norm` leaves
    // undefined: routed through a `where` that never takes the other side, it is zeros.
    const at::Tensor never = at::zeros_like(distance, distance.options().dtype(at::kBool));
    return at::where(never, gap.sum(1), distance);
  }
  return distance;
}

// `linalg_matrix_exp` by scaling and squaring with the [13/13] Padé approximant (Higham's
// method): each matrix scaled by 2^-s so its 1-norm is at most theta_13, the approximant
// (V - U)^-1 (V + U) from one solve, then squared s times. Each matrix's s is computed on the
// device; only the largest is read to the host (the number of squaring steps; a matrix with a
// smaller s keeps its value in the extra steps), as PyTorch's own kernels read their norms.
// Reduced floats compute in float32.
at::Tensor pjrt_linalg_matrix_exp(const at::Tensor& self) {
  at::native::squareCheckInputs(self, "linalg.matrix_exp");
  at::native::checkFloatingOrComplex(self, "linalg.matrix_exp");
  const int64_t n = self.size(-1);
  if (self.numel() == 0) {
    return self.clone(at::MemoryFormat::Contiguous);
  }
  if (n == 1) {
    return self.exp();
  }
  const at::ScalarType dtype = self.scalar_type();
  const at::Tensor A = at::isReducedFloatingType(dtype) ? self.to(at::kFloat) : self;
  // b_j = (26 - j)! 13! / (26! j! (13 - j)!), the approximant's coefficients.
  std::array<double, 14> b{};
  for (int j = 0; j <= 13; ++j) {
    b[j] = std::exp(
        std::lgamma(27.0 - j) + std::lgamma(14.0) - std::lgamma(27.0) - std::lgamma(j + 1.0) -
        std::lgamma(14.0 - j));
  }
  constexpr double theta_13 = 5.371920351148152;
  const at::Tensor norm = A.abs().sum(-2).amax(-1);
  at::Tensor steps = at::clamp_min(at::ceil(at::log2(norm / theta_13)), 0);
  // A norm that is not finite gives a result that is not either; it takes no steps.
  steps = at::where(at::isfinite(steps), steps, at::zeros_like(steps));
  const int64_t squarings = steps.max().item<int64_t>();
  const at::Tensor scaled = A * at::exp2(-steps).unsqueeze(-1).unsqueeze(-1);
  const at::Tensor identity = at::eye(n, A.options()).expand_as(A);
  const at::Tensor A2 = at::matmul(scaled, scaled);
  const at::Tensor A4 = at::matmul(A2, A2);
  const at::Tensor A6 = at::matmul(A4, A2);
  const at::Tensor U = at::matmul(
      scaled,
      at::matmul(A6, b[13] * A6 + b[11] * A4 + b[9] * A2) + b[7] * A6 + b[5] * A4 + b[3] * A2 + b[1] * identity);
  const at::Tensor V =
      at::matmul(A6, b[12] * A6 + b[10] * A4 + b[8] * A2) + b[6] * A6 + b[4] * A4 + b[2] * A2 + b[0] * identity;
  at::Tensor result = at::linalg_solve(V - U, V + U);
  for (int64_t k = 0; k < squarings; ++k) {
    const at::Tensor more = (steps > static_cast<double>(k)).unsqueeze(-1).unsqueeze(-1);
    result = at::where(more, at::matmul(result, result), result);
  }
  return result.to(dtype).contiguous();
}

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

// ----- factorizations and what composes from them --------------------------------------------------
//
// The engine factors (Cholesky, LU with its permutation, QR, symmetric eigh); solving, inverting
// and determinants compose from those and `linalg_solve_triangular` here, as LAPACK composes
// them on the CPU. Registering the functional overload of a structured op skips PyTorch's meta
// function, so each kernel makes its checks first, with PyTorch's messages.

// LAPACK's layout, which PyTorch's results keep on every device: each matrix column-major
// (`batched_matrix_contiguous_strides(..., f_contig=true)`).
at::Tensor column_major(const at::Tensor& t) {
  if (t.dim() < 2) {
    return t;
  }
  const auto strides = at::native::batched_matrix_contiguous_strides(t.sizes(), /*f_contig=*/true);
  at::Tensor r = t.mT().contiguous().mT();
  // With sizes of 1 several stride sets are contiguous; PyTorch's results carry LAPACK's.
  return r.strides() == c10::IntArrayRef(strides) ? r : r.as_strided(r.sizes(), strides, r.storage_offset());
}

at::Tensor pjrt_linalg_solve_triangular(
    const at::Tensor& A,
    const at::Tensor& B,
    bool upper,
    bool left,
    bool unitriangular) {
  static const auto op = engine_op(ops::linalg_solve_triangular);
  OpCall c(op, "aten::linalg_solve_triangular", {.upper = upper, .left = left, .unitriangular = unitriangular});
  c.input(A);
  c.input(B);
  return column_major(c.run_functional());
}

std::tuple<at::Tensor, at::Tensor> pjrt_linalg_cholesky_ex(const at::Tensor& A, bool upper, bool check_errors) {
  at::native::squareCheckInputs(A, "linalg.cholesky");
  at::native::checkFloatingOrComplex(A, "linalg.cholesky");
  static const auto op = engine_op(ops::linalg_cholesky_ex);
  OpCall c(op, "aten::linalg_cholesky_ex", {.upper = upper});
  c.input(A);
  std::vector<at::Tensor> r = c.run_functional_n(2);
  if (check_errors) {
    at::_linalg_check_errors(r[1], "linalg.cholesky_ex", A.dim() == 2);
  }
  return std::make_tuple(column_major(r[0]), std::move(r[1]));
}

at::Tensor pjrt_cholesky(const at::Tensor& self, bool upper) {
  TORCH_WARN_ONCE(
      "torch.cholesky is deprecated in favor of torch.linalg.cholesky and will be removed in a "
      "future PyTorch release.");
  if (self.numel() == 0) {
    return at::empty_like(self, at::MemoryFormat::Contiguous);
  }
  at::native::squareCheckInputs(self, "cholesky");
  auto [factor, info] = pjrt_linalg_cholesky_ex(self, upper, /*check_errors=*/false);
  at::_linalg_check_errors(info, "cholesky", self.dim() == 2);
  return factor;
}

// `A X = B` for `A = L L^H` (or `U^H U`), given the factor: two triangular solves.
at::Tensor pjrt_cholesky_solve_helper(const at::Tensor& B, const at::Tensor& factor, bool upper) {
  const at::Tensor lower = upper ? factor.mH() : factor;
  const at::Tensor y = at::linalg_solve_triangular(lower, B, /*upper=*/false);
  return column_major(at::linalg_solve_triangular(lower.mH(), y, /*upper=*/true));
}

at::Tensor pjrt_cholesky_inverse(const at::Tensor& factor, bool upper) {
  at::native::squareCheckInputs(factor, "cholesky_inverse");
  at::native::checkFloatingOrComplex(factor, "cholesky_inverse");
  const at::Tensor identity = at::eye(factor.size(-1), factor.options()).expand_as(factor);
  return pjrt_cholesky_solve_helper(identity, factor, upper);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_linalg_lu_factor_ex(
    const at::Tensor& A,
    bool pivot,
    bool check_errors) {
  TORCH_CHECK(
      A.dim() >= 2, "torch.lu_factor: Expected tensor with 2 or more dimensions. Got size: ", A.sizes(), " instead");
  at::native::checkFloatingOrComplex(A, "torch.lu_factor");
  static const auto op = engine_op(ops::linalg_lu_factor_ex);
  OpCall c(op, "aten::linalg_lu_factor_ex", {.pivot = pivot});
  c.input(A);
  std::vector<at::Tensor> r = c.run_functional_n(3);
  if (check_errors) {
    at::_linalg_check_errors(r[2], "torch.linalg.lu_factor_ex", A.dim() == 2);
  }
  return std::make_tuple(column_major(r[0]), std::move(r[1]), std::move(r[2]));
}

// The row order LU's pivots make: row j of P^T A is row perm[j] of A (int64, `[*, rows]`).
at::Tensor lu_permutation(const at::Tensor& pivots, int64_t rows) {
  static const auto op = engine_op(ops::lu_permutation);
  OpCall c(op, "aten::lu_unpack", {.rows = rows});
  c.input(pivots);
  return c.run_functional();
}

// `P^T B` (`transposed`) or `P B`: B's rows gathered (or scattered) by the permutation.
at::Tensor permute_rows(const at::Tensor& B, const at::Tensor& perm, bool transposed) {
  const at::Tensor index = perm.unsqueeze(-1).expand(B.sizes());
  return transposed ? B.gather(-2, index) : at::empty_like(B).scatter(-2, index, B);
}

at::Tensor pjrt_linalg_lu_solve(
    const at::Tensor& LU,
    const at::Tensor& pivots,
    const at::Tensor& B,
    bool left,
    bool adjoint) {
  TORCH_CHECK(
      LU.dim() >= 2, "linalg.lu_solve: Expected LU to have at least 2 dimensions, but it has ", LU.dim(),
      " dimensions instead");
  TORCH_CHECK(
      B.dim() >= 2, "linalg.lu_solve: Expected B to have at least 2 dimensions, but it has ", B.dim(),
      " dimensions instead");
  TORCH_CHECK(
      LU.size(-1) == LU.size(-2), "linalg.lu_solve: Expected LU to be square. Got ", LU.size(-2), "x",
      LU.size(-1), " instead");
  TORCH_CHECK(
      left ? LU.size(-1) == B.size(-2) : LU.size(-2) == B.size(-1),
      "linalg.lu_solve: LU and B should have compatible shapes. Got LU of shape ", LU.sizes(),
      " and B of shape ", B.sizes(), (left ? " (left=True)" : " (left=False)"));
  TORCH_CHECK(
      pivots.dim() == LU.dim() - 1 && pivots.size(-1) == LU.size(-1) &&
          pivots.sizes().slice(0, pivots.dim() - 1).equals(LU.sizes().slice(0, LU.dim() - 2)),
      "linalg.lu_solve: Expected pivots to have shape ", LU.sizes().slice(0, LU.dim() - 1), ". Got ",
      pivots.sizes(), " instead");
  TORCH_CHECK(
      pivots.scalar_type() == at::kInt, "linalg.lu_solve: pivots should be a Tensor of scalar type torch.int32");
  TORCH_CHECK(
      B.scalar_type() == LU.scalar_type(), "linalg.lu_solve: Expected LU and B to have the same dtype, but found LU of type ",
      LU.scalar_type(), " and B of type ", B.scalar_type(), " instead");
  if (!left) {
    // X A = B is A^H X^H = B^H.
    return pjrt_linalg_lu_solve(LU, pivots, B.mH(), /*left=*/true, !adjoint).mH();
  }
  const int64_t n = LU.size(-1);
  auto [B_b, LU_b] = at::native::_linalg_broadcast_batch_dims(B, LU, "linalg.lu_solve");
  at::Tensor perm = lu_permutation(pivots, n);
  std::vector<int64_t> perm_shape(LU_b.sizes().begin(), LU_b.sizes().end() - 1);
  perm = perm.expand(perm_shape);
  if (!adjoint) {
    // A = P L U: X = U^-1 L^-1 P^T B.
    const at::Tensor y = at::linalg_solve_triangular(
        LU_b, permute_rows(B_b, perm, /*transposed=*/true), /*upper=*/false, /*left=*/true,
        /*unitriangular=*/true);
    return column_major(at::linalg_solve_triangular(LU_b, y, /*upper=*/true));
  }
  // A^H = U^H L^H P^T: X = P L^-H U^-H B.
  const at::Tensor z = at::linalg_solve_triangular(LU_b.mH(), B_b, /*upper=*/false);
  const at::Tensor w = at::linalg_solve_triangular(
      LU_b.mH(), z, /*upper=*/true, /*left=*/true, /*unitriangular=*/true);
  return column_major(permute_rows(w, perm, /*transposed=*/false));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_lu_unpack(
    const at::Tensor& LU,
    const at::Tensor& pivots,
    bool unpack_data,
    bool unpack_pivots) {
  TORCH_CHECK(
      LU.dim() >= 2, "torch.lu_unpack: Expected tensor with 2 or more dimensions. Got size: ", LU.sizes(),
      " instead");
  if (unpack_pivots) {
    TORCH_CHECK(
        pivots.scalar_type() == at::kInt,
        "torch.lu_unpack: LU_pivots is expected to be a contiguous tensor of torch.int32 dtype.\n"
        "Note: this function is intended to be used with the output produced by torch.linalg.lu_factor");
  }
  const int64_t m = LU.size(-2);
  const int64_t n = LU.size(-1);
  const int64_t k = std::min(m, n);
  at::Tensor L = LU.new_empty({0});
  at::Tensor U = LU.new_empty({0});
  if (unpack_data) {
    const at::Tensor unit = at::eye(m, k, LU.options());
    L = (LU.narrow(-1, 0, k).tril(-1) + unit).contiguous();
    U = LU.narrow(-2, 0, k).triu().contiguous();
  }
  at::Tensor P = LU.new_empty({0});
  if (unpack_pivots) {
    // P[perm[j], j] = 1, so that A = P L U.
    const at::Tensor perm = lu_permutation(pivots, m);
    const at::Tensor rows = at::arange(m, perm.options()).unsqueeze(-1);
    P = at::eq(rows, perm.unsqueeze(-2)).to(LU.scalar_type());
  }
  return std::make_tuple(std::move(P), std::move(L), std::move(U));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_linalg_lu(const at::Tensor& A, bool pivot) {
  TORCH_CHECK(A.dim() >= 2, "linalg.lu: Expected tensor with 2 or more dimensions. Got size: ", A.sizes(), " instead");
  auto [LU, pivots, info] = pjrt_linalg_lu_factor_ex(A, pivot, /*check_errors=*/false);
  auto [P, L, U] = pjrt_lu_unpack(LU, pivots, /*unpack_data=*/true, /*unpack_pivots=*/pivot);
  return std::make_tuple(std::move(P), std::move(L), std::move(U));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pjrt_linalg_solve_ex(
    const at::Tensor& A,
    const at::Tensor& B,
    bool left,
    bool check_errors) {
  TORCH_CHECK(
      A.scalar_type() == B.scalar_type(), "linalg.solve: Expected A and B to have the same dtype, but found A of type ",
      A.scalar_type(), " and B of type ", B.scalar_type(), " instead");
  const bool vector_case = at::native::linalg_solve_is_vector_rhs(A, B);
  const at::Tensor B_ = vector_case ? B.unsqueeze(-1) : B;
  at::native::checkInputsSolver(A, B_, left, "linalg.solve");
  TORCH_CHECK(
      left || !vector_case,
      "linalg.solve: Vector broadcasting of the left hand side is not supported for left=False. In this case "
      "linalg.solve is equivalent to B / A.squeeze(-1)");
  auto [LU, pivots, info] = pjrt_linalg_lu_factor_ex(A, /*pivot=*/true, /*check_errors=*/false);
  at::Tensor result = pjrt_linalg_lu_solve(LU, pivots, B_, left, /*adjoint=*/false);
  if (vector_case) {
    // PyTorch lays a batch of solution vectors out as one column-major matrix.
    result = column_major(result.squeeze(-1));
  }
  if (check_errors) {
    at::_linalg_check_errors(info, "torch.linalg.solve_ex", A.dim() == 2);
  }
  return std::make_tuple(std::move(result), std::move(LU), std::move(pivots), std::move(info));
}

std::tuple<at::Tensor, at::Tensor> pjrt_linalg_inv_ex(const at::Tensor& A, bool check_errors) {
  at::native::squareCheckInputs(A, "linalg.inv");
  at::native::checkFloatingOrComplex(A, "linalg.inv", /*allow_low_precision_dtypes=*/false);
  const at::Tensor identity = at::eye(A.size(-1), A.options()).expand_as(A);
  auto [LU, pivots, info] = pjrt_linalg_lu_factor_ex(A, /*pivot=*/true, /*check_errors=*/false);
  at::Tensor inverse = pjrt_linalg_lu_solve(LU, pivots, identity, /*left=*/true, /*adjoint=*/false);
  if (check_errors) {
    at::_linalg_check_errors(info, "linalg.inv_ex", A.dim() == 2);
  }
  return std::make_tuple(std::move(inverse), std::move(info));
}

// The permutation's sign: -1 for an odd number of row swaps, in A's dtype.
at::Tensor permutation_sign(const at::Tensor& pivots, at::ScalarType dtype) {
  const at::Tensor unswapped = at::arange(1, pivots.size(-1) + 1, pivots.options());
  const at::Tensor swaps = at::ne(pivots, unswapped).sum(-1);
  return (1 - 2 * swaps.remainder(2)).to(dtype);
}

// What `det` and `slogdet` factor: PyTorch factors a contiguous real A's transpose (the same
// determinant, with no copy into LAPACK's layout), and their gradient formulas read the saved LU
// as that transpose's whenever A is contiguous, so the same matrix is factored here.
at::Tensor det_factor_input(const at::Tensor& A) {
  return A.is_contiguous() ? A.mT() : A;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_linalg_det(const at::Tensor& A) {
  at::native::squareCheckInputs(A, "linalg.det");
  at::native::checkFloatingOrComplex(A, "linalg.det");
  auto [LU, pivots, info] = pjrt_linalg_lu_factor_ex(det_factor_input(A), /*pivot=*/true, /*check_errors=*/false);
  at::Tensor det = LU.diagonal(0, -2, -1).prod(-1) * permutation_sign(pivots, A.scalar_type());
  return std::make_tuple(std::move(det), std::move(LU), std::move(pivots));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pjrt_linalg_slogdet(const at::Tensor& A) {
  at::native::squareCheckInputs(A, "linalg.slogdet");
  at::native::checkFloatingOrComplex(A, "linalg.slogdet");
  auto [LU, pivots, info] = pjrt_linalg_lu_factor_ex(det_factor_input(A), /*pivot=*/true, /*check_errors=*/false);
  const at::Tensor diagonal = LU.diagonal(0, -2, -1);
  at::Tensor sign = diagonal.sgn().prod(-1) * permutation_sign(pivots, A.scalar_type());
  at::Tensor logabsdet = diagonal.abs().log().sum(-1);
  return std::make_tuple(std::move(sign), std::move(logabsdet), std::move(LU), std::move(pivots));
}

std::tuple<at::Tensor, at::Tensor> pjrt_linalg_qr(const at::Tensor& A, c10::string_view mode) {
  at::native::checkIsMatrix(A, "linalg.qr");
  at::native::checkFloatingOrComplex(A, "linalg.qr");
  auto [compute_q, reduced] = at::native::_parse_qr_mode(mode);
  static const auto op = engine_op(ops::linalg_qr);
  OpCall c(op, "aten::linalg_qr", {.mode = !compute_q ? 2 : (reduced ? 0 : 1)});
  c.input(A);
  std::vector<at::Tensor> r = c.run_functional_n(2);
  return std::make_tuple(column_major(r[0]), column_major(r[1]));
}

std::tuple<at::Tensor, at::Tensor> pjrt_linalg_eigh(const at::Tensor& A, c10::string_view uplo, bool compute_v) {
  at::native::squareCheckInputs(A, "linalg.eigh");
  at::native::checkUplo(uplo);
  at::native::checkFloatingOrComplex(A, "linalg.eigh");
  static const auto op = engine_op(ops::_linalg_eigh);
  const bool upper = uplo == "U" || uplo == "u";
  OpCall c(op, "aten::_linalg_eigh", {.upper = upper, .compute_v = compute_v});
  c.input(A);
  std::vector<at::Tensor> r = c.run_functional_n(2);
  return std::make_tuple(std::move(r[0]), column_major(r[1]));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_linalg_svd(
    const at::Tensor& A,
    bool full_matrices,
    bool compute_uv,
    std::optional<c10::string_view> driver) {
  at::native::checkIsMatrix(A, "linalg.svd");
  at::native::checkFloatingOrComplex(A, "linalg.svd");
  TORCH_CHECK(
      !driver.has_value(),
      "torch.linalg.svd: keyword argument `driver=` is only supported on CUDA inputs with cuSOLVER backend.");
  static const auto op = engine_op(ops::_linalg_svd);
  OpCall c(op, "aten::_linalg_svd", {.full_matrices = full_matrices, .compute_uv = compute_uv});
  c.input(A);
  std::vector<at::Tensor> r = c.run_functional_n(3);
  if (!compute_uv) {
    return std::make_tuple(std::move(r[0]), std::move(r[1]), std::move(r[2]));
  }
  return std::make_tuple(column_major(r[0]), std::move(r[1]), column_major(r[2]));
}

// `linalg_lstsq` from the SVD: the minimum-norm least-squares solution, singular values at or
// below `rcond` times the largest counted as zero, which is what every LAPACK driver returns
// for the full-rank problems `gels` assumes, and what `gelsy`, `gelsd` and `gelss` return for
// any rank. What each driver reports beside the solution is PyTorch's: `rank` except for
// `gels`, singular values for `gelsd` and `gelss`, residuals for tall problems except with
// `gelsy` (and with `gelsd`/`gelss` only when every matrix has full rank).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pjrt_linalg_lstsq(
    const at::Tensor& A,
    const at::Tensor& B,
    std::optional<double> rcond,
    std::optional<c10::string_view> driver) {
  TORCH_CHECK(A.dim() >= 2, "torch.linalg.lstsq: input must have at least 2 dimensions.");
  TORCH_CHECK(B.dim() >= 1, "torch.linalg.lstsq: other must have at least 1 dimension.");
  TORCH_CHECK(
      A.scalar_type() == B.scalar_type(),
      "torch.linalg.lstsq: Expected input and other to have the same dtype, but got input's dtype ",
      A.scalar_type(), " and other's dtype ", B.scalar_type());
  const int64_t dim_diff = A.dim() - B.dim();
  TORCH_CHECK(
      0 <= dim_diff && dim_diff <= 1,
      "torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and (input.dim() - other.dim()) <= 1");
  const bool vector_case = dim_diff == 1;
  const at::Tensor B2 = vector_case ? B.unsqueeze(-1) : B;
  TORCH_CHECK(
      A.size(-2) == B2.size(-2),
      vector_case ? "torch.linalg.lstsq: input.size(-2) should match other.size(-1)"
                  : "torch.linalg.lstsq: input.size(-2) should match other.size(-2)");
  at::native::checkFloatingOrComplex(A, "torch.linalg.lstsq");
  std::string driver_name = driver.has_value() ? std::string(*driver) : "gelsy";
  std::transform(driver_name.begin(), driver_name.end(), driver_name.begin(), [](unsigned char ch) {
    return std::tolower(ch);
  });
  TORCH_CHECK(
      driver_name == "gels" || driver_name == "gelsy" || driver_name == "gelsd" || driver_name == "gelss",
      "torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)");
  // The solution broadcasts the batches; the rank and singular values are A's own.
  at::infer_size(A.sizes().slice(0, A.dim() - 2), B2.sizes().slice(0, B2.dim() - 2));
  const int64_t m = A.size(-2);
  const int64_t n = A.size(-1);
  const int64_t k = std::min(m, n);
  const double epsilon = A.scalar_type() == at::kDouble ? std::numeric_limits<double>::epsilon()
                                                        : std::numeric_limits<float>::epsilon();
  const double rcond_value = rcond.has_value() && *rcond >= 0 ? *rcond : epsilon * std::max(m, n);

  auto [U, S, Vh] = at::_linalg_svd(A, /*full_matrices=*/false, /*compute_uv=*/true);
  const at::Tensor projected = at::matmul(U.mT(), B2);
  const at::Tensor threshold = k > 0 ? S.narrow(-1, 0, 1) * rcond_value : at::zeros_like(S);
  const at::Tensor kept = S > threshold;
  const at::Tensor inverse = at::where(kept, S.reciprocal(), at::zeros_like(S));
  at::Tensor solution = at::matmul(Vh.mT(), inverse.unsqueeze(-1) * projected);

  const auto empty_long = A.options().dtype(at::kLong);
  at::Tensor rank = driver_name == "gels" ? at::empty({0}, empty_long) : kept.sum(-1);
  at::Tensor singular_values =
      (driver_name == "gelsd" || driver_name == "gelss") ? S : at::empty({0}, A.options());
  at::Tensor residuals = at::empty({0}, A.options());
  if (m > n && driver_name != "gelsy") {
    bool full_rank = true;
    if (driver_name != "gels") {
      full_rank = rank.eq(n).all().item<bool>();
    }
    if (full_rank) {
      // B's part outside A's column space.
      const at::Tensor outside = B2 - at::matmul(U, projected);
      residuals = (outside * outside).sum(-2);
    }
  }
  // LAPACK leaves the solution in a column-major buffer of max(m, n) rows; PyTorch returns its
  // first n rows.
  solution = m > n ? column_major(at::constant_pad_nd(solution, {0, 0, 0, m - n})).narrow(-2, 0, n)
                   : column_major(solution);
  if (vector_case) {
    solution = solution.squeeze(-1);
  }
  return std::make_tuple(std::move(solution), std::move(residuals), std::move(rank), std::move(singular_values));
}

std::tuple<at::Tensor, at::Tensor> pjrt_geqrf(const at::Tensor& self) {
  TORCH_CHECK(self.dim() >= 2, "torch.geqrf: input must have at least 2 dimensions.");
  at::native::checkFloatingOrComplex(self, "torch.geqrf");
  static const auto op = engine_op(ops::geqrf);
  OpCall c(op, "aten::geqrf");
  c.input(self);
  std::vector<at::Tensor> r = c.run_functional_n(2);
  return std::make_tuple(column_major(r[0]), std::move(r[1]));
}

at::Tensor pjrt_householder_product(const at::Tensor& input, const at::Tensor& tau) {
  TORCH_CHECK(
      input.dim() >= 2, "torch.linalg.householder_product: input must have at least 2 dimensions.");
  at::native::checkFloatingOrComplex(input, "torch.linalg.householder_product");
  static const auto op = engine_op(ops::linalg_householder_product);
  OpCall c(op, "aten::linalg_householder_product");
  c.input(input);
  c.input(tau);
  return column_major(c.run_functional());
}

// `ormqr`: `Q C`, `Q^T C`, `C Q` or `C Q^T` for the `Q` (square, of C's rows or columns) that
// `geqrf`'s reflectors make, from their product with the vectors zero-padded to square.
at::Tensor pjrt_ormqr(const at::Tensor& input, const at::Tensor& tau, const at::Tensor& other, bool left, bool transpose) {
  TORCH_CHECK(input.dim() >= 2, "torch.ormqr: input must have at least 2 dimensions.");
  TORCH_CHECK(other.dim() >= 2, "torch.ormqr: other must have at least 2 dimensions.");
  const int64_t size = left ? other.size(-2) : other.size(-1);
  TORCH_CHECK(
      input.size(-2) == size, "torch.ormqr: other.shape[", left ? -2 : -1, "] must be equal to input.shape[-2]");
  TORCH_CHECK(
      tau.size(-1) <= input.size(-1), "torch.ormqr: tau.shape[-1] must be less than or equal to input.shape[-1]");
  TORCH_CHECK(
      input.scalar_type() == tau.scalar_type() && input.scalar_type() == other.scalar_type(),
      "torch.ormqr: Expected input, tau and other to have the same dtype, but got ", input.scalar_type(), ", ",
      tau.scalar_type(), " and ", other.scalar_type());
  const int64_t columns = std::min(input.size(-1), size);
  at::Tensor vectors = input.narrow(-1, 0, columns);
  if (columns < size) {
    vectors = at::constant_pad_nd(vectors, {0, size - columns});
  }
  const at::Tensor q = pjrt_householder_product(vectors, tau.narrow(-1, 0, std::min(tau.size(-1), columns)));
  const at::Tensor applied = transpose ? q.mH() : q;
  return column_major(left ? at::matmul(applied, other) : at::matmul(other, applied));
}

// The legacy `triangular_solve(b, A)`: `A X = b` (or `A^T X = b`), and a copy of `A`, both
// broadcast over the batch and column-major.
std::tuple<at::Tensor, at::Tensor> pjrt_triangular_solve(
    const at::Tensor& self,
    const at::Tensor& A,
    bool upper,
    bool transpose,
    bool unitriangular) {
  TORCH_CHECK(
      self.dim() >= 2, "torch.triangular_solve: Expected b to have at least 2 dimensions, but it has ", self.dim(),
      " dimensions instead");
  TORCH_CHECK(
      A.dim() >= 2, "torch.triangular_solve: Expected A to have at least 2 dimensions, but it has ", A.dim(),
      " dimensions instead");
  at::native::checkInputsSolver(A, self, /*left=*/true, "triangular_solve");
  auto [b_b, A_b] = at::native::_linalg_broadcast_batch_dims(self, A, "triangular_solve");
  const at::Tensor coefficient = transpose ? A_b.mT() : A_b;
  at::Tensor solution = pjrt_linalg_solve_triangular(coefficient, b_b, upper != transpose, /*left=*/true, unitriangular);
  at::Tensor copy = A_b.mT().clone(at::MemoryFormat::Contiguous).mT();
  return std::make_tuple(std::move(solution), std::move(copy));
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/linalg_kernels.inc"

}  // namespace torch_pjrt

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_pjrt::pjrt_fused_sdp_choice)
}  // namespace at::native
