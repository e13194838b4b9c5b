// Resampling composed from device ops (RFC 0019): nearest and nearest-exact upsampling in 1, 2
// and 3 dims, linear, bilinear, trilinear and bicubic upsampling, each with its backward op (the
// forward ops of 1-d nearest and nearest-exact upsampling are PyTorch's decompositions instead,
// RFC 0045), and `grid_sampler_2d`.
//
// Upsampling is a gather along each resampled dim: the source positions (and for linear
// upsampling the two taps' weights) come from an `arange` on the device, with PyTorch's CPU
// kernels' float arithmetic, so nothing is uploaded and a region stays whole. The backward ops
// scatter-add the gradient through the same positions (`index_add`), dim by dim in reverse.
//
// `grid_sampler_2d` (`F.grid_sample` on 4-d inputs): bilinear, nearest and bicubic sampling with
// zeros, border and reflection padding, following the formulas of PyTorch's CPU kernel
// (GridSampler.h) step by step. It is registered for autograd too (AutogradPrivateUse1), so its
// gradients with respect to the input and the grid come from autograd through the same ops. Where
// the CPU kernel's hand-written gradient is one-sided (a clipped coordinate has gradient 0 at the
// clip bounds, a reflection flips the sign only below the axis) the composition uses `where`
// instead of `clamp`/`abs`, whose gradients differ exactly there.
#include <ATen/ATen.h>
#include <c10/core/SymIntArrayRef.h>
#include <torch/library.h>

#include "composites.h"
#include "pjrt_backend.h"

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch_pjrt {
namespace {

// PyTorch's `compute_scales_value`: the input step per output step, in float.
float source_scale(std::optional<double> scale, int64_t input_size, int64_t output_size) {
  if (scale.has_value() && *scale > 0.0) {
    return static_cast<float>(1.0 / *scale);
  }
  return static_cast<float>(input_size) / static_cast<float>(output_size);
}

at::Tensor positions(int64_t count, const at::Tensor& like, at::ScalarType dtype) {
  return at::arange(count, like.options().dtype(dtype));
}

// The source index of each output position for nearest (or nearest-exact) resampling.
at::Tensor nearest_source(
    int64_t input_size,
    int64_t output_size,
    std::optional<double> scale,
    bool exact,
    const at::Tensor& like) {
  if (input_size == output_size) {
    return positions(output_size, like, at::kLong);
  }
  float step = source_scale(scale, input_size, output_size);
  at::Tensor at_position = positions(output_size, like, at::kFloat);
  if (exact) {
    at_position = at_position + 0.5;
  }
  return at::floor(at_position * static_cast<double>(step)).to(at::kLong).clamp_max(input_size - 1);
}

// The taps of an interpolation along one dim: for each tap, the source index of every output
// position and its weight (two taps for linear, four for cubic).
struct Taps {
  std::vector<at::Tensor> index;
  std::vector<at::Tensor> weight;
};

// The arithmetic type PyTorch's CPU kernels interpolate in: double for double, float otherwise.
at::ScalarType interpolation_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Each output position's real source position, as PyTorch's `area_pixel_compute_scale` and
// `area_pixel_compute_source_index` compute it in `type` (cubic sources are not clamped at 0).
at::Tensor source_positions(
    int64_t input_size,
    int64_t output_size,
    bool align_corners,
    std::optional<double> scale,
    bool cubic,
    const at::Tensor& like,
    at::ScalarType type) {
  double step;
  if (type == at::kDouble) {
    if (align_corners) {
      step = output_size > 1 ? static_cast<double>(input_size - 1) / static_cast<double>(output_size - 1) : 0.0;
    } else {
      step = (scale.has_value() && *scale > 0.0) ? 1.0 / *scale
                                                 : static_cast<double>(input_size) / static_cast<double>(output_size);
    }
  } else if (align_corners) {
    step = output_size > 1 ? static_cast<double>(static_cast<float>(input_size - 1) / static_cast<float>(output_size - 1))
                           : 0.0;
  } else {
    step = static_cast<double>(source_scale(scale, input_size, output_size));
  }
  at::Tensor source = positions(output_size, like, type);
  if (align_corners) {
    return source * step;
  }
  source = (source + 0.5) * step - 0.5;
  return cubic ? source : source.clamp_min(0.0);
}

// PyTorch's `guard_index_and_lambda`: the tap below the source (at most the last index) and the
// fraction past it, in [0, 1].
std::pair<at::Tensor, at::Tensor> index_and_fraction(const at::Tensor& source, int64_t input_size, at::ScalarType type) {
  at::Tensor index = at::floor(source).to(at::kLong).clamp_max(input_size - 1);
  at::Tensor fraction = (source - index.to(type)).clamp(0.0, 1.0);
  return {index, fraction};
}

Taps linear_taps(
    int64_t input_size,
    int64_t output_size,
    bool align_corners,
    std::optional<double> scale,
    const at::Tensor& like) {
  at::ScalarType type = interpolation_type(like);
  at::Tensor source = source_positions(input_size, output_size, align_corners, scale, false, like, type);
  auto [low, lambda] = index_and_fraction(source, input_size, type);
  at::Tensor high = low + (low < input_size - 1).to(at::kLong);
  return {{low, high}, {1.0 - lambda, lambda}};
}

// Keys' cubic convolution with a = -0.75, as PyTorch's bicubic kernels use: four taps around the
// source, indices clamped to the edges.
Taps cubic_taps(
    int64_t input_size,
    int64_t output_size,
    bool align_corners,
    std::optional<double> scale,
    const at::Tensor& like) {
  at::ScalarType type = interpolation_type(like);
  at::Tensor source = source_positions(input_size, output_size, align_corners, scale, true, like, type);
  auto [base, t] = index_and_fraction(source, input_size, type);
  constexpr double a = -0.75;
  auto near = [&](const at::Tensor& x) { return ((x * (a + 2) - (a + 3)) * x * x) + 1; };
  auto far = [&](const at::Tensor& x) { return ((x * a - 5 * a) * x + 8 * a) * x - 4 * a; };
  Taps taps;
  taps.weight = {far(t + 1), near(t), near(1 - t), far(2 - t)};
  for (int64_t k = 0; k < 4; ++k) {
    taps.index.push_back((base + (k - 1)).clamp(0, input_size - 1));
  }
  return taps;
}

// `weights` ([n]) shaped to broadcast along `dim` of a `rank`-d tensor.
at::Tensor along(const at::Tensor& weights, int64_t dim, int64_t rank) {
  std::vector<int64_t> shape(rank, 1);
  shape[dim] = weights.size(0);
  return weights.view(shape);
}

at::Tensor interpolate(const at::Tensor& x, int64_t dim, const Taps& taps) {
  at::Tensor sum;
  for (size_t k = 0; k < taps.index.size(); ++k) {
    at::Tensor term = x.index_select(dim, taps.index[k]) * along(taps.weight[k], dim, x.dim());
    sum = k == 0 ? term : sum + term;
  }
  return sum;
}

// The adjoint of `interpolate`: each output gradient goes back to its taps.
at::Tensor interpolate_backward(
    const at::Tensor& grad,
    int64_t dim,
    int64_t input_size,
    const Taps& taps) {
  std::vector<int64_t> shape = grad.sizes().vec();
  shape[dim] = input_size;
  at::Tensor result;
  for (size_t k = 0; k < taps.index.size(); ++k) {
    at::Tensor weighted = grad * along(taps.weight[k], dim, grad.dim());
    if (k == 0) {
      result = at::zeros(shape, weighted.options());
    }
    result = result.index_add(dim, taps.index[k], weighted);
  }
  return result;
}

void check_resample(
    const char* op,
    const at::Tensor& self,
    int64_t spatial,
    at::IntArrayRef output_size) {
  TORCH_CHECK(
      self.dim() == spatial + 2,
      op,
      ": expected a ",
      spatial + 2,
      "-D input (batch, channels and ",
      spatial,
      " spatial dims), but got a tensor of shape ",
      self.sizes());
  TORCH_CHECK(
      static_cast<int64_t>(output_size.size()) == spatial,
      op,
      ": expected ",
      spatial,
      " output sizes, but got ",
      output_size);
  for (int64_t i = 0; i < spatial; ++i) {
    TORCH_CHECK(
        self.size(i + 2) > 0 && output_size[i] > 0,
        op,
        ": input and output sizes should be greater than 0, but got input (",
        self.sizes(),
        ") output (",
        output_size,
        ")");
  }
}

// ----- nearest ----------------------------------------------------------------------------------

at::Tensor upsample_nearest(
    const char* op,
    const at::Tensor& self,
    at::IntArrayRef output_size,
    const std::vector<std::optional<double>>& scales,
    bool exact) {
  int64_t spatial = static_cast<int64_t>(scales.size());
  check_resample(op, self, spatial, output_size);
  at::Tensor result = self;
  for (int64_t i = 0; i < spatial; ++i) {
    int64_t dim = i + 2;
    if (self.size(dim) == output_size[i]) {
      continue;
    }
    result = result.index_select(
        dim, nearest_source(self.size(dim), output_size[i], scales[i], exact, self));
  }
  // A channels-last input gives a channels-last result, as on the CPU.
  return result.is_same(self) ? self.clone(self.suggest_memory_format())
                              : result.contiguous(self.suggest_memory_format());
}

at::Tensor upsample_nearest_backward(
    const at::Tensor& grad_output,
    at::IntArrayRef input_size,
    const std::vector<std::optional<double>>& scales,
    bool exact) {
  int64_t spatial = static_cast<int64_t>(scales.size());
  TORCH_CHECK(
      static_cast<int64_t>(input_size.size()) == spatial + 2 && grad_output.dim() == spatial + 2,
      "upsample_nearest_backward: expected a ",
      spatial + 2,
      "-D gradient and input size, but got a gradient of shape ",
      grad_output.sizes(),
      " and input size ",
      input_size);
  at::Tensor grad = grad_output;
  for (int64_t i = spatial - 1; i >= 0; --i) {
    int64_t dim = i + 2;
    int64_t in = input_size[dim];
    int64_t out = grad_output.size(dim);
    if (in == out) {
      continue;
    }
    grad = scatter_back(grad, dim, in, nearest_source(in, out, scales[i], exact, grad_output));
  }
  return grad.is_same(grad_output) ? grad_output.clone() : grad;
}

// ----- linear -----------------------------------------------------------------------------------

at::Tensor upsample_linear(
    const char* op,
    const at::Tensor& self,
    at::IntArrayRef output_size,
    bool align_corners,
    const std::vector<std::optional<double>>& scales,
    bool cubic = false) {
  int64_t spatial = static_cast<int64_t>(scales.size());
  check_resample(op, self, spatial, output_size);
  // Interpolated in float (bfloat16 and half in float, as PyTorch's CPU kernels do, double in
  // double), rounded once.
  at::Tensor result = self;
  for (int64_t i = spatial - 1; i >= 0; --i) {
    int64_t dim = i + 2;
    auto taps = cubic ? cubic_taps : linear_taps;
    result = interpolate(result, dim, taps(self.size(dim), output_size[i], align_corners, scales[i], self));
  }
  return result.to(self.scalar_type()).contiguous(self.suggest_memory_format());
}

// uint8 images: PyTorch's CPU kernel interpolates them with its own fixed-point rounding, which
// only the CPU reproduces, so that case goes to the CPU (counted as a fallback).
template <typename Call>
at::Tensor linear_on_the_cpu(const char* op, const at::Tensor& self, Call call) {
  note_kernel_cpu_fallback(
      std::string("aten::") + op + " for " + c10::toString(self.scalar_type()) + " inputs");
  return call(self.cpu()).to(self.device());
}

at::Tensor upsample_linear_backward(
    const at::Tensor& grad_output,
    at::IntArrayRef input_size,
    bool align_corners,
    const std::vector<std::optional<double>>& scales,
    bool cubic = false) {
  int64_t spatial = static_cast<int64_t>(scales.size());
  TORCH_CHECK(
      static_cast<int64_t>(input_size.size()) == spatial + 2 && grad_output.dim() == spatial + 2,
      "upsample_linear_backward: expected a ",
      spatial + 2,
      "-D gradient and input size, but got a gradient of shape ",
      grad_output.sizes(),
      " and input size ",
      input_size);
  at::Tensor grad = grad_output;
  for (int64_t i = 0; i < spatial; ++i) {
    int64_t dim = i + 2;
    int64_t in = input_size[dim];
    auto taps = cubic ? cubic_taps : linear_taps;
    grad = interpolate_backward(grad, dim, in, taps(in, grad_output.size(dim), align_corners, scales[i], grad_output));
  }
  return grad.to(grad_output.scalar_type());
}

using Scale = std::optional<double>;

// The linear kinds' kernels: a floating-point image on the device, an integer one on the CPU.
at::Tensor pjrt_upsample_linear1d(
    const at::Tensor& self, c10::SymIntArrayRef size, bool align_corners, Scale s) {
  if (!at::isFloatingType(self.scalar_type())) {
    return linear_on_the_cpu("upsample_linear1d", self, [&](const at::Tensor& x) {
      return at::upsample_linear1d_symint(x, size, align_corners, s);
    });
  }
  return upsample_linear("upsample_linear1d", self, ints(size), align_corners, {s});
}

at::Tensor pjrt_upsample_bilinear2d(
    const at::Tensor& self, c10::SymIntArrayRef size, bool align_corners, Scale h, Scale w) {
  if (!at::isFloatingType(self.scalar_type())) {
    return linear_on_the_cpu("upsample_bilinear2d", self, [&](const at::Tensor& x) {
      return at::upsample_bilinear2d_symint(x, size, align_corners, h, w);
    });
  }
  return upsample_linear("upsample_bilinear2d", self, ints(size), align_corners, {h, w});
}

at::Tensor pjrt_upsample_trilinear3d(
    const at::Tensor& self, c10::SymIntArrayRef size, bool align_corners, Scale d, Scale h, Scale w) {
  if (!at::isFloatingType(self.scalar_type())) {
    return linear_on_the_cpu("upsample_trilinear3d", self, [&](const at::Tensor& x) {
      return at::upsample_trilinear3d_symint(x, size, align_corners, d, h, w);
    });
  }
  return upsample_linear("upsample_trilinear3d", self, ints(size), align_corners, {d, h, w});
}

at::Tensor pjrt_upsample_bicubic2d(
    const at::Tensor& self, c10::SymIntArrayRef size, bool align_corners, Scale h, Scale w) {
  if (!at::isFloatingType(self.scalar_type())) {
    return linear_on_the_cpu("upsample_bicubic2d", self, [&](const at::Tensor& x) {
      return at::upsample_bicubic2d_symint(x, size, align_corners, h, w);
    });
  }
  return upsample_linear("upsample_bicubic2d", self, ints(size), align_corners, {h, w}, true);
}

// ----- antialiased (PIL-style) resampling ------------------------------------------------------

// The taps of an antialiased resize along one dim, as PyTorch's `_upsample_*_aa` kernels
// define them: output i is centred at scale * (i + 1/2) in the input; when shrinking
// (scale >= 1) the filter is stretched by the scale, so every input pixel under it counts. The
// weights are the filter at each input pixel's centre, normalized to sum to one; a pixel past
// an output's window takes weight 0. They depend only on the sizes, so they are made on the host.
Taps antialias_taps(
    int64_t input_size,
    int64_t output_size,
    bool align_corners,
    std::optional<double> scale_factor,
    const at::Tensor& like,
    bool cubic) {
  double scale;
  if (align_corners) {
    scale = output_size > 1 ? static_cast<double>(input_size - 1) / static_cast<double>(output_size - 1) : 0.0;
  } else {
    scale = (scale_factor.has_value() && *scale_factor > 0.0)
        ? 1.0 / *scale_factor
        : static_cast<double>(input_size) / static_cast<double>(output_size);
  }
  const double half_width = cubic ? 2.0 : 1.0;
  const double support = scale >= 1.0 ? half_width * scale : half_width;
  const double inverse = scale >= 1.0 ? 1.0 / scale : 1.0;
  // Triangle (bilinear), or Keys' cubic with a = -1/2 (what PIL uses).
  auto filter = [cubic](double x) {
    x = std::abs(x);
    if (!cubic) {
      return x < 1.0 ? 1.0 - x : 0.0;
    }
    constexpr double a = -0.5;
    if (x < 1.0) {
      return ((a + 2) * x - (a + 3)) * x * x + 1;
    }
    if (x < 2.0) {
      return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    }
    return 0.0;
  };
  std::vector<int64_t> first(output_size), count(output_size);
  int64_t width = 1;
  for (int64_t i = 0; i < output_size; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    first[i] = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    count[i] = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), input_size) - first[i];
    width = std::max(width, count[i]);
  }
  std::vector<std::vector<int64_t>> index(width, std::vector<int64_t>(output_size));
  std::vector<std::vector<double>> weight(width, std::vector<double>(output_size, 0.0));
  for (int64_t i = 0; i < output_size; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    double total = 0.0;
    for (int64_t j = 0; j < width; ++j) {
      index[j][i] = j < count[i] ? first[i] + j : std::max<int64_t>(first[i], 0);
      if (j < count[i]) {
        weight[j][i] = filter((static_cast<double>(j + first[i]) - center + 0.5) * inverse);
        total += weight[j][i];
      }
    }
    if (total != 0.0) {
      for (int64_t j = 0; j < count[i]; ++j) {
        weight[j][i] /= total;
      }
    }
  }
  const at::ScalarType type = interpolation_type(like);
  Taps taps;
  for (int64_t j = 0; j < width; ++j) {
    taps.index.push_back(at::tensor(index[j], at::kLong).to(like.device()));
    taps.weight.push_back(at::tensor(weight[j], at::kDouble).to(type).to(like.device()));
  }
  return taps;
}

at::Tensor upsample_antialias(
    const char* op,
    const at::Tensor& self,
    at::IntArrayRef output_size,
    bool align_corners,
    const std::vector<std::optional<double>>& scales,
    bool cubic) {
  check_resample(op, self, 2, output_size);
  // PyTorch's kernels compute the taps in float32 and float64 only.
  TORCH_CHECK_NOT_IMPLEMENTED(
      !at::isReducedFloatingType(self.scalar_type()),
      "\"", op, "\" not implemented for '", c10::toString(self.scalar_type()), "'");
  at::Tensor result = self.to(interpolation_type(self));
  for (int64_t i = 1; i >= 0; --i) {
    const int64_t dim = i + 2;
    result = interpolate(
        result, dim, antialias_taps(self.size(dim), output_size[i], align_corners, scales[i], self, cubic));
  }
  return result.to(self.scalar_type()).contiguous(self.suggest_memory_format());
}

at::Tensor upsample_antialias_backward(
    const at::Tensor& grad_output,
    at::IntArrayRef input_size,
    bool align_corners,
    const std::vector<std::optional<double>>& scales,
    bool cubic) {
  TORCH_CHECK(
      input_size.size() == 4 && grad_output.dim() == 4,
      "upsample antialias backward: expected a 4-D gradient and input size, but got a gradient of shape ",
      grad_output.sizes(), " and input size ", input_size);
  TORCH_CHECK_NOT_IMPLEMENTED(
      !at::isReducedFloatingType(grad_output.scalar_type()),
      "\"upsample antialias backward\" not implemented for '", c10::toString(grad_output.scalar_type()), "'");
  at::Tensor grad = grad_output.to(interpolation_type(grad_output));
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t dim = i + 2;
    const int64_t in = input_size[dim];
    grad = interpolate_backward(
        grad, dim, in, antialias_taps(in, grad_output.size(dim), align_corners, scales[i], grad_output, cubic));
  }
  return grad.to(grad_output.scalar_type());
}

at::Tensor pjrt_upsample_bilinear2d_aa(
    const at::Tensor& self, c10::SymIntArrayRef size, bool align_corners, Scale h, Scale w) {
  if (!at::isFloatingType(self.scalar_type())) {
    return linear_on_the_cpu("_upsample_bilinear2d_aa", self, [&](const at::Tensor& x) {
      return at::_upsample_bilinear2d_aa_symint(x, size, align_corners, h, w);
    });
  }
  return upsample_antialias("_upsample_bilinear2d_aa", self, ints(size), align_corners, {h, w}, false);
}

at::Tensor pjrt_upsample_bicubic2d_aa(
    const at::Tensor& self, c10::SymIntArrayRef size, bool align_corners, Scale h, Scale w) {
  if (!at::isFloatingType(self.scalar_type())) {
    return linear_on_the_cpu("_upsample_bicubic2d_aa", self, [&](const at::Tensor& x) {
      return at::_upsample_bicubic2d_aa_symint(x, size, align_corners, h, w);
    });
  }
  return upsample_antialias("_upsample_bicubic2d_aa", self, ints(size), align_corners, {h, w}, true);
}

constexpr int64_t kBilinear = 0, kNearest = 1, kBicubic = 2;
constexpr int64_t kZeros = 0, kBorder = 1, kReflection = 2;

at::Tensor constant_like(const at::Tensor& like, double value) {
  return at::scalar_tensor(value, like.options());
}

// From [-1, 1] to pixel coordinates.
at::Tensor unnormalize(const at::Tensor& coord, int64_t size, bool align_corners) {
  if (align_corners) {
    return (coord + 1) / 2 * static_cast<double>(size - 1);
  }
  return ((coord + 1) * static_cast<double>(size) - 1) / 2;
}

// Into [0, size - 1]; the gradient is 0 at and beyond the bounds, and a NaN goes to 0, as in the
// CPU kernel.
at::Tensor clip(const at::Tensor& coord, int64_t size) {
  at::Tensor limit = constant_like(coord, static_cast<double>(size - 1));
  return at::where(coord > 0, at::where(coord >= limit, limit, coord), constant_like(coord, 0));
}

// Reflects `coord` into [twice_low / 2, twice_high / 2] by bouncing off the bounds.
at::Tensor reflect(const at::Tensor& coord, int64_t twice_low, int64_t twice_high) {
  if (twice_low == twice_high) {
    return at::zeros_like(coord);
  }
  double low = twice_low / 2.0;
  double span = (twice_high - twice_low) / 2.0;
  at::Tensor d = coord - low;
  d = at::where(d < 0, -d, d);
  at::Tensor extra = at::fmod(d, span);
  at::Tensor flips = at::floor(d / span);
  at::Tensor even = at::fmod(flips, 2) == 0;
  return at::where(even, extra + low, (span - extra) + low);
}

// The source coordinate a padding mode reads for `coord`.
at::Tensor pad_coordinate(const at::Tensor& coord, int64_t size, int64_t padding, bool align_corners) {
  if (padding == kBorder) {
    return clip(coord, size);
  }
  if (padding == kReflection) {
    at::Tensor reflected = align_corners ? reflect(coord, 0, 2 * (size - 1))
                                         : reflect(coord, -1, 2 * size - 1);
    return clip(reflected, size);
  }
  return coord;
}

// Reads input[n, :, y, x] for integer-valued float coordinates (N, OH, OW): (N, C, OH, OW), 0
// where (x, y) lies outside the image (NaN coordinates included).
struct Image {
  at::Tensor flat;  // (N, C, H * W)
  int64_t c, h, w;

  at::Tensor read(const at::Tensor& x, const at::Tensor& y) const {
    at::Tensor inside = (x >= 0).logical_and(x <= static_cast<double>(w - 1))
                            .logical_and(y >= 0).logical_and(y <= static_cast<double>(h - 1));
    // Indices from clamped coordinates, so that a far or NaN coordinate converts safely.
    at::Tensor xi = at::where(inside, x, constant_like(x, 0)).to(at::kLong);
    at::Tensor yi = at::where(inside, y, constant_like(y, 0)).to(at::kLong);
    at::Tensor index = (yi * w + xi).flatten(1);  // (N, OH * OW)
    int64_t n = index.size(0);
    at::Tensor values = flat.gather(2, index.unsqueeze(1).expand({n, c, index.size(1)}));
    values = values.view({n, c, x.size(1), x.size(2)});
    return at::where(inside.unsqueeze(1), values, at::zeros({}, values.options()));
  }
};

at::Tensor sample_bilinear(const Image& img, const at::Tensor& ix, const at::Tensor& iy) {
  at::Tensor ix_nw = at::floor(ix), iy_nw = at::floor(iy);
  at::Tensor ix_se = ix_nw + 1, iy_se = iy_nw + 1;
  // The CPU kernel's corner weights, term for term.
  at::Tensor nw = (ix_se - ix) * (iy_se - iy);
  at::Tensor ne = (ix - ix_nw) * (iy_se - iy);
  at::Tensor sw = (ix_se - ix) * (iy - iy_nw);
  at::Tensor se = (ix - ix_nw) * (iy - iy_nw);
  return img.read(ix_nw, iy_nw) * nw.unsqueeze(1) + img.read(ix_se, iy_nw) * ne.unsqueeze(1) +
      img.read(ix_nw, iy_se) * sw.unsqueeze(1) + img.read(ix_se, iy_se) * se.unsqueeze(1);
}

// Keys' cubic convolution weights (A = -0.75) of the four taps around fraction t.
std::array<at::Tensor, 4> cubic_weights(const at::Tensor& t) {
  constexpr double A = -0.75;
  auto near = [](const at::Tensor& x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
  auto far = [](const at::Tensor& x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
  at::Tensor rest = 1 - t;
  return {far(t + 1), near(t), near(rest), far(rest + 1)};
}

at::Tensor sample_bicubic(
    const Image& img,
    const at::Tensor& gx,
    const at::Tensor& gy,
    int64_t padding,
    bool align_corners) {
  // Bicubic taps are padded one by one, from the unpadded coordinate.
  at::Tensor ix = unnormalize(gx, img.w, align_corners);
  at::Tensor iy = unnormalize(gy, img.h, align_corners);
  at::Tensor ix_nw = at::floor(ix), iy_nw = at::floor(iy);
  std::array<at::Tensor, 4> wx = cubic_weights(ix - ix_nw);
  std::array<at::Tensor, 4> wy = cubic_weights(iy - iy_nw);
  at::Tensor out;
  for (int64_t j = 0; j < 4; ++j) {
    at::Tensor y = pad_coordinate(iy_nw + static_cast<double>(j - 1), img.h, padding, align_corners);
    at::Tensor row;
    for (int64_t i = 0; i < 4; ++i) {
      at::Tensor x = pad_coordinate(ix_nw + static_cast<double>(i - 1), img.w, padding, align_corners);
      // The CPU kernel truncates padded tap coordinates to integers.
      at::Tensor tap = img.read(at::trunc(x), at::trunc(y)) * wx[i].unsqueeze(1);
      row = i == 0 ? tap : row + tap;
    }
    at::Tensor term = row * wy[j].unsqueeze(1);
    out = j == 0 ? term : out + term;
  }
  return out;
}

// The checks both grid samplers make first, in PyTorch's order and words: floating-point images
// only, an `(N, C, spatial...)` input with a grid of `(N, spatial_out..., spatial)` points (the
// grid's shape spelled out in `grid_shape`), one batch size and one dtype for both.
void check_grid_sampler(
    const char* name,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t spatial,
    const char* grid_shape) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      at::isFloatingType(input.scalar_type()),
      "\"", name, "\" not implemented for '", c10::toString(input.scalar_type()), "'");
  TORCH_CHECK(
      input.dim() == spatial + 2 && grid.dim() == spatial + 2 && grid.size(spatial + 1) == spatial, name,
      "(): expected a ", spatial + 2, "-D input and a grid of shape ", grid_shape, ", but got "
      "input of shape ", input.sizes(), " and grid of shape ", grid.sizes());
  TORCH_CHECK(
      input.size(0) == grid.size(0),
      "grid_sampler(): expected grid and input to have same batch size, but got input with sizes ",
      input.sizes(), " and grid with sizes ", grid.sizes());
  TORCH_CHECK(
      input.scalar_type() == grid.scalar_type(),
      "grid_sampler(): expected input and grid to have same dtype, but input has ",
      input.scalar_type(), " and grid has ", grid.scalar_type());
}

// Zero with a gradient of one with respect to `t` where it is finite: nearest sampling scales its
// values by 1 plus these, so the grid's gradient is zero, not absent.
at::Tensor zero_through(const at::Tensor& t) {
  return at::where(at::isfinite(t), t - t.detach(), at::zeros({}, t.options()));
}

at::Tensor pjrt_grid_sampler_2d(
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  check_grid_sampler("grid_sampler_2d", input, grid, 2, "(N, H_out, W_out, 2)");
  TORCH_CHECK(
      interpolation_mode >= kBilinear && interpolation_mode <= kBicubic,
      "grid_sampler_2d(): unknown interpolation mode ", interpolation_mode);
  TORCH_CHECK(
      padding_mode >= kZeros && padding_mode <= kReflection,
      "grid_sampler_2d(): unknown padding mode ", padding_mode);
  int64_t n = input.size(0), c = input.size(1), h = input.size(2), w = input.size(3);
  if (input.numel() == 0 || grid.numel() == 0) {
    return at::zeros({n, c, grid.size(1), grid.size(2)}, input.options());
  }
  Image img{input.reshape({n, c, h * w}), c, h, w};
  at::Tensor gx = grid.select(3, 0), gy = grid.select(3, 1);
  if (interpolation_mode == kBicubic) {
    return sample_bicubic(img, gx, gy, padding_mode, align_corners);
  }
  at::Tensor ix = pad_coordinate(unnormalize(gx, w, align_corners), w, padding_mode, align_corners);
  at::Tensor iy = pad_coordinate(unnormalize(gy, h, align_corners), h, padding_mode, align_corners);
  if (interpolation_mode == kNearest) {
    // Halves round to even, as `std::nearbyint` does.
    at::Tensor x = at::round(ix), y = at::round(iy);
    // The grid's gradient is zero, not absent (as on the CPU): the values are scaled by a one
    // whose gradient with respect to the rounded coordinates is one (and `round`'s is zero).
    at::Tensor one = 1 + zero_through(x) + zero_through(y);
    return img.read(x, y) * one.unsqueeze(1);
  }
  return sample_bilinear(img, ix, iy);
}

// A batch of volumes, `(N, C, D * H * W)`, read at integer voxel coordinates (zero outside).
struct Volume {
  at::Tensor flat;
  int64_t c, d, h, w;

  at::Tensor read(const at::Tensor& x, const at::Tensor& y, const at::Tensor& z) const {
    at::Tensor inside = (x >= 0).logical_and(x <= static_cast<double>(w - 1))
                            .logical_and(y >= 0).logical_and(y <= static_cast<double>(h - 1))
                            .logical_and(z >= 0).logical_and(z <= static_cast<double>(d - 1));
    at::Tensor xi = at::where(inside, x, constant_like(x, 0)).to(at::kLong);
    at::Tensor yi = at::where(inside, y, constant_like(y, 0)).to(at::kLong);
    at::Tensor zi = at::where(inside, z, constant_like(z, 0)).to(at::kLong);
    at::Tensor index = ((zi * h + yi) * w + xi).flatten(1);  // (N, OD * OH * OW)
    int64_t n = index.size(0);
    at::Tensor values = flat.gather(2, index.unsqueeze(1).expand({n, c, index.size(1)}));
    values = values.view({n, c, x.size(1), x.size(2), x.size(3)});
    return at::where(inside.unsqueeze(1), values, at::zeros({}, values.options()));
  }
};

// `grid_sampler_3d`: trilinear (the CPU kernel's eight corner weights, summed in its order) or
// nearest sampling of volumes at a grid of normalized (x, y, z) points, with the 2-d sampler's
// padding modes; above autograd, as the 2-d one.
at::Tensor pjrt_grid_sampler_3d(
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  check_grid_sampler("grid_sampler_3d", input, grid, 3, "(N, D_out, H_out, W_out, 3)");
  TORCH_CHECK(
      interpolation_mode != kBicubic, "grid_sampler(): bicubic interpolation only supports 4D input");
  TORCH_CHECK(
      interpolation_mode == kBilinear || interpolation_mode == kNearest,
      "grid_sampler_3d(): unknown interpolation mode ", interpolation_mode);
  TORCH_CHECK(
      padding_mode >= kZeros && padding_mode <= kReflection,
      "grid_sampler_3d(): unknown padding mode ", padding_mode);
  const int64_t n = input.size(0), c = input.size(1), d = input.size(2), h = input.size(3), w = input.size(4);
  if (input.numel() == 0 || grid.numel() == 0) {
    return at::zeros({n, c, grid.size(1), grid.size(2), grid.size(3)}, input.options());
  }
  Volume vol{input.reshape({n, c, d * h * w}), c, d, h, w};
  at::Tensor ix = pad_coordinate(unnormalize(grid.select(4, 0), w, align_corners), w, padding_mode, align_corners);
  at::Tensor iy = pad_coordinate(unnormalize(grid.select(4, 1), h, align_corners), h, padding_mode, align_corners);
  at::Tensor iz = pad_coordinate(unnormalize(grid.select(4, 2), d, align_corners), d, padding_mode, align_corners);
  if (interpolation_mode == kNearest) {
    at::Tensor x = at::round(ix), y = at::round(iy), z = at::round(iz);
    at::Tensor one = 1 + zero_through(x) + zero_through(y) + zero_through(z);
    return vol.read(x, y, z) * one.unsqueeze(1);
  }
  const at::Tensor x0 = at::floor(ix), y0 = at::floor(iy), z0 = at::floor(iz);
  const at::Tensor x1 = x0 + 1, y1 = y0 + 1, z1 = z0 + 1;
  const std::array<at::Tensor, 2> xs = {x0, x1}, ys = {y0, y1}, zs = {z0, z1};
  const std::array<at::Tensor, 2> wx = {x1 - ix, ix - x0}, wy = {y1 - iy, iy - y0}, wz = {z1 - iz, iz - z0};
  at::Tensor out;
  // Corners top (z0) then bottom (z1); in each, north-west, north-east, south-west, south-east.
  for (int k = 0; k < 2; ++k) {
    for (int j = 0; j < 2; ++j) {
      for (int i = 0; i < 2; ++i) {
        const at::Tensor weight = wx[i] * wy[j] * wz[k];
        const at::Tensor term = vol.read(xs[i], ys[j], zs[k]) * weight.unsqueeze(1);
        out = out.defined() ? out + term : term;
      }
    }
  }
  return out;
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/resample_kernels.inc"

}  // namespace torch_pjrt
