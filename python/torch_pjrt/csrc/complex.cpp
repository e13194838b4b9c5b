// Complex numbers on pjrt: the views between complex and real tensors (`view_as_real`,
// `view_as_complex`, and through them `real` and `imag`), which share storage as on the CPU, and
// the complex ops that PyTorch routes through `out=` kernels (`conj_physical`, which resolves the
// conjugate bit, `complex`, `polar`) or that compose from device ops (`angle`, `vdot`).
#include <ATen/ATen.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <torch/library.h>

#include "pjrt_backend.h"

#include <cmath>

namespace torch_pjrt {
namespace {

at::Tensor& pjrt_conj_physical_out(const at::Tensor& self, at::Tensor& out) {
  static const auto op = engine_op(ops::_conj_physical);
  OpCall c(op, "aten::conj_physical.out");
  c.input(self);
  c.out(out);
  c.run_out();
  return out;
}

// PyTorch's `conj_physical_` calls its CPU kernel directly rather than the `out=` op.
at::Tensor& pjrt_conj_physical_(at::Tensor& self) {
  if (!self.is_complex()) {
    return self;
  }
  return pjrt_conj_physical_out(self, self);
}

at::Tensor& pjrt_complex_out(const at::Tensor& real, const at::Tensor& imag, at::Tensor& out) {
  static const auto op = engine_op(ops::complex);
  OpCall c(op, "aten::complex.out");
  c.input(real);
  c.input(imag);
  c.out(out);
  c.run_out();
  return out;
}

// PyTorch's CPU kernel: `c10::polar`, the parts `abs * cos(angle)` and `abs * sin(angle)`.
at::Tensor& pjrt_polar_out(const at::Tensor& abs, const at::Tensor& angle, at::Tensor& out) {
  TORCH_CHECK(
      abs.scalar_type() == angle.scalar_type(),
      "Expected object of scalar type ",
      abs.scalar_type(),
      " but got scalar type ",
      angle.scalar_type(),
      " for second argument");
  at::Tensor parts = at::complex(abs * at::cos(angle), abs * at::sin(angle));
  return write_out(parts, out);
}

// PyTorch's CPU kernel: `atan2(imag, real)` for complex values; for real ones pi below zero,
// 0 from zero up, and NaN kept. Integers give the default float dtype.
at::Tensor pjrt_angle(const at::Tensor& self) {
  if (self.is_complex()) {
    at::Tensor z = self.resolve_conj();
    return at::atan2(at::imag(z), at::real(z));
  }
  at::Tensor x = as_floating(self);
  at::Tensor r = at::where(x.lt(0), at::full_like(x, M_PI), at::zeros_like(x));
  return at::where(at::isnan(x), x, r);
}

at::Tensor& pjrt_angle_out(const at::Tensor& self, at::Tensor& out) {
  return write_out(pjrt_angle(self), out);
}

// PyTorch's CPU kernel: real values are `dot`'s; a conjugate operand is read through its
// conjugate bit the way the CPU kernel does, so a conjugate `other` gives a conjugate view of
// `dot` (the CPU fallback would return the same values with the bit cleared).
at::Tensor pjrt_vdot(const at::Tensor& self, const at::Tensor& other) {
  if (!self.is_complex()) {
    return at::dot(self, other);
  }
  if (self.is_conj()) {
    if (other.is_conj()) {
      return pjrt_vdot(other.conj(), self.conj());
    }
    return at::dot(self.conj(), other);
  }
  if (other.is_conj()) {
    return at::dot(self, other.conj()).conj();
  }
  return at::dot(self.conj(), other);
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/complex_kernels.inc"

}  // namespace torch_pjrt
