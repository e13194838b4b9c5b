// Helpers that the composite kernels of more than one family file use (activation.cpp,
// elementwise.cpp, reduce.cpp, embedding.cpp, conv.cpp, padding.cpp, resample.cpp).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace torch_pjrt {

// PyTorch's CPU kernels refuse integer and bool inputs for the activations and `frac`.
inline void require_floating(const char* op, const at::Tensor& self) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      at::isFloatingType(self.scalar_type()),
      "\"",
      op,
      "\" not implemented for '",
      c10::toString(self.scalar_type()),
      "': expected a floating-point tensor; convert it first, e.g. with `.float()`");
}

using Tensors = std::vector<at::Tensor>;

// An inclusive scan along `dim`: after the step of stride s, element i holds the combination of
// elements i - 2s + 1 .. i. `combine(earlier, later)` combines the tensors of `state` elementwise
// (each list holds one slice per state tensor) and returns the combined slices. In reduce.cpp.
Tensors running_scan(
    Tensors state,
    int64_t dim,
    const std::function<Tensors(const Tensors&, const Tensors&)>& combine);

// The adjoint of `index_select(dim, source)` on a dim of `input_size`: each gradient is added
// back at its source index (padding.cpp and resample.cpp).
inline at::Tensor scatter_back(
    const at::Tensor& grad,
    int64_t dim,
    int64_t input_size,
    const at::Tensor& source) {
  std::vector<int64_t> shape = grad.sizes().vec();
  shape[dim] = input_size;
  return at::zeros(shape, grad.options()).index_add(dim, source, grad);
}

// Concrete sizes from a symbolic size list.
inline std::vector<int64_t> ints(c10::SymIntArrayRef sizes) {
  return C10_AS_INTARRAYREF_SLOW(sizes).vec();
}

}  // namespace torch_pjrt
