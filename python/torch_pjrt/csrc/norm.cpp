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

// `renorm`: each slice along `dim` whose p-norm exceeds `maxnorm` scaled down to it, as PyTorch's
// kernel: the norm in the accumulation dtype, the factor `maxnorm / (norm + 1e-7)`.
at::Tensor pjrt_renorm(const at::Tensor& self, const at::Scalar& p, int64_t dim, const at::Scalar& maxnorm) {
  TORCH_CHECK(!maxnorm.isComplex(), "renorm: maxnorm must be real-valued");
  TORCH_CHECK(p.toDouble() > 0.0, "renorm: non-positive-norm not supported");
  TORCH_CHECK(maxnorm.toDouble() >= 0.0, "renorm: expected maxnorm to be >= 0 but got ", maxnorm.toDouble());
  const int64_t ndim = self.dim();
  TORCH_CHECK(ndim > 1, "renorm: input needs at least 2 dimensions, got ", ndim, " dimensions");
  dim = at::maybe_wrap_dim(dim, ndim);
  std::vector<int64_t> reduce_dims;
  for (int64_t d = 0; d < ndim; ++d) {
    if (d != dim) {
      reduce_dims.push_back(d);
    }
  }
  const at::ScalarType accumulate =
      at::isReducedFloatingType(self.scalar_type()) ? at::kFloat : self.scalar_type();
  const at::Tensor norm = at::linalg_vector_norm(self, p, reduce_dims, /*keepdim=*/true, accumulate);
  const at::Tensor factor = at::where(norm > maxnorm, at::reciprocal(norm + 1e-7) * maxnorm, 1.0);
  return self * factor.to(self.scalar_type());
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/norm_kernels.inc"

}  // namespace torch_pjrt
