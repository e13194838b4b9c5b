// Reductions, scans, order statistics and searches along a dimension, composed from device ops
// (RFC 0019): `max.dim`/`min.dim`, `var_mean`, `kthvalue` and `median` (sorted on the device),
// `torch.unique` without a dim, `bincount` and `histc`, `equal`, the running extremes behind
// `cummax` and `cummin`, `count_nonzero`, `aminmax`, and `searchsorted`/`bucketize`.
//
// Scans over a dimension run in log2(n) steps of shifted combines (Hillis–Steele), which the
// engine fuses into one region. The ops whose result size depends on the data (`unique`,
// `bincount`, `histc` over the data's range) and `equal`, whose result is a C++ bool, read values
// to the host, as PyTorch's own kernels do.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "composites.h"
#include "pjrt_backend.h"

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace torch_pjrt {

// Declared in composites.h: `cummax`/`cummin` here and `embedding_bag`'s maximum use it.
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

namespace {

// `0, 1, ..., n - 1` along `dim` of a tensor shaped like `like`, broadcast to it.
at::Tensor positions_along(const at::Tensor& like, int64_t dim) {
  std::vector<int64_t> shape(like.dim(), 1);
  shape[dim] = like.size(dim);
  return at::arange(like.size(dim), like.options().dtype(at::kLong)).view(shape).expand(like.sizes());
}

// ----- reductions with indices ------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> pjrt_max_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  TORCH_CHECK(
      self.numel() > 0 || self.dim() == 0 || self.size(at::maybe_wrap_dim(dim, self.dim())) > 0,
      "max(): Expected reduction dim ",
      dim,
      " to have non-zero size.");
  if (self.scalar_type() == at::kBool) {
    // argmax has no bool kernel; as bytes, the first true (or the first false) wins.
    at::Tensor bytes = self.to(at::kByte);
    return {at::amax(self, {dim}, keepdim), at::argmax(bytes, dim, keepdim)};
  }
  return {at::amax(self, {dim}, keepdim), at::argmax(self, dim, keepdim)};
}

std::tuple<at::Tensor, at::Tensor> pjrt_min_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  TORCH_CHECK(
      self.numel() > 0 || self.dim() == 0 || self.size(at::maybe_wrap_dim(dim, self.dim())) > 0,
      "min(): Expected reduction dim ",
      dim,
      " to have non-zero size.");
  if (self.scalar_type() == at::kBool) {
    at::Tensor bytes = self.to(at::kByte);
    return {at::amin(self, {dim}, keepdim), at::argmin(bytes, dim, keepdim)};
  }
  return {at::amin(self, {dim}, keepdim), at::argmin(self, dim, keepdim)};
}

// ----- moments --------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> pjrt_var_mean(
    const at::Tensor& self,
    at::OptionalIntArrayRef dim,
    const std::optional<at::Scalar>& correction,
    bool keepdim) {
  return {at::var(self, dim, correction, keepdim), at::mean(self, dim, keepdim)};
}

// ----- order statistics -----------------------------------------------------------------------

// A value-and-index reduction's results, picked with `dim` kept: `dim` dropped unless `keepdim`,
// and contiguous, as PyTorch's kernels return them.
std::tuple<at::Tensor, at::Tensor> reduced_pair(at::Tensor value, at::Tensor index, int64_t dim, bool keepdim) {
  if (!keepdim) {
    value = value.squeeze(dim);
    index = index.squeeze(dim);
  }
  return {value.contiguous(), index.contiguous()};
}

// The `k`-th smallest (0-based) along `dim`, NaN sorting last as in PyTorch's sort.
std::tuple<at::Tensor, at::Tensor> order_statistic(const at::Tensor& self, int64_t k, int64_t dim, bool keepdim) {
  if (self.dim() == 0) {
    return {self.clone(), at::zeros({}, self.options().dtype(at::kLong))};
  }
  auto [values, indices] = at::sort(self, /*stable=*/true, dim, /*descending=*/false);
  return reduced_pair(values.narrow(dim, k, 1), indices.narrow(dim, k, 1), dim, keepdim);
}

std::tuple<at::Tensor, at::Tensor> pjrt_kthvalue(const at::Tensor& self, c10::SymInt k_sym, int64_t dim, bool keepdim) {
  int64_t k = k_sym.expect_int();
  int64_t wrapped = at::maybe_wrap_dim(dim, self.dim());
  int64_t size = self.dim() == 0 ? 1 : self.size(wrapped);
  TORCH_CHECK(
      k >= 1 && k <= size,
      "kthvalue(): selected number k out of range for dimension ",
      wrapped);
  return order_statistic(self, k - 1, wrapped, keepdim);
}

// The lower median along `dim`; a row holding a NaN gives NaN and the index of its first NaN.
std::tuple<at::Tensor, at::Tensor> pjrt_median_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  int64_t wrapped = at::maybe_wrap_dim(dim, self.dim());
  int64_t size = self.dim() == 0 ? 1 : self.size(wrapped);
  TORCH_CHECK(
      size > 0,
      "median() cannot compute median for a dimension of size 0 because the operation does not "
      "have an identity; reduce over a non-empty dimension instead");
  auto [value, index] = order_statistic(self, (size - 1) / 2, wrapped, keepdim);
  if (!at::isFloatingType(self.scalar_type()) || self.dim() == 0) {
    return {value, index};
  }
  at::Tensor nan = at::isnan(self);
  at::Tensor has_nan = nan.any(wrapped, keepdim);
  at::Tensor first_nan = nan.to(at::kByte).argmax(wrapped, keepdim);
  return {
      at::where(has_nan, at::full_like(value, std::numeric_limits<double>::quiet_NaN()), value),
      at::where(has_nan, first_nan, index)};
}

// The lower median of each row's values that are not NaN: the row sorted (NaNs last), read at
// half its count of numbers. A row of NaNs gives NaN and index 0, as PyTorch's kernel does.
std::tuple<at::Tensor, at::Tensor> pjrt_nanmedian_dim(const at::Tensor& self, int64_t dim, bool keepdim) {
  const int64_t wrapped = at::maybe_wrap_dim(dim, self.dim());
  if (!at::isFloatingType(self.scalar_type()) || self.dim() == 0) {
    return pjrt_median_dim(self, dim, keepdim);
  }
  TORCH_CHECK_INDEX(
      self.size(wrapped) > 0,
      "median(): Expected reduction dim ",
      wrapped,
      " to have non-zero size.");
  auto [values, indices] = at::sort(self, /*stable=*/true, wrapped, /*descending=*/false);
  const at::Tensor count = at::logical_not(at::isnan(self)).sum(wrapped, /*keepdim=*/true);
  const at::Tensor k = at::where(count > 0, (count - 1).div(2, "floor"), at::zeros_like(count));
  return reduced_pair(values.gather(wrapped, k), indices.gather(wrapped, k), wrapped, keepdim);
}

at::Tensor pjrt_nanmedian(const at::Tensor& self) {
  if (self.numel() == 0) {
    // PyTorch's kernel: the median of no numbers is NaN.
    return at::full({}, std::numeric_limits<double>::quiet_NaN(), self.options());
  }
  return std::get<0>(pjrt_nanmedian_dim(self.reshape({-1}), 0, false));
}

// The most frequent value along `dim` (the smallest of the most frequent) and the index of its
// last occurrence, as PyTorch's CPU kernel finds them: in the row sorted stably each run of
// equal values ends at its last occurrence, and a run's length is its end less its start. A NaN,
// equal to nothing, is a run of one.
std::tuple<at::Tensor, at::Tensor> pjrt_mode(const at::Tensor& self, int64_t dim, bool keepdim) {
  const int64_t wrapped = at::maybe_wrap_dim(dim, self.dim());
  if (self.dim() == 0) {
    return {self.clone(), at::zeros({}, self.options().dtype(at::kLong))};
  }
  const int64_t n = self.size(wrapped);
  TORCH_CHECK_INDEX(n > 0, "mode(): Expected reduction dim ", wrapped, " to have non-zero size.");
  auto [sorted, order] = at::sort(self, /*stable=*/true, wrapped, /*descending=*/false);
  std::vector<int64_t> along(self.dim(), 1);
  along[wrapped] = n;
  const at::Tensor positions = at::arange(n, self.options().dtype(at::kLong)).view(along);
  const at::Tensor edge = at::ones_like(sorted.narrow(wrapped, 0, 1), self.options().dtype(at::kBool));
  const at::Tensor differs = at::ne(sorted.narrow(wrapped, 1, n - 1), sorted.narrow(wrapped, 0, n - 1));
  const at::Tensor starts = at::cat({edge, differs}, wrapped);
  const at::Tensor ends = at::cat({differs, edge}, wrapped);
  const at::Tensor run_start = std::get<0>(at::cummax(at::where(starts, positions, 0), wrapped));
  const at::Tensor length = at::where(ends, positions - run_start + 1, 0);
  const at::Tensor longest = length.amax(wrapped, /*keepdim=*/true);
  // argmax takes the first: the smallest of the most frequent values.
  const at::Tensor pick = at::eq(length, longest).to(at::kByte).argmax(wrapped, /*keepdim=*/true);
  return reduced_pair(sorted.gather(wrapped, pick), order.gather(wrapped, pick), wrapped, keepdim);
}

at::Tensor pjrt_median(const at::Tensor& self) {
  TORCH_CHECK(
      self.numel() > 0,
      "median() input tensor cannot be empty: it has no median; check its size before the call");
  return std::get<0>(pjrt_median_dim(self.reshape({-1}), 0, false));
}

// ----- unique ------------------------------------------------------------------------------------

// `torch.unique` without a dim: a stable sort, a mask of where the value changes, and the runs it
// delimits. The number of distinct values is read to the host (the result's length), as on the
// CPU. NaNs are all distinct, as on the CPU.
std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_unique2(
    const at::Tensor& self,
    bool sorted,
    bool return_inverse,
    bool return_counts) {
  if (!sorted) {
    // The CPU's unsorted order comes from its hash set, which only the CPU reproduces.
    note_kernel_cpu_fallback("aten::_unique2 with sorted=False");
    auto [values, inverse, counts] = at::_unique2(self.cpu(), false, return_inverse, return_counts);
    return {values.to(self.device()), inverse.to(self.device()), counts.to(self.device())};
  }
  at::TensorOptions longs = self.options().dtype(at::kLong);
  at::Tensor none = at::empty({0}, longs);
  at::Tensor flat = self.reshape({-1});
  int64_t n = flat.numel();
  if (n == 0) {
    return {flat.clone(), return_inverse ? at::zeros(self.sizes(), longs) : none, none};
  }
  auto [values, order] = at::sort(flat, /*stable=*/true, 0, /*descending=*/false);
  at::Tensor is_new = at::cat({at::ones({1}, self.options().dtype(at::kBool)), values.slice(0, 1) != values.slice(0, 0, n - 1)});
  at::Tensor starts = is_new.nonzero().squeeze(1);
  // Advanced indexing rather than index_select: it takes every dtype unique does (PyTorch has
  // no index_select for uint16/32/64).
  at::Tensor distinct = values.index({starts});
  at::Tensor inverse = none;
  if (return_inverse) {
    at::Tensor group = is_new.to(at::kLong).cumsum(0) - 1;
    c10::List<std::optional<at::Tensor>> at_order;
    at_order.push_back(order);
    inverse = at::index_put(at::zeros({n}, longs), at_order, group).view(self.sizes());
  }
  at::Tensor counts = none;
  if (return_counts) {
    at::Tensor ends = at::cat({starts.slice(0, 1), at::full({1}, n, longs)});
    counts = ends - starts;
  }
  return {distinct, inverse, counts};
}

// `torch.unique_consecutive`: each element (or slice along `dim`) that differs from the one
// before starts a run. The number of runs is read to the host (the result's length), as on the
// CPU; NaNs differ from everything, as on the CPU.
std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_unique_consecutive(
    const at::Tensor& self,
    bool return_inverse,
    bool return_counts,
    std::optional<int64_t> dim) {
  const at::TensorOptions longs = self.options().dtype(at::kLong);
  const at::Tensor none = at::empty({0}, longs);
  const bool whole = !dim.has_value();
  const at::Tensor source = whole ? self.reshape({-1}) : self;
  const int64_t d = whole ? 0 : at::maybe_wrap_dim(*dim, self.dim());
  const int64_t n = source.dim() == 0 ? 1 : source.size(d);
  if (!whole) {
    for (int64_t other = 0; other < self.dim(); ++other) {
      TORCH_CHECK(
          other == d || self.size(other) > 0,
          "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied");
    }
  }
  if (n == 0) {
    at::Tensor inverse = return_inverse ? (whole ? at::zeros(self.sizes(), longs) : none) : none;
    return {source.clone(), inverse, none};
  }
  // Slices along `d` that differ from the one before, any element counting.
  at::Tensor differs = at::ne(source.narrow(d, 1, n - 1), source.narrow(d, 0, n - 1));
  if (!whole) {
    differs = n == 1 ? differs.reshape({0}) : differs.movedim(d, 0).reshape({n - 1, -1}).any(1);
  }
  const at::Tensor is_new = at::cat({at::ones({1}, self.options().dtype(at::kBool)), differs});
  const at::Tensor starts = is_new.nonzero().squeeze(1);
  // Along a dim, PyTorch's result is the selected slices moved back from the front: the same
  // layout here.
  const at::Tensor values = whole
      ? source.index({starts})
      : source.movedim(d, 0).contiguous().index_select(0, starts).movedim(0, d);
  at::Tensor inverse = none;
  if (return_inverse) {
    inverse = is_new.to(at::kLong).cumsum(0) - 1;
    inverse = whole ? inverse.view(self.sizes()) : inverse;
  }
  at::Tensor counts = none;
  if (return_counts) {
    counts = at::cat({starts.slice(0, 1), at::full({1}, n, longs)}) - starts;
  }
  return {values, inverse, counts};
}

// ----- counting --------------------------------------------------------------------------------

// `torch.bincount` reads the largest value (and checks the smallest) on the host, as PyTorch's
// own kernel does: the result's length depends on it.
at::Tensor pjrt_bincount(const at::Tensor& self, const std::optional<at::Tensor>& weights, c10::SymInt minlength_sym) {
  int64_t minlength = minlength_sym.expect_int();
  TORCH_CHECK(minlength >= 0, "minlength should be >= 0");
  TORCH_CHECK(
      self.dim() == 1 && !at::isFloatingType(self.scalar_type()) && self.scalar_type() != at::kBool,
      "bincount only supports 1-d non-negative integral inputs.");
  bool weighted = present(weights);
  if (weighted) {
    TORCH_CHECK(
        weights->dim() == 1 && weights->size(0) == self.size(0),
        "weights should be 1-d and have the same length as input");
  }
  at::ScalarType dtype = weighted
      ? (weights->scalar_type() == at::kFloat ? at::kFloat : at::kDouble)
      : at::kLong;
  if (self.numel() == 0) {
    return at::zeros({minlength}, self.options().dtype(dtype));
  }
  TORCH_CHECK(self.min().item<int64_t>() >= 0, "bincount only supports 1-d non-negative integral inputs.");
  int64_t length = std::max(minlength, self.max().item<int64_t>() + 1);
  at::Tensor counts = weighted ? weights->to(dtype) : at::ones({self.size(0)}, self.options().dtype(dtype));
  return at::zeros({length}, counts.options()).index_add(0, self.to(at::kLong), counts);
}

// `torch.histogramdd`'s counts (or summed weights) of the points `(N, D)` in the bins the
// per-coordinate `edges` delimit: each bin holds [edge_k, edge_k+1) along each coordinate, the
// last one its right edge too, exactly as PyTorch's kernel places values against the edges (a
// search over them, not a division); points outside the edges in any coordinate, and NaNs, are
// not counted. `density` divides by the total and each coordinate's bin widths, in PyTorch's
// order.
at::Tensor histogram_of_points(
    const at::Tensor& points,
    const std::vector<at::Tensor>& edges,
    const std::optional<at::Tensor>& weight,
    bool density,
    const std::vector<std::pair<double, double>>& bounds = {}) {
  const int64_t n = points.size(0);
  const at::TensorOptions longs = points.options().dtype(at::kLong);
  at::Tensor counted = at::ones({n}, points.options().dtype(at::kBool));
  at::Tensor flat = at::zeros({n}, longs);
  std::vector<int64_t> shape;
  for (size_t d = 0; d < edges.size(); ++d) {
    const at::Tensor& e = edges[d];
    const int64_t bins = e.size(0) - 1;
    shape.push_back(bins);
    const at::Tensor coordinate = points.select(1, static_cast<int64_t>(d)).contiguous();
    // The outer edges as the host knows them where it chose them: a fused linspace may round
    // its last edge below the data's maximum.
    const at::Tensor inside = bounds.empty()
        ? at::logical_and(coordinate >= e.narrow(0, 0, 1), coordinate <= e.narrow(0, bins, 1))
        : at::logical_and(coordinate >= bounds[d].first, coordinate <= bounds[d].second);
    const at::Tensor bin =
        (at::searchsorted(e, coordinate, /*out_int32=*/false, /*right=*/true) - 1).clamp(0, bins - 1);
    counted = at::logical_and(counted, inside);
    flat = flat * bins + bin;
  }
  const at::Tensor amounts = present(weight) ? weight->reshape({-1}) : at::ones({n}, points.options());
  at::Tensor hist = at::zeros({c10::multiply_integers(shape)}, points.options())
                        .index_add(0, flat, at::where(counted, amounts, at::zeros_like(amounts)))
                        .view(shape);
  if (density) {
    hist = hist / hist.sum();
    for (size_t d = 0; d < edges.size(); ++d) {
      std::vector<int64_t> along(edges.size(), 1);
      along[d] = shape[d];
      const at::Tensor widths = edges[d].narrow(0, 1, shape[d]) - edges[d].narrow(0, 0, shape[d]);
      hist = hist / widths.view(along);
    }
  }
  return hist;
}

void check_histogram(const at::Tensor& self, const std::optional<at::Tensor>& weight, bool per_point) {
  TORCH_CHECK(
      at::isFloatingType(self.scalar_type()),
      "torch.histogramdd: input tensor should have a floating-point dtype, but got ", self.scalar_type());
  // As PyTorch's kernel: float32 and float64 only.
  TORCH_CHECK_NOT_IMPLEMENTED(
      !at::isReducedFloatingType(self.scalar_type()),
      "\"histogramdd\" not implemented for '", c10::toString(self.scalar_type()), "'");
  if (present(weight)) {
    TORCH_CHECK(
        weight->scalar_type() == self.scalar_type(),
        "torch.histogramdd: if weight tensor is provided, it should have the same dtype as the input tensor");
    const at::IntArrayRef expected = per_point ? self.sizes().slice(0, self.dim() - 1) : self.sizes();
    TORCH_CHECK(
        weight->sizes() == expected,
        "torch.histogramdd: if weight tensor is provided it should have the same shape as the input tensor",
        per_point ? " excluding its innermost dimension" : "");
  }
}

// The points of a `histogramdd` input: its last dim holds each point's coordinates.
at::Tensor histogram_points(const at::Tensor& self) {
  TORCH_CHECK(
      self.dim() >= 2, "torch.histogramdd: input tensor should have at least 2 dimensions, but got ",
      self.dim());
  return self.reshape({-1, self.size(-1)});
}

// Equal bins along each coordinate: over `range`'s pairs, or over the data's range (read to the
// host, as PyTorch's kernel reads it: it fixes the edges), widened by 1/2 each way where every
// value is the same, and [0, 1] for no points.
std::vector<at::Tensor> histogram_edges(
    const at::Tensor& points,
    at::IntArrayRef bins,
    at::OptionalArrayRef<double> range,
    std::vector<std::pair<double, double>>* bounds = nullptr) {
  const int64_t dims = points.size(1);
  TORCH_CHECK(
      static_cast<int64_t>(bins.size()) == dims,
      "histogramdd: The size of bins must be equal to the innermost dimension of the input.");
  std::vector<double> left(dims, 0.0), right(dims, 1.0);
  if (range.has_value()) {
    TORCH_CHECK(
        static_cast<int64_t>(range->size()) == 2 * dims, "torch.histogramdd: for a ", dims,
        "-dimensional histogram range should have ", 2 * dims, " elements, but got ", range->size());
    for (int64_t d = 0; d < dims; ++d) {
      left[d] = (*range)[2 * d];
      right[d] = (*range)[2 * d + 1];
    }
  } else if (points.size(0) > 0) {
    auto [low, high] = at::aminmax(points, 0);
    const at::Tensor both = at::stack({low, high}).to(at::kDouble).cpu();
    for (int64_t d = 0; d < dims; ++d) {
      left[d] = both[0][d].item<double>();
      right[d] = both[1][d].item<double>();
    }
  }
  std::vector<at::Tensor> edges;
  for (int64_t d = 0; d < dims; ++d) {
    TORCH_CHECK(
        bins[d] > 0, "torch.histogramdd(): bins must be > 0, but got ", bins[d], " for dimension ", d);
    TORCH_CHECK(
        std::isfinite(left[d]) && std::isfinite(right[d]), "torch.histogramdd: dimension ", d, "'s range [",
        left[d], ", ", right[d], "] is not finite");
    TORCH_CHECK(
        left[d] <= right[d], "torch.histogramdd: min should not exceed max, but got min ", left[d], " max ",
        right[d], " for dimension ", d);
    if (left[d] == right[d]) {
      left[d] -= 0.5;
      right[d] += 0.5;
    }
    edges.push_back(at::linspace(left[d], right[d], bins[d] + 1, points.options()));
    if (bounds != nullptr) {
      bounds->emplace_back(left[d], right[d]);
    }
  }
  return edges;
}

std::vector<at::Tensor> checked_edges(const at::Tensor& self, at::TensorList bins) {
  std::vector<at::Tensor> edges;
  for (size_t d = 0; d < bins.size(); ++d) {
    const at::Tensor& b = bins[d];
    TORCH_CHECK(
        b.dim() == 1, "torch.histogramdd: bins tensor should have one dimension, but got ", b.dim(),
        " dimensions in the bins tensor for dimension ", d);
    TORCH_CHECK(
        b.scalar_type() == self.scalar_type(),
        "torch.histogramdd: input tensor and bins tensors should have the same dtype, but got input ",
        self.scalar_type(), " and bins for dimension ", d, " ", b.scalar_type());
    TORCH_CHECK(
        b.numel() > 0, "torch.histogramdd: bins tensor should have at least 1 element, but got ", b.numel(),
        " elements for dimension ", d);
    edges.push_back(b.contiguous().clone());
  }
  return edges;
}

// `torch.histogram` with a bin count: one coordinate's `histogramdd`.
std::tuple<at::Tensor, at::Tensor> pjrt_histogram_bin_ct(
    const at::Tensor& self,
    int64_t bins,
    at::OptionalArrayRef<double> range,
    const std::optional<at::Tensor>& weight,
    bool density) {
  check_histogram(self, weight, /*per_point=*/false);
  const at::Tensor points = self.reshape({-1, 1});
  std::vector<std::pair<double, double>> bounds;
  std::vector<at::Tensor> edges = histogram_edges(points, {bins}, range, &bounds);
  return {histogram_of_points(points, edges, weight, density, bounds), edges[0]};
}

// `torch.histogram` with the edges given (increasing).
std::tuple<at::Tensor, at::Tensor> pjrt_histogram_bins_tensor(
    const at::Tensor& self,
    const at::Tensor& bins,
    const std::optional<at::Tensor>& weight,
    bool density) {
  check_histogram(self, weight, /*per_point=*/false);
  std::vector<at::Tensor> edges = checked_edges(self, {bins});
  if (edges[0].numel() == 1) {
    return {at::zeros({0}, self.options()), edges[0]};
  }
  return {histogram_of_points(self.reshape({-1, 1}), edges, weight, density), edges[0]};
}

// `torch.histogramdd`'s pieces: the edges of equal bins, and the histogram over equal bins or
// over given edges.
std::vector<at::Tensor> pjrt_histogramdd_bin_edges(
    const at::Tensor& self,
    at::IntArrayRef bins,
    at::OptionalArrayRef<double> range,
    const std::optional<at::Tensor>& weight,
    bool density) {
  check_histogram(self, weight, /*per_point=*/true);
  return histogram_edges(histogram_points(self), bins, range);
}

at::Tensor pjrt_histogramdd_from_bin_cts(
    const at::Tensor& self,
    at::IntArrayRef bins,
    at::OptionalArrayRef<double> range,
    const std::optional<at::Tensor>& weight,
    bool density) {
  check_histogram(self, weight, /*per_point=*/true);
  const at::Tensor points = histogram_points(self);
  std::vector<std::pair<double, double>> bounds;
  std::vector<at::Tensor> edges = histogram_edges(points, bins, range, &bounds);
  return histogram_of_points(points, edges, weight, density, bounds);
}

at::Tensor pjrt_histogramdd_from_bin_tensors(
    const at::Tensor& self,
    at::TensorList bins,
    const std::optional<at::Tensor>& weight,
    bool density) {
  check_histogram(self, weight, /*per_point=*/true);
  const at::Tensor points = histogram_points(self);
  TORCH_CHECK(
      static_cast<int64_t>(bins.size()) == points.size(1), "torch.histogramdd: expected ", points.size(1),
      " sequences of bin edges for a ", points.size(1), "-dimensional histogram but got ", bins.size());
  std::vector<at::Tensor> edges = checked_edges(self, bins);
  for (const at::Tensor& e : edges) {
    if (e.numel() == 1) {
      std::vector<int64_t> shape;
      for (const at::Tensor& f : edges) {
        shape.push_back(f.numel() - 1);
      }
      return at::zeros(shape, self.options());
    }
  }
  return histogram_of_points(points, edges, weight, density);
}

// `torch.histc`: `bins` equal bins over [min, max] (the data's range when both are 0); values
// outside are not counted, and `max` itself falls in the last bin. Integer inputs are counted as
// CUDA counts them (mixture-of-experts routing counts expert ids so): the bounds truncated to
// the input's type and the bin computed in integer arithmetic, counts in the input's dtype.
at::Tensor pjrt_histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  TORCH_CHECK(bins > 0, "torch.histc: bins must be > 0, but got ", bins);
  bool integral = at::isIntegralType(self.scalar_type(), /*includeBool=*/false);
  TORCH_CHECK_NOT_IMPLEMENTED(
      at::isFloatingType(self.scalar_type()) || integral,
      "\"histogram_pjrt\" not implemented for '",
      c10::toString(self.scalar_type()),
      "'");
  double low = integral ? static_cast<double>(min.toLong()) : min.toDouble();
  double high = integral ? static_cast<double>(max.toLong()) : max.toDouble();
  if (low == high && self.numel() > 0) {
    low = self.min().item<double>();
    high = self.max().item<double>();
  }
  if (low == high) {
    low -= 1;
    high += 1;
  }
  TORCH_CHECK(
      !(std::isinf(low) || std::isinf(high) || std::isnan(low) || std::isnan(high)),
      "torch.histc: range of [",
      low,
      ", ",
      high,
      "] is not finite");
  TORCH_CHECK(low < high, "torch.histc: max must be larger than min");
  at::Tensor x = self.reshape({-1});
  at::Tensor inside = (x >= low).logical_and(x <= high);
  at::Tensor position;
  if (integral) {
    auto low_int = static_cast<int64_t>(low);
    auto span = static_cast<int64_t>(high) - low_int;
    position = (x.to(at::kLong) - low_int).mul(bins).div(span, "floor");
  } else {
    // In the input's dtype, in PyTorch's order: (x - low) / (high - low) * bins.
    position = ((x - low) / (high - low) * static_cast<double>(bins)).to(at::kLong);
  }
  at::Tensor bin = at::where(inside, position.clamp(0, bins - 1), at::zeros_like(position));
  at::Tensor ones = inside.to(self.scalar_type());
  return at::zeros({bins}, self.options()).index_add(0, bin, ones);
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

// ----- count_nonzero and aminmax -----------------------------------------------------------------

// PyTorch's CPU counts along given dims as `(self != 0).sum(dims)`, which takes uint16/32/64,
// and over all dims with a kernel of its own that has no case for them: that call runs on the
// CPU, which raises its error.
at::Tensor pjrt_count_nonzero(const at::Tensor& self, at::IntArrayRef dims) {
  if (C10_UNLIKELY(dims.empty() && wide_unsigned(self))) {
    return run_on_cpu<at::_ops::count_nonzero_dim_IntList>(self, dims);
  }
  return (self != 0).sum(dims, /*keepdim=*/false, at::kLong);
}

std::tuple<at::Tensor, at::Tensor> pjrt_aminmax(
    const at::Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  TORCH_CHECK(
      self.numel() > 0 || dim.has_value(),
      "aminmax(): cannot compute aminmax over an empty dimension as the operation has no "
      "identity.");
  if (dim.has_value()) {
    return {at::amin(self, *dim, keepdim), at::amax(self, *dim, keepdim)};
  }
  at::Tensor lo = at::amin(self);
  at::Tensor hi = at::amax(self);
  if (keepdim) {
    std::vector<int64_t> ones(self.dim(), 1);
    return {lo.reshape(ones), hi.reshape(ones)};
  }
  return {lo, hi};
}

// ----- searching sorted sequences ---------------------------------------------------------------

// For each value, how many elements of its row of `sorted` come before it: those not at least it
// (left) or not greater (right); a NaN value lands past the end, as in PyTorch's binary search.
at::Tensor pjrt_searchsorted(
    const at::Tensor& sorted_sequence,
    const at::Tensor& self,
    bool out_int32,
    bool right,
    std::optional<std::string_view> side,
    const std::optional<at::Tensor>& sorter) {
  if (side.has_value()) {
    TORCH_CHECK(
        *side == "left" || *side == "right",
        "torch.searchsorted(): side can only be 'left' or 'right' but got ",
        *side);
    TORCH_CHECK(
        !right || *side == "right",
        "torch.searchsorted(): side and right can't be set to opposites, got side of ",
        *side,
        " while right was True");
    right = *side == "right";
  }
  TORCH_CHECK(
      sorted_sequence.dim() >= 1,
      "torch.searchsorted(): boundaries tensor should have positive dimension, but got 0 "
      "dimension");
  if (sorted_sequence.dim() > 1) {
    TORCH_CHECK(
        sorted_sequence.dim() == self.dim() &&
            sorted_sequence.sizes().slice(0, self.dim() - 1) ==
                self.sizes().slice(0, self.dim() - 1),
        "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
        "dimensions of boundaries tensor and input value tensor must match, but we got "
        "boundaries tensor ",
        sorted_sequence.sizes(),
        " and input value tensor ",
        self.sizes());
  }
  at::Tensor seq = sorted_sequence;
  if (present(sorter)) {
    TORCH_CHECK(
        sorter->sizes() == sorted_sequence.sizes(),
        "torch.searchsorted(): boundary and sorter must have the same size, but got boundary "
        "tensor ",
        sorted_sequence.sizes(),
        "and got sorter tensor ",
        sorter->sizes());
    seq = sorted_sequence.gather(-1, *sorter);
  }
  at::ScalarType common = at::result_type(seq, self);
  seq = seq.to(common);
  at::Tensor values = self.to(common);
  at::Tensor rows = seq.dim() == 1 ? seq : seq.unsqueeze(-2);
  at::Tensor v = values.unsqueeze(-1);
  at::Tensor before = at::logical_not(right ? at::gt(rows, v) : at::ge(rows, v));
  return before.sum(-1, /*keepdim=*/false, out_int32 ? at::kInt : at::kLong);
}

at::Tensor pjrt_searchsorted_scalar(
    const at::Tensor& sorted_sequence,
    const at::Scalar& self,
    bool out_int32,
    bool right,
    std::optional<std::string_view> side,
    const std::optional<at::Tensor>& sorter) {
  TORCH_CHECK(
      sorted_sequence.dim() == 1,
      "torch.searchsorted(): input value can be a scalar only when boundaries tensor "
      "dimension is 1, but we got boundaries tensor dim(",
      sorted_sequence.dim(),
      ") and input value's dim(0) numel(1)");
  at::Tensor value = at::scalar_tensor(self, sorted_sequence.options());
  return pjrt_searchsorted(sorted_sequence, value, out_int32, right, side, sorter);
}

at::Tensor pjrt_bucketize(
    const at::Tensor& self, const at::Tensor& boundaries, bool out_int32, bool right) {
  TORCH_CHECK(
      boundaries.dim() == 1,
      "bucketize only supports 1-D boundaries, but got ",
      boundaries.dim());
  return pjrt_searchsorted(boundaries, self, out_int32, right, std::nullopt, std::nullopt);
}

at::Tensor pjrt_bucketize_scalar(
    const at::Scalar& self, const at::Tensor& boundaries, bool out_int32, bool right) {
  return pjrt_bucketize(
      at::scalar_tensor(self, boundaries.options()), boundaries, out_int32, right);
}

// `nansum`: a sum that reads each NaN as zero (integers hold none).
at::Tensor pjrt_nansum(
    const at::Tensor& self,
    at::OptionalIntArrayRef dim,
    bool keepdim,
    std::optional<at::ScalarType> dtype) {
  TORCH_CHECK(!self.is_complex(), "nansum does not support complex inputs");
  const at::Tensor values =
      at::isFloatingType(self.scalar_type()) ? at::where(at::isnan(self), at::zeros_like(self), self) : self;
  return at::sum(values, dim, keepdim, dtype);
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/reduce_kernels.inc"

}  // namespace torch_pjrt
