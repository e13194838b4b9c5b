// Advanced indexing on pjrt: `index`, `_index_put_impl_`, `index_add`, `nonzero`,
// `masked_select`, `masked_scatter_` and `repeat_interleave`, whose arguments (lists of optional
// index tensors), checks or data-dependent result sizes the kernel table cannot describe.
//
// A result size that depends on the data (how many elements nonzero or masked_select return) is
// counted on the device and read to the host: the one sync these ops need. The op itself then
// has a static shape and stays deferred like any other. A bool mask inside an index list becomes
// the columns of its nonzero coordinates, as in PyTorch.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include "pjrt_backend.h"

namespace torch_pjrt {
namespace {

bool is_mask(const at::Tensor& t) {
  return t.scalar_type() == at::kBool || t.scalar_type() == at::kByte;
}

// How many elements of `t` are nonzero: a reduction on the device, read to the host.
int64_t count_true(const at::Tensor& t) {
  if (t.numel() == 0) {
    return 0;
  }
  const at::Tensor flags = t.scalar_type() == at::kBool ? t : t.ne(0);
  return flags.sum().item<int64_t>();
}

// The engine's nonzero for a known count of nonzero elements: `[count, dim]`, column-major as
// PyTorch's (the engine computes the transpose).
at::Tensor nonzero_counted(const at::Tensor& self, int64_t count) {
  static const auto op = engine_op(ops::nonzero);
  OpCall c(op, "aten::nonzero", {.count = count});
  c.input(self);
  return c.run_functional().t();
}

at::Tensor pjrt_nonzero(const at::Tensor& self) {
  if (C10_UNLIKELY(wide_unsigned(self))) {
    return run_on_cpu<at::_ops::nonzero>(self);
  }
  return nonzero_counted(self, count_true(self));
}

// `nonzero_static`: the first `size` nonzero positions, rows of `fill_value` past the last. The
// result's shape is known, so nothing is read to the host: each nonzero element's row is its
// running count, its flat index is scattered there, and unravelled into coordinates.
at::Tensor pjrt_nonzero_static(const at::Tensor& self, c10::SymInt size_sym, int64_t fill_value) {
  const int64_t size = size_sym.expect_int();
  TORCH_CHECK(size >= 0, "nonzero_static: 'size' must be an non-negative integer");
  const at::TensorOptions longs = self.options().dtype(at::kLong);
  const int64_t rank = self.dim();
  if (rank == 0) {
    return at::empty({size, 0}, longs);
  }
  if (self.numel() == 0 || size == 0) {
    return at::full({size, rank}, fill_value, longs);
  }
  const at::Tensor flags = (self.scalar_type() == at::kBool ? self : self.ne(0)).reshape({-1});
  const at::Tensor row = flags.to(at::kLong).cumsum(0) - 1;
  // Elements past the first `size` nonzero ones, and zeros, all land in one spare row.
  const at::Tensor target = at::where(flags.logical_and(row < size), row, size);
  const at::Tensor flat = at::full({size + 1}, -1, longs)
                              .scatter(0, target, at::arange(flags.numel(), longs))
                              .narrow(0, 0, size);
  std::vector<at::Tensor> coordinates;
  int64_t stride = self.numel();
  for (int64_t d = 0; d < rank; ++d) {
    stride /= self.size(d);
    coordinates.push_back(flat.div(stride, "floor").remainder(self.size(d)));
  }
  const at::Tensor positions = at::stack(coordinates, 1);
  return at::where(flat.unsqueeze(1) >= 0, positions, fill_value);
}

at::Tensor& pjrt_nonzero_out(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK(
      out.scalar_type() == at::kLong,
      "nonzero: Expected out tensor to have scalar type Long but got scalar type ",
      out.scalar_type());
  check_out_device("nonzero", self, out);
  if (C10_UNLIKELY(wide_unsigned(self))) {
    return run_on_cpu<at::_ops::nonzero_out>(self, out);
  }
  const at::Tensor result = pjrt_nonzero(self);
  // As PyTorch's kernel: an output it has to resize gets the column-major layout.
  if (at::native::resize_output(out, result.sizes())) {
    out.as_strided_(result.sizes(), result.strides());
  }
  out.copy_(result);
  return out;
}

// How many elements `mask` selects once broadcast to `shape`: every element of the mask is
// repeated the same number of times, so the count of the mask itself is enough.
int64_t count_broadcast(const at::Tensor& mask, c10::IntArrayRef shape) {
  const int64_t total = c10::multiply_integers(shape);
  if (total == 0) {
    return 0;
  }
  return count_true(mask) * (total / mask.numel());
}

// How many elements masked_select selects: its result's length.
int64_t masked_select_count(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask");
  const std::vector<int64_t> shape = at::infer_size(self.sizes(), mask.sizes());
  return count_broadcast(mask, shape);
}

at::Tensor pjrt_masked_select(const at::Tensor& self, const at::Tensor& mask) {
  if (C10_UNLIKELY(wide_unsigned(self))) {
    return run_on_cpu<at::_ops::masked_select>(self, mask);
  }
  static const auto op = engine_op(ops::masked_select);
  OpCall c(op, "aten::masked_select", {.count = masked_select_count(self, mask)});
  c.input(self);
  c.input(mask);
  return c.run_functional();
}

at::Tensor& pjrt_masked_select_out(const at::Tensor& self, const at::Tensor& mask, at::Tensor& out) {
  if (C10_UNLIKELY(wide_unsigned(self))) {
    return run_on_cpu<at::_ops::masked_select_out>(self, mask, out);
  }
  static const auto op = engine_op(ops::masked_select);
  OpCall c(op, "aten::masked_select.out", {.count = masked_select_count(self, mask)});
  c.input(self);
  c.input(mask);
  c.out(out);
  c.run_out();
  return out;
}

at::Tensor& pjrt_masked_scatter_(at::Tensor& self, const at::Tensor& mask, const at::Tensor& source) {
  if (C10_UNLIKELY(wide_unsigned(self))) {
    return run_on_cpu<at::_ops::masked_scatter_>(self, mask, source);
  }
  static const auto op = engine_op(ops::masked_scatter_);
  OpCall c(op, "aten::masked_scatter_");
  c.input(self);
  c.input(mask);
  c.input(source);
  c.out(self);
  c.run_inplace();
  return self;
}

// ----- index lists -----

using IndexList = c10::List<std::optional<at::Tensor>>;

// PyTorch's indexing warns once per uint8 mask in the index list, at each call.
void warn_byte_masks(const IndexList& indices) {
  for (const auto i : c10::irange(indices.size())) {
    const std::optional<at::Tensor> entry = indices.get(i);
    if (entry.has_value() && entry->defined() && entry->scalar_type() == at::kByte) {
      TORCH_WARN(
          "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool "
          "instead.");
    }
  }
}

// An index list as integer index tensors on self's device and the dims they select along.
struct Indices {
  std::vector<at::Tensor> tensors;
  std::vector<int64_t> dims;
};

void check_mask_shape(const at::Tensor& self, const at::Tensor& mask, int64_t dim) {
  TORCH_CHECK_INDEX(
      dim + mask.dim() <= self.dim(),
      "too many indices for tensor of dimension ",
      self.dim(),
      " (got ",
      dim + mask.dim(),
      ")");
  for (const auto j : c10::irange(mask.dim())) {
    TORCH_CHECK_INDEX(
        mask.size(j) == self.size(dim + j),
        "The shape of the mask ",
        mask.sizes(),
        " at index ",
        j,
        " does not match the shape of the indexed tensor ",
        self.sizes(),
        " at index ",
        dim + j);
  }
}

// Indices still on the host are checked there, so the error comes at once, in every mode;
// indices on the device are checked by the engine, on the device (RFC 0012).
void check_host_index(const at::Tensor& index, int64_t size, int64_t position) {
  if (index.numel() == 0) {
    return;
  }
  const at::Tensor flat = index.reshape({-1}).to(at::kLong);
  const at::Tensor bad = flat.lt(-size).logical_or(flat.ge(size));
  if (!bad.any().item<bool>()) {
    return;
  }
  const int64_t first = bad.to(at::kByte).argmax().item<int64_t>();
  TORCH_CHECK_INDEX(
      false,
      "index ",
      flat[first].item<int64_t>(),
      " is out of bounds for dimension ",
      position,
      " with size ",
      size);
}

// PyTorch's index list (None takes a dim whole; a bool or uint8 mask covers as many dims as it
// has) as integer tensors. `mask_count`, when known, is how many elements the list's one mask
// selects, so it needn't be read from the device.
Indices expand_indices(
    const at::Tensor& self, const IndexList& indices, std::optional<int64_t> mask_count) {
  Indices r;
  int64_t dim = 0;
  for (const auto i : c10::irange(indices.size())) {
    const std::optional<at::Tensor> entry = indices.get(i);
    if (!entry.has_value() || !entry->defined()) {
      ++dim;
      continue;
    }
    const at::Tensor& index = *entry;
    if (is_mask(index)) {
      check_mask_shape(self, index, dim);
      at::Tensor coords;
      if (!is_pjrt(index)) {
        // A host mask is counted on the host: no device read.
        coords = at::nonzero(index).to(self.device());
      } else if (mask_count.has_value()) {
        coords = nonzero_counted(index, *mask_count);
      } else {
        coords = at::nonzero(index);
      }
      for (const auto j : c10::irange(index.dim())) {
        r.tensors.push_back(coords.select(1, j));
        r.dims.push_back(dim + j);
      }
      dim += index.dim();
      continue;
    }
    TORCH_CHECK_INDEX(
        index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
        "tensors used as indices must be long, int, byte or bool tensors");
    if (!is_pjrt(index) && dim < self.dim()) {
      check_host_index(index, self.size(dim), static_cast<int64_t>(r.tensors.size()));
    }
    r.tensors.push_back(is_pjrt(index) ? index : index.to(self.device()));
    r.dims.push_back(dim);
    ++dim;
  }
  TORCH_CHECK_INDEX(
      dim <= self.dim(),
      "too many indices for tensor of dimension ",
      self.dim(),
      " (got ",
      dim,
      ")");
  return r;
}

// `index`'s inputs: self, then the index tensors. `ix` must outlive the call: its tensors may
// be temporaries (nonzero columns, uploads).
void index_inputs(OpCall& c, const at::Tensor& self, const Indices& ix) {
  c.input(self);
  for (const at::Tensor& t : ix.tensors) {
    c.input(t);
  }
}

at::Tensor pjrt_index(const at::Tensor& self, const IndexList& indices) {
  static const auto op = engine_op(ops::index);
  warn_byte_masks(indices);
  const Indices ix = expand_indices(self, indices, std::nullopt);
  OpCall c(op, "aten::index.Tensor", {.indexed_dims = ix.dims});
  index_inputs(c, self, ix);
  return c.run_functional();
}

at::Tensor& pjrt_index_out(const at::Tensor& self, const IndexList& indices, at::Tensor& out) {
  static const auto op = engine_op(ops::index);
  warn_byte_masks(indices);
  const Indices ix = expand_indices(self, indices, std::nullopt);
  OpCall c(op, "aten::index.Tensor_out", {.indexed_dims = ix.dims});
  index_inputs(c, self, ix);
  c.out(out);
  c.run_out();
  return out;
}

// The list's only tensor, when it is a mask on self's device (or, with `host_mask_ok`, on the
// host), and the dims before it.
std::optional<std::pair<at::Tensor, int64_t>> single_mask(
    const at::Tensor& self, const IndexList& indices, bool host_mask_ok = false) {
  std::optional<std::pair<at::Tensor, int64_t>> found;
  int64_t dim = 0;
  for (const auto i : c10::irange(indices.size())) {
    const std::optional<at::Tensor> entry = indices.get(i);
    if (!entry.has_value() || !entry->defined()) {
      ++dim;
      continue;
    }
    if (found.has_value() || !is_mask(*entry) || !(is_pjrt(*entry) || host_mask_ok)) {
      return std::nullopt;
    }
    check_mask_shape(self, *entry, dim);
    found.emplace(*entry, dim);
    dim += entry->dim();
  }
  return found;
}

// `self[mask] = value` with one element: a select against the mask broadcast over the trailing
// dims (PyTorch dispatches this case to masked_fill_ too), so no count is read. A mask on the
// host is uploaded whole: its shape is the tensor's, so every mask of that shape runs one
// program, where its selected positions (a count that changes with every mask) would make a
// program per count.
bool try_masked_fill(at::Tensor& self, const IndexList& indices, const at::Tensor& values) {
  if (values.numel() != 1) {
    return false;
  }
  auto found = single_mask(self, indices, /*host_mask_ok=*/true);
  if (!found.has_value()) {
    return false;
  }
  auto [mask, lead] = *found;
  if (!is_pjrt(mask)) {
    mask = mask.to(self.device());
  }
  std::vector<int64_t> shape(mask.sizes().begin(), mask.sizes().end());
  shape.resize(self.dim() - lead, 1);
  at::Tensor condition = mask.reshape(shape);
  if (condition.scalar_type() != at::kBool) {
    condition = condition.to(at::kBool);
  }
  at::Tensor value = values.reshape({});
  if (value.scalar_type() != self.scalar_type()) {
    value = value.to(self.scalar_type());
  }
  // where(condition, value, self): `value` is a value scalar when it is a CPU 0-d tensor.
  static const auto op = engine_op(ops::where);
  OpCall c(
      op,
      "aten::_index_put_impl_",
      {.self_kind = OpCall::operand_kind(value), .other_kind = OpCall::operand_kind(self)});
  c.input(condition);
  c.input_or_scalar(value);
  c.input_or_scalar(self);
  c.out(self);
  c.run_inplace();
  return true;
}

// How many elements the list's one mask selects, read from the shape of `values` where that
// shape says it (autograd's backward of `x[mask]` passes a gradient of exactly that shape).
std::optional<int64_t> implied_mask_count(
    const at::Tensor& self, const IndexList& indices, const at::Tensor& values) {
  auto found = single_mask(self, indices);
  if (!found.has_value() || found->first.dim() == 0) {
    return std::nullopt;
  }
  const auto& [mask, lead] = *found;
  // The result's dims: self's before the mask, the count, self's after it.
  const int64_t result_dim = self.dim() - mask.dim() + 1;
  const int64_t at = values.dim() - (result_dim - lead);
  if (at < 0 || values.size(at) == 1) {
    return std::nullopt;
  }
  return values.size(at);
}

at::Tensor& pjrt_index_put_impl_(
    at::Tensor& self,
    const IndexList& indices,
    const at::Tensor& values,
    bool accumulate,
    bool unsafe) {
  TORCH_CHECK_INDEX(
      static_cast<int64_t>(indices.size()) <= self.dim(),
      "too many indices for tensor of dimension ",
      self.dim(),
      " (got ",
      indices.size(),
      ")");
  if (C10_UNLIKELY(wide_unsigned(self))) {
    return run_on_cpu<at::_ops::_index_put_impl_>(self, indices, values, accumulate, unsafe);
  }
  warn_byte_masks(indices);
  if (!accumulate && try_masked_fill(self, indices, values)) {
    return self;
  }
  // `unsafe` callers (autograd) pass values of the indexed shape; others get the count read, so
  // a values tensor of the wrong size is PyTorch's shape error.
  const std::optional<int64_t> count =
      unsafe ? implied_mask_count(self, indices, values) : std::nullopt;
  Indices ix = expand_indices(self, indices, count);
  static const auto op = engine_op(ops::index_put);
  OpCall c(
      op, "aten::_index_put_impl_", {.accumulate = accumulate ? 1 : 0, .indexed_dims = ix.dims});
  c.input(self);
  c.input(values);
  for (const at::Tensor& t : ix.tensors) {
    c.input(t);
  }
  c.out(self);
  c.run_inplace();
  return self;
}

// ----- index_add -----

enum class Into { Functional, Inplace, Out };

// `self` with `alpha * source` added at `index` along `dim`: an accumulating index_put with the
// index in that dim (autograd's backward of index_select).
at::Tensor index_add_impl(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& source,
    const at::Scalar& alpha,
    Into into,
    at::Tensor* out) {
  dim = c10::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_add_(): Index is supposed to be a vector");
  TORCH_CHECK(
      index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
      "index_add_(): Expected dtype int32/int64 for index");
  TORCH_CHECK(
      self.scalar_type() == source.scalar_type(),
      "index_add_(): self (",
      self.scalar_type(),
      ") and source (",
      source.scalar_type(),
      ") must have the same scalar type");
  const int64_t selected = source.dim() > 0 ? source.size(dim) : 1;
  TORCH_CHECK_INDEX(
      index.numel() == selected,
      "index_add_(): Number of indices (",
      index.numel(),
      ") should be equal to source.size(dim) (",
      selected,
      ")");
  if (self.dim() > 0 && source.dim() > 0) {
    TORCH_CHECK_INDEX(
        self.dim() == source.dim(),
        "index_add_(): self and source must have the same number of dimensions, got ",
        self.dim(),
        " and ",
        source.dim());
    for (const auto d : c10::irange(self.dim())) {
      TORCH_CHECK(
          d == dim || self.size(d) == source.size(d),
          "index_add_(): self and source must have same size at dimension ",
          d,
          "; self has size ",
          self.size(d),
          ", source has size ",
          source.size(d));
    }
  }
  const bool unit = alpha.isIntegral(true) ? alpha.toLong() == 1 : alpha.toDouble() == 1.0;
  const at::Tensor values = unit ? source : source.mul(alpha);
  if (self.dim() == 0) {
    // One element, selected once.
    const at::Tensor v = values.reshape({});
    switch (into) {
      case Into::Functional:
        return self.add(v);
      case Into::Inplace:
        return self.add_(v);
      case Into::Out:
        return at::add_out(*out, self, v);
    }
  }
  const at::Tensor flat_index = is_pjrt(index) ? index.reshape({-1})
                                               : index.reshape({-1}).to(self.device());
  static const auto op = engine_op(ops::index_put);
  OpCall c(
      op,
      "aten::index_add",
      // 2: accumulate, reporting out-of-range indices as index_add does.
      {.accumulate = 2, .indexed_dims = c10::IntArrayRef(dim)});
  c.input(self);
  c.input(values);
  c.input(flat_index);
  switch (into) {
    case Into::Functional:
      return c.run_functional();
    case Into::Inplace:
      c.out(self);
      c.run_inplace();
      return self;
    case Into::Out:
      c.out(*out);
      c.run_out();
      return *out;
  }
  return self;
}

at::Tensor pjrt_index_add(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& source,
    const at::Scalar& alpha) {
  if (C10_UNLIKELY(wide_unsigned(self))) {
    return run_on_cpu<at::_ops::index_add>(self, dim, index, source, alpha);
  }
  return index_add_impl(self, dim, index, source, alpha, Into::Functional, nullptr);
}

at::Tensor& pjrt_index_add_(
    at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& source,
    const at::Scalar& alpha) {
  if (C10_UNLIKELY(wide_unsigned(self))) {
    return run_on_cpu<at::_ops::index_add_>(self, dim, index, source, alpha);
  }
  index_add_impl(self, dim, index, source, alpha, Into::Inplace, &self);
  return self;
}

at::Tensor& pjrt_index_add_out(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& source,
    const at::Scalar& alpha,
    at::Tensor& out) {
  if (C10_UNLIKELY(wide_unsigned(self))) {
    return run_on_cpu<at::_ops::index_add_out>(self, dim, index, source, alpha, out);
  }
  index_add_impl(self, dim, index, source, alpha, Into::Out, &out);
  return out;
}

// ----- repeat_interleave -----

// `torch.repeat_interleave(repeats)`: each position of `repeats` written as often as it says,
// the index `repeat_interleave(self, repeats, dim)` selects with (PyTorch's composite). Without
// `output_size` the total is the repeats' sum, read to the host together with their minimum
// (the op's one sync, which also finds a negative repeat). With it nothing is read: a check on
// the device compares the sum and the signs, and its verdict raises PyTorch's error at the next
// materialization point, as index checks do.
at::Tensor pjrt_repeat_interleave(const at::Tensor& repeats, std::optional<c10::SymInt> output_size) {
  TORCH_CHECK(repeats.dim() == 1, "repeat_interleave only accept 1D vector as repeat");
  TORCH_CHECK_NOT_IMPLEMENTED(
      repeats.scalar_type() == at::kLong || repeats.scalar_type() == at::kInt,
      "\"repeat_interleave_pjrt\" not implemented for '", repeats.scalar_type(), "'");
  int64_t total = 0;
  bool trusted = false;
  if (repeats.numel() != 0) {
    if (output_size.has_value()) {
      total = output_size->expect_int();
      TORCH_CHECK(
          total >= 0, "Trying to create tensor with negative dimension ", total, ": [", total, "]");
      trusted = true;
    } else {
      const at::Tensor summary =
          at::stack({repeats.sum(at::kLong), repeats.min().to(at::kLong)}).cpu();
      const int64_t* sum_and_min = summary.const_data_ptr<int64_t>();
      TORCH_CHECK(sum_and_min[1] >= 0, "repeats can not be negative");
      total = sum_and_min[0];
    }
  }
  static const auto op = engine_op(ops::repeat_interleave);
  OpCall c(op, "aten::repeat_interleave.Tensor", {.count = total});
  c.input(repeats);
  at::Tensor result = c.run_functional();
  if (trusted) {
    static const auto check = engine_op(ops::repeats_check);
    OpCall k(check, "aten::repeat_interleave.Tensor");
    k.input(repeats);
    k.scalar(at::Scalar(total));
    // A check gives PyTorch nothing: the engine keeps its verdict.
    k.run_functional_n(0);
  }
  return result;
}


// ----- index_copy, index_fill, scatter_reduce and index_reduce -----

at::Tensor pjrt_index_copy(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& source) {
  int64_t wrapped = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  TORCH_CHECK_INDEX(
      index.dim() <= 1, "index_copy_(): Index should have dimension 1 or 0 (got ", index.dim(), ")");
  TORCH_CHECK(
      index.scalar_type() == at::kLong,
      "index_copy_(): Expected a long tensor for index, but got ",
      index.scalar_type());
  TORCH_CHECK(
      self.scalar_type() == source.scalar_type(),
      "index_copy_(): self and source expected to have the same dtype, but got (self) ",
      self.scalar_type(),
      " and (source) ",
      source.scalar_type());
  if (self.dim() == 0) {
    return source.reshape({}).clone();
  }
  c10::List<std::optional<at::Tensor>> indices;
  for (int64_t d = 0; d < wrapped; ++d) {
    indices.push_back(std::nullopt);
  }
  indices.push_back(index.reshape({-1}));
  return at::index_put(self, indices, source, /*accumulate=*/false);
}

// A uint16/32/64 `self` runs on the CPU, whose kernel has no case for them and raises its error
// after its own checks (or computes it, where a later PyTorch can); the in-place and `out=` forms
// call this one.
at::Tensor pjrt_index_fill(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& value) {
  if (C10_UNLIKELY(wide_unsigned(self))) {
    return run_on_cpu<at::_ops::index_fill_int_Tensor>(self, dim, index, value);
  }
  TORCH_CHECK(
      value.dim() == 0,
      "index_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
      value.dim(),
      " dimension(s).");
  TORCH_CHECK_INDEX(
      index.dim() <= 1, "index_fill_(): Index is supposed to be a vector, but got ", index.dim(), "-D");
  TORCH_CHECK(
      index.scalar_type() == at::kLong,
      "index_fill_(): Expected dtype int64 for index, but got ",
      index.scalar_type());
  at::Tensor fill = value.to(self.device()).to(self.scalar_type());
  if (self.dim() == 0) {
    return index.numel() > 0 ? fill.clone() : self.clone();
  }
  int64_t wrapped = at::maybe_wrap_dim(dim, self.dim());
  c10::List<std::optional<at::Tensor>> indices;
  for (int64_t d = 0; d < wrapped; ++d) {
    indices.push_back(std::nullopt);
  }
  indices.push_back(index.reshape({-1}));
  return at::index_put(self, indices, fill, /*accumulate=*/false);
}

at::Tensor index_fill_scalar(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value) {
  return pjrt_index_fill(self, dim, index, at::scalar_tensor(value, self.options()));
}

// The value `reduce` ("prod", "amax", "amin") leaves unchanged: where `scatter_reduce` with
// `include_self=False` starts the positions that receive values.
at::Scalar reduction_identity(at::ScalarType dtype, c10::string_view reduce) {
  if (reduce == "prod") {
    return 1;
  }
  bool for_max = reduce == "amax";
  at::Scalar identity;
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, dtype, "reduction_identity", [&] {
    using limits = std::numeric_limits<scalar_t>;
    if constexpr (limits::has_infinity) {
      identity = for_max ? -limits::infinity() : limits::infinity();
    } else {
      identity = for_max ? limits::lowest() : limits::max();
    }
  });
  return identity;
}

// `scatter_reduce` on the device. "sum" and "mean" come from `scatter_add`: `include_self=False`
// first zeroes the positions that receive values; "mean" divides by how many values each
// position took (itself included), flooring for integers as PyTorch does. "prod", "amax" and
// "amin" are the engine's scatter with that combiner, from the identity where `self` is left out.
at::Tensor pjrt_scatter_reduce(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& src,
    c10::string_view reduce,
    bool include_self) {
  if (reduce == "sum" || reduce == "mean") {
    at::Tensor base = include_self ? self : self.scatter(dim, index, 0);
    at::Tensor total = base.scatter_add(dim, index, src.to(self.scalar_type()));
    if (reduce == "sum") {
      return total;
    }
    at::Tensor taken = (include_self ? at::ones_like(self) : at::zeros_like(self))
                           .scatter_add(dim, index, at::ones_like(src, self.options()));
    taken = taken.masked_fill(taken == 0, 1);
    return at::isIntegralType(self.scalar_type(), /*includeBool=*/true) ? total.div(taken, "floor")
                                                                        : total / taken;
  }
  int64_t combiner = reduce == "prod" ? 1 : reduce == "amax" ? 2 : reduce == "amin" ? 3 : 0;
  TORCH_CHECK(
      combiner != 0,
      "reduce argument must be either sum, prod, mean, amax or amin, got ", reduce);
  at::Tensor base =
      include_self ? self : self.scatter(dim, index, reduction_identity(self.scalar_type(), reduce));
  static const auto op = engine_op(ops::scatter_reduce);
  OpCall c(op, "aten::scatter_reduce.two", {.dim = dim, .combiner = combiner});
  c.input(base);
  c.input(index);
  c.input(src.to(self.scalar_type()));
  return c.run_functional();
}

// The legacy `scatter(..., reduce=)`: `scatter_reduce` with the self included ("add" sums,
// "multiply" multiplies); a scalar value is a source of that value in the index's shape.
c10::string_view legacy_scatter_reduction(c10::string_view reduce) {
  if (reduce == "add") {
    return "sum";
  }
  TORCH_CHECK(reduce == "multiply", "reduce argument must be either add or multiply.");
  return "prod";
}

at::Tensor pjrt_scatter_legacy_reduce(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& src,
    c10::string_view reduce) {
  return pjrt_scatter_reduce(self, dim, index, src, legacy_scatter_reduction(reduce), /*include_self=*/true);
}

at::Tensor pjrt_scatter_value_legacy_reduce(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Scalar& value,
    c10::string_view reduce) {
  return pjrt_scatter_legacy_reduce(self, dim, index, at::full(index.sizes(), value, self.options()), reduce);
}

// `index_reduce` is `scatter_reduce` with the index spread over `source`'s other dimensions.
at::Tensor pjrt_index_reduce(
    const at::Tensor& self,
    int64_t dim,
    const at::Tensor& index,
    const at::Tensor& source,
    c10::string_view reduce,
    bool include_self) {
  TORCH_CHECK(
      reduce == "prod" || reduce == "mean" || reduce == "amax" || reduce == "amin",
      "index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got ", reduce, ".");
  TORCH_CHECK(index.dim() <= 1, "index_reduce_(): Index is supposed to be a vector");
  TORCH_CHECK(
      index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
      "index_reduce_(): Expected dtype int32/int64 for index");
  TORCH_CHECK(
      self.scalar_type() == source.scalar_type(),
      "index_reduce_(): self (", self.scalar_type(), ") and source (", source.scalar_type(),
      ") must have the same scalar type");
  if (source.dim() == 0) {
    return pjrt_scatter_reduce(self, dim, index.reshape({1}), source.reshape({1}), reduce, include_self);
  }
  dim = at::maybe_wrap_dim(dim, source.dim());
  TORCH_CHECK(
      index.numel() == source.size(dim),
      "index_reduce_(): Number of indices (", index.numel(), ") should be equal to source.size(dim) (",
      source.size(dim), ")");
  std::vector<int64_t> shape(source.dim(), 1);
  shape[dim] = index.numel();
  at::Tensor spread = index.to(at::kLong).reshape(shape).expand(source.sizes());
  return pjrt_scatter_reduce(self, dim, spread, source, reduce, include_self);
}

// `take`: `self` read as one dimension at the positions of `index` (negative ones from the end),
// in `index`'s shape. The advanced-indexing kernel checks the bounds.
at::Tensor pjrt_take(const at::Tensor& self, const at::Tensor& index) {
  TORCH_CHECK(
      index.scalar_type() == at::kLong,
      "take(): Expected a long tensor for index, but got ",
      index.scalar_type());
  TORCH_CHECK(
      !(self.numel() == 0 && index.numel() != 0),
      "take(): tried to take from an empty tensor");
  return self.reshape({-1}).index({index});
}

// `put_`: `source` written (or added) into `self` read as one dimension, at the positions of
// `index`, through the advanced-indexing kernel, which checks the bounds; `self` of any layout.
at::Tensor& pjrt_put_(at::Tensor& self, const at::Tensor& index, const at::Tensor& source, bool accumulate) {
  TORCH_CHECK(
      index.scalar_type() == at::kLong,
      "put_(): Expected a long tensor for index, but got ",
      index.scalar_type());
  TORCH_CHECK(
      self.scalar_type() == source.scalar_type(),
      "put_(): self and source expected to have the same dtype, but got self.dtype = ",
      self.scalar_type(),
      " and source.dtype = ",
      source.scalar_type());
  TORCH_CHECK_INDEX(
      index.numel() == source.numel(),
      "put_(): Expected source and index to have the same number of elements, but got source.numel() = ",
      source.numel(),
      ", index.numel() = ",
      index.numel());
  TORCH_CHECK(
      !(self.numel() == 0 && index.numel() != 0),
      "put_(): Tried to put elements into an empty tensor");
  if (index.numel() == 0) {
    return self;
  }
  // A contiguous `self` is written through its flat view; any other is written back once.
  at::Tensor flat = self.reshape({-1});
  flat.index_put_({index.reshape({-1})}, source.reshape({-1}), accumulate);
  return flat.is_alias_of(self) ? self : self.copy_(flat.view(self.sizes()));
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/indexing_kernels.inc"

}  // namespace torch_pjrt
