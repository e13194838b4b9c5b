// Sequences grown by appends: `torch.cat([a, b], dim)` along `a`'s outermost non-unit dimension,
// step after step (generate()'s input_ids and attention mask, a list of logits), writes into a
// buffer with room to grow (a capacity), so every append of one size runs one program per
// capacity instead of one per length, and every fixed-size window read from the sequence
// (`input_ids[:, -1]`) reads at a runtime offset of a buffer whose size does not change.
// PyTorch sees true sizes; only the storage is larger (RFC 0028).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "module_api.h"
#include "pjrt_backend.h"

namespace torch_pjrt {

namespace {

std::atomic<int64_t> g_capacity_buffers{0};
std::atomic<int64_t> g_appends{0};

// The smallest capacity, in elements: bookkeeping sequences (token ids, masks) never cross it in
// a generation of a few hundred tokens.
constexpr int64_t kMinCapacityElements = 256;

// Room for at least half as many elements again, rounded up to a power of two: a sequence
// growing one step at a time crosses a capacity O(log n) times, and wastes at most 3x.
int64_t capacity_for(int64_t elements, int64_t bound) {
  int64_t wanted = std::max(kMinCapacityElements, elements + elements / 2);
  int64_t capacity = 1;
  while (capacity < wanted) {
    capacity <<= 1;
  }
  return std::max(capacity, bound);
}

bool dynamic_off() {
  const char* value = std::getenv("TORCH_PJRT_DYNAMIC");
  return value != nullptr && std::strcmp(value, "off") == 0;
}

// Whether `dim` is `t`'s outermost non-unit dimension (every dimension before it has size 1):
// then the first `n` elements of the sequence are the first `n` of its storage, whatever its
// length, and a longer sequence is the shorter one with more elements after it.
bool grows_at_the_end(const at::Tensor& t, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) {
    if (t.size(d) != 1) {
      return false;
    }
  }
  return true;
}

// Append sites seen: (dtype, dim, the other sizes, the appended piece's sizes) -> the lengths
// along `dim` of its latest results. A cat whose first input is as long as one of them continues
// a sequence seen growing (generate() grows input_ids and the attention mask alike, so a site
// holds several sequences): from then on it gets a capacity. Bounded: cleared when large.
constexpr size_t kLengthsPerSite = 4;

struct SiteLengths {
  int64_t lengths[kLengthsPerSite] = {-1, -1, -1, -1};
  size_t next = 0;
};

std::mutex g_sites_mutex;
std::unordered_map<uint64_t, SiteLengths> g_sites;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

uint64_t site_key(const at::Tensor& a, const at::Tensor& b, int64_t dim) {
  uint64_t h = mix(0, static_cast<uint64_t>(a.scalar_type()));
  h = mix(h, static_cast<uint64_t>(dim));
  h = mix(h, static_cast<uint64_t>(a.dim()));
  for (int64_t d = 0; d < a.dim(); ++d) {
    h = mix(h, d == dim ? uint64_t(-1) : static_cast<uint64_t>(a.size(d)));
  }
  for (int64_t d = 0; d < b.dim(); ++d) {
    h = mix(h, static_cast<uint64_t>(b.size(d)));
  }
  return h;
}

// Whether this cat continues a sequence seen growing, and records its result's length.
bool continues_a_growing_sequence(const at::Tensor& a, const at::Tensor& b, int64_t dim) {
  const uint64_t key = site_key(a, b, dim);
  std::lock_guard<std::mutex> lock(g_sites_mutex);
  if (g_sites.size() > 4096) {
    g_sites.clear();
  }
  SiteLengths& site = g_sites[key];
  bool continues = false;
  for (int64_t length : site.lengths) {
    continues = continues || length == a.size(dim);
  }
  site.lengths[site.next] = a.size(dim) + b.size(dim);
  site.next = (site.next + 1) % kLengthsPerSite;
  return continues;
}

// A tensor of `sizes` (contiguous) over the first elements of `storage`: not a view of anything
// (cat's result is a tensor of its own).
at::Tensor tensor_on(const c10::Storage& storage, const at::Tensor& like, at::IntArrayRef sizes) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), like.key_set(), like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

int64_t storage_elements(const at::Tensor& t) {
  return static_cast<int64_t>(t.storage().nbytes()) / static_cast<int64_t>(t.itemsize());
}

}  // namespace

std::optional<at::Tensor> append_in_capacity(const at::ITensorListRef& tensors, int64_t dim) {
  if (tensors.size() != 2) {
    return std::nullopt;
  }
  auto it = tensors.begin();
  const at::Tensor& a = *it;
  const at::Tensor& b = *(++it);
  if (!a.defined() || !b.defined() || !is_pjrt(a) || !is_pjrt(b) || a.dim() == 0 ||
      a.dim() != b.dim() || a.scalar_type() != b.scalar_type() || a.device() != b.device()) {
    return std::nullopt;
  }
  dim = c10::maybe_wrap_dim(dim, a.dim());
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (d != dim && a.size(d) != b.size(d)) {
      return std::nullopt;  // cat's own checks say what is wrong
    }
  }
  // Autograd needs cat's own node; a view, an offset or a gap would not grow at the end.
  if ((at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad())) ||
      a.numel() == 0 || b.numel() == 0 || a.storage_offset() != 0 || !a.is_contiguous() ||
      !grows_at_the_end(a, dim) || dynamic_off()) {
    return std::nullopt;
  }
  StorageGrowth* growth = storage_growth(a.storage());
  if (growth == nullptr) {
    return std::nullopt;
  }
  // One step appended to a sequence without autograd (a token to input_ids in generate()): the
  // shape of a decoding loop, seen at its first step, so its second step already runs the
  // programs of every later one. The site table is consulted (and fed) only when nothing
  // cheaper decides.
  const bool one_step = b.size(dim) == 1 && a.size(dim) >= 2 && !at::GradMode::is_enabled();
  if (!growth->capacity && growth->marked_dim != dim && !one_step &&
      !continues_a_growing_sequence(a, b, dim)) {
    return std::nullopt;
  }
  const int64_t length = a.numel();
  const int64_t grown = length + b.numel();
  std::vector<int64_t> sizes = a.sizes().vec();
  sizes[dim] += b.size(dim);

  const int64_t available = storage_elements(a);
  at::Tensor buffer;
  if (growth->capacity && grown <= available) {
    // The same capacity again: the whole old buffer is the new one's start (one program per
    // capacity and appended size; the bytes past the old length are never read as values).
    buffer = at::empty({available}, a.options());
    buffer.copy_(tensor_on(a.storage(), a, {available}));
  } else {
    // A new capacity (the first append of a growing sequence, or one that outgrew its buffer).
    buffer = at::empty({capacity_for(grown, growth->bound_elements)}, a.options());
    buffer.narrow(0, 0, length).copy_(a.reshape({-1}));
    g_capacity_buffers.fetch_add(1, std::memory_order_relaxed);
  }
  buffer.narrow(0, length, b.numel()).copy_(b.reshape({-1}));
  StorageGrowth* grown_growth = storage_growth(buffer.storage());
  TORCH_INTERNAL_ASSERT(grown_growth != nullptr);
  grown_growth->capacity = true;
  grown_growth->bound_elements = growth->bound_elements;
  grown_growth->marked_dim = growth->marked_dim;
  g_appends.fetch_add(1, std::memory_order_relaxed);
  // A model that reads the whole sequence at every step (generation without a cache) reads it
  // padded to the length's bucket from now on (RFC 0029).
  check(api().note_sequence_length(sizes[dim]), "torch.cat");
  return tensor_on(buffer.storage(), a, sizes);
}

namespace module {

std::vector<int64_t> growth_counters() {
  return {
      g_capacity_buffers.load(std::memory_order_relaxed),
      g_appends.load(std::memory_order_relaxed)};
}

void reset_growth_counters() {
  g_capacity_buffers.store(0, std::memory_order_relaxed);
  g_appends.store(0, std::memory_order_relaxed);
}

}  // namespace module

// `torch_pjrt.mark_dynamic(t, dim, max)`: `t` will grow along `dim` (up to `max`): its first
// append already gets a capacity of at least `max` along `dim`.
void mark_dynamic(const at::Tensor& self, int64_t dim, std::optional<int64_t> max) {
  TORCH_CHECK_VALUE(
      is_pjrt(self),
      "mark_dynamic expects a tensor on the pjrt device, got one on ",
      self.device(),
      "; move it with .to('pjrt') first");
  TORCH_CHECK_VALUE(self.dim() > 0, "mark_dynamic expects a tensor with a dimension, got a 0-d one");
  dim = c10::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK_VALUE(
      !max.has_value() || *max >= self.size(dim),
      "mark_dynamic: max=",
      max.value_or(0),
      " is below dimension ",
      dim,
      "'s size ",
      self.size(dim),
      "; give a bound at least the current size");
  bool outermost = true;
  for (int64_t d = 0; d < dim; ++d) {
    outermost = outermost && self.size(d) == 1;
  }
  if (!outermost) {
    // An inner dimension (a batch of sequences, `[batch, length]`): the engine pads tensors
    // like this one along it, so their readers compile once per bucket (RFC 0029).
    TpjrtTensor t = describe(self);
    check(
        api().mark_dynamic(&t, static_cast<int32_t>(dim), max.value_or(self.size(dim))),
        "torch_pjrt.mark_dynamic");
    return;
  }
  StorageGrowth* growth = storage_growth(self.storage());
  TORCH_CHECK(growth != nullptr, "mark_dynamic: the tensor's storage is not the pjrt engine's");
  growth->marked_dim = dim;
  if (max.has_value() && self.size(dim) > 0) {
    growth->bound_elements = self.numel() / self.size(dim) * *max;
  }
}

}  // namespace torch_pjrt

TORCH_LIBRARY(torch_pjrt, m) {
  m.def("mark_dynamic(Tensor self, int dim, int? max=None) -> ()");
}

TORCH_LIBRARY_IMPL(torch_pjrt, PrivateUse1, m) {
  m.impl("mark_dynamic", TORCH_FN(torch_pjrt::mark_dynamic));
}
