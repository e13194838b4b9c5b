// ATen ops that pjrt runs as a few of its own ops instead of falling back to the CPU: the
// activations `leaky_relu`, `elu` (and so `selu` and `celu`), `softplus`, `hardswish`,
// `hardsigmoid` and `mish` with their backward ops; `max.dim` and `min.dim`; `addmv` (and so `mv`
// and matrix-vector `matmul`); and `xlogy` (and so `kl_div`).
//
// Each kernel composes device ops (compare, select, exp, products, reductions) with PyTorch's CPU
// formulas, so in DeferAndFuse it fuses with its neighbours like a native op, and autograd uses
// PyTorch's own derivative formulas, which call the backward kernels here. PyTorch also calls the
// in-place and `out=` variants directly (`inplace=True`, structured ops' `.out`): each is the
// functional kernel followed by a copy into the destination.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "pjrt_backend.h"

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

namespace torch_pjrt {
namespace {

// PyTorch's CPU kernels refuse integer and bool inputs for these activations.
void require_floating(const char* op, const at::Tensor& self) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      at::isFloatingType(self.scalar_type()),
      "\"",
      op,
      "\" not implemented for '",
      c10::toString(self.scalar_type()),
      "': expected a floating-point tensor; convert it first, e.g. with `.float()`");
}

// ----- activations ------------------------------------------------------------------------------

at::Tensor pjrt_leaky_relu(const at::Tensor& self, const at::Scalar& negative_slope) {
  require_floating("leaky_relu", self);
  return at::where(self > 0, self, self * negative_slope);
}

at::Tensor pjrt_leaky_relu_backward(
    const at::Tensor& grad_output,
    const at::Tensor& self,
    const at::Scalar& negative_slope,
    bool self_is_result) {
  TORCH_CHECK(
      !self_is_result || negative_slope.toDouble() >= 0.0,
      "In-place leakyReLu backward calculation is triggered with a negative slope which is not "
      "supported. This is caused by calling in-place forward function with a negative slope, "
      "please call out-of-place version instead. File an issue at "
      "https://github.com/pytorch/pytorch if you do require supporting in-place leakRelu backward "
      "calculation with negative slope");
  return at::where(self > 0, grad_output, grad_output * negative_slope);
}

at::Tensor pjrt_elu(
    const at::Tensor& self,
    const at::Scalar& alpha,
    const at::Scalar& scale,
    const at::Scalar& input_scale) {
  require_floating("elu", self);
  at::Tensor negative = at::expm1(self * input_scale) * alpha * scale;
  return at::where(self > 0, self * scale, negative);
}

at::Tensor pjrt_elu_backward(
    const at::Tensor& grad_output,
    const at::Scalar& alpha,
    const at::Scalar& scale,
    const at::Scalar& input_scale,
    bool is_result,
    const at::Tensor& self_or_result) {
  at::Tensor positive = grad_output * scale;
  if (is_result) {
    TORCH_CHECK(
        alpha.toDouble() >= 0.0,
        "In-place elu backward calculation is triggered with a negative slope which is not "
        "supported. This is caused by calling in-place forward function with a negative slope, "
        "please call out-of-place version instead.");
    // From the result y: d/dx = input_scale * (y + alpha * scale) where y <= 0.
    at::Tensor negative = grad_output * input_scale * (self_or_result + alpha.toDouble() * scale.toDouble());
    return at::where(self_or_result <= 0, negative, positive);
  }
  at::Tensor negative =
      grad_output * input_scale * alpha * scale * at::exp(self_or_result * input_scale);
  return at::where(self_or_result <= 0, negative, positive);
}

at::Tensor pjrt_softplus(const at::Tensor& self, const at::Scalar& beta, const at::Scalar& threshold) {
  require_floating("softplus", self);
  at::Tensor scaled = self * beta;
  return at::where(scaled > threshold, self, at::log1p(at::exp(scaled)) / beta);
}

at::Tensor pjrt_softplus_backward(
    const at::Tensor& grad_output,
    const at::Tensor& self,
    const at::Scalar& beta,
    const at::Scalar& threshold) {
  at::Tensor scaled = self * beta;
  at::Tensor z = at::exp(scaled);
  return at::where(scaled > threshold, grad_output, grad_output * z / (z + 1));
}

at::Tensor pjrt_hardswish(const at::Tensor& self) {
  require_floating("hardswish", self);
  return self * at::clamp(self + 3, 0, 6) / 6;
}

at::Tensor pjrt_hardswish_backward(const at::Tensor& grad_output, const at::Tensor& self) {
  // PyTorch's kernel: 0 up to -3 included, the slope strictly inside, 1 from 3 on.
  at::Tensor middle = grad_output * (self / 3 + 0.5);
  at::Tensor upper = at::where(self < 3, middle, grad_output);
  return at::where(self <= -3, at::zeros_like(grad_output), upper);
}

at::Tensor pjrt_hardsigmoid(const at::Tensor& self) {
  require_floating("hardsigmoid", self);
  return at::clamp(self + 3, 0, 6) / 6;
}

at::Tensor pjrt_hardsigmoid_backward(const at::Tensor& grad_output, const at::Tensor& self) {
  at::Tensor inside = (self > -3).logical_and(self < 3);
  return at::where(inside, grad_output / 6, at::zeros_like(grad_output));
}

at::Tensor pjrt_mish(const at::Tensor& self) {
  require_floating("mish", self);
  return self * at::tanh(at::log1p(at::exp(self)));
}

at::Tensor pjrt_mish_backward(const at::Tensor& grad_output, const at::Tensor& self) {
  at::Tensor sigmoid = at::sigmoid(self);
  at::Tensor tanh_softplus = at::tanh(at::log1p(at::exp(self)));
  return grad_output * (tanh_softplus + self * sigmoid * (1 - tanh_softplus * tanh_softplus));
}

at::Tensor pjrt_hardtanh(const at::Tensor& self, const at::Scalar& min_val, const at::Scalar& max_val) {
  TORCH_CHECK(self.scalar_type() != at::kBool, "Bool inputs not supported for hardtanh");
  // An integer tensor keeps its dtype, as with PyTorch's `out=` clamp into the input's dtype.
  return at::clamp(self, min_val, max_val).to(self.scalar_type());
}

at::Tensor pjrt_hardtanh_backward(
    const at::Tensor& grad_output,
    const at::Tensor& self,
    const at::Scalar& min_val,
    const at::Scalar& max_val) {
  at::Tensor outside = (self <= min_val).logical_or(self >= max_val);
  return at::where(outside, at::zeros_like(grad_output), grad_output);
}

// The gradients of `hardshrink` and `softshrink` are zero within [-lambd, lambd], as their values.
at::Tensor inside_band(const at::Tensor& self, const at::Scalar& lambd) {
  return (self >= -lambd.toDouble()).logical_and(self <= lambd);
}

at::Tensor pjrt_shrink_backward(
    const at::Tensor& grad_output,
    const at::Tensor& self,
    const at::Scalar& lambd) {
  return at::where(inside_band(self, lambd), at::zeros_like(grad_output), grad_output);
}

// Gated linear unit: the first half of `dim` times the sigmoid of the second.
at::Tensor pjrt_glu(const at::Tensor& self, int64_t dim) {
  TORCH_CHECK(self.dim() > 0, "glu does not support scalars because halving size must be even");
  int64_t wrapped = at::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK(
      self.size(wrapped) % 2 == 0,
      "Halving dimension must be even, but dimension ",
      wrapped,
      " is size ",
      self.size(wrapped));
  auto halves = self.chunk(2, wrapped);
  return halves[0] * at::sigmoid(halves[1]);
}

at::Tensor pjrt_glu_backward(const at::Tensor& grad_output, const at::Tensor& self, int64_t dim) {
  int64_t wrapped = at::maybe_wrap_dim(dim, self.dim());
  auto halves = self.chunk(2, wrapped);
  at::Tensor gate = at::sigmoid(halves[1]);
  at::Tensor grad_first = grad_output * gate;
  at::Tensor grad_second = grad_first * halves[0] * (1 - gate);
  return at::cat({grad_first, grad_second}, wrapped);
}

// ----- reductions with indices ------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> pjrt_max_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  TORCH_CHECK(
      self.numel() > 0 || self.dim() == 0 || self.size(at::maybe_wrap_dim(dim, self.dim())) > 0,
      "max(): Expected reduction dim ",
      dim,
      " to have non-zero size.");
  if (self.scalar_type() == at::kBool) {
    // argmax has no bool kernel; as bytes, the first true (or the first false) wins.
    at::Tensor bytes = self.to(at::kByte);
    return {at::amax(self, {dim}, keepdim), at::argmax(bytes, dim, keepdim)};
  }
  return {at::amax(self, {dim}, keepdim), at::argmax(self, dim, keepdim)};
}

std::tuple<at::Tensor, at::Tensor> pjrt_min_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  TORCH_CHECK(
      self.numel() > 0 || self.dim() == 0 || self.size(at::maybe_wrap_dim(dim, self.dim())) > 0,
      "min(): Expected reduction dim ",
      dim,
      " to have non-zero size.");
  if (self.scalar_type() == at::kBool) {
    at::Tensor bytes = self.to(at::kByte);
    return {at::amin(self, {dim}, keepdim), at::argmin(bytes, dim, keepdim)};
  }
  return {at::amin(self, {dim}, keepdim), at::argmin(self, dim, keepdim)};
}

// ----- moments --------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> pjrt_var_mean(
    const at::Tensor& self,
    at::OptionalIntArrayRef dim,
    const std::optional<at::Scalar>& correction,
    bool keepdim) {
  return {at::var(self, dim, correction, keepdim), at::mean(self, dim, keepdim)};
}

// ----- elementwise functions without a native lowering ------------------------------------------

constexpr double kLn2 = 0.69314718055994530942;

at::Tensor pjrt_atan(const at::Tensor& self) {
  at::Tensor x = as_floating(self);
  return at::atan2(x, at::ones_like(x));
}

// sqrt(1 - x^2) as sqrt((1 - x)(1 + x)): exact near |x| = 1; NaN outside [-1, 1].
at::Tensor cosine_of_asin(const at::Tensor& x) {
  return at::sqrt((1 - x) * (1 + x));
}

at::Tensor pjrt_asin(const at::Tensor& self) {
  at::Tensor x = as_floating(self);
  return at::atan2(x, cosine_of_asin(x));
}

at::Tensor pjrt_acos(const at::Tensor& self) {
  at::Tensor x = as_floating(self);
  return at::atan2(cosine_of_asin(x), x);
}

// exp(|x|) / 2 without overflowing where exp(|x|) alone would.
at::Tensor half_exp_abs(const at::Tensor& ax) {
  return at::where(ax < 80, at::exp(ax) * 0.5, at::exp(ax - kLn2));
}

at::Tensor pjrt_sinh(const at::Tensor& self) {
  at::Tensor x = as_floating(self);
  at::Tensor ax = at::abs(x);
  // Near 0 from expm1 (no cancellation), elsewhere exp(|x|)/2 - exp(-|x|)/2.
  at::Tensor small = (at::expm1(ax) - at::expm1(-ax)) * 0.5;
  at::Tensor large = half_exp_abs(ax) - at::exp(-ax) * 0.5;
  return at::sign(x) * at::where(ax < 1, small, large);
}

at::Tensor pjrt_cosh(const at::Tensor& self) {
  at::Tensor x = as_floating(self);
  at::Tensor ax = at::abs(x);
  return half_exp_abs(ax) + at::exp(-ax) * 0.5;
}

at::Tensor pjrt_asinh(const at::Tensor& self) {
  at::Tensor x = as_floating(self);
  at::Tensor ax = at::abs(x);
  at::Tensor moderate = at::log1p(ax + ax * ax / (1 + at::sqrt(1 + ax * ax)));
  at::Tensor huge = at::log(ax) + kLn2;  // where x^2 would overflow
  return at::sign(x) * at::where(ax > 1e10, huge, moderate);
}

at::Tensor pjrt_acosh(const at::Tensor& self) {
  at::Tensor x = as_floating(self);
  at::Tensor above_one = x - 1;
  at::Tensor moderate = at::log1p(above_one + at::sqrt(above_one * (x + 1)));
  at::Tensor huge = at::log(x) + kLn2;
  return at::where(x > 1e10, huge, moderate);
}

at::Tensor pjrt_atanh(const at::Tensor& self) {
  at::Tensor x = as_floating(self);
  return (at::log1p(x) - at::log1p(-x)) * 0.5;
}

// Kept here rather than as PyTorch's decomposition: a complex input must reach the CPU (through
// PJRT_REAL_UNARY), which raises frac's own error; the decomposition raises trunc's.
at::Tensor pjrt_frac(const at::Tensor& self) {
  require_floating("frac", self);
  return self - at::trunc(self);
}

// logaddexp of complex values as PyTorch's CPU kernel computes it: of the two, `lo` has the
// smaller real part (`other` on a tie) and `hi` the other, and the result is
// log1p(exp(lo - hi)) + hi. A NaN in any part makes both parts NaN; equal infinite real parts give
// `lo` (both -inf) or log(exp(lo) + exp(hi)) (both +inf). Computed on the parts with real ops,
// with C's values of the complex exp and log where a part is infinite.
at::Tensor complex_log_add_exp(
    const at::Tensor& self, const at::Tensor& other, at::ScalarType dtype) {
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor x = self.to(dtype).resolve_conj();
  const at::Tensor y = other.to(dtype).resolve_conj();
  const at::Tensor xr = at::real(x);
  const at::Tensor xi = at::imag(x);
  const at::Tensor yr = at::real(y);
  const at::Tensor yi = at::imag(y);
  const at::Tensor x_lower = xr < yr;
  const at::Tensor lo_r = at::where(x_lower, xr, yr);
  const at::Tensor lo_i = at::where(x_lower, xi, yi);
  const at::Tensor hi_r = at::where(x_lower, yr, xr);
  const at::Tensor hi_i = at::where(x_lower, yi, xi);

  // z = exp(lo - hi), of modulus at most 1; 0 where the real part is -inf, whatever the angle.
  const at::Tensor modulus = at::exp(lo_r - hi_r);
  const at::Tensor angle = lo_i - hi_i;
  const at::Tensor vanishes = modulus == 0;
  const at::Tensor zero = at::zeros_like(modulus);
  const at::Tensor zr = at::where(vanishes, zero, modulus * at::cos(angle));
  const at::Tensor zi = at::where(vanishes, zero, modulus * at::sin(angle));
  // log1p(z): log|1 + z| as half of log1p(|1 + z|^2 - 1) for a small z (no cancellation, and z's
  // real part itself where that underflows to 0), else as log|1 + z|; the angle of 1 + z.
  const at::Tensor r = zr * (zr + 2) + zi * zi;
  const at::Tensor near_one = at::where(r == 0, zr, at::log1p(r) * 0.5);
  const at::Tensor log_modulus = at::where(modulus < 0.5, near_one, at::log(at::hypot(zr + 1, zi)));
  const at::Tensor finite_r = log_modulus + hi_r;
  const at::Tensor finite_i = at::atan2(zi, zr + 1) + hi_i;

  // Both real parts +inf: log(exp(lo) + exp(hi)). C's exp of +inf along an angle is infinite
  // along it (its imaginary part kept where the angle is 0, and NaN where the angle is not
  // finite); C's log of a value with an infinite part has an infinite modulus, even beside a NaN.
  auto infinite_exp = [&](const at::Tensor& theta) {
    at::Tensor re = at::where(at::isfinite(theta), at::cos(theta) * inf, at::full_like(theta, inf));
    at::Tensor im = at::where(theta == 0, theta, at::sin(theta) * inf);
    return std::make_pair(re, im);
  };
  const auto [lo_exp_r, lo_exp_i] = infinite_exp(lo_i);
  const auto [hi_exp_r, hi_exp_i] = infinite_exp(hi_i);
  const at::Tensor sum_r = lo_exp_r + hi_exp_r;
  const at::Tensor sum_i = lo_exp_i + hi_exp_i;
  const at::Tensor plus_r = at::log(at::hypot(sum_r, sum_i));
  const at::Tensor plus_i = at::atan2(sum_i, sum_r);

  const at::Tensor both_infinite = at::isinf(lo_r).logical_and(lo_r == hi_r);
  const at::Tensor both_minus = both_infinite.logical_and(lo_r < 0);
  at::Tensor re = at::where(both_infinite, at::where(both_minus, lo_r, plus_r), finite_r);
  at::Tensor im = at::where(both_infinite, at::where(both_minus, lo_i, plus_i), finite_i);
  const at::Tensor nan =
      at::isnan(xr).logical_or(at::isnan(xi)).logical_or(at::isnan(yr)).logical_or(at::isnan(yi));
  const double quiet_nan = std::numeric_limits<double>::quiet_NaN();
  re = at::where(nan, quiet_nan, re);
  im = at::where(nan, quiet_nan, im);
  return at::complex(re, im);
}

// log(exp(a) + exp(b)), with PyTorch's rule for equal infinities.
at::Tensor pjrt_logaddexp(const at::Tensor& self, const at::Tensor& other) {
  at::ScalarType dtype = at::result_type(self, other);
  if (at::isComplexType(dtype)) {
    return complex_log_add_exp(self, other, dtype);
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      at::isFloatingType(dtype),
      "\"logaddexp\" not implemented for '",
      c10::toString(dtype),
      "': expected floating-point tensors");
  at::Tensor a = self.to(dtype);
  at::Tensor b = other.to(dtype);
  at::Tensor larger = at::maximum(a, b);
  at::Tensor gap = -at::abs(a - b);
  at::Tensor sum = larger + at::log1p(at::exp(gap));
  return at::where(at::isinf(a).logical_and(a == b), a, sum);
}

at::Tensor pjrt_hypot(const at::Tensor& self, const at::Tensor& other) {
  at::ScalarType dtype = at::result_type(self, other);
  TORCH_CHECK_NOT_IMPLEMENTED(
      at::isFloatingType(dtype),
      "\"hypot\" not implemented for '",
      c10::toString(dtype),
      "': expected floating-point tensors");
  at::Tensor a = at::abs(self.to(dtype));
  at::Tensor b = at::abs(other.to(dtype));
  // Scaled by the larger side so the squares cannot overflow; an infinite side wins over NaN.
  at::Tensor larger = at::maximum(a, b);
  at::Tensor smaller = at::minimum(a, b);
  at::Tensor ratio = smaller / larger;
  at::Tensor scaled = larger * at::sqrt(1 + ratio * ratio);
  at::Tensor finite = at::where(larger == 0, at::zeros_like(larger), scaled);
  at::Tensor infinite = at::isinf(a).logical_or(at::isinf(b));
  return at::where(infinite, at::full_like(larger, std::numeric_limits<double>::infinity()), finite);
}

at::Tensor pjrt_index_copy(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& source) {
  int64_t wrapped = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  TORCH_CHECK_INDEX(
      index.dim() <= 1, "index_copy_(): Index should have dimension 1 or 0 (got ", index.dim(), ")");
  TORCH_CHECK(
      index.scalar_type() == at::kLong,
      "index_copy_(): Expected a long tensor for index, but got ",
      index.scalar_type());
  TORCH_CHECK(
      self.scalar_type() == source.scalar_type(),
      "index_copy_(): self and source expected to have the same dtype, but got (self) ",
      self.scalar_type(),
      " and (source) ",
      source.scalar_type());
  if (self.dim() == 0) {
    return source.reshape({}).clone();
  }
  c10::List<std::optional<at::Tensor>> indices;
  for (int64_t d = 0; d < wrapped; ++d) {
    indices.push_back(std::nullopt);
  }
  indices.push_back(index.reshape({-1}));
  return at::index_put(self, indices, source, /*accumulate=*/false);
}

// A uint16/32/64 `self` runs on the CPU, whose kernel has no case for them and raises its error
// after its own checks (or computes it, where a later PyTorch can); the in-place and `out=` forms
// call this one.
at::Tensor pjrt_index_fill(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& value) {
  if (C10_UNLIKELY(wide_unsigned(self))) {
    return run_on_cpu<at::_ops::index_fill_int_Tensor>(self, dim, index, value);
  }
  TORCH_CHECK(
      value.dim() == 0,
      "index_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
      value.dim(),
      " dimension(s).");
  TORCH_CHECK_INDEX(
      index.dim() <= 1, "index_fill_(): Index is supposed to be a vector, but got ", index.dim(), "-D");
  TORCH_CHECK(
      index.scalar_type() == at::kLong,
      "index_fill_(): Expected dtype int64 for index, but got ",
      index.scalar_type());
  at::Tensor fill = value.to(self.device()).to(self.scalar_type());
  if (self.dim() == 0) {
    return index.numel() > 0 ? fill.clone() : self.clone();
  }
  int64_t wrapped = at::maybe_wrap_dim(dim, self.dim());
  c10::List<std::optional<at::Tensor>> indices;
  for (int64_t d = 0; d < wrapped; ++d) {
    indices.push_back(std::nullopt);
  }
  indices.push_back(index.reshape({-1}));
  return at::index_put(self, indices, fill, /*accumulate=*/false);
}

at::Tensor index_fill_scalar(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value) {
  return pjrt_index_fill(self, dim, index, at::scalar_tensor(value, self.options()));
}

// ----- order statistics -----------------------------------------------------------------------

// The `k`-th smallest (0-based) along `dim`, NaN sorting last as in PyTorch's sort.
std::tuple<at::Tensor, at::Tensor> order_statistic(const at::Tensor& self, int64_t k, int64_t dim, bool keepdim) {
  if (self.dim() == 0) {
    return {self.clone(), at::zeros({}, self.options().dtype(at::kLong))};
  }
  auto [values, indices] = at::sort(self, /*stable=*/true, dim, /*descending=*/false);
  at::Tensor value = values.narrow(dim, k, 1);
  at::Tensor index = indices.narrow(dim, k, 1);
  if (!keepdim) {
    value = value.squeeze(dim);
    index = index.squeeze(dim);
  }
  // Contiguous results, as PyTorch's kernels return them.
  return {value.contiguous(), index.contiguous()};
}

std::tuple<at::Tensor, at::Tensor> pjrt_kthvalue(const at::Tensor& self, c10::SymInt k_sym, int64_t dim, bool keepdim) {
  int64_t k = k_sym.expect_int();
  int64_t wrapped = at::maybe_wrap_dim(dim, self.dim());
  int64_t size = self.dim() == 0 ? 1 : self.size(wrapped);
  TORCH_CHECK(
      k >= 1 && k <= size,
      "kthvalue(): selected number k out of range for dimension ",
      wrapped);
  return order_statistic(self, k - 1, wrapped, keepdim);
}

// The lower median along `dim`; a row holding a NaN gives NaN and the index of its first NaN.
std::tuple<at::Tensor, at::Tensor> pjrt_median_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  int64_t wrapped = at::maybe_wrap_dim(dim, self.dim());
  int64_t size = self.dim() == 0 ? 1 : self.size(wrapped);
  TORCH_CHECK(
      size > 0,
      "median() cannot compute median for a dimension of size 0 because the operation does not "
      "have an identity; reduce over a non-empty dimension instead");
  auto [value, index] = order_statistic(self, (size - 1) / 2, wrapped, keepdim);
  if (!at::isFloatingType(self.scalar_type()) || self.dim() == 0) {
    return {value, index};
  }
  at::Tensor nan = at::isnan(self);
  at::Tensor has_nan = nan.any(wrapped, keepdim);
  at::Tensor first_nan = nan.to(at::kByte).argmax(wrapped, keepdim);
  return {
      at::where(has_nan, at::full_like(value, std::numeric_limits<double>::quiet_NaN()), value),
      at::where(has_nan, first_nan, index)};
}

at::Tensor pjrt_median(const at::Tensor& self) {
  TORCH_CHECK(
      self.numel() > 0,
      "median() input tensor cannot be empty: it has no median; check its size before the call");
  return std::get<0>(pjrt_median_dim(self.reshape({-1}), 0, false));
}

// ----- counting --------------------------------------------------------------------------------

// `torch.bincount` reads the largest value (and checks the smallest) on the host, as PyTorch's
// own kernel does: the result's length depends on it.
at::Tensor pjrt_bincount(const at::Tensor& self, const std::optional<at::Tensor>& weights, c10::SymInt minlength_sym) {
  int64_t minlength = minlength_sym.expect_int();
  TORCH_CHECK(minlength >= 0, "minlength should be >= 0");
  TORCH_CHECK(
      self.dim() == 1 && !at::isFloatingType(self.scalar_type()) && self.scalar_type() != at::kBool,
      "bincount only supports 1-d non-negative integral inputs.");
  bool weighted = present(weights);
  if (weighted) {
    TORCH_CHECK(
        weights->dim() == 1 && weights->size(0) == self.size(0),
        "weights should be 1-d and have the same length as input");
  }
  at::ScalarType dtype = weighted
      ? (weights->scalar_type() == at::kFloat ? at::kFloat : at::kDouble)
      : at::kLong;
  if (self.numel() == 0) {
    return at::zeros({minlength}, self.options().dtype(dtype));
  }
  TORCH_CHECK(self.min().item<int64_t>() >= 0, "bincount only supports 1-d non-negative integral inputs.");
  int64_t length = std::max(minlength, self.max().item<int64_t>() + 1);
  at::Tensor counts = weighted ? weights->to(dtype) : at::ones({self.size(0)}, self.options().dtype(dtype));
  return at::zeros({length}, counts.options()).index_add(0, self.to(at::kLong), counts);
}

// `torch.histc`: `bins` equal bins over [min, max] (the data's range when both are 0); values
// outside are not counted, and `max` itself falls in the last bin. Integer inputs are counted as
// CUDA counts them (mixture-of-experts routing counts expert ids so): the bounds truncated to
// the input's type and the bin computed in integer arithmetic, counts in the input's dtype.
at::Tensor pjrt_histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  TORCH_CHECK(bins > 0, "torch.histc: bins must be > 0, but got ", bins);
  bool integral = at::isIntegralType(self.scalar_type(), /*includeBool=*/false);
  TORCH_CHECK_NOT_IMPLEMENTED(
      at::isFloatingType(self.scalar_type()) || integral,
      "\"histogram_pjrt\" not implemented for '",
      c10::toString(self.scalar_type()),
      "'");
  double low = integral ? static_cast<double>(min.toLong()) : min.toDouble();
  double high = integral ? static_cast<double>(max.toLong()) : max.toDouble();
  if (low == high && self.numel() > 0) {
    low = self.min().item<double>();
    high = self.max().item<double>();
  }
  if (low == high) {
    low -= 1;
    high += 1;
  }
  TORCH_CHECK(
      !(std::isinf(low) || std::isinf(high) || std::isnan(low) || std::isnan(high)),
      "torch.histc: range of [",
      low,
      ", ",
      high,
      "] is not finite");
  TORCH_CHECK(low < high, "torch.histc: max must be larger than min");
  at::Tensor x = self.reshape({-1});
  at::Tensor inside = (x >= low).logical_and(x <= high);
  at::Tensor position;
  if (integral) {
    auto low_int = static_cast<int64_t>(low);
    auto span = static_cast<int64_t>(high) - low_int;
    position = (x.to(at::kLong) - low_int).mul(bins).div(span, "floor");
  } else {
    // In the input's dtype, in PyTorch's order: (x - low) / (high - low) * bins.
    position = ((x - low) / (high - low) * static_cast<double>(bins)).to(at::kLong);
  }
  at::Tensor bin = at::where(inside, position.clamp(0, bins - 1), at::zeros_like(position));
  at::Tensor ones = inside.to(self.scalar_type());
  return at::zeros({bins}, self.options()).index_add(0, bin, ones);
}

// Its gradient: with s = sum over the other dimensions of grad_w * v,
// grad_g = s / ||v|| and grad_v = g / ||v|| * (grad_w - v * s / ||v||^2).
std::tuple<at::Tensor, at::Tensor> pjrt_weight_norm_interface_backward(
    const at::Tensor& grad_w,
    const at::Tensor& saved_v,
    const at::Tensor& saved_g,
    const at::Tensor& saved_norms,
    int64_t dim) {
  TORCH_CHECK(
      dim == 0 || dim == saved_v.dim() - 1,
      "fused kernels can only be applied for first or last dim, got dim ",
      dim);
  at::ScalarType compute = saved_norms.scalar_type();
  at::Tensor v = saved_v.to(compute);
  at::Tensor gw = grad_w.to(compute);
  std::vector<int64_t> keep_shape(v.dim(), 1);
  keep_shape[dim] = v.size(dim);
  at::Tensor norms = saved_norms.reshape(keep_shape);
  at::Tensor g = saved_g.to(compute).reshape(keep_shape);
  std::vector<int64_t> reduce;
  for (int64_t d = 0; d < v.dim(); ++d) {
    if (d != dim) {
      reduce.push_back(d);
    }
  }
  at::Tensor s = (gw * v).sum(reduce, /*keepdim=*/true);
  at::Tensor grad_g = (s / norms).reshape(saved_g.sizes()).to(saved_g.scalar_type());
  at::Tensor grad_v = (g / norms * (gw - v * (s / norms.pow(2)))).to(saved_v.scalar_type());
  return {grad_v, grad_g};
}

// `nn.Embedding(max_norm=...)`: the rows `indices` refers to whose `norm_type` norm exceeds
// `max_norm` are scaled down to it, in place, as PyTorch's kernels do (scale max_norm / (norm +
// 1e-7)). A row named twice gets the same new value twice, so no deduplication is needed.
at::Tensor& pjrt_embedding_renorm_(
    at::Tensor& self,
    const at::Tensor& indices,
    double max_norm,
    double norm_type) {
  TORCH_CHECK(self.dim() == 2, "embedding_renorm_(): self must be 2-D, got ", self.dim(), "-D");
  at::NoGradGuard no_grad;
  at::Tensor ids = indices.reshape({-1}).to(at::kLong);
  at::Tensor rows = self.index_select(0, ids);
  at::Tensor norms = at::linalg_vector_norm(rows, norm_type, at::IntArrayRef{1}, /*keepdim=*/true);
  at::Tensor scale = at::where(norms > max_norm, max_norm / (norms + 1e-7), at::ones_like(norms));
  self.index_copy_(0, ids, rows * scale);
  return self;
}

// `torch.unique` without a dim: a stable sort, a mask of where the value changes, and the runs it
// delimits. The number of distinct values is read to the host (the result's length), as on the
// CPU. NaNs are all distinct, as on the CPU.
std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_unique2(
    const at::Tensor& self,
    bool sorted,
    bool return_inverse,
    bool return_counts) {
  if (!sorted) {
    // The CPU's unsorted order comes from its hash set, which only the CPU reproduces.
    note_kernel_cpu_fallback("aten::_unique2 with sorted=False");
    auto [values, inverse, counts] = at::_unique2(self.cpu(), false, return_inverse, return_counts);
    return {values.to(self.device()), inverse.to(self.device()), counts.to(self.device())};
  }
  at::TensorOptions longs = self.options().dtype(at::kLong);
  at::Tensor none = at::empty({0}, longs);
  at::Tensor flat = self.reshape({-1});
  int64_t n = flat.numel();
  if (n == 0) {
    return {flat.clone(), return_inverse ? at::zeros(self.sizes(), longs) : none, none};
  }
  auto [values, order] = at::sort(flat, /*stable=*/true, 0, /*descending=*/false);
  at::Tensor is_new = at::cat({at::ones({1}, self.options().dtype(at::kBool)), values.slice(0, 1) != values.slice(0, 0, n - 1)});
  at::Tensor starts = is_new.nonzero().squeeze(1);
  // Advanced indexing rather than index_select: it takes every dtype unique does (PyTorch has
  // no index_select for uint16/32/64).
  at::Tensor distinct = values.index({starts});
  at::Tensor inverse = none;
  if (return_inverse) {
    at::Tensor group = is_new.to(at::kLong).cumsum(0) - 1;
    c10::List<std::optional<at::Tensor>> at_order;
    at_order.push_back(order);
    inverse = at::index_put(at::zeros({n}, longs), at_order, group).view(self.sizes());
  }
  at::Tensor counts = none;
  if (return_counts) {
    at::Tensor ends = at::cat({starts.slice(0, 1), at::full({1}, n, longs)});
    counts = ends - starts;
  }
  return {distinct, inverse, counts};
}

// The value `reduce` ("prod", "amax", "amin") leaves unchanged: where `scatter_reduce` with
// `include_self=False` starts the positions that receive values.
at::Scalar reduction_identity(at::ScalarType dtype, c10::string_view reduce) {
  if (reduce == "prod") {
    return 1;
  }
  bool for_max = reduce == "amax";
  at::Scalar identity;
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, dtype, "reduction_identity", [&] {
    using limits = std::numeric_limits<scalar_t>;
    if constexpr (limits::has_infinity) {
      identity = for_max ? -limits::infinity() : limits::infinity();
    } else {
      identity = for_max ? limits::lowest() : limits::max();
    }
  });
  return identity;
}

// `scatter_reduce` on the device. "sum" and "mean" come from `scatter_add`: `include_self=False`
// first zeroes the positions that receive values; "mean" divides by how many values each
// position took (itself included), flooring for integers as PyTorch does. "prod", "amax" and
// "amin" are the engine's scatter with that combiner, from the identity where `self` is left out.
at::Tensor pjrt_scatter_reduce(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& src,
    c10::string_view reduce,
    bool include_self) {
  if (reduce == "sum" || reduce == "mean") {
    at::Tensor base = include_self ? self : self.scatter(dim, index, 0);
    at::Tensor total = base.scatter_add(dim, index, src.to(self.scalar_type()));
    if (reduce == "sum") {
      return total;
    }
    at::Tensor taken = (include_self ? at::ones_like(self) : at::zeros_like(self))
                           .scatter_add(dim, index, at::ones_like(src, self.options()));
    taken = taken.masked_fill(taken == 0, 1);
    return at::isIntegralType(self.scalar_type(), /*includeBool=*/true) ? total.div(taken, "floor")
                                                                        : total / taken;
  }
  int64_t combiner = reduce == "prod" ? 1 : reduce == "amax" ? 2 : reduce == "amin" ? 3 : 0;
  TORCH_CHECK(
      combiner != 0,
      "reduce argument must be either sum, prod, mean, amax or amin, got ", reduce);
  at::Tensor base =
      include_self ? self : self.scatter(dim, index, reduction_identity(self.scalar_type(), reduce));
  static const auto op = engine_op(ops::scatter_reduce);
  OpCall c(op, "aten::scatter_reduce.two", {.dim = dim, .combiner = combiner});
  c.input(base);
  c.input(index);
  c.input(src.to(self.scalar_type()));
  return c.run_functional();
}

// `index_reduce` is `scatter_reduce` with the index spread over `source`'s other dimensions.
at::Tensor pjrt_index_reduce(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& source,
    c10::string_view reduce,
    bool include_self) {
  TORCH_CHECK(
      reduce == "prod" || reduce == "mean" || reduce == "amax" || reduce == "amin",
      "index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got ", reduce, ".");
  TORCH_CHECK(index.dim() <= 1, "index_reduce_(): Index is supposed to be a vector");
  TORCH_CHECK(
      index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
      "index_reduce_(): Expected dtype int32/int64 for index");
  TORCH_CHECK(
      self.scalar_type() == source.scalar_type(),
      "index_reduce_(): self (", self.scalar_type(), ") and source (", source.scalar_type(),
      ") must have the same scalar type");
  if (source.dim() == 0) {
    return pjrt_scatter_reduce(self, dim, index.reshape({1}), source.reshape({1}), reduce, include_self);
  }
  dim = at::maybe_wrap_dim(dim, source.dim());
  TORCH_CHECK(
      index.numel() == source.size(dim),
      "index_reduce_(): Number of indices (", index.numel(), ") should be equal to source.size(dim) (",
      source.size(dim), ")");
  std::vector<int64_t> shape(source.dim(), 1);
  shape[dim] = index.numel();
  at::Tensor spread = index.to(at::kLong).reshape(shape).expand(source.sizes());
  return pjrt_scatter_reduce(self, dim, spread, source, reduce, include_self);
}

// ----- creation ----------------------------------------------------------------------------------

// The index lists are a function of the sizes alone: built on the host, uploaded once.
at::Tensor triangle_indices(
    bool lower,
    int64_t row,
    int64_t col,
    int64_t offset,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Device> device) {
  at::TensorOptions host = at::TensorOptions().dtype(dtype.value_or(at::kLong));
  at::Tensor indices = lower ? at::tril_indices(row, col, offset, host) : at::triu_indices(row, col, offset, host);
  return indices.to(device.value_or(at::Device(c10::DeviceType::PrivateUse1, 0)));
}

// A random permutation: the order of n uniform float64 draws from pjrt's generator (53-bit keys,
// so ties, which would bias the order, are vanishingly rare).
at::Tensor pjrt_randperm(
    c10::SymInt n_sym,
    std::optional<at::Generator> generator,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Device> device) {
  int64_t n = n_sym.expect_int();
  TORCH_CHECK(n >= 0, "n must be non-negative, got", n);
  at::TensorOptions options =
      at::TensorOptions().device(device.value_or(at::Device(c10::DeviceType::PrivateUse1, 0)));
  at::Tensor keys = at::rand({n}, generator, options.dtype(at::kDouble));
  return at::argsort(keys, /*stable=*/true, 0, false).to(dtype.value_or(at::kLong));
}

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

// ----- xlogy ------------------------------------------------------------------------------------

// PyTorch's `x * log(y)`: NaN where y is NaN, else 0 where x is 0.
at::Tensor pjrt_xlogy(const at::Tensor& self, const at::Tensor& other) {
  at::ScalarType dtype = floating_dtype(at::result_type(self, other));
  at::Tensor x = self.to(dtype);
  at::Tensor y = other.to(dtype);
  at::Tensor product = at::where(x == 0, at::zeros_like(x), x * at::log(y));
  return at::where(at::isnan(y), y, product);
}

at::Tensor pjrt_xlogy_scalar_other(const at::Tensor& self, const at::Scalar& other) {
  return pjrt_xlogy(self, at::scalar_tensor(other, at::TensorOptions().dtype(at::kDouble)).to(self.device()));
}

at::Tensor pjrt_xlogy_scalar_self(const at::Scalar& self, const at::Tensor& other) {
  return pjrt_xlogy(at::scalar_tensor(self, at::TensorOptions().dtype(at::kDouble)).to(other.device()), other);
}

}  // namespace


TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  PJRT_WITH_OUT_AND_IN_PLACE("leaky_relu", "leaky_relu.out", "leaky_relu_", pjrt_leaky_relu)
  PJRT_WITH_OUT("leaky_relu_backward", "leaky_relu_backward.grad_input", pjrt_leaky_relu_backward)
  PJRT_WITH_OUT_AND_IN_PLACE("elu", "elu.out", "elu_", pjrt_elu)
  PJRT_WITH_OUT("elu_backward", "elu_backward.grad_input", pjrt_elu_backward)
  PJRT_WITH_OUT("softplus", "softplus.out", pjrt_softplus)
  PJRT_WITH_OUT("softplus_backward", "softplus_backward.grad_input", pjrt_softplus_backward)
  PJRT_WITH_OUT_AND_IN_PLACE("hardswish", "hardswish.out", "hardswish_", pjrt_hardswish)
  PJRT_WITH_OUT("hardswish_backward", "hardswish_backward.out", pjrt_hardswish_backward)
  PJRT_WITH_OUT_AND_IN_PLACE("hardsigmoid", "hardsigmoid.out", "hardsigmoid_", pjrt_hardsigmoid)
  PJRT_WITH_OUT("hardsigmoid_backward", "hardsigmoid_backward.grad_input", pjrt_hardsigmoid_backward)
  PJRT_WITH_OUT_AND_IN_PLACE("mish", "mish.out", "mish_", pjrt_mish)
  m.impl("mish_backward", TORCH_FN(pjrt_mish_backward));
  PJRT_WITH_OUT_AND_IN_PLACE("hardtanh", "hardtanh.out", "hardtanh_", pjrt_hardtanh)
  PJRT_WITH_OUT("hardtanh_backward", "hardtanh_backward.grad_input", pjrt_hardtanh_backward)
  PJRT_WITH_OUT("hardshrink_backward", "hardshrink_backward.grad_input", pjrt_shrink_backward)
  PJRT_WITH_OUT("softshrink_backward", "softshrink_backward.grad_input", pjrt_shrink_backward)
  PJRT_WITH_OUT("glu", "glu.out", pjrt_glu)
  PJRT_WITH_OUT("glu_backward", "glu_backward.grad_input", pjrt_glu_backward)

  m.impl("var_mean.correction", TORCH_FN(pjrt_var_mean));

  // Compositions for real numbers: complex values run on the CPU, which computes them (`frac`:
  // raises PyTorch's error).
  PJRT_REAL_UNARY(atan, pjrt_atan)
  PJRT_REAL_UNARY(asin, pjrt_asin)
  PJRT_REAL_UNARY(acos, pjrt_acos)
  PJRT_REAL_UNARY(sinh, pjrt_sinh)
  PJRT_REAL_UNARY(cosh, pjrt_cosh)
  PJRT_REAL_UNARY(asinh, pjrt_asinh)
  PJRT_REAL_UNARY(acosh, pjrt_acosh)
  PJRT_REAL_UNARY(atanh, pjrt_atanh)
  PJRT_REAL_UNARY(frac, pjrt_frac)
  PJRT_WITH_OUT("logaddexp", "logaddexp.out", pjrt_logaddexp)
  PJRT_WITH_OUT_AND_IN_PLACE("hypot", "hypot.out", "hypot_", pjrt_hypot)

  PJRT_WITH_OUT_AND_IN_PLACE("index_copy", "index_copy.out", "index_copy_", pjrt_index_copy)
  PJRT_WITH_OUT_AND_IN_PLACE(
      "index_fill.int_Tensor", "index_fill.int_Tensor_out", "index_fill_.int_Tensor", pjrt_index_fill)
  PJRT_WITH_OUT_AND_IN_PLACE(
      "index_fill.int_Scalar", "index_fill.int_Scalar_out", "index_fill_.int_Scalar", index_fill_scalar)

  PJRT_WITH_OUT("max.dim", "max.dim_max", pjrt_max_dim)
  PJRT_WITH_OUT("min.dim", "min.dim_min", pjrt_min_dim)
  PJRT_WITH_OUT("kthvalue", "kthvalue.values", pjrt_kthvalue)
  PJRT_WITH_OUT("median.dim", "median.dim_values", pjrt_median_dim)
  PJRT_WITH_OUT("median", "median.out", pjrt_median)
  m.impl("_unique2", TORCH_FN(pjrt_unique2));
  PJRT_WITH_OUT("scatter_reduce.two", "scatter_reduce.two_out", pjrt_scatter_reduce)
  PJRT_WITH_OUT_AND_IN_PLACE("index_reduce", "index_reduce.out", "index_reduce_", pjrt_index_reduce)
  PJRT_WITH_OUT_AND_IN_PLACE("addmv", "addmv.out", "addmv_", pjrt_addmv)
  PJRT_WITH_OUT("xlogy.Tensor", "xlogy.OutTensor", pjrt_xlogy)
  PJRT_WITH_OUT("xlogy.Scalar_Other", "xlogy.OutScalar_Other", pjrt_xlogy_scalar_other)
  m.impl("xlogy.Scalar_Self", TORCH_FN(pjrt_xlogy_scalar_self));
  m.impl(
      "xlogy.OutScalar_Self",
      [](const at::Scalar& self, const at::Tensor& other, at::Tensor& out) -> at::Tensor& {
        return write_out(pjrt_xlogy_scalar_self(self, other), out);
      });
  m.impl("xlogy_.Tensor", TORCH_FN(Variants<&pjrt_xlogy>::in_place));
  m.impl("xlogy_.Scalar_Other", TORCH_FN(Variants<&pjrt_xlogy_scalar_other>::in_place));
  m.impl("bincount", TORCH_FN(pjrt_bincount));
  PJRT_WITH_OUT("histc", "histc.out", pjrt_histc)
  m.impl("_weight_norm_interface_backward", TORCH_FN(pjrt_weight_norm_interface_backward));
  m.impl("embedding_renorm_", TORCH_FN(pjrt_embedding_renorm_));
  m.impl(
      "tril_indices",
      [](int64_t row,
         int64_t col,
         int64_t offset,
         std::optional<at::ScalarType> dtype,
         std::optional<at::Layout>,
         std::optional<at::Device> device,
         std::optional<bool>) { return triangle_indices(true, row, col, offset, dtype, device); });
  m.impl(
      "triu_indices",
      [](int64_t row,
         int64_t col,
         int64_t offset,
         std::optional<at::ScalarType> dtype,
         std::optional<at::Layout>,
         std::optional<at::Device> device,
         std::optional<bool>) { return triangle_indices(false, row, col, offset, dtype, device); });
  m.impl(
      "randperm",
      [](c10::SymInt n,
         std::optional<at::ScalarType> dtype,
         std::optional<at::Layout>,
         std::optional<at::Device> device,
         std::optional<bool>) { return pjrt_randperm(n, std::nullopt, dtype, device); });
  m.impl(
      "randperm.generator",
      [](c10::SymInt n,
         std::optional<at::Generator> generator,
         std::optional<at::ScalarType> dtype,
         std::optional<at::Layout>,
         std::optional<at::Device> device,
         std::optional<bool>) { return pjrt_randperm(n, generator, dtype, device); });
  m.impl(
      "randperm.generator_out",
      [](c10::SymInt n, std::optional<at::Generator> generator, at::Tensor& out) -> at::Tensor& {
        return write_out(pjrt_randperm(n, generator, out.scalar_type(), out.device()), out);
      });
  m.impl("randperm.out", [](c10::SymInt n, at::Tensor& out) -> at::Tensor& {
    return write_out(pjrt_randperm(n, std::nullopt, out.scalar_type(), out.device()), out);
  });

}

}  // namespace torch_pjrt
