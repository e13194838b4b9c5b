// Normalization kernels composed from device ops: the backward op of `_weight_norm_interface`
// (the forward op is PyTorch's decomposition, RFC 0045).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "pjrt_backend.h"

#include <tuple>
#include <vector>

namespace torch_pjrt {
namespace {

// `_weight_norm_interface`'s gradient: with s = sum over the other dimensions of grad_w * v,
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

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/norm_kernels.inc"

}  // namespace torch_pjrt
