// Activations and their backward ops, composed from device ops (RFC 0019): `leaky_relu`, `elu`
// (and so `selu` and `celu`), `softplus`, `hardswish`, `hardsigmoid`, `mish`, `hardtanh` (and so
// `relu6`) and `glu`, with their backward ops; the backward ops of `hardshrink` and `softshrink`
// (their forward ops are PyTorch's decompositions, RFC 0045); and `logit_backward`.
//
// Each kernel composes device ops (compare, select, exp, products) with PyTorch's CPU formulas,
// so in DeferAndFuse it fuses with its neighbours like a native op, and autograd uses PyTorch's
// own derivative formulas, which call the backward kernels here. PyTorch also calls the in-place
// and `out=` variants directly (`inplace=True`, structured ops' `.out`): each is the functional
// kernel followed by a copy into the destination.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "composites.h"
#include "pjrt_backend.h"

#include <limits>
#include <optional>

namespace torch_pjrt {
namespace {

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

at::Tensor pjrt_logit_backward(
    const at::Tensor& grad_output, const at::Tensor& self, std::optional<double> eps) {
  at::Tensor slope = grad_output / (self * (1 - self));
  if (eps.has_value() && *eps >= 0) {
    return at::where((self < *eps) | (self > 1 - *eps), at::zeros_like(slope), slope);
  }
  // Without eps the CPU kernel gives NaN outside logit's domain [0, 1].
  return at::where((self < 0) | (self > 1), at::full_like(slope, std::numeric_limits<double>::quiet_NaN()), slope);
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/activation_kernels.inc"

}  // namespace torch_pjrt
