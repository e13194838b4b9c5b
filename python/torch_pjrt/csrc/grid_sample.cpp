// `grid_sampler_2d` (`F.grid_sample` on 4-d inputs) composed from pjrt ops: bilinear, nearest and
// bicubic sampling with zeros, border and reflection padding, following the formulas of
// PyTorch's CPU kernel (GridSampler.h) step by step.
//
// The kernel is registered for autograd too (AutogradPrivateUse1), so its gradients with respect
// to the input and the grid come from autograd through the same ops. Where the CPU kernel's
// hand-written gradient is one-sided (a clipped coordinate has gradient 0 at the clip bounds, a
// reflection flips the sign only below the axis) the composition uses `where` instead of
// `clamp`/`abs`, whose gradients differ exactly there.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "pjrt_backend.h"

#include <array>
#include <vector>

namespace torch_pjrt {
namespace {

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

at::Tensor pjrt_grid_sampler_2d(
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  TORCH_CHECK(
      input.dim() == 4 && grid.dim() == 4 && grid.size(3) == 2,
      "grid_sampler_2d(): expected a 4-D input and a grid of shape (N, H_out, W_out, 2), but got "
      "input of shape ", input.sizes(), " and grid of shape ", grid.sizes());
  TORCH_CHECK(
      input.size(0) == grid.size(0),
      "grid_sampler(): expected grid and input to have same batch size, but got input with sizes ",
      input.sizes(), " and grid with sizes ", grid.sizes());
  TORCH_CHECK(
      input.scalar_type() == grid.scalar_type(),
      "grid_sampler(): expected input and grid to have same dtype, but input has ",
      input.scalar_type(), " and grid has ", grid.scalar_type());
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
    auto zero_through = [](const at::Tensor& t) {
      return at::where(at::isfinite(t), t - t.detach(), at::zeros({}, t.options()));
    };
    at::Tensor one = 1 + zero_through(x) + zero_through(y);
    return img.read(x, y) * one.unsqueeze(1);
  }
  return sample_bilinear(img, ix, iy);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("grid_sampler_2d", TORCH_FN(pjrt_grid_sampler_2d));
}

// Above autograd: the composition records its own gradients.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("grid_sampler_2d", TORCH_FN(pjrt_grid_sampler_2d));
}

}  // namespace torch_pjrt
