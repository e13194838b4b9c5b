// ATen ops that pjrt runs as a few of its own ops instead of falling back to the CPU: the
// distributions drawn from uniform and normal numbers (`exponential_`, `geometric_`,
// `log_normal_`, `cauchy_`) and `multinomial`; `searchsorted` and `bucketize`; small
// elementwise and reduction ops (`signbit`, `copysign`, `logit_backward`, `heaviside`,
// `count_nonzero`, `aminmax`, `linalg_cross`); and `cdist`'s direct form with its gradient.
//
// As in composite.cpp, each kernel composes device ops with PyTorch's CPU formulas, and the
// random ones draw from the device generator (random.cpp) through `uniform_` and `normal_`, so
// their numbers follow the pjrt generator's seed, not the CPU's.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "pjrt_backend.h"

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

namespace torch_pjrt {
namespace {

void require_floating_self(const char* op, const at::Tensor& self) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      at::isFloatingType(self.scalar_type()),
      op,
      " not implemented for '",
      c10::toString(self.scalar_type()),
      "': expected a floating-point tensor");
}

// Uniform numbers in (0, 1] with self's shape and dtype.
at::Tensor open_unit(const at::Tensor& self, std::optional<at::Generator> gen) {
  return 1 - at::empty_like(self, at::MemoryFormat::Contiguous).uniform_(0, 1, gen);
}

// ----- distributions ----------------------------------------------------------------------------

at::Tensor& pjrt_exponential_(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  TORCH_CHECK(lambd > 0.0, "exponential_ expects lambda > 0.0, but found lambda=", lambd);
  require_floating_self("exponential_", self);
  at::Tensor u = open_unit(self, gen);
  // -log(u) / lambda, never 0: u next to 1 maps to half an epsilon, as PyTorch's CUDA kernel.
  double eps = std::numeric_limits<float>::epsilon();
  if (self.scalar_type() == at::kDouble) {
    eps = std::numeric_limits<double>::epsilon();
  } else if (self.scalar_type() == at::kHalf || self.scalar_type() == at::kBFloat16) {
    u = u.to(at::kFloat);
  }
  at::Tensor log_u = at::where(u >= 1 - eps / 2, at::scalar_tensor(-eps / 2, u.options()), at::log(u));
  return self.copy_(log_u * (-1.0 / lambd));
}

at::Tensor& pjrt_geometric_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 < p && p < 1, "geometric_ expects p to be in (0, 1), but got p=", p);
  at::ScalarType compute = self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor u = open_unit(self.to(compute), gen);
  // The number of Bernoulli(p) trials up to the first success: at least 1.
  return self.copy_(at::ceil(at::log(u) / std::log1p(-p)).clamp_min(1));
}

at::Tensor& pjrt_log_normal_(
    at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std > 0.0, "log_normal_ expects std > 0.0, but found std=", std);
  require_floating_self("log_normal_", self);
  return self.copy_(at::exp(at::empty_like(self).normal_(mean, std, gen)));
}

at::Tensor& pjrt_cauchy_(
    at::Tensor& self, double median, double sigma, std::optional<at::Generator> gen) {
  TORCH_CHECK(sigma > 0.0, "cauchy_ expects sigma > 0.0, but found sigma=", sigma);
  require_floating_self("cauchy_", self);
  at::Tensor u = at::empty_like(self).uniform_(0, 1, gen);
  return self.copy_(median + sigma * at::tan(M_PI * (u - 0.5)));
}

// PyTorch's algorithm (ATen's `multinomial`): without replacement, or for one sample, the
// indices of the largest p / q with q ~ Exp(1) (the Gumbel-max trick, exponentiated); with
// replacement, each sample is the first index whose running sum exceeds a uniform draw scaled
// by the row's total. The distribution is checked first, with one read of the device, as
// PyTorch's CUDA kernel does.
at::Tensor pjrt_multinomial(
    const at::Tensor& self,
    int64_t n_sample,
    bool replacement,
    std::optional<at::Generator> gen) {
  TORCH_CHECK(
      self.dim() > 0 && self.dim() <= 2, "prob_dist must be 1 or 2 dim, but got ", self.dim());
  TORCH_CHECK(
      at::isFloatingType(self.scalar_type()),
      "multinomial only supports floating-point dtypes for input, got: ",
      self.scalar_type());
  TORCH_CHECK(n_sample > 0, "cannot sample n_sample <= 0 samples");
  int64_t categories = self.size(-1);
  TORCH_CHECK(
      replacement || n_sample <= categories,
      "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  TORCH_CHECK(
      categories <= (int64_t{1} << 24),
      "number of categories cannot exceed 2^24");
  at::Tensor p = self.scalar_type() == at::kDouble ? self : self.to(at::kFloat);
  // One read for both of PyTorch's checks: 1 for a bad element, 2 for a row summing to zero.
  at::Tensor bad_element = at::logical_not((p.max() < INFINITY) & (p.min() >= 0));
  at::Tensor zero_row = (p.sum(-1) == 0).any();
  int64_t verdict = at::where(bad_element, 1, at::where(zero_row, 2, 0)).item<int64_t>();
  TORCH_CHECK(verdict != 1, "probability tensor contains either `inf`, `nan` or element < 0");
  TORCH_CHECK(verdict != 2, "invalid multinomial distribution (sum of probabilities <= 0)");
  if (!replacement || n_sample == 1) {
    at::Tensor q = at::empty_like(p).exponential_(1, gen);
    at::Tensor keys = p / q;
    if (n_sample == 1) {
      return at::argmax(keys, -1, /*keepdim=*/true);
    }
    return std::get<1>(at::topk(keys, n_sample));
  }
  at::Tensor cdf = at::cumsum(p, -1);
  at::Tensor total = cdf.narrow(-1, categories - 1, 1);
  std::vector<int64_t> sample_shape(p.sizes().begin(), p.sizes().end());
  sample_shape.back() = n_sample;
  at::Tensor u = at::empty(sample_shape, p.options()).uniform_(0, 1, gen) * total;
  at::Tensor below = at::le(cdf.unsqueeze(-2), u.unsqueeze(-1));
  return below.sum(-1).clamp_max(categories - 1);
}

// ----- searching sorted sequences ---------------------------------------------------------------

// For each value, how many elements of its row of `sorted` come before it: those not at least it
// (left) or not greater (right); a NaN value lands past the end, as in PyTorch's binary search.
at::Tensor pjrt_searchsorted(
    const at::Tensor& sorted_sequence,
    const at::Tensor& self,
    bool out_int32,
    bool right,
    std::optional<std::string_view> side,
    const std::optional<at::Tensor>& sorter) {
  if (side.has_value()) {
    TORCH_CHECK(
        *side == "left" || *side == "right",
        "torch.searchsorted(): side can only be 'left' or 'right' but got ",
        *side);
    TORCH_CHECK(
        !right || *side == "right",
        "torch.searchsorted(): side and right can't be set to opposites, got side of ",
        *side,
        " while right was True");
    right = *side == "right";
  }
  TORCH_CHECK(
      sorted_sequence.dim() >= 1,
      "torch.searchsorted(): boundaries tensor should have positive dimension, but got 0 "
      "dimension");
  if (sorted_sequence.dim() > 1) {
    TORCH_CHECK(
        sorted_sequence.dim() == self.dim() &&
            sorted_sequence.sizes().slice(0, self.dim() - 1) ==
                self.sizes().slice(0, self.dim() - 1),
        "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
        "dimensions of boundaries tensor and input value tensor must match, but we got "
        "boundaries tensor ",
        sorted_sequence.sizes(),
        " and input value tensor ",
        self.sizes());
  }
  at::Tensor seq = sorted_sequence;
  if (present(sorter)) {
    TORCH_CHECK(
        sorter->sizes() == sorted_sequence.sizes(),
        "torch.searchsorted(): boundary and sorter must have the same size, but got boundary "
        "tensor ",
        sorted_sequence.sizes(),
        "and got sorter tensor ",
        sorter->sizes());
    seq = sorted_sequence.gather(-1, *sorter);
  }
  at::ScalarType common = at::result_type(seq, self);
  seq = seq.to(common);
  at::Tensor values = self.to(common);
  at::Tensor rows = seq.dim() == 1 ? seq : seq.unsqueeze(-2);
  at::Tensor v = values.unsqueeze(-1);
  at::Tensor before = at::logical_not(right ? at::gt(rows, v) : at::ge(rows, v));
  return before.sum(-1, /*keepdim=*/false, out_int32 ? at::kInt : at::kLong);
}

at::Tensor pjrt_searchsorted_scalar(
    const at::Tensor& sorted_sequence,
    const at::Scalar& self,
    bool out_int32,
    bool right,
    std::optional<std::string_view> side,
    const std::optional<at::Tensor>& sorter) {
  TORCH_CHECK(
      sorted_sequence.dim() == 1,
      "torch.searchsorted(): input value can be a scalar only when boundaries tensor "
      "dimension is 1, but we got boundaries tensor dim(",
      sorted_sequence.dim(),
      ") and input value's dim(0) numel(1)");
  at::Tensor value = at::scalar_tensor(self, sorted_sequence.options());
  return pjrt_searchsorted(sorted_sequence, value, out_int32, right, side, sorter);
}

at::Tensor pjrt_bucketize(
    const at::Tensor& self, const at::Tensor& boundaries, bool out_int32, bool right) {
  TORCH_CHECK(
      boundaries.dim() == 1,
      "bucketize only supports 1-D boundaries, but got ",
      boundaries.dim());
  return pjrt_searchsorted(boundaries, self, out_int32, right, std::nullopt, std::nullopt);
}

at::Tensor pjrt_bucketize_scalar(
    const at::Scalar& self, const at::Tensor& boundaries, bool out_int32, bool right) {
  return pjrt_bucketize(
      at::scalar_tensor(self, boundaries.options()), boundaries, out_int32, right);
}

// ----- elementwise ------------------------------------------------------------------------------

// The sign bit of a number: set for -0.0 too (a zero whose reciprocal is negative).
at::Tensor pjrt_signbit(const at::Tensor& self) {
  if (self.scalar_type() == at::kBool || self.scalar_type() == at::kByte) {
    return at::zeros(self.sizes(), self.options().dtype(at::kBool));
  }
  if (!at::isFloatingType(self.scalar_type())) {
    return self < 0;
  }
  return (self < 0) | ((self == 0) & (at::reciprocal(self) < 0));
}

at::Tensor pjrt_copysign(const at::Tensor& self, const at::Tensor& other) {
  at::ScalarType dtype = floating_dtype(at::result_type(self, other));
  at::Tensor magnitude = at::abs(self.to(dtype));
  return at::where(pjrt_signbit(other.to(dtype)), -magnitude, magnitude);
}

at::Tensor pjrt_copysign_scalar(const at::Tensor& self, const at::Scalar& other) {
  at::Tensor magnitude = at::abs(as_floating(self));
  return std::signbit(other.toDouble()) ? -magnitude : magnitude;
}

at::Tensor pjrt_logit_backward(
    const at::Tensor& grad_output, const at::Tensor& self, std::optional<double> eps) {
  at::Tensor slope = grad_output / (self * (1 - self));
  if (eps.has_value() && *eps >= 0) {
    return at::where((self < *eps) | (self > 1 - *eps), at::zeros_like(slope), slope);
  }
  // Without eps the CPU kernel gives NaN outside logit's domain [0, 1].
  return at::where((self < 0) | (self > 1), at::full_like(slope, std::numeric_limits<double>::quiet_NaN()), slope);
}

at::Tensor pjrt_heaviside(const at::Tensor& self, const at::Tensor& values) {
  TORCH_CHECK(
      self.scalar_type() == values.scalar_type(),
      "heaviside is not yet implemented for tensors with different dtypes");
  at::Tensor step = (self > 0).to(self.scalar_type());
  return at::where(self == 0, values, step);
}

// Kept here rather than as PyTorch's decomposition: a complex input runs on the CPU (through
// PJRT_REAL_UNARY), in every form and on conjugate views, as the other real compositions do.
at::Tensor pjrt_sinc(const at::Tensor& self) {
  at::Tensor x = as_floating(self);
  at::Tensor product = x * M_PI;
  return at::where(x == 0, at::ones_like(x), at::sin(product) / product);
}

// ----- reductions and products ------------------------------------------------------------------

// PyTorch's CPU counts along given dims as `(self != 0).sum(dims)`, which takes uint16/32/64,
// and over all dims with a kernel of its own that has no case for them: that call runs on the
// CPU, which raises its error.
at::Tensor pjrt_count_nonzero(const at::Tensor& self, at::IntArrayRef dims) {
  if (C10_UNLIKELY(dims.empty() && wide_unsigned(self))) {
    return run_on_cpu<at::_ops::count_nonzero_dim_IntList>(self, dims);
  }
  return (self != 0).sum(dims, /*keepdim=*/false, at::kLong);
}

std::tuple<at::Tensor, at::Tensor> pjrt_aminmax(
    const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  TORCH_CHECK(
      self.numel() > 0 || dim.has_value(),
      "aminmax(): cannot compute aminmax over an empty dimension as the operation has no "
      "identity.");
  if (dim.has_value()) {
    return {at::amin(self, *dim, keepdim), at::amax(self, *dim, keepdim)};
  }
  at::Tensor lo = at::amin(self);
  at::Tensor hi = at::amax(self);
  if (keepdim) {
    std::vector<int64_t> ones(self.dim(), 1);
    return {lo.reshape(ones), hi.reshape(ones)};
  }
  return {lo, hi};
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

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {

  m.impl("exponential_", TORCH_FN(pjrt_exponential_));
  m.impl("geometric_", TORCH_FN(pjrt_geometric_));
  m.impl("log_normal_", TORCH_FN(pjrt_log_normal_));
  m.impl("cauchy_", TORCH_FN(pjrt_cauchy_));
  PJRT_WITH_OUT("multinomial", "multinomial.out", pjrt_multinomial)

  PJRT_WITH_OUT("searchsorted.Tensor", "searchsorted.Tensor_out", pjrt_searchsorted)
  m.impl("searchsorted.Scalar", TORCH_FN(pjrt_searchsorted_scalar));
  PJRT_WITH_OUT("bucketize.Tensor", "bucketize.Tensor_out", pjrt_bucketize)
  m.impl("bucketize.Scalar", TORCH_FN(pjrt_bucketize_scalar));

  PJRT_WITH_OUT("signbit", "signbit.out", pjrt_signbit)
  PJRT_WITH_OUT("copysign.Tensor", "copysign.out", pjrt_copysign)
  m.impl("copysign_.Tensor", TORCH_FN(Variants<&pjrt_copysign>::in_place_floating));
  m.impl("copysign.Scalar", TORCH_FN(pjrt_copysign_scalar));
  m.impl("copysign_.Scalar", TORCH_FN(Variants<&pjrt_copysign_scalar>::in_place_floating));
  PJRT_WITH_OUT("logit_backward", "logit_backward.grad_input", pjrt_logit_backward)
  PJRT_REAL_UNARY(sinc, pjrt_sinc)
  PJRT_WITH_OUT("heaviside", "heaviside.out", pjrt_heaviside)
  m.impl("heaviside_", TORCH_FN(Variants<&pjrt_heaviside>::in_place));

  m.impl("count_nonzero.dim_IntList", TORCH_FN(pjrt_count_nonzero));
  PJRT_WITH_OUT("aminmax", "aminmax.out", pjrt_aminmax)
  PJRT_WITH_OUT("linalg_cross", "linalg_cross.out", pjrt_linalg_cross)
  m.impl("_cdist_forward", TORCH_FN(pjrt_cdist_forward));
  m.impl("_cdist_backward", TORCH_FN(pjrt_cdist_backward));
}

}  // namespace torch_pjrt
