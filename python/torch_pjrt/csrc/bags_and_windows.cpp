// ATen ops that pjrt composes from its own ops instead of falling back to the CPU: `equal`;
// `fmax` and `fmin`; the running extremes behind `cummax` and `cummin`; `Tensor.unfold` (a view;
// its gradient is PyTorch's decomposition); `im2col` and `col2im` (`F.unfold`, `F.fold`); and
// `embedding_bag` in its three modes, with its gradients.
//
// Scans over a dimension run in log2(n) steps of shifted combines (Hillis–Steele), which the
// engine fuses into one region; segment sums use `index_add`. Nothing here reads a value back to
// the host except `equal`, whose result is a C++ bool.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <ATen/ops/unfold_native.h>

#include "pjrt_backend.h"

#include <functional>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

namespace torch_pjrt {
namespace {

using Tensors = std::vector<at::Tensor>;

// An inclusive scan along `dim`: after the step of stride s, element i holds the combination of
// elements i - 2s + 1 .. i. `combine(earlier, later)` combines the tensors of `state` elementwise
// (each list holds one slice per state tensor) and returns the combined slices.
Tensors running_scan(
    Tensors state,
    int64_t dim,
    const std::function<Tensors(const Tensors&, const Tensors&)>& combine) {
  int64_t n = state.front().size(dim);
  for (int64_t s = 1; s < n; s *= 2) {
    Tensors earlier, later;
    for (const at::Tensor& t : state) {
      earlier.push_back(t.narrow(dim, 0, n - s));
      later.push_back(t.narrow(dim, s, n - s));
    }
    Tensors combined = combine(earlier, later);
    for (size_t k = 0; k < state.size(); ++k) {
      state[k] = at::cat({state[k].narrow(dim, 0, s), combined[k]}, dim);
    }
  }
  return state;
}

// `0, 1, ..., n - 1` along `dim` of a tensor shaped like `like`, broadcast to it.
at::Tensor positions_along(const at::Tensor& like, int64_t dim) {
  std::vector<int64_t> shape(like.dim(), 1);
  shape[dim] = like.size(dim);
  return at::arange(like.size(dim), like.options().dtype(at::kLong)).view(shape).expand(like.sizes());
}

// ----- equal ------------------------------------------------------------------------------------

bool pjrt_equal(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(
      self.device() == other.device(),
      "Cannot compare two tensors on different devices. Got: ",
      self.device(),
      " and ",
      other.device());
  if (!self.is_same_size(other)) {
    return false;
  }
  if (self.numel() == 0) {
    return true;
  }
  // NaN equals nothing, as on the CPU; dtypes promote as `eq` promotes them.
  return at::eq(self, other).all().item<bool>();
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

// ----- cummax and cummin ------------------------------------------------------------------------

// The running maximum (or minimum) of `self` along `dim` into `values`, and into `indices` the
// position it was last attained at. As PyTorch's kernel: a NaN propagates, and each later NaN
// takes the index; among equal values the later one does.
void cumulative_extreme(
    const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t dim, bool maximum) {
  if (self.numel() == 0) {
    return;
  }
  at::Tensor x = self.dim() == 0 ? self.reshape({1}) : self;
  dim = at::maybe_wrap_dim(dim, x.dim());
  // Bools compare as 0/1 bytes.
  at::Tensor v = x.scalar_type() == at::kBool ? x.to(at::kByte) : x;
  auto extreme = [&](const Tensors& earlier, const Tensors& later) -> Tensors {
    return {maximum ? at::maximum(earlier[0], later[0]) : at::minimum(earlier[0], later[0])};
  };
  at::Tensor running = running_scan({v}, dim, extreme)[0];
  // Element i sets the index when it equals the running extreme (it is at least every earlier
  // one), or is NaN. Element 0 always does, so the latest such position is the index.
  at::Tensor sets = v == running;
  if (at::isFloatingType(v.scalar_type())) {
    sets = sets.logical_or(at::isnan(v));
  }
  at::Tensor marks = at::where(sets, positions_along(v, dim), at::zeros({}, v.options().dtype(at::kLong)));
  auto latest = [](const Tensors& earlier, const Tensors& later) -> Tensors {
    return {at::maximum(earlier[0], later[0])};
  };
  at::Tensor index = running_scan({marks}, dim, latest)[0];
  values.copy_(running.view(values.sizes()));
  indices.copy_(index.view(indices.sizes()));
}

void pjrt_cummax_helper(const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  cumulative_extreme(self, values, indices, dim, /*maximum=*/true);
}

void pjrt_cummin_helper(const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  cumulative_extreme(self, values, indices, dim, /*maximum=*/false);
}

// ----- im2col and col2im ------------------------------------------------------------------------

struct Window {
  int64_t kh, kw, dh, dw, ph, pw, sh, sw;
};

Window window_of(
    at::IntArrayRef kernel_size,
    at::IntArrayRef dilation,
    at::IntArrayRef padding,
    at::IntArrayRef stride) {
  auto pair = [](at::IntArrayRef v, const char* name) {
    TORCH_CHECK(v.size() == 2, "It is expected ", name, " equals to 2, but got size ", v.size());
  };
  pair(kernel_size, "kernel_size");
  pair(dilation, "dilation");
  pair(padding, "padding");
  pair(stride, "stride");
  Window w{kernel_size[0], kernel_size[1], dilation[0], dilation[1],
           padding[0],     padding[1],     stride[0],   stride[1]};
  TORCH_CHECK(
      w.kh > 0 && w.kw > 0,
      "kernel size should be greater than zero, but got kernel_height: ", w.kh,
      " kernel_width: ", w.kw);
  TORCH_CHECK(
      w.sh > 0 && w.sw > 0,
      "stride should be greater than zero, but got stride_height: ", w.sh,
      " stride_width: ", w.sw);
  TORCH_CHECK(
      w.dh > 0 && w.dw > 0,
      "dilation should be greater than zero, but got dilation_height: ", w.dh,
      " dilation_width: ", w.dw);
  TORCH_CHECK(
      w.ph >= 0 && w.pw >= 0,
      "padding should be non-negative, but got pad_height: ", w.ph, " pad_width: ", w.pw);
  return w;
}

// The number of window positions along a dimension of `size` elements.
int64_t blocks_along(int64_t size, int64_t kernel, int64_t dilation, int64_t padding, int64_t stride) {
  return (size + 2 * padding - (dilation * (kernel - 1) + 1)) / stride + 1;
}

// The elements of the padded image that window offset (i, j) reads at every block position.
at::Tensor offset_view(const at::Tensor& padded, const Window& w, int64_t i, int64_t j, int64_t oh, int64_t ow) {
  return padded.slice(2, i * w.dh, i * w.dh + w.sh * (oh - 1) + 1, w.sh)
      .slice(3, j * w.dw, j * w.dw + w.sw * (ow - 1) + 1, w.sw);
}

at::Tensor pjrt_im2col(
    const at::Tensor& self,
    at::IntArrayRef kernel_size,
    at::IntArrayRef dilation,
    at::IntArrayRef padding,
    at::IntArrayRef stride) {
  Window w = window_of(kernel_size, dilation, padding, stride);
  bool valid = (self.dim() == 3 || self.dim() == 4) && self.size(-1) != 0 && self.size(-2) != 0 &&
      self.size(-3) != 0;
  TORCH_CHECK(
      valid,
      "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero "
      "dimensions for input, but got: ",
      self.sizes());
  at::Tensor x = self.dim() == 4 ? self : self.unsqueeze(0);
  int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  int64_t oh = blocks_along(h, w.kh, w.dh, w.ph, w.sh);
  int64_t ow = blocks_along(wd, w.kw, w.dw, w.pw, w.sw);
  TORCH_CHECK(
      oh >= 1 && ow >= 1,
      "Given input with spatial size (", h, ", ", wd, "), kernel_size=(", w.kh, ", ", w.kw,
      "), dilation=(", w.dh, ", ", w.dw, "), padding=(", w.ph, ", ", w.pw,
      "), calculated shape of the array of sliding blocks as (", oh, ", ", ow,
      "), but its components must be at least one.");
  at::Tensor padded = (w.ph || w.pw) ? at::constant_pad_nd(x, {w.pw, w.pw, w.ph, w.ph}, 0) : x;
  Tensors blocks;
  for (int64_t i = 0; i < w.kh; ++i) {
    for (int64_t j = 0; j < w.kw; ++j) {
      blocks.push_back(offset_view(padded, w, i, j, oh, ow));
    }
  }
  // Rows are (channel, kernel row, kernel column), channel-major, as PyTorch lays them out.
  at::Tensor cols = at::stack(blocks, 2).reshape({n, c * w.kh * w.kw, oh * ow});
  return self.dim() == 4 ? cols : cols.squeeze(0);
}

at::Tensor pjrt_col2im(
    const at::Tensor& self,
    at::IntArrayRef output_size,
    at::IntArrayRef kernel_size,
    at::IntArrayRef dilation,
    at::IntArrayRef padding,
    at::IntArrayRef stride) {
  TORCH_CHECK(
      output_size.size() == 2, "It is expected output_size equals to 2, but got size ",
      output_size.size());
  Window w = window_of(kernel_size, dilation, padding, stride);
  bool valid = (self.dim() == 2 || self.dim() == 3) && self.size(-1) != 0 && self.size(-2) != 0;
  TORCH_CHECK(
      valid,
      "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and non-zero "
      "dimensions for input, but got: ",
      self.sizes());
  at::Tensor x = self.dim() == 3 ? self : self.unsqueeze(0);
  int64_t n = x.size(0), rows = x.size(1), length = x.size(2);
  int64_t h = output_size[0], wd = output_size[1];
  TORCH_CHECK(
      rows % (w.kh * w.kw) == 0,
      "Expected size of input's dimension 1 to be divisible by the product of kernel_size, but "
      "got input.size(1)=", rows, " and kernel_size=(", w.kh, ", ", w.kw, ").");
  int64_t oh = blocks_along(h, w.kh, w.dh, w.ph, w.sh);
  int64_t ow = blocks_along(wd, w.kw, w.dw, w.pw, w.sw);
  TORCH_CHECK(
      oh >= 1 && ow >= 1 && length == oh * ow,
      "Given output_size=(", h, ", ", wd, "), kernel_size=(", w.kh, ", ", w.kw,
      "), dilation=(", w.dh, ", ", w.dw, "), padding=(", w.ph, ", ", w.pw, "), stride=(", w.sh,
      ", ", w.sw, "), expected size of input's dimension 2 to match the calculated number of "
      "sliding blocks ", oh, " * ", ow, " = ", oh * ow, ", but got input.size(2)=", length, ".");
  int64_t c = rows / (w.kh * w.kw);
  at::Tensor cols = x.reshape({n, c, w.kh, w.kw, oh, ow});
  // Each window offset adds its values where im2col read them; overlapping windows sum.
  at::Tensor image = at::zeros({n, c, h + 2 * w.ph, wd + 2 * w.pw}, x.options());
  for (int64_t i = 0; i < w.kh; ++i) {
    for (int64_t j = 0; j < w.kw; ++j) {
      offset_view(image, w, i, j, oh, ow).add_(cols.select(2, i).select(2, j));
    }
  }
  at::Tensor out = image.slice(2, w.ph, w.ph + h).slice(3, w.pw, w.pw + wd).contiguous();
  return self.dim() == 3 ? out : out.squeeze(0);
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

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("equal", TORCH_FN(pjrt_equal));
  PJRT_WITH_OUT("fmax", "fmax.out", pjrt_fmax)
  PJRT_WITH_OUT("fmin", "fmin.out", pjrt_fmin)
  m.impl("_cummax_helper", TORCH_FN(pjrt_cummax_helper));
  m.impl("_cummin_helper", TORCH_FN(pjrt_cummin_helper));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("im2col", TORCH_FN(pjrt_im2col));
  m.impl("col2im", TORCH_FN(pjrt_col2im));
  m.impl("_embedding_bag", TORCH_FN(pjrt_embedding_bag));
  m.impl("_embedding_bag_forward_only", TORCH_FN(pjrt_embedding_bag));
  m.impl("_embedding_bag_backward", TORCH_FN(pjrt_embedding_bag_backward));
  m.impl("_embedding_bag_dense_backward", TORCH_FN(pjrt_embedding_bag_dense_backward));
  m.impl(
      "_embedding_bag_per_sample_weights_backward",
      TORCH_FN(pjrt_embedding_bag_per_sample_weights_backward));
}

}  // namespace torch_pjrt
