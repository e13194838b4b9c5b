// Resampling and padding kernels composed from device ops (RFC 0019): nearest and
// nearest-exact upsampling in 1, 2 and 3 dims, linear, bilinear, trilinear and bicubic upsampling, and reflection
// and replication padding in 1, 2 and 3 dims, each with its backward op. The forward ops of 1-d
// nearest and nearest-exact upsampling and of 1-d replication padding are PyTorch's
// decompositions instead (RFC 0045); their backward ops are here.
//
// Every one of them is a gather along each resampled dim: the source positions (and for linear
// upsampling the two taps' weights) come from an `arange` on the device, with PyTorch's CPU
// kernels' float arithmetic, so nothing is uploaded and a region stays whole. The backward ops
// scatter-add the gradient through the same positions (`index_add`), dim by dim in reverse.
#include <ATen/ATen.h>
#include <c10/core/SymIntArrayRef.h>
#include <torch/library.h>

#include "pjrt_backend.h"

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

at::Tensor scatter_back(
    const at::Tensor& grad,
    int64_t dim,
    int64_t input_size,
    const at::Tensor& source) {
  std::vector<int64_t> shape = grad.sizes().vec();
  shape[dim] = input_size;
  return at::zeros(shape, grad.options()).index_add(dim, source, grad);
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

std::vector<int64_t> ints(c10::SymIntArrayRef sizes) {
  return C10_AS_INTARRAYREF_SLOW(sizes).vec();
}

using Scale = std::optional<double>;

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // nearest
  m.impl(
      "upsample_nearest2d",
      [](const at::Tensor& self, c10::SymIntArrayRef size, Scale h, Scale w) {
        return upsample_nearest("upsample_nearest2d", self, ints(size), {h, w}, false);
      });
  m.impl(
      "upsample_nearest2d.out",
      [](const at::Tensor& self, c10::SymIntArrayRef size, Scale h, Scale w, at::Tensor& out)
          -> at::Tensor& {
        return write_out(upsample_nearest("upsample_nearest2d", self, ints(size), {h, w}, false), out);
      });
  m.impl(
      "upsample_nearest3d",
      [](const at::Tensor& self, c10::SymIntArrayRef size, Scale d, Scale h, Scale w) {
        return upsample_nearest("upsample_nearest3d", self, ints(size), {d, h, w}, false);
      });
  m.impl(
      "upsample_nearest3d.out",
      [](const at::Tensor& self, c10::SymIntArrayRef size, Scale d, Scale h, Scale w, at::Tensor& out)
          -> at::Tensor& {
        return write_out(
            upsample_nearest("upsample_nearest3d", self, ints(size), {d, h, w}, false), out);
      });
  m.impl(
      "_upsample_nearest_exact2d",
      [](const at::Tensor& self, c10::SymIntArrayRef size, Scale h, Scale w) {
        return upsample_nearest("_upsample_nearest_exact2d", self, ints(size), {h, w}, true);
      });
  m.impl(
      "_upsample_nearest_exact3d",
      [](const at::Tensor& self, c10::SymIntArrayRef size, Scale d, Scale h, Scale w) {
        return upsample_nearest("_upsample_nearest_exact3d", self, ints(size), {d, h, w}, true);
      });
  m.impl(
      "upsample_nearest1d_backward",
      [](const at::Tensor& grad, c10::SymIntArrayRef, c10::SymIntArrayRef input_size, Scale s) {
        return upsample_nearest_backward(grad, ints(input_size), {s}, false);
      });
  m.impl(
      "upsample_nearest2d_backward",
      [](const at::Tensor& grad, c10::SymIntArrayRef, c10::SymIntArrayRef input_size, Scale h, Scale w) {
        return upsample_nearest_backward(grad, ints(input_size), {h, w}, false);
      });
  m.impl(
      "upsample_nearest3d_backward",
      [](const at::Tensor& grad,
         c10::SymIntArrayRef,
         c10::SymIntArrayRef input_size,
         Scale d,
         Scale h,
         Scale w) { return upsample_nearest_backward(grad, ints(input_size), {d, h, w}, false); });
  m.impl(
      "_upsample_nearest_exact1d_backward",
      [](const at::Tensor& grad, c10::SymIntArrayRef, c10::SymIntArrayRef input_size, Scale s) {
        return upsample_nearest_backward(grad, ints(input_size), {s}, true);
      });
  m.impl(
      "_upsample_nearest_exact2d_backward",
      [](const at::Tensor& grad, c10::SymIntArrayRef, c10::SymIntArrayRef input_size, Scale h, Scale w) {
        return upsample_nearest_backward(grad, ints(input_size), {h, w}, true);
      });
  m.impl(
      "_upsample_nearest_exact3d_backward",
      [](const at::Tensor& grad,
         c10::SymIntArrayRef,
         c10::SymIntArrayRef input_size,
         Scale d,
         Scale h,
         Scale w) { return upsample_nearest_backward(grad, ints(input_size), {d, h, w}, true); });

  // linear
  m.impl(
      "upsample_linear1d",
      [](const at::Tensor& self, c10::SymIntArrayRef size, bool align_corners, Scale s) {
        if (!at::isFloatingType(self.scalar_type())) {
          return linear_on_the_cpu("upsample_linear1d", self, [&](const at::Tensor& x) {
            return at::upsample_linear1d_symint(x, size, align_corners, s);
          });
        }
        return upsample_linear("upsample_linear1d", self, ints(size), align_corners, {s});
      });
  m.impl(
      "upsample_linear1d.out",
      [](const at::Tensor& self, c10::SymIntArrayRef size, bool align_corners, Scale s, at::Tensor& out)
          -> at::Tensor& {
        return write_out(at::upsample_linear1d_symint(self, size, align_corners, s), out);
      });
  m.impl(
      "upsample_bilinear2d",
      [](const at::Tensor& self, c10::SymIntArrayRef size, bool align_corners, Scale h, Scale w) {
        if (!at::isFloatingType(self.scalar_type())) {
          return linear_on_the_cpu("upsample_bilinear2d", self, [&](const at::Tensor& x) {
            return at::upsample_bilinear2d_symint(x, size, align_corners, h, w);
          });
        }
        return upsample_linear("upsample_bilinear2d", self, ints(size), align_corners, {h, w});
      });
  m.impl(
      "upsample_bilinear2d.out",
      [](const at::Tensor& self,
         c10::SymIntArrayRef size,
         bool align_corners,
         Scale h,
         Scale w,
         at::Tensor& out) -> at::Tensor& {
        return write_out(at::upsample_bilinear2d_symint(self, size, align_corners, h, w), out);
      });
  m.impl(
      "upsample_trilinear3d",
      [](const at::Tensor& self, c10::SymIntArrayRef size, bool align_corners, Scale d, Scale h, Scale w) {
        if (!at::isFloatingType(self.scalar_type())) {
          return linear_on_the_cpu("upsample_trilinear3d", self, [&](const at::Tensor& x) {
            return at::upsample_trilinear3d_symint(x, size, align_corners, d, h, w);
          });
        }
        return upsample_linear("upsample_trilinear3d", self, ints(size), align_corners, {d, h, w});
      });
  m.impl(
      "upsample_trilinear3d.out",
      [](const at::Tensor& self,
         c10::SymIntArrayRef size,
         bool align_corners,
         Scale d,
         Scale h,
         Scale w,
         at::Tensor& out) -> at::Tensor& {
        return write_out(at::upsample_trilinear3d_symint(self, size, align_corners, d, h, w), out);
      });
  m.impl(
      "upsample_trilinear3d_backward",
      [](const at::Tensor& grad,
         c10::SymIntArrayRef,
         c10::SymIntArrayRef input_size,
         bool align_corners,
         Scale d,
         Scale h,
         Scale w) {
        return upsample_linear_backward(grad, ints(input_size), align_corners, {d, h, w});
      });
  m.impl(
      "upsample_bicubic2d",
      [](const at::Tensor& self, c10::SymIntArrayRef size, bool align_corners, Scale h, Scale w) {
        if (!at::isFloatingType(self.scalar_type())) {
          return linear_on_the_cpu("upsample_bicubic2d", self, [&](const at::Tensor& x) {
            return at::upsample_bicubic2d_symint(x, size, align_corners, h, w);
          });
        }
        return upsample_linear("upsample_bicubic2d", self, ints(size), align_corners, {h, w}, true);
      });
  m.impl(
      "upsample_bicubic2d.out",
      [](const at::Tensor& self,
         c10::SymIntArrayRef size,
         bool align_corners,
         Scale h,
         Scale w,
         at::Tensor& out) -> at::Tensor& {
        return write_out(at::upsample_bicubic2d_symint(self, size, align_corners, h, w), out);
      });
  m.impl(
      "upsample_bicubic2d_backward",
      [](const at::Tensor& grad,
         c10::SymIntArrayRef,
         c10::SymIntArrayRef input_size,
         bool align_corners,
         Scale h,
         Scale w) {
        return upsample_linear_backward(grad, ints(input_size), align_corners, {h, w}, true);
      });
  m.impl(
      "upsample_linear1d_backward",
      [](const at::Tensor& grad,
         c10::SymIntArrayRef,
         c10::SymIntArrayRef input_size,
         bool align_corners,
         Scale s) { return upsample_linear_backward(grad, ints(input_size), align_corners, {s}); });
  m.impl(
      "upsample_bilinear2d_backward",
      [](const at::Tensor& grad,
         c10::SymIntArrayRef,
         c10::SymIntArrayRef input_size,
         bool align_corners,
         Scale h,
         Scale w) {
        return upsample_linear_backward(grad, ints(input_size), align_corners, {h, w});
      });

  // padding; `replication_pad1d` itself is PyTorch's decomposition (torch_pjrt/_decompositions.py)
#define PJRT_PAD_BACKWARD_KERNELS(name, mode, spatial)                                             \
  m.impl(                                                                                         \
      #name "_backward",                                                                          \
      [](const at::Tensor& grad, const at::Tensor& self, c10::SymIntArrayRef padding) {           \
        return pad_backward(mode, spatial, grad, self, ints(padding));                            \
      });                                                                                         \
  m.impl(                                                                                         \
      #name "_backward.grad_input",                                                               \
      [](const at::Tensor& grad,                                                                  \
         const at::Tensor& self,                                                                  \
         c10::SymIntArrayRef padding,                                                             \
         at::Tensor& grad_input) -> at::Tensor& {                                                 \
        return write_out(pad_backward(mode, spatial, grad, self, ints(padding)), grad_input);     \
      });
#define PJRT_PAD_KERNELS(name, mode, spatial)                                                      \
  m.impl(#name, [](const at::Tensor& self, c10::SymIntArrayRef padding) {                         \
    return pad(mode, spatial, self, ints(padding));                                               \
  });                                                                                             \
  m.impl(                                                                                         \
      #name ".out",                                                                               \
      [](const at::Tensor& self, c10::SymIntArrayRef padding, at::Tensor& out) -> at::Tensor& {   \
        return write_out(pad(mode, spatial, self, ints(padding)), out);                           \
      });                                                                                         \
  PJRT_PAD_BACKWARD_KERNELS(name, mode, spatial)
  PJRT_PAD_KERNELS(reflection_pad1d, PadMode::Reflect, 1)
  PJRT_PAD_KERNELS(reflection_pad2d, PadMode::Reflect, 2)
  PJRT_PAD_KERNELS(reflection_pad3d, PadMode::Reflect, 3)
  PJRT_PAD_BACKWARD_KERNELS(replication_pad1d, PadMode::Replicate, 1)
  PJRT_PAD_KERNELS(replication_pad2d, PadMode::Replicate, 2)
  PJRT_PAD_KERNELS(replication_pad3d, PadMode::Replicate, 3)
#undef PJRT_PAD_KERNELS
#undef PJRT_PAD_BACKWARD_KERNELS
}

}  // namespace torch_pjrt
