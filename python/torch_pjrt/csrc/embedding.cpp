// Embeddings composed from device ops (RFC 0019): `embedding_renorm_` (`nn.Embedding(max_norm=...)`)
// and `embedding_bag` in its three modes, with `padding_idx`, `per_sample_weights` and
// `include_last_offset`, and its gradients.
//
// Bags are found by `bucketize` over the offsets; sums are `index_add`; the maximum is a
// segmented log-step scan (`running_scan`, reduce.cpp).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "composites.h"
#include "pjrt_backend.h"

#include <limits>
#include <optional>
#include <tuple>
#include <vector>

namespace torch_pjrt {
namespace {

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

// ----- embedding_bag ----------------------------------------------------------------------------

constexpr int64_t kSum = 0, kMean = 1, kMax = 2;

// Where each index goes: its bag, or `bags` (a spare row dropped at the end) for an index outside
// every bag.
struct BagLayout {
  int64_t bags;
  at::Tensor bag_of;   // [n] long, in 0..bags
  at::Tensor kept;     // [n] bool: in a bag and not `padding_idx`
  at::Tensor starts;   // [bags] long: each bag's first index
  at::Tensor ends;     // [bags] long: one past each bag's last index
};

BagLayout layout_bags(
    const at::Tensor& indices,
    const at::Tensor& offsets,
    bool include_last_offset,
    int64_t padding_idx) {
  int64_t n = indices.size(0);
  at::Tensor offs = offsets.to(at::kLong);
  int64_t bags = include_last_offset ? std::max<int64_t>(offs.size(0) - 1, 0) : offs.size(0);
  at::TensorOptions longs = indices.options().dtype(at::kLong);
  at::Tensor starts = offs.narrow(0, 0, bags);
  // With `include_last_offset` the last offset ends the last bag; without, `indices` does.
  at::Tensor ends = include_last_offset
      ? offs.narrow(0, 1, bags)
      : at::cat({offs.narrow(0, 1, std::max<int64_t>(bags - 1, 0)), at::full({1}, n, longs)})
            .narrow(0, 0, bags);
  at::Tensor position = at::arange(n, longs);
  // The bag of position p is the last one starting at or before it; positions before the first
  // offset, or from the last offset on (`include_last_offset`), belong to none.
  at::Tensor bag = at::bucketize(position, starts, /*out_int32=*/false, /*right=*/true) - 1;
  at::Tensor in_range = bag >= 0;
  if (include_last_offset && bags > 0) {
    in_range = in_range.logical_and(position < offs.narrow(0, bags, 1));
  }
  at::Tensor bag_of = at::where(in_range, bag, at::full({}, bags, longs));
  at::Tensor kept = in_range;
  if (padding_idx >= 0) {
    kept = kept.logical_and(indices.to(at::kLong) != padding_idx);
  }
  return {bags, bag_of, kept, starts, ends};
}

// Sums `rows` ([n, d]) into their bags: [bags, d].
at::Tensor sum_into_bags(const BagLayout& bl, const at::Tensor& rows) {
  return at::zeros({bl.bags + 1, rows.size(1)}, rows.options())
      .index_add(0, bl.bag_of, rows)
      .narrow(0, 0, bl.bags);
}

// The kept indices of each bag: [bags] long.
at::Tensor bag_sizes(const BagLayout& bl) {
  return at::zeros({bl.bags + 1}, bl.bag_of.options())
      .index_add(0, bl.bag_of, bl.kept.to(at::kLong))
      .narrow(0, 0, bl.bags);
}

// The maximum of each bag's rows, per column, and the index (into `weight`) it came from. As
// PyTorch's kernel reads a bag in order: a later row replaces the maximum only when greater, so
// ties keep the first, and a NaN wins only as the bag's first kept row. Empty bags give 0, 0.
std::tuple<at::Tensor, at::Tensor> max_of_bags(
    const BagLayout& bl, const at::Tensor& rows, const at::Tensor& indices, const at::Tensor& sizes) {
  int64_t n = rows.size(0);
  at::TensorOptions longs = bl.bag_of.options();
  if (n == 0 || bl.bags == 0) {
    return {at::zeros({bl.bags, rows.size(1)}, rows.options()),
            at::zeros({bl.bags, rows.size(1)}, longs)};
  }
  bool floating = at::isFloatingType(rows.scalar_type());
  at::Tensor usable = bl.kept.unsqueeze(1).expand(rows.sizes());
  if (floating) {
    // A row is its bag's first kept one when as many rows were kept before it as before the bag.
    at::Tensor kept_count = bl.kept.to(at::kLong);
    at::Tensor kept_prefix = at::cat({at::zeros({1}, longs), at::cumsum(kept_count, 0)});
    at::Tensor before_bag = kept_prefix.index_select(0, bl.starts.clamp(0, n));
    at::Tensor first_kept = bl.kept.logical_and(
        kept_prefix.narrow(0, 0, n) == before_bag.index_select(0, bl.bag_of.clamp_max(bl.bags - 1)));
    usable = usable.logical_and(
        at::isnan(rows).logical_not().logical_or(first_kept.unsqueeze(1)));
  }
  at::Tensor word = indices.to(at::kLong).unsqueeze(1).expand(rows.sizes());
  at::Tensor bag = bl.bag_of.unsqueeze(1).expand(rows.sizes());
  // State (usable, value, word, bag), combined only within a bag. The later row wins when it is
  // usable and the earlier is not, or is strictly greater than an earlier one that is not NaN.
  auto keep_greater = [&](const Tensors& e, const Tensors& l) -> Tensors {
    at::Tensor same_bag = e[3] == l[3];
    at::Tensor greater = l[1] > e[1];
    if (floating) {
      greater = greater.logical_and(at::isnan(e[1]).logical_not());
    }
    at::Tensor later_wins = l[0].logical_and(e[0].logical_not().logical_or(greater));
    at::Tensor take = later_wins.logical_or(same_bag.logical_not());
    return {
        at::where(same_bag, e[0].logical_or(l[0]), l[0]),
        at::where(take, l[1], e[1]),
        at::where(take, l[2], e[2]),
        l[3]};
  };
  Tensors scanned = running_scan({usable, rows, word, bag}, 0, keep_greater);
  // Each bag's maximum is where the scan reaches the bag's last index.
  at::Tensor last = (bl.ends - 1).clamp(0, n - 1);
  at::Tensor has = (sizes > 0).unsqueeze(1);
  at::Tensor value = at::where(has, scanned[1].index_select(0, last), at::zeros({}, rows.options()));
  at::Tensor word_max = at::where(has, scanned[2].index_select(0, last), at::zeros({}, longs));
  return {value, word_max};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pjrt_embedding_bag(
    const at::Tensor& weight,
    const at::Tensor& indices,
    const at::Tensor& offsets,
    bool scale_grad_by_freq,
    int64_t mode,
    bool sparse,
    const std::optional<at::Tensor>& per_sample_weights,
    bool include_last_offset,
    int64_t padding_idx) {
  (void)scale_grad_by_freq;
  (void)sparse;
  auto integral = [](const at::Tensor& t) {
    return t.scalar_type() == at::kLong || t.scalar_type() == at::kInt;
  };
  TORCH_CHECK(
      integral(indices), "embedding_bag: Expected indices to be of scalar type Long or Int, but got ",
      indices.scalar_type());
  TORCH_CHECK(
      integral(offsets), "embedding_bag: Expected offsets to be of scalar type Long or Int, but got ",
      offsets.scalar_type());
  TORCH_CHECK(weight.dim() == 2, "embedding_bag: weight has to be a 2D Tensor, but got Tensor of dimension ", weight.dim());
  TORCH_CHECK(indices.dim() == 1, "embedding_bag: input has to be a 1D or 2D Tensor, but got Tensor of dimension ", indices.dim());
  TORCH_CHECK(offsets.dim() == 1, "embedding_bag: offsets has to be a 1D Tensor, but got Tensor of dimension ", offsets.dim());
  TORCH_CHECK(mode >= kSum && mode <= kMax, "embedding_bag: mode must be 0 (sum), 1 (mean) or 2 (max), got ", mode);
  bool weighted = present(per_sample_weights);
  TORCH_CHECK(
      !weighted || mode == kSum,
      "embedding_bag: per_sample_weights was not None. per_sample_weights is only supported for "
      "mode='sum' (got mode='", mode == kMean ? "mean" : "max", "'). Please open a feature request on GitHub.");
  if (weighted) {
    TORCH_CHECK(
        per_sample_weights->sizes() == indices.sizes(),
        "embedding_bag: Expected per_sample_weights to have the shape of indices ", indices.sizes(),
        ", but got ", per_sample_weights->sizes());
  }
  BagLayout bl = layout_bags(indices, offsets, include_last_offset, padding_idx);
  at::Tensor rows = weight.index_select(0, indices.to(at::kLong));
  at::Tensor sizes = bag_sizes(bl);
  at::Tensor output, max_indices;
  if (mode == kMax) {
    std::tie(output, max_indices) = max_of_bags(bl, rows, indices, sizes);
  } else {
    at::Tensor contribution = rows;
    if (weighted) {
      contribution = contribution * per_sample_weights->unsqueeze(1).to(rows.scalar_type());
    }
    // Selected, not multiplied by 0: a padding row may hold NaN or inf.
    contribution = at::where(bl.kept.unsqueeze(1), contribution, at::zeros({}, rows.options()));
    output = sum_into_bags(bl, contribution);
    if (mode == kMean) {
      output = output / sizes.clamp_min(1).unsqueeze(1).to(output.scalar_type());
    }
    max_indices = sizes;
  }
  // The bag of each index, and each bag's kept count, are what the gradient kernels read back.
  return {output, bl.bag_of, sizes, max_indices};
}

void refuse_sparse(bool sparse) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      !sparse,
      "embedding_bag with sparse=True: pjrt has no sparse tensors; pass sparse=False for a dense "
      "gradient");
}

at::Tensor pjrt_embedding_bag_backward(
    const at::Tensor& grad,
    const at::Tensor& indices,
    const at::Tensor& offsets,
    const at::Tensor& offset2bag,
    const at::Tensor& bag_size,
    const at::Tensor& maximum_indices,
    c10::SymInt num_weights_sym,
    bool scale_grad_by_freq,
    int64_t mode,
    bool sparse,
    const std::optional<at::Tensor>& per_sample_weights,
    int64_t padding_idx) {
  (void)offsets;
  refuse_sparse(sparse);
  int64_t num_weights = num_weights_sym.guard_int(__FILE__, __LINE__);
  int64_t d = grad.size(1);
  int64_t bags = grad.size(0);
  at::Tensor words = indices.to(at::kLong);
  if (mode == kMax) {
    // Each bag's gradient goes, column by column, to the row its maximum came from. Empty bags
    // have no row: their index is replaced by a spare slot.
    at::Tensor has = (bag_size > 0).unsqueeze(1).expand({bags, d});
    at::Tensor column = at::arange(d, words.options()).unsqueeze(0).expand({bags, d});
    at::Tensor slot = at::where(has, maximum_indices.to(at::kLong) * d + column,
                                at::full({}, num_weights * d, words.options()));
    at::Tensor flat = at::zeros({num_weights * d + 1}, grad.options())
                          .index_add(0, slot.reshape(-1), grad.reshape(-1));
    return flat.narrow(0, 0, num_weights * d).view({num_weights, d});
  }
  at::Tensor in_bag = offset2bag < bags;
  at::Tensor kept = in_bag;
  if (padding_idx >= 0) {
    kept = kept.logical_and(words != padding_idx);
  }
  at::Tensor bag = offset2bag.clamp_max(std::max<int64_t>(bags - 1, 0));
  at::Tensor rows = bags > 0 ? grad.index_select(0, bag) : at::zeros({words.size(0), d}, grad.options());
  at::Tensor scale = kept.to(grad.scalar_type());
  if (mode == kMean) {
    scale = scale / bag_size.clamp_min(1).index_select(0, bag).to(grad.scalar_type());
  }
  if (present(per_sample_weights)) {
    scale = scale * per_sample_weights->to(grad.scalar_type());
  }
  if (scale_grad_by_freq) {
    // Each row's gradient is divided by how often its index occurs in the whole batch.
    at::Tensor counts = at::zeros({num_weights}, words.options()).index_add(0, words, at::ones_like(words));
    scale = scale / counts.index_select(0, words).to(grad.scalar_type());
  }
  return at::zeros({num_weights, d}, grad.options()).index_add(0, words, rows * scale.unsqueeze(1));
}

at::Tensor pjrt_embedding_bag_dense_backward(
    const at::Tensor& grad,
    const at::Tensor& indices,
    const at::Tensor& offset2bag,
    const at::Tensor& bag_size,
    const at::Tensor& maximum_indices,
    c10::SymInt num_weights,
    bool scale_grad_by_freq,
    int64_t mode,
    const std::optional<at::Tensor>& per_sample_weights,
    int64_t padding_idx) {
  return pjrt_embedding_bag_backward(
      grad, indices, at::Tensor(), offset2bag, bag_size, maximum_indices, std::move(num_weights),
      scale_grad_by_freq, mode, false, per_sample_weights, padding_idx);
}

// d(output[bag_i]) / d(per_sample_weights[i]) is the row weight[indices[i]]: the gradient is its
// dot product with the bag's output gradient (0 for padding and indices outside every bag).
at::Tensor pjrt_embedding_bag_per_sample_weights_backward(
    const at::Tensor& grad,
    const at::Tensor& weight,
    const at::Tensor& indices,
    const at::Tensor& offsets,
    const at::Tensor& offset2bag,
    int64_t mode,
    int64_t padding_idx) {
  (void)offsets;
  TORCH_CHECK(
      mode == kSum,
      "embedding_bag_backward: per_sample_weights only supported for mode='sum'");
  at::Tensor words = indices.to(at::kLong);
  int64_t bags = grad.size(0);
  if (bags == 0 || words.size(0) == 0) {
    return at::zeros({words.size(0)}, grad.options());
  }
  at::Tensor kept = offset2bag < bags;
  if (padding_idx >= 0) {
    kept = kept.logical_and(words != padding_idx);
  }
  at::Tensor rows = grad.index_select(0, offset2bag.clamp_max(bags - 1));
  at::Tensor dots = (rows * weight.index_select(0, words)).sum(1);
  return at::where(kept, dots, at::zeros({}, dots.options()));
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/embedding_kernels.inc"

}  // namespace torch_pjrt
