// Grouped matrix products on pjrt (`torch.nn.functional.grouped_mm`, `aten::_grouped_mm`): the
// experts of a mixture of experts, each multiplying the rows routed to it. PyTorch's own kernel
// for other devices slices the rows at offsets it reads on the host, so every routing gives
// products of new sizes: a program per size on pjrt. Here every group's product runs over all
// rows and a mask made on the device from the offsets keeps each row's own group, so the
// program depends on the shapes alone. It costs one product per group (the groups' count times
// the work); selecting with `where`, not multiplying by the mask, keeps another group's
// infinities and NaNs out of a row.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "pjrt_backend.h"

namespace torch_pjrt {
namespace {

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

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_grouped_mm", TORCH_FN(pjrt_grouped_mm));
}

}  // namespace torch_pjrt
