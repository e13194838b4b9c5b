// Convolution's sliding windows composed from device ops (RFC 0019): `im2col` and `col2im`
// (`F.unfold`, `F.fold`), one strided slice per kernel offset, and `Tensor.unfold`, a strided view
// through PyTorch's own kernel over pjrt's `as_strided` (its gradient is PyTorch's decomposition).
#include <ATen/ATen.h>
#include <ATen/ops/unfold_native.h>
#include <torch/library.h>

#include "composites.h"
#include "pjrt_backend.h"

#include <vector>

namespace torch_pjrt {
namespace {

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

// `max_unpool2d`/`max_unpool3d`: each value written at its flat index into its plane of the
// output (zeros elsewhere), one scatter over the flattened spatial dims.
// ----- fractional max pooling ----------------------------------------------------------------

// The window starts of fractional max pooling along one dim, per (batch, plane), as PyTorch's
// `generate_intervals` makes them in the input's dtype: trunc((i + u) a) - trunc(u a) with
// a = (in - pool) / (out - 1) and u the plane's sample, the last window at the end.
at::Tensor fractional_starts(const at::Tensor& sample, int64_t in, int64_t out, int64_t pool) {
  const at::TensorOptions longs = sample.options().dtype(at::kLong);
  const at::Tensor last = at::full({sample.size(0), sample.size(1), 1}, in - pool, longs);
  if (out == 1) {
    return last;
  }
  const at::Tensor alpha = at::scalar_tensor(static_cast<double>(in - pool), sample.options()) /
      at::scalar_tensor(static_cast<double>(out - 1), sample.options());
  const at::Tensor u = sample.unsqueeze(-1);
  const at::Tensor i = at::arange(out - 1, sample.options()).view({1, 1, -1});
  const at::Tensor starts = at::trunc((i + u) * alpha) - at::trunc(u * alpha);
  return at::cat({starts.to(at::kLong), last}, -1);
}

// `fractional_max_pool2d`/`3d`: the maximum of each pseudo-random window (its starts from the
// given samples: the last sample index along width, as PyTorch reads them) and its flat index in
// the plane. Windows are read in row-major order; a larger value or any NaN replaces the best,
// as in PyTorch's kernel.
std::tuple<at::Tensor, at::Tensor> fractional_max_pool(
    const char* op,
    const at::Tensor& self,
    at::IntArrayRef kernel,
    at::IntArrayRef output_size,
    const at::Tensor& samples,
    int64_t dims) {
  const bool batched = self.dim() == dims + 2;
  TORCH_CHECK(
      self.dim() == dims + 1 || batched, op, "(): Expected ", dims + 1, "D or ", dims + 2,
      "D tensor, but got: ", self.sizes());
  TORCH_CHECK(
      static_cast<int64_t>(kernel.size()) == dims && static_cast<int64_t>(output_size.size()) == dims,
      op, "(): kernel_size and output_size must each have ", dims, " elements");
  const at::Tensor x = batched ? self : self.unsqueeze(0);
  const int64_t n = x.size(0), c = x.size(1);
  for (int64_t d = 0; d < dims; ++d) {
    TORCH_CHECK(
        output_size[d] + kernel[d] - 1 <= x.size(d + 2), op, "(): pool size ", kernel[d],
        " too large relative to input size ", x.size(d + 2), " along dimension ", d, " for output size ",
        output_size[d]);
  }
  TORCH_CHECK(
      samples.dim() == 3 && samples.size(0) >= n && samples.size(1) == c && samples.size(2) == dims, op,
      "(): expected random_samples of shape (", n, ", ", c, ", ", dims, "), but got ", samples.sizes());
  const at::TensorOptions longs = x.options().dtype(at::kLong);
  std::vector<int64_t> strides(dims);
  int64_t stride = 1;
  for (int64_t d = dims - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= x.size(d + 2);
  }
  std::vector<int64_t> out_shape = {n, c};
  out_shape.insert(out_shape.end(), output_size.begin(), output_size.end());
  if (n * c == 0) {
    at::Tensor values = at::empty(out_shape, x.options());
    at::Tensor indices = at::empty(out_shape, longs);
    return batched ? std::make_tuple(values, indices) : std::make_tuple(values.squeeze(0), indices.squeeze(0));
  }
  // Each window's first element, as a flat index in its plane.
  at::Tensor origin = at::zeros(out_shape, longs);
  for (int64_t d = 0; d < dims; ++d) {
    const int64_t which = dims == 2 ? 1 - d : d;
    const at::Tensor sample = samples.narrow(0, 0, n).select(2, which).to(x.scalar_type());
    std::vector<int64_t> view = {n, c};
    for (int64_t e = 0; e < dims; ++e) {
      view.push_back(e == d ? output_size[d] : 1);
    }
    origin = origin + fractional_starts(sample, x.size(d + 2), output_size[d], kernel[d]).view(view) * strides[d];
  }
  const at::Tensor planes = x.reshape({n, c, -1});
  int64_t window = 1;
  for (int64_t d = 0; d < dims; ++d) {
    window *= kernel[d];
  }
  at::Tensor best, best_index;
  for (int64_t k = 0; k < window; ++k) {
    int64_t offset = 0, rest = k;
    for (int64_t d = dims - 1; d >= 0; --d) {
      offset += (rest % kernel[d]) * strides[d];
      rest /= kernel[d];
    }
    const at::Tensor index = origin + offset;
    const at::Tensor value = planes.gather(2, index.reshape({n, c, -1})).view(out_shape);
    if (k == 0) {
      best = value;
      best_index = index;
      continue;
    }
    const at::Tensor take = at::logical_or(value > best, at::isnan(value));
    best = at::where(take, value, best);
    best_index = at::where(take, index, best_index);
  }
  if (!batched) {
    best = best.squeeze(0);
    best_index = best_index.squeeze(0);
  }
  return {best.contiguous(), best_index.contiguous()};
}

// Its gradient: each output's gradient added at its maximum's index.
at::Tensor fractional_max_pool_backward(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& indices, int64_t dims) {
  const bool batched = self.dim() == dims + 2;
  const at::Tensor x = batched ? self : self.unsqueeze(0);
  const int64_t n = x.size(0), c = x.size(1);
  if (n * c == 0) {
    return at::zeros(self.sizes(), grad_output.options());
  }
  const at::Tensor grad = grad_output.reshape({n, c, -1});
  const at::Tensor where = indices.reshape({n, c, -1});
  return at::zeros({n, c, x.numel() / (n * c)}, grad_output.options())
      .scatter_add(2, where, grad)
      .view(self.sizes());
}

at::Tensor pjrt_max_unpool(const at::Tensor& self, const at::Tensor& indices, std::vector<int64_t> output_size, int64_t dims) {
  const char* name = dims == 2 ? "max_unpooling2d" : "max_unpooling3d";
  TORCH_CHECK(
      indices.scalar_type() == at::kLong, "elements in indices should be type int64 but got: ", indices.scalar_type());
  TORCH_CHECK(
      static_cast<int64_t>(output_size.size()) == dims, "There should be exactly ", dims,
      " elements in output_size, but got ", output_size.size(), " elements.");
  TORCH_CHECK(
      self.dim() == dims + 1 || self.dim() == dims + 2, "Input to ", name, " should be a ", dims + 1, "d or ",
      dims + 2, "d Tensor, but got a tensor with ", self.dim(), " dimensions.");
  TORCH_CHECK(
      self.sizes() == indices.sizes(), "Expected shape of indices to be same as that of the input tensor (",
      self.sizes(), ") but got indices tensor with shape: ", indices.sizes());
  for (int64_t i = 1; i < self.dim(); ++i) {
    TORCH_CHECK(
        self.size(i) > 0, name, "_forward_out_cpu(): Expected input to have non-zero size for non-batch dimensions, but got ",
        self.sizes(), " with dimension ", i, " being empty.");
  }
  const int64_t lead = self.dim() - dims;
  std::vector<int64_t> shape(self.sizes().begin(), self.sizes().begin() + lead);
  int64_t plane = 1;
  for (int64_t s : output_size) {
    plane *= s;
  }
  std::vector<int64_t> flat_shape = shape;
  flat_shape.push_back(plane);
  std::vector<int64_t> out_shape = shape;
  out_shape.insert(out_shape.end(), output_size.begin(), output_size.end());
  at::Tensor out = at::zeros(flat_shape, self.options());
  out = out.scatter(-1, indices.flatten(lead), self.flatten(lead));
  // The CPU's output takes the input's memory format (channels-last stays channels-last).
  return out.view(out_shape).contiguous(self.suggest_memory_format());
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/conv_kernels.inc"

}  // namespace torch_pjrt
