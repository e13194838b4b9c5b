// Reflection and replication padding in 1, 2 and 3 dims, with their backward ops, composed from
// device ops (RFC 0019). The forward op of 1-d replication padding is PyTorch's decomposition
// instead (RFC 0045); its backward op is here.
//
// Padding gathers along each padded dim through reflected or clamped positions made by an
// `arange` on the device, so nothing is uploaded and a region stays whole. The backward ops
// scatter-add the gradient through the same positions (`index_add`), dim by dim in reverse.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "composites.h"
#include "pjrt_backend.h"

#include <vector>

namespace torch_pjrt {
namespace {

// ----- padding ----------------------------------------------------------------------------------

enum class PadMode { Reflect, Replicate };

const char* pad_name(PadMode mode) {
  return mode == PadMode::Reflect ? "reflection_pad" : "replication_pad";
}

// The source index of each padded position along a dim of `size` with `before`/`after` padding.
at::Tensor pad_source(int64_t size, int64_t before, int64_t after, PadMode mode, const at::Tensor& like) {
  at::Tensor position = at::arange(-before, size + after, like.options().dtype(at::kLong));
  if (mode == PadMode::Replicate) {
    return position.clamp(0, size - 1);
  }
  // Reflection about the first and last elements: (n-1) - |(n-1) - |p||.
  return (size - 1) - ((size - 1) - position.abs()).abs();
}

void check_pad(PadMode mode, const at::Tensor& self, int64_t spatial, at::IntArrayRef padding) {
  TORCH_CHECK(
      static_cast<int64_t>(padding.size()) == 2 * spatial,
      pad_name(mode),
      spatial,
      "d: expected padding of length ",
      2 * spatial,
      ", but got ",
      padding.size());
  TORCH_CHECK(
      self.dim() == spatial + 1 || self.dim() == spatial + 2,
      pad_name(mode),
      spatial,
      "d: expected a ",
      spatial + 1,
      "-D or ",
      spatial + 2,
      "-D input, but got a tensor of shape ",
      self.sizes());
  for (int64_t i = 0; i < spatial; ++i) {
    int64_t dim = self.dim() - 1 - i;
    int64_t size = self.size(dim);
    int64_t before = padding[2 * i];
    int64_t after = padding[2 * i + 1];
    if (mode == PadMode::Reflect) {
      TORCH_CHECK(
          before < size && after < size,
          "Argument #4: Padding size should be less than the corresponding input dimension, but "
          "got: padding (",
          before,
          ", ",
          after,
          ") at dimension ",
          dim,
          " of input ",
          self.sizes());
    } else {
      TORCH_CHECK(
          size > 0,
          pad_name(mode),
          spatial,
          "d: expected a non-empty dim ",
          dim,
          " to replicate, but got input of shape ",
          self.sizes());
    }
    TORCH_CHECK(
        size + before + after > 0,
        pad_name(mode),
        spatial,
        "d: input of shape ",
        self.sizes(),
        " padded by ",
        padding,
        " would have a dim of size ",
        size + before + after,
        "; the padded size must be positive");
  }
}

at::Tensor pad(PadMode mode, int64_t spatial, const at::Tensor& self, at::IntArrayRef padding) {
  check_pad(mode, self, spatial, padding);
  at::Tensor result = self;
  for (int64_t i = 0; i < spatial; ++i) {
    int64_t dim = self.dim() - 1 - i;
    result = result.index_select(
        dim, pad_source(self.size(dim), padding[2 * i], padding[2 * i + 1], mode, self));
  }
  return result;
}

at::Tensor pad_backward(
    PadMode mode,
    int64_t spatial,
    const at::Tensor& grad_output,
    const at::Tensor& self,
    at::IntArrayRef padding) {
  check_pad(mode, self, spatial, padding);
  at::Tensor grad = grad_output;
  for (int64_t i = spatial - 1; i >= 0; --i) {
    int64_t dim = self.dim() - 1 - i;
    int64_t size = self.size(dim);
    grad = scatter_back(grad, dim, size, pad_source(size, padding[2 * i], padding[2 * i + 1], mode, self));
  }
  return grad;
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/padding_kernels.inc"

}  // namespace torch_pjrt
