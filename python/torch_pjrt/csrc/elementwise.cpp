// Elementwise functions without a native lowering, composed from device ops (RFC 0019): the
// inverse trigonometric and the hyperbolic functions, `frac`, `logaddexp` (complex values
// included), `hypot`, `xlogy` (and so `kl_div`), `fmax`/`fmin`, `signbit`, `copysign`,
// `heaviside`, `sinc`, `isposinf`/`isneginf` and the special functions `xlog1py`, `entr` and
// `i1` (over the engine's `i1e`).
//
// The compositions for real numbers send a complex input to the CPU (option `real` of their rows), in every
// form and on conjugate views. Each kernel follows PyTorch's CPU formulas, edge values included.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "composites.h"
#include "pjrt_backend.h"

#include <cmath>
#include <limits>

namespace torch_pjrt {
namespace {

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
// its row's option `real`), which raises frac's own error; the decomposition raises trunc's.
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

// ----- fmax and fmin ----------------------------------------------------------------------------

// The larger (or smaller) of two values, a NaN counting only when both are NaN.
at::Tensor nan_ignoring_extreme(const at::Tensor& self, const at::Tensor& other, bool maximum) {
  at::ScalarType common = at::result_type(self, other);
  at::Tensor a = self.to(common), b = other.to(common);
  at::Tensor m = maximum ? at::maximum(a, b) : at::minimum(a, b);
  if (!at::isFloatingType(common)) {
    return m;
  }
  return at::where(at::isnan(a), b, at::where(at::isnan(b), a, m));
}

at::Tensor pjrt_fmax(const at::Tensor& self, const at::Tensor& other) {
  return nan_ignoring_extreme(self, other, /*maximum=*/true);
}

at::Tensor pjrt_fmin(const at::Tensor& self, const at::Tensor& other) {
  return nan_ignoring_extreme(self, other, /*maximum=*/false);
}

// ----- signs and steps ---------------------------------------------------------------------------

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

at::Tensor pjrt_heaviside(const at::Tensor& self, const at::Tensor& values) {
  TORCH_CHECK(
      self.scalar_type() == values.scalar_type(),
      "heaviside is not yet implemented for tensors with different dtypes");
  at::Tensor step = (self > 0).to(self.scalar_type());
  return at::where(self == 0, values, step);
}

// `isposinf` (sign 1) and `isneginf` (sign -1): an integer or bool tensor holds no infinity.
at::Tensor pjrt_isinf_signed(const at::Tensor& self, const char* name, int sign) {
  TORCH_CHECK(!self.is_complex(), name, " does not support complex inputs.");
  if (!at::isFloatingType(self.scalar_type())) {
    return at::zeros_like(self, self.options().dtype(at::kBool));
  }
  return at::eq(self, sign * std::numeric_limits<double>::infinity());
}

// Kept here rather than as PyTorch's decomposition: a complex input runs on the CPU (through
// its row's option `real`), in every form and on conjugate views, as the other real compositions do.
at::Tensor pjrt_sinc(const at::Tensor& self) {
  at::Tensor x = as_floating(self);
  at::Tensor product = x * M_PI;
  return at::where(x == 0, at::ones_like(x), at::sin(product) / product);
}

// ----- xlogy ------------------------------------------------------------------------------------

// A CPU 0-d operand on the device of the other operand. A Python number reaches a kernel as a
// CPU 0-d "wrapped number" (`special.xlog1py`'s scalar overloads are PyTorch's composites), and
// a unary op computes a wrapped number in the default float dtype: `log1p` of a float64 0.5
// would be rounded to float32. On the device it is a plain tensor of its dtype.
at::Tensor beside(const at::Tensor& t, const at::Tensor& other) {
  return t.is_cpu() && !other.is_cpu() ? t.to(other.device()) : t;
}

// PyTorch's `x * log(y)` (`xlogy`) and `x * log1p(y)` (`special.xlog1py`): NaN where y is NaN,
// else 0 where x is 0. `log` is `at::log` or `at::log1p`.
at::Tensor x_times_log(const at::Tensor& self, const at::Tensor& other, at::Tensor (*log)(const at::Tensor&)) {
  at::ScalarType dtype = floating_dtype(at::result_type(self, other));
  at::Tensor x = beside(self, other).to(dtype);
  at::Tensor y = beside(other, self).to(dtype);
  at::Tensor product = at::where(x == 0, at::zeros_like(x), x * log(y));
  return at::where(at::isnan(y), y, product);
}

at::Tensor pjrt_xlogy(const at::Tensor& self, const at::Tensor& other) {
  return x_times_log(self, other, at::log);
}

at::Tensor pjrt_xlogy_scalar_other(const at::Tensor& self, const at::Scalar& other) {
  return pjrt_xlogy(self, at::scalar_tensor(other, at::TensorOptions().dtype(at::kDouble)).to(self.device()));
}

at::Tensor pjrt_xlogy_scalar_self(const at::Scalar& self, const at::Tensor& other) {
  return pjrt_xlogy(at::scalar_tensor(self, at::TensorOptions().dtype(at::kDouble)).to(other.device()), other);
}

at::Tensor pjrt_special_xlog1py(const at::Tensor& self, const at::Tensor& other) {
  return x_times_log(self, other, at::log1p);
}

// `special.entr`: `-x log x` for x > 0, 0 at 0, -inf below, NaN for NaN.
at::Tensor pjrt_special_entr(const at::Tensor& self) {
  at::Tensor x = as_floating(self);
  at::Tensor positive = -x * at::log(x);
  at::Tensor rest = at::where(x == 0, at::zeros_like(x), at::full_like(x, -std::numeric_limits<double>::infinity()));
  return at::where((x > 0) | at::isnan(x), positive, rest);
}

// `frexp`: x = mantissa * 2^exponent with |mantissa| in [0.5, 1), read from the bits as C's
// frexp does, so it is exact. A subnormal's fraction bits, converted to a (normal) float, give
// its mantissa, the exponent shifted by the format's smallest; zero, infinity and NaN keep
// their value with exponent 0. Reduced floats go through float32, where they are normal.
std::tuple<at::Tensor, at::Tensor> pjrt_frexp(const at::Tensor& self) {
  TORCH_CHECK(
      at::isFloatingType(self.scalar_type()),
      "torch.frexp() only supports floating-point dtypes");
  const at::ScalarType dtype = self.scalar_type();
  const at::Tensor x = at::isReducedFloatingType(dtype) ? self.to(at::kFloat) : self;
  const bool wide = x.scalar_type() == at::kDouble;
  const at::ScalarType bits_type = wide ? at::kLong : at::kInt;
  const int64_t fraction_bits = wide ? 52 : 23;
  const int64_t exponent_mask = wide ? 0x7ff : 0xff;
  const int64_t half_bias = wide ? 1022 : 126;  // the biased exponent of 0.5
  const int64_t subnormal_scale = wide ? 1074 : 149;  // a subnormal is its fraction times 2^-this
  const int64_t fraction_mask = (int64_t{1} << fraction_bits) - 1;
  const int64_t exponent_field = exponent_mask << fraction_bits;
  // A normal number's mantissa (its exponent field set to 0.5's) and exponent.
  auto split_normal = [&](const at::Tensor& v) {
    const at::Tensor bits = v.view(bits_type);
    const at::Tensor biased = at::bitwise_and(at::bitwise_right_shift(bits, fraction_bits), exponent_mask);
    const at::Tensor mantissa =
        at::bitwise_or(at::bitwise_and(bits, ~exponent_field), half_bias << fraction_bits).view(v.scalar_type());
    return std::make_tuple(mantissa, biased - half_bias, biased);
  };
  auto [mantissa, exponent, biased] = split_normal(x);
  const at::Tensor fraction = at::bitwise_and(x.view(bits_type), fraction_mask);
  const at::Tensor magnitude = fraction.to(x.scalar_type());
  // The sign bit, not `x < 0`: XLA's CPU compiler treats subnormal operands as zero.
  const at::Tensor negative = x.view(bits_type) < 0;
  auto [sub_mantissa, sub_exponent, unused] = split_normal(at::where(negative, -magnitude, magnitude));
  const at::Tensor zero_or_subnormal = biased == 0;
  const at::Tensor special = at::logical_or(at::logical_and(zero_or_subnormal, fraction == 0), biased == exponent_mask);
  mantissa = at::where(zero_or_subnormal, sub_mantissa, mantissa);
  exponent = at::where(zero_or_subnormal, sub_exponent - subnormal_scale, exponent);
  mantissa = at::where(special, x, mantissa).to(dtype);
  exponent = at::where(special, at::zeros_like(exponent), exponent).to(at::kInt);
  return std::make_tuple(std::move(mantissa), std::move(exponent));
}

// `special.i1`: the scaled function times exp(|x|), which overflows where PyTorch's kernel's own
// exp(|x|) does. A reduced float computes in float32 and rounds once.
at::Tensor pjrt_special_i1(const at::Tensor& self) {
  at::Tensor x = as_floating(self);
  const at::ScalarType dtype = x.scalar_type();
  if (at::isReducedFloatingType(dtype)) {
    x = x.to(at::kFloat);
  }
  return (at::special_i1e(x) * at::exp(x.abs())).to(dtype);
}

// The coefficients (constant term first) of the polynomial P_n with
// d^n/dx^n cot(pi x) = pi^n P_n(cot(pi x)): P_0(c) = c and P_{k+1}(c) = -(1 + c^2) P_k'(c).
std::vector<double> cot_derivative_polynomial(int64_t n) {
  std::vector<double> p = {0.0, 1.0};
  for (int64_t k = 0; k < n; ++k) {
    std::vector<double> next(p.size() + 1, 0.0);
    for (size_t i = 1; i < p.size(); ++i) {
      const double derivative = static_cast<double>(i) * p[i];  // of c^(i-1)
      next[i - 1] -= derivative;
      next[i + 1] -= derivative;
    }
    p = std::move(next);
  }
  return p;
}

// The special functions whose CPU and CUDA kernels take float32 and float64 only (and integers,
// promoted) refuse the reduced floats as those do.
void check_not_reduced(const at::Tensor& self, const char* name) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      !at::isReducedFloatingType(self.scalar_type()),
      "\"", name, "\" not implemented for '", c10::toString(self.scalar_type()), "'");
}

// The error-function family of `torch.special` in float64 (float32 computes there and rounds
// once), with `erfc` and `erfinv` as the engine lowers them.
at::Tensor in_double(const at::Tensor& self) {
  return as_floating(self).to(at::kDouble);
}

// exp(x^2) erfc(x) in float64: the product below x = 10, where erfc is still a normal number,
// and above it the asymptotic series 1 / (x sqrt(pi)) (1 - 1/(2x^2) + 3/(2x^2)^2 - ...) to 40
// terms, nested (its smallest term there is far below float64's precision).
at::Tensor scaled_complementary_error(const at::Tensor& x) {
  const at::Tensor direct = at::exp(x * x) * at::erfc(x);
  const at::Tensor u = 1.0 / (2.0 * x * x);
  at::Tensor series = at::ones_like(x);
  for (int k = 40; k >= 1; --k) {
    series = 1 - u * static_cast<double>(2 * k - 1) * series;
  }
  const at::Tensor asymptotic = series / (x * std::sqrt(M_PI));
  return at::where(x >= 10.0, asymptotic, direct);
}

at::Tensor pjrt_special_erfcx(const at::Tensor& self) {
  check_not_reduced(self, "erfcx");
  const at::Tensor x = as_floating(self);
  return scaled_complementary_error(in_double(x)).to(x.scalar_type());
}

// log of the standard normal CDF: log1p(-erfc(x/sqrt 2)/2) from zero up, and below zero
// log(erfcx(-x/sqrt 2)/2) - x^2/2, which neither underflows nor loses the tail's digits.
at::Tensor pjrt_special_log_ndtr(const at::Tensor& self) {
  check_not_reduced(self, "log_ndtr");
  const at::Tensor x = as_floating(self);
  const at::Tensor y = in_double(x);
  const at::Tensor upper = at::log1p(-0.5 * at::erfc(y * M_SQRT1_2));
  const at::Tensor lower = at::log(0.5 * scaled_complementary_error(-y * M_SQRT1_2)) - 0.5 * y * y;
  return at::where(y >= 0, upper, lower).to(x.scalar_type());
}

// The inverse of the standard normal CDF. Solved in the lower half (the upper by symmetry, from
// 1 - p as PyTorch's kernel does): a first guess from erfinv in the middle, from Abramowitz and
// Stegun's rational approximation 26.2.23 in the tail (within 4.5e-4), then four Newton steps
// on Phi(x) = erfc(-x/sqrt 2)/2, which stays accurate to relative precision in the tail.
at::Tensor pjrt_special_ndtri(const at::Tensor& self) {
  check_not_reduced(self, "ndtri");
  const at::Tensor p = as_floating(self);
  const at::Tensor y = in_double(p);
  const at::Tensor flip = y > 0.5;
  const at::Tensor q = at::where(flip, 1 - y, y);
  const at::Tensor central = M_SQRT2 * at::erfinv(2 * q - 1);
  const at::Tensor t = at::sqrt(-2 * at::log(q));
  const at::Tensor tail = -(t - (2.515517 + t * (0.802853 + t * 0.010328)) /
                                    (1 + t * (1.432788 + t * (0.189269 + t * 0.001308))));
  at::Tensor x = at::where(q > 0.05, central, tail);
  for (int step = 0; step < 4; ++step) {
    const at::Tensor cdf = 0.5 * at::erfc(-x * M_SQRT1_2);
    const at::Tensor density = at::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    x = x - (cdf - q) / density;
  }
  x = at::where(flip, -x, x);
  const double inf = std::numeric_limits<double>::infinity();
  x = at::where(y == 0, at::full_like(x, -inf), at::where(y == 1, at::full_like(x, inf), x));
  x = at::where(at::logical_or(y < 0, y > 1), at::full_like(x, std::numeric_limits<double>::quiet_NaN()), x);
  return x.to(p.scalar_type());
}

// `special.modified_bessel_i1`: the same function as `special.i1`.
at::Tensor pjrt_special_modified_bessel_i1(const at::Tensor& self) {
  check_not_reduced(self, "modified_bessel_i1");
  return pjrt_special_i1(self);
}

// `special.spherical_bessel_j0`: sin(x) / x, from its Taylor series (nested) below |x| = 1/2,
// where the quotient loses precision, and 0 at the infinities, as PyTorch's kernel.
at::Tensor pjrt_special_spherical_bessel_j0(const at::Tensor& self) {
  check_not_reduced(self, "spherical_bessel_j0");
  const at::Tensor y = as_floating(self);
  const at::ScalarType dtype = y.scalar_type();
  const at::Tensor square = y * y;
  // sin(x)/x = 1 - x^2/(2*3) (1 - x^2/(4*5) (1 - x^2/(6*7) (...))).
  at::Tensor series = at::ones_like(y);
  for (int k = 7; k >= 1; --k) {
    series = 1 - square / static_cast<double>((2 * k) * (2 * k + 1)) * series;
  }
  at::Tensor result = at::where(y.abs() < 0.5, series, at::sin(y) / y);
  result = at::where(at::isinf(y), at::zeros_like(y), result);
  return result.to(dtype);
}

// `polygamma(n, x)`: digamma for n = 0; above it (-1)^(n+1) n! zeta(n+1, x), as PyTorch's kernel,
// for x >= 0. The Hurwitz zeta of a negative argument is not accurate, so below zero the
// reflection psi_n(x) = (-1)^n psi_n(1 - x) - pi^(n+1) P_n(cot(pi x)) gives the same values
// (PyTorch's trigamma kernel reflects the same way); the non-positive integers are poles. Reduced
// floats compute in float32, as the CPU's.
at::Tensor pjrt_polygamma(int64_t n, const at::Tensor& self) {
  TORCH_CHECK(n >= 0, "polygamma(n, x) does not support negative n.");
  const at::Tensor x = at::isIntegralType(self.scalar_type(), /*includeBool=*/true)
      ? self.to(c10::typeMetaToScalarType(c10::get_default_dtype()))
      : self;
  if (n == 0) {
    return at::digamma(x);
  }
  const at::ScalarType dtype = x.scalar_type();
  const at::Tensor y = at::isReducedFloatingType(dtype) ? x.to(at::kFloat) : x;
  const at::Tensor negative = y < 0;
  const at::Tensor argument = at::where(negative, 1 - y, y);
  const double signed_factorial = (n % 2 ? 1.0 : -1.0) * std::exp(std::lgamma(static_cast<double>(n) + 1.0));
  const at::Tensor series = at::special_zeta(at::Scalar(static_cast<double>(n + 1)), argument) * signed_factorial;
  at::Tensor reflected;
  if (n == 1) {
    // As PyTorch's trigamma kernel: sin(pi x) unreduced, so its negative integers are large
    // but finite.
    const at::Tensor sine = at::sin(y * M_PI);
    reflected = (M_PI * M_PI) / (sine * sine) - series;
    // PyTorch's trigamma kernel gives 0 at +inf (the series' limit).
    return at::where(y == std::numeric_limits<double>::infinity(), at::zeros_like(y), at::where(negative, reflected, series))
        .to(dtype);
  } else {
    // cot(pi x) has period 1: reduced to |r| <= 1/2 first, pi r keeps its relative precision
    // next to the poles, where pi x would not (PyTorch's zeta is accurate there). Past
    // |r| = 1/4 it is tan(pi (1/2 - |r|)) (an exact difference), accurate next to its zero,
    // where cot's terms cancel against psi_n(1 - x).
    const at::Tensor reduced = y - at::round(y);
    const at::Tensor magnitude = reduced.abs();
    const at::Tensor cotangent = at::where(
        magnitude <= 0.25,
        at::cos(reduced * M_PI) / at::sin(reduced * M_PI),
        at::sign(reduced) * at::tan((0.5 - magnitude) * M_PI));
    const std::vector<double> coefficients = cot_derivative_polynomial(n);
    at::Tensor polynomial = at::full_like(y, coefficients.back());
    for (size_t i = coefficients.size() - 1; i-- > 0;) {
      polynomial = polynomial * cotangent + coefficients[i];
    }
    const at::Tensor mirrored = n % 2 ? -series : series;
    reflected = mirrored - std::pow(M_PI, static_cast<double>(n + 1)) * polynomial;
    const at::Tensor pole = negative & (y == at::floor(y));
    reflected = at::where(pole, at::full_like(y, signed_factorial * std::numeric_limits<double>::infinity()), reflected);
  }
  return at::where(negative, reflected, series).to(dtype);
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/elementwise_kernels.inc"

}  // namespace torch_pjrt
