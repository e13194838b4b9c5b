// The pjrt PrivateUse1 backend: engine table, allocator, device guard, hooks, the minimal kernels
// PyTorch needs for any device (creation, views, copies, `set_`, `resize_`, scalars), the op-call
// builder used by the generated kernels, and the CPU fallback.
#include "pjrt_backend.h"

#include <algorithm>
#include <array>
#include <string_view>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/record_function.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "module_api.h"

namespace torch_pjrt {

constexpr c10::DeviceType kPjrt = c10::DeviceType::PrivateUse1;

// ===== the engine table ===========================================================================

namespace {
std::atomic<const TpjrtApi*> g_api{nullptr};
std::atomic<bool> g_started{false};
std::mutex g_unavailable_mutex;
std::string g_unavailable;  // why there is no table (guarded by g_unavailable_mutex)
std::vector<std::string> g_missing_ops;
}  // namespace

std::string set_api(const TpjrtApi* table) {
  if (table == nullptr) {
    return "the pjrt engine returned no function table";
  }
  if (table->version != TPJRT_ABI_VERSION) {
    return "the pjrt engine library has C ABI version " + std::to_string(table->version) +
        " but this build of torch_pjrt expects version " + std::to_string(TPJRT_ABI_VERSION) +
        "; rebuild the package (make python-build)";
  }
  if (table->struct_size < sizeof(TpjrtApi)) {
    return "the pjrt engine's function table has " + std::to_string(table->struct_size) +
        " bytes but this build of torch_pjrt needs " + std::to_string(sizeof(TpjrtApi)) +
        "; rebuild the package (make python-build)";
  }
  const TpjrtApi* current = g_api.load();
  if (current != nullptr) {
    if (current == table) {
      return "";
    }
    return "a different pjrt engine is already installed in this process; there is exactly one "
           "engine per process";
  }
  g_api.store(table);
  g_missing_ops = register_generated_kernels();
  return "";
}

void set_unavailable(const std::string& reason) {
  std::lock_guard<std::mutex> lock(g_unavailable_mutex);
  g_unavailable = reason;
}

bool api_loaded() {
  return g_api.load() != nullptr;
}

const TpjrtApi& api() {
  const TpjrtApi* table = g_api.load();
  if (C10_LIKELY(table != nullptr)) {
    return *table;
  }
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(g_unavailable_mutex);
    reason = g_unavailable;
  }
  TORCH_CHECK(
      false,
      "the pjrt device is not available: ",
      reason.empty() ? std::string("the torch-pjrt engine library was not loaded (import torch_pjrt "
                                   "to load it)")
                     : reason);
}

bool engine_started() {
  return g_started.load(std::memory_order_relaxed);
}

void mark_started() {
  if (!g_started.load(std::memory_order_relaxed)) {
    g_started.store(true);
  }
}

void raise_engine_error(int32_t code, const char* context) {
  const TpjrtApi* table = g_api.load();
  const char* raw = table != nullptr ? table->last_error() : nullptr;
  std::string message = raw != nullptr && raw[0] != '\0'
      ? std::string(raw)
      : std::string(context) + ": the pjrt engine failed without a message (status " +
          std::to_string(code) + ")";
  switch (code) {
    case TPJRT_VALUE_ERROR:
      TORCH_CHECK_VALUE(false, message);
    case TPJRT_TYPE_ERROR:
      TORCH_CHECK_TYPE(false, message);
    case TPJRT_NOT_IMPLEMENTED:
      TORCH_CHECK_NOT_IMPLEMENTED(false, message);
    case TPJRT_INDEX_ERROR:
      TORCH_CHECK_INDEX(false, message);
    default:
      TORCH_CHECK(false, message);
  }
}

// ===== storages and the allocator =================================================================

namespace {

// The context of a pjrt DataPtr: the engine storage it owns. `id` is 0 once ownership moved to
// another DataPtr (a storage re-addressed by a resize).
struct StorageCtx {
  uint64_t id;
  // Growth bookkeeping (growth.cpp): whether the storage is a capacity buffer an append sequence
  // writes into, and the bound `torch_pjrt.mark_dynamic` gave it (elements, 0 when none).
  StorageGrowth growth{};
};

void delete_storage_ctx(void* ptr) noexcept {
  auto* ctx = static_cast<StorageCtx*>(ptr);
  if (ctx == nullptr) {
    return;
  }
  const TpjrtApi* table = g_api.load();
  if (ctx->id != 0 && table != nullptr) {
    // A release failure (e.g. at interpreter exit) has no one to report to.
    (void)table->storage_release(ctx->id);
  }
  delete ctx;
}

// PyTorch needs a unique non-null data pointer per storage (`torch.save` dedups storages by it,
// and views add byte offsets to it). Storages live on the device, so these are virtual addresses
// handed out by a bump counter, never dereferenced: each storage gets its byte size (rounded up)
// plus a gap, so no pointer into one storage equals a pointer into another.
std::atomic<uintptr_t> g_next_address{uintptr_t(0x100000000000ULL)};

c10::DataPtr make_data_ptr(uint64_t id, size_t nbytes, c10::Device device) {
  auto* ctx = new StorageCtx{id, {}};
  const uintptr_t span = ((nbytes + 63) / 64) * 64 + 64;
  const uintptr_t address = g_next_address.fetch_add(span);
  return c10::DataPtr(reinterpret_cast<void*>(address), ctx, &delete_storage_ctx, device);
}

class PjrtAllocator final : public at::Allocator {
 public:
  at::DataPtr allocate(size_t nbytes) override {
    const TpjrtApi& table = api();
    uint64_t id = 0;
    const c10::DeviceIndex device = current_device_index();
    check(table.storage_new_on(nbytes, device, &id), "allocating pjrt memory");
    mark_started();
    return make_data_ptr(id, nbytes, c10::Device(kPjrt, device));
  }

  at::DeleterFnPtr raw_deleter() const override {
    return nullptr;
  }

  void copy_data(void* /*dest*/, const void* /*src*/, std::size_t /*count*/) const override {
    TORCH_CHECK_NOT_IMPLEMENTED(
        false,
        "pjrt memory lives on the device and cannot be copied as raw host bytes; copy tensors "
        "instead (tensor.clone(), tensor.copy_())");
  }
};

PjrtAllocator g_allocator;

}  // namespace

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator)

at::Allocator* allocator() {
  return &g_allocator;
}

uint64_t storage_id(const c10::Storage& storage) {
  TORCH_CHECK(storage, "a pjrt tensor without storage was passed to the pjrt engine");
  const c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  auto* ctx = impl->data_ptr().cast_context<StorageCtx>(&delete_storage_ctx);
  TORCH_CHECK(
      ctx != nullptr && ctx->id != 0,
      "a storage on device ",
      impl->device(),
      " was not allocated by the pjrt engine and cannot be used by it");
  return ctx->id;
}

StorageGrowth* storage_growth(const c10::Storage& storage) {
  if (!storage) {
    return nullptr;
  }
  auto* ctx =
      storage.unsafeGetStorageImpl()->data_ptr().cast_context<StorageCtx>(&delete_storage_ctx);
  return ctx != nullptr && ctx->id != 0 ? &ctx->growth : nullptr;
}

c10::Storage wrap_storage(uint64_t id, size_t nbytes, c10::Device device) {
  return c10::Storage(
      c10::Storage::use_byte_size_t(),
      nbytes,
      make_data_ptr(id, nbytes, device),
      &g_allocator,
      /*resizable=*/true);
}

void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  const uint64_t id = storage_id(storage);
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  if (impl->nbytes() == nbytes) {
    return;
  }
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  check(api().storage_resize(id, nbytes), "resizing a pjrt storage");
  // A grown storage needs a larger address range: move ownership to a new DataPtr.
  auto* old_ctx =
      static_cast<const c10::StorageImpl*>(impl)->data_ptr().cast_context<StorageCtx>(
          &delete_storage_ctx);
  c10::DataPtr fresh = make_data_ptr(id, nbytes, impl->device());
  old_ctx->id = 0;
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(nbytes);
}

// ===== devices =====================================================================================

namespace {
thread_local c10::DeviceIndex t_device = 0;
std::atomic<int> g_device_count{0};
}  // namespace

c10::DeviceIndex current_device_index() {
  return t_device;
}

void set_current_device_index(c10::DeviceIndex index) {
  TORCH_CHECK_INDEX(
      index >= 0 && index < device_count_nothrow(),
      "pjrt device index ",
      static_cast<int>(index),
      " is out of range: there are ",
      static_cast<int>(device_count_nothrow()),
      " pjrt devices");
  t_device = index;
}

c10::DeviceIndex device_count_nothrow() noexcept {
  int cached = g_device_count.load(std::memory_order_relaxed);
  if (cached > 0) {
    return static_cast<c10::DeviceIndex>(cached);
  }
  const TpjrtApi* table = g_api.load();
  // Never start PJRT just to count devices (autograd asks every backend at each backward).
  if (table == nullptr || !engine_started()) {
    return 1;
  }
  int32_t n = 0;
  if (table->device_count(&n) != TPJRT_OK || n < 1) {
    return 1;
  }
  n = std::min<int32_t>(n, std::numeric_limits<c10::DeviceIndex>::max());
  g_device_count.store(n);
  return static_cast<c10::DeviceIndex>(n);
}

namespace {

// The current stream of each thread (0: the default stream), and the next new stream's id.
thread_local c10::StreamId t_stream = 0;
std::atomic<c10::StreamId> g_next_stream{1};

c10::Stream stream_of(c10::Device d, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, d, id);
}

void sync_engine() {
  if (!api_loaded() || !engine_started()) {
    return;  // nothing was ever queued
  }
  check(api().sync(), "synchronizing the pjrt device");
}

struct PjrtGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kPjrt;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() >= 0 && d.index() != old.index()) {
      setDevice(d);
    }
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(kPjrt, t_device);
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kPjrt, "expected a pjrt device, got ", d);
    if (d.index() >= 0) {
      set_current_device_index(d.index());
    }
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) {
      t_device = d.index();
    }
  }
  // Streams: one ordered execution queue serves them all, so work on any stream runs after
  // everything launched before it, on every stream. A stream is an id (0 the default one),
  // current per thread as CUDA's are; events and queries are the engine's (device completion).
  c10::Stream getStream(c10::Device d) const override {
    return stream_of(d, t_stream);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return stream_of(d, 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return stream_of(d, g_next_stream.fetch_add(1));
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return stream_of(d, g_next_stream.fetch_add(1));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = stream_of(s.device(), t_stream);
    t_stream = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count_nothrow();
  }
  void record(void** event, const c10::Stream& /*stream*/, const c10::DeviceIndex /*device*/,
              const c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(api_loaded(), "the pjrt device is not available");
    uint64_t id = 0;
    check(api().event_record(&id), "recording a pjrt event");
    if (*event != nullptr) {
      (void)api().event_destroy(reinterpret_cast<uintptr_t>(*event));
    }
    *event = reinterpret_cast<void*>(static_cast<uintptr_t>(id));
  }
  // A stream waiting for an event: the one queue already runs every later launch after it.
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* event) const override {
    if (event == nullptr) {
      return true;  // never recorded: nothing to wait for
    }
    int32_t done = 0;
    check(api().event_query(reinterpret_cast<uintptr_t>(event), &done), "querying a pjrt event");
    return done != 0;
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device*/) const noexcept override {
    if (event != nullptr && api_loaded()) {
      (void)api().event_destroy(reinterpret_cast<uintptr_t>(event));
    }
  }
  bool queryStream(const c10::Stream& /*stream*/) const override {
    if (!api_loaded() || !engine_started()) {
      return true;
    }
    void* event = nullptr;
    record(&event, c10::Stream(c10::Stream::DEFAULT, getDevice()), getDevice().index(),
           c10::EventFlag::PYTORCH_DEFAULT);
    const bool done = queryEvent(event);
    destroyEvent(event, getDevice().index());
    return done;
  }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {
    sync_engine();
  }
  void synchronizeEvent(void* event) const override {
    if (event == nullptr) {
      return;
    }
    check(api().event_synchronize(reinterpret_cast<uintptr_t>(event)),
          "synchronizing a pjrt event");
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "elapsed_time: both events must be recorded first (event.record())");
    double ms = 0;
    check(api().event_elapsed(reinterpret_cast<uintptr_t>(start),
                              reinterpret_cast<uintptr_t>(end), &ms),
          "timing pjrt events");
    return ms;
  }
  void synchronizeDevice(const c10::DeviceIndex /*device*/) const override {
    sync_engine();
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, PjrtGuardImpl);

struct PjrtHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return api_loaded();
  }
  // The device's own generators (random.cpp): random ops draw their keys from them.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return default_generator(device);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    return new_generator(device);
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return at::Device(kPjrt, t_device);
  }
  bool isPinnedPtr(const void* /*data*/) const override {
    return false;
  }
  // Host memory is not pinned for pjrt transfers: pin_memory() is a plain host copy.
  at::Allocator* getPinnedMemoryAllocator() const override {
    return c10::GetCPUAllocator();
  }
  bool hasPrimaryContext(c10::DeviceIndex /*device*/) const override {
    return engine_started();
  }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override {
    return device_count_nothrow();
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    set_current_device_index(device);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return t_device;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    c10::DeviceIndex old = t_device;
    if (device >= 0) {
      set_current_device_index(device);
    }
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage_bytes(storage, nbytes);
  }
};

const int g_hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new PjrtHooks());
  return 0;
}();

}  // namespace

// ===== tensors ======================================================================================

TpjrtTensor describe(const at::Tensor& t) {
  TpjrtTensor d;
  d.storage = storage_id(t.storage());
  d.dtype = dtype_code(t.scalar_type());
  d.ndim = static_cast<int32_t>(t.dim());
  d.sizes = t.sizes().data();
  d.strides = t.strides().data();
  d.offset = t.storage_offset();
  return d;
}

at::Tensor tensor_from_output(const TpjrtOutput& out, c10::Device device) {
  // Own the engine storage before anything else can throw.
  c10::Storage storage = wrap_storage(out.storage, static_cast<size_t>(out.nbytes), device);
  TORCH_CHECK(
      out.ndim >= 0 && out.ndim <= TPJRT_MAX_DIMS,
      "the pjrt engine returned a result with ",
      out.ndim,
      " dimensions");
  auto dtype = static_cast<at::ScalarType>(out.dtype);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(c10::IntArrayRef(out.sizes, out.ndim));
  return t;
}

void copy_host_to_device(const at::Tensor& src_cpu, const at::Tensor& dst) {
  if (dst.numel() == 0) {
    return;
  }
  at::Tensor src = src_cpu;
  if (src.scalar_type() != dst.scalar_type()) {
    src = src.to(dst.scalar_type());
  }
  if (src.sizes() != dst.sizes()) {
    src = src.expand(dst.sizes());
  }
  src = src.resolve_conj().resolve_neg().contiguous();
  TpjrtTensor d = describe(dst);
  check(api().write_host(&d, src.const_data_ptr(), src.nbytes()), "copying to pjrt");
  mark_started();
}

void copy_device_to_host(const at::Tensor& src, const at::Tensor& dst_cpu) {
  if (src.numel() == 0) {
    return;
  }
  const bool direct = dst_cpu.is_contiguous() && dst_cpu.scalar_type() == src.scalar_type() &&
      dst_cpu.sizes() == src.sizes() && !dst_cpu.is_neg() && !dst_cpu.is_conj();
  at::Tensor host = direct
      ? dst_cpu
      : at::empty(src.sizes(), src.options().device(c10::kCPU).memory_format(
                                   c10::MemoryFormat::Contiguous));
  TpjrtTensor d = describe(src);
  check(api().read_host(&d, host.mutable_data_ptr(), host.nbytes()), "copying from pjrt");
  mark_started();
  if (!direct) {
    dst_cpu.copy_(host);
  }
}

// Whether `t` covers its whole storage, contiguously, with no view bits: the engine can hand
// its buffer to another device as it is.
bool is_whole_storage(const at::Tensor& t) {
  return t.is_contiguous() && t.storage_offset() == 0 && !t.is_neg() && !t.is_conj() &&
      t.storage().nbytes() == t.nbytes();
}

// A copy between two devices of the process: the source's values, in the destination's dtype
// and shape, are made whole on the source's device, and the engine moves that buffer to the
// destination's device (the plugin copies device to device) and writes it into the destination.
void copy_across_devices(const at::Tensor& src, const at::Tensor& dst) {
  at::Tensor whole = src;
  {
    const c10::DeviceGuard guard(src.device());
    if (whole.scalar_type() != dst.scalar_type()) {
      whole = whole.to(dst.scalar_type());
    }
    if (whole.sizes() != dst.sizes()) {
      whole = whole.expand(dst.sizes());
    }
    if (!is_whole_storage(whole)) {
      whole = whole.resolve_conj().resolve_neg().clone(at::MemoryFormat::Contiguous);
    }
  }
  TpjrtTensor from = describe(whole);
  TpjrtTensor to = describe(dst);
  check(api().copy_to_device(&from, &to), "copying between pjrt devices");
  mark_started();
}

void copy_device_to_device(const at::Tensor& src, const at::Tensor& dst) {
  if (src.is_same(dst)) {
    return;
  }
  if (src.device() != dst.device()) {
    copy_across_devices(src, dst);
    return;
  }
  if (src.sizes() == dst.sizes()) {
    static const auto clone_op = engine_op(ops::clone);
    static const auto to_copy_op = engine_op(ops::_to_copy);
    OpCall call = src.scalar_type() == dst.scalar_type()
        ? OpCall(clone_op, "clone")
        : OpCall(to_copy_op, "_to_copy", {.dtype = dst.scalar_type()});
    call.input(src);
    call.out(dst);
    call.run_inplace();
    return;
  }
  static const auto copy_op = engine_op(ops::copy_);
  OpCall call(copy_op, "copy_");
  call.input(dst);
  call.input(src);
  call.out(dst);
  call.run_inplace();
}

at::Tensor in_format_of(at::Tensor t, std::initializer_list<at::Tensor> like) {
  if (!t.defined() || t.dim() != 4) {
    return t;
  }
  constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;
  bool channels_last = false;
  for (const at::Tensor& l : like) {
    channels_last = channels_last || (l.defined() && l.dim() == 4 &&
                                      l.suggest_memory_format() == kChannelsLast);
  }
  if (!channels_last || t.is_contiguous(kChannelsLast)) {
    return t;
  }
  at::Tensor r = at::empty(t.sizes(), t.options().memory_format(kChannelsLast));
  copy_device_to_device(t, r);
  return r;
}

at::Tensor in_memory_format(
    at::Tensor t,
    std::optional<at::MemoryFormat> memory_format,
    const at::Tensor& like) {
  if (!t.defined()) {
    return t;
  }
  at::MemoryFormat format = memory_format.value_or(at::MemoryFormat::Preserve);
  if (format == at::MemoryFormat::Preserve) {
    if (like.is_non_overlapping_and_dense()) {
      if (t.strides() == like.strides()) {
        return t;
      }
      at::Tensor r = at::empty_strided(like.sizes(), like.strides(), t.options());
      copy_device_to_device(t, r);
      return r;
    }
    format = like.suggest_memory_format();
  }
  if (t.is_contiguous(format)) {
    return t;
  }
  at::Tensor r = at::empty(t.sizes(), t.options().memory_format(format));
  copy_device_to_device(t, r);
  return r;
}

// ===== one op call ==================================================================================

namespace {

TpjrtScalar scalar_of(const at::Scalar& s, int32_t tensor_dtype) {
  TpjrtScalar r{};
  r.tensor_dtype = tensor_dtype;
  if (s.isBoolean()) {
    r.kind = TPJRT_SCALAR_BOOL;
    r.int_value = s.toBool() ? 1 : 0;
  } else if (s.isIntegral(/*includeBool=*/false)) {
    r.kind = TPJRT_SCALAR_INT;
    // A uint64 past int64's range travels as its two's complement bits; the engine reads them
    // back as unsigned for an unsigned result.
    r.int_value = s.type() == at::kUInt64 ? static_cast<int64_t>(s.to<uint64_t>()) : s.toLong();
  } else if (s.isFloatingPoint()) {
    r.kind = TPJRT_SCALAR_FLOAT;
    r.float_value = s.toDouble();
  } else {
    TORCH_CHECK_TYPE(
        false, "complex and symbolic scalars are not supported on pjrt (got ", s.type(), ")");
  }
  return r;
}

bool is_one(const TpjrtScalar& s) {
  return s.tensor_dtype < 0 &&
      ((s.kind == TPJRT_SCALAR_INT && s.int_value == 1) ||
       (s.kind == TPJRT_SCALAR_FLOAT && s.float_value == 1.0));
}

bool is_cpu_scalar_tensor(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.dim() == 0;
}

// The value of a one-element CPU tensor, read from its memory for the dtypes Python numbers
// arrive as: `item()` would go through the dispatcher twice (`item`, `_local_scalar_dense`)
// for every scalar operand of every op.
at::Scalar host_value(const at::Tensor& t) {
  const void* data = t.const_data_ptr();
  switch (t.scalar_type()) {
    case at::kDouble:
      return *static_cast<const double*>(data);
    case at::kFloat:
      return static_cast<double>(*static_cast<const float*>(data));
    case at::kLong:
      return *static_cast<const int64_t*>(data);
    case at::kInt:
      return static_cast<int64_t>(*static_cast<const int32_t*>(data));
    case at::kBool:
      return *static_cast<const bool*>(data);
    default:
      return t.item();
  }
}

}  // namespace

void OpCall::input(const at::Tensor& t) {
  TORCH_CHECK(t.defined(), name_, ": an undefined tensor was passed to the pjrt device");
  note_complex(t);
  if (C10_LIKELY(is_pjrt(t))) {
    if (!device_) {
      device_ = t.device();
    }
    if (C10_UNLIKELY(t.is_conj())) {
      // A conjugate view reaching a kernel (the ops PyTorch's conjugation fallback lets through:
      // `clone`, `copy_`, products): its logical values. `t.conj()` has no conjugate bit.
      keep_alive_.push_back(at::conj_physical(t.conj()));
      inputs_.push_back(describe(keep_alive_.back()));
      return;
    }
    if (C10_UNLIKELY(t.is_neg())) {
      // A negative view reaching a kernel (`clone` and `copy_` fall through PyTorch's negation
      // fallback, which resolves the inputs of every other op): its logical values.
      keep_alive_.push_back(at::neg(at::_neg_view(t)));
      inputs_.push_back(describe(keep_alive_.back()));
      return;
    }
    inputs_.push_back(describe(t));
    return;
  }
  if (is_cpu_scalar_tensor(t) && t.unsafeGetTensorImpl()->is_wrapped_number()) {
    wrapped_.emplace_back(inputs_.size(), t);
    inputs_.push_back(TpjrtTensor{});  // described in upload_wrapped_numbers
    return;
  }
  TORCH_CHECK(
      is_cpu_scalar_tensor(t),
      "Expected all tensors to be on the same device, but found at least two devices, ",
      result_device(),
      " and ",
      t.device(),
      "! (while running ",
      name_,
      " on pjrt; move the tensor with .to('pjrt'))");
  inputs_.push_back(upload_scalar(t));
}

TpjrtTensor OpCall::upload_scalar(const at::Tensor& host) {
  // On the op's device, as its other tensors.
  const c10::DeviceGuard guard(result_device());
  at::Tensor uploaded = at::detail::empty_generic(
      {}, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), host.scalar_type(),
      std::nullopt);
  copy_host_to_device(host, uploaded);
  keep_alive_.push_back(uploaded);
  return describe(keep_alive_.back());
}

void OpCall::opt_input(const std::optional<at::Tensor>& t) {
  if (t.has_value() && t->defined()) {
    input(*t);
  }
}

void OpCall::inputs(at::ITensorListRef ts) {
  for (const at::Tensor& t : ts) {
    input(t);
  }
}

int64_t OpCall::operand_kind(const at::Tensor& t) {
  return is_cpu_scalar_tensor(t) && !t.is_complex() ? 2 : 1;
}

int64_t OpCall::input_or_scalar(const at::Tensor& t) {
  if (operand_kind(t) == 2) {
    const int32_t tensor_dtype = t.unsafeGetTensorImpl()->is_wrapped_number()
        ? -1
        : dtype_code(t.scalar_type());
    scalars_.push_back(scalar_of(host_value(t), tensor_dtype));
    trimmable_.push_back(false);
    return 2;
  }
  input(t);
  return 1;
}

int64_t OpCall::opt_input_or_scalar(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) {
    return 0;
  }
  return input_or_scalar(*t);
}

void OpCall::scalar(const at::Scalar& s) {
  scalars_.push_back(real_scalar(s));
  trimmable_.push_back(false);
}

void OpCall::scalar_default1(const at::Scalar& s) {
  scalars_.push_back(real_scalar(s));
  trimmable_.push_back(true);
}

TpjrtScalar OpCall::real_scalar(const at::Scalar& s) {
  if (C10_UNLIKELY(s.isComplex())) {
    // The call runs on the CPU (`on_cpu`); a placeholder keeps the layout.
    complex_ = true;
    complex_scalar_ = true;
    return scalar_of(at::Scalar(0.0), -1);
  }
  return scalar_of(s, -1);
}

bool OpCall::complex_on_cpu() {
  if (complex_scalar_) {
    return true;
  }
  trim_default_scalars();
  TpjrtOpCall c = make_call();
  TpjrtOutput meta[4];
  uint64_t count = 0;
  return api().op_meta(&c, meta, 4, &count) == TPJRT_NOT_IMPLEMENTED;
}

int64_t OpCall::opt_scalar(const std::optional<at::Scalar>& s) {
  if (!s.has_value()) {
    return 0;
  }
  scalar(*s);
  return 2;
}

void OpCall::out(const at::Tensor& t) {
  note_complex(t);
  TORCH_CHECK(
      is_pjrt(t),
      name_,
      ": the output tensor is on ",
      t.defined() ? t.device().str() : std::string("no device"),
      " but the op runs on pjrt; Expected all tensors to be on the same device");
  if (!device_) {
    device_ = t.device();
  }
  out_tensors_.push_back(t);
}

void OpCall::trim_default_scalars() {
  while (!scalars_.empty() && trimmable_.back() && is_one(scalars_.back())) {
    scalars_.pop_back();
    trimmable_.pop_back();
  }
}

namespace {

// PyTorch's type-promotion categories: bool < integer < floating < complex.
int promotion_category(at::ScalarType t) {
  if (at::isComplexType(t)) {
    return 3;
  }
  if (at::isFloatingType(t)) {
    return 2;
  }
  return t == at::kBool ? 0 : 1;
}

}  // namespace

// A wrapped number takes part in type promotion only when its category is above every tensor
// input's, and then as the category's default dtype; otherwise it takes the operands' dtype.
// Uploaded in a dtype that promotes the same way, so the engine's meta, which sees tensors
// only, gives PyTorch's result dtype (`torch.sub(5, int16_scalar_tensor)` is int16, not int64).
void OpCall::upload_wrapped_numbers() {
  int top = -1;
  std::optional<at::ScalarType> top_type;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (std::any_of(wrapped_.begin(), wrapped_.end(), [&](const auto& w) { return w.first == i; })) {
      continue;
    }
    const auto type = static_cast<at::ScalarType>(inputs_[i].dtype);
    if (promotion_category(type) > top) {
      top = promotion_category(type);
      top_type = type;
    }
  }
  for (const auto& [index, number] : wrapped_) {
    at::ScalarType target = number.scalar_type();
    const int category = promotion_category(target);
    if (top_type && category <= top) {
      target = *top_type;
    } else if (category == 2) {
      target = c10::typeMetaToScalarType(c10::get_default_dtype());
    } else if (category == 3 && top_type == at::kHalf) {
      // Over float16 a complex number gives complex32 (`toComplexType`), also when every
      // tensor is 0-d and the number would otherwise promote with them as complex64.
      target = at::kComplexHalf;
    } else if (category == 3) {
      target = c10::toComplexType(c10::typeMetaToScalarType(c10::get_default_dtype()));
    }
    inputs_[index] = upload_scalar(number.to(target));
  }
  wrapped_.clear();
}

TpjrtOpCall OpCall::make_call() {
  TORCH_CHECK(op_ >= 0, name_, ": the pjrt engine does not implement this op");
  if (C10_UNLIKELY(!wrapped_.empty())) {
    upload_wrapped_numbers();
  }
  TpjrtOpCall c{};
  c.op = op_;
  c.inputs = inputs_.data();
  c.num_inputs = inputs_.size();
  c.scalars = scalars_.data();
  c.num_scalars = scalars_.size();
  c.params = params_.data();
  c.num_params = params_.size();
  c.outs = outs_.data();
  c.num_outs = outs_.size();
  c.default_float = dtype_code(c10::typeMetaToScalarType(c10::get_default_dtype()));
  c.device = result_device().index();
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST:
      c.matmul_precision = 0;
      break;
    case at::Float32MatmulPrecision::HIGH:
      c.matmul_precision = 1;
      break;
    case at::Float32MatmulPrecision::MEDIUM:
      c.matmul_precision = 2;
      break;
  }
  return c;
}

c10::Device OpCall::result_device() const {
  return device_ ? *device_ : c10::Device(kPjrt, t_device);
}

at::Tensor OpCall::run_functional() {
  std::vector<at::Tensor> results = run_functional_n(1);
  return std::move(results[0]);
}

std::vector<at::Tensor> OpCall::run_functional_n(size_t n) {
  trim_default_scalars();
  TpjrtOpCall c = make_call();
  TpjrtOutput outs[4];
  uint64_t count = 0;
  check(api().op(&c, outs, 4, &count), name_);
  mark_started();
  std::vector<at::Tensor> results;
  results.reserve(count);
  const c10::Device device = result_device();
  for (uint64_t i = 0; i < count && i < 4; ++i) {
    results.push_back(tensor_from_output(outs[i], device));
  }
  TORCH_CHECK(
      results.size() == n,
      name_,
      ": the pjrt engine returned ",
      results.size(),
      " results where PyTorch expects ",
      n);
  return results;
}

void OpCall::check_outs(bool resize) {
  trim_default_scalars();
  TpjrtOpCall c = make_call();
  TpjrtOutput meta[4];
  uint64_t count = 0;
  check(api().op_meta(&c, meta, 4, &count), name_);
  TORCH_CHECK(
      count == out_tensors_.size(),
      name_,
      ": the op produces ",
      count,
      " results but ",
      out_tensors_.size(),
      " output tensors were given");
  outs_.clear();
  for (size_t i = 0; i < out_tensors_.size(); ++i) {
    const at::Tensor& o = out_tensors_[i];
    auto result_type = static_cast<at::ScalarType>(meta[i].dtype);
    c10::IntArrayRef shape(meta[i].sizes, meta[i].ndim);
    TORCH_CHECK(
        c10::canCast(result_type, o.scalar_type()),
        "result type ",
        result_type,
        " can't be cast to the desired output type ",
        o.scalar_type());
    if (resize) {
      at::native::resize_output(o, shape);
    } else {
      TORCH_CHECK(
          o.sizes() == shape,
          "output with shape ",
          o.sizes(),
          " doesn't match the broadcast shape ",
          shape);
    }
  }
  for (const at::Tensor& o : out_tensors_) {
    outs_.push_back(describe(o));
  }
}

void OpCall::run_inplace() {
  check_outs(/*resize=*/false);
  TpjrtOpCall c = make_call();
  TpjrtOutput results[4];
  uint64_t count = 0;
  check(api().op(&c, results, 4, &count), name_);
  mark_started();
  conjugate_conjugate_outs();
}

void OpCall::run_out() {
  check_outs(/*resize=*/true);
  TpjrtOpCall c = make_call();
  TpjrtOutput results[4];
  uint64_t count = 0;
  check(api().op(&c, results, 4, &count), name_);
  mark_started();
  conjugate_conjugate_outs();
}

namespace {
// The in-place and `out=` products that PyTorch's conjugation fallback passes straight to the
// kernel (ConjugateFallback.cpp registers them as fallthroughs, since BLAS kernels read and
// write the conjugate bit themselves). Every other op's conjugate outputs are resolved by the
// fallback before the kernel runs, and `conj_physical_` must conjugate the memory as it is.
bool writes_through_the_conjugate_bit(std::string_view name) {
  static const std::array<std::string_view, 8> names = {
      "aten::mm.out",      "aten::addmm_", "aten::addmm.out", "aten::bmm.out",
      "aten::baddbmm_",    "aten::baddbmm.out", "aten::dot.out", "aten::vdot.out"};
  return std::find(names.begin(), names.end(), name) != names.end();
}
}  // namespace

void OpCall::conjugate_conjugate_outs() {
  // The engine wrote the result into the output's memory; an output with the conjugate bit
  // reads that memory conjugated, so the memory must hold the result's conjugate.
  bool any = false;
  for (const at::Tensor& o : out_tensors_) any = any || o.is_conj();
  if (C10_LIKELY(!any) || !writes_through_the_conjugate_bit(name_)) return;
  for (const at::Tensor& o : out_tensors_) {
    if (o.is_conj()) o.conj().conj_physical_();
  }
}

// ===== param encoders ===============================================================================

namespace enc {

int64_t f64(double x) {
  int64_t bits = 0;
  static_assert(sizeof(bits) == sizeof(x));
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

int64_t rounding(std::optional<c10::string_view> mode) {
  if (!mode.has_value()) {
    return 0;
  }
  if (*mode == "trunc") {
    return 1;
  }
  if (*mode == "floor") {
    return 2;
  }
  TORCH_CHECK(
      false,
      "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '",
      std::string(*mode),
      "'");
}

int64_t gelu_approx(c10::string_view approximate) {
  if (approximate == "none") {
    return 0;
  }
  if (approximate == "tanh") {
    return 1;
  }
  TORCH_CHECK(false, "approximate argument must be either none or tanh.");
}

int64_t full_reduction(const at::Tensor& self, const char* op) {
  TORCH_CHECK(
      self.numel() > 0,
      op,
      "(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction "
      "dim with the 'dim' argument.");
  return 0;
}

int64_t correction(const std::optional<at::Scalar>& c) {
  return f64(c.has_value() ? c->toDouble() : 1.0);
}

c10::SmallVector<int64_t, 4> nan_to_num(
    std::optional<double> nan,
    std::optional<double> posinf,
    std::optional<double> neginf) {
  c10::SmallVector<int64_t, 4> r;
  if (!nan && !posinf && !neginf) {
    return r;
  }
  r.push_back((nan ? 1 : 0) | (posinf ? 2 : 0) | (neginf ? 4 : 0));
  r.push_back(f64(nan.value_or(0.0)));
  r.push_back(f64(posinf.value_or(0.0)));
  r.push_back(f64(neginf.value_or(0.0)));
  return r;
}

}  // namespace enc

// ===== the minimal kernels ==========================================================================

namespace {

// The element types the engine stores (its DType); others are refused at creation, as a TypeError.
void check_dtype_supported(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kLong:
    case at::kInt:
    case at::kShort:
    case at::kChar:
    case at::kByte:
    case at::kUInt16:
    case at::kUInt32:
    case at::kUInt64:
    case at::kBool:
    case at::kComplexHalf:
    case at::kComplexFloat:
    case at::kComplexDouble:
      return;
    default:
      TORCH_CHECK_TYPE(
          false,
          "dtype ",
          t,
          " is not supported on pjrt; supported: float64, float32, float16, bfloat16, int64, "
          "int32, int16, int8, uint64, uint32, uint16, uint8, bool, complex32, complex64, complex128");
  }
}

at::Tensor pjrt_empty(
    c10::SymIntArrayRef size,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Layout> layout,
    std::optional<at::Device> device,
    std::optional<bool> pin_memory,
    std::optional<at::MemoryFormat> memory_format) {
  const c10::Device dev = c10::device_or_default(device);
  TORCH_CHECK(dev.type() == kPjrt, "pjrt's empty was asked for a tensor on ", dev);
  TORCH_CHECK(
      c10::layout_or_default(layout) == c10::Layout::Strided,
      "pjrt supports only strided tensors, got layout ",
      c10::layout_or_default(layout));
  TORCH_CHECK(
      !c10::pinned_memory_or_default(pin_memory),
      "pin_memory=True applies to CPU tensors only, not to pjrt tensors");
  check_dtype_supported(c10::dtype_or_default(dtype));
  const c10::DeviceGuard guard(dev);
  return at::detail::empty_generic(
      C10_AS_INTARRAYREF_SLOW(size),
      &g_allocator,
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::dtype_or_default(dtype),
      memory_format);
}

at::Tensor pjrt_empty_strided(
    c10::SymIntArrayRef size,
    c10::SymIntArrayRef stride,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Layout> layout,
    std::optional<at::Device> device,
    std::optional<bool> pin_memory) {
  const c10::Device dev = c10::device_or_default(device);
  TORCH_CHECK(dev.type() == kPjrt, "pjrt's empty_strided was asked for a tensor on ", dev);
  TORCH_CHECK(
      c10::layout_or_default(layout) == c10::Layout::Strided,
      "pjrt supports only strided tensors, got layout ",
      c10::layout_or_default(layout));
  TORCH_CHECK(
      !c10::pinned_memory_or_default(pin_memory),
      "pin_memory=True applies to CPU tensors only, not to pjrt tensors");
  check_dtype_supported(c10::dtype_or_default(dtype));
  const c10::DeviceGuard guard(dev);
  return at::detail::empty_strided_generic(
      C10_AS_INTARRAYREF_SLOW(size),
      C10_AS_INTARRAYREF_SLOW(stride),
      &g_allocator,
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::dtype_or_default(dtype));
}

at::Tensor pjrt_as_strided(
    const at::Tensor& self,
    c10::SymIntArrayRef size,
    c10::SymIntArrayRef stride,
    std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset.has_value()) {
    offset = storage_offset->expect_int();
  }
  return at::native::as_strided_tensorimpl(
      self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), offset);
}

at::Tensor pjrt_view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor pjrt_reshape_alias(
    const at::Tensor& self,
    c10::SymIntArrayRef size,
    c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(
      self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

// Sets sizes (and strides, or contiguous ones) and grows the storage when it is too small.
void resize_impl(c10::TensorImpl* impl, c10::IntArrayRef sizes, at::OptionalIntArrayRef strides) {
  if (impl->sizes() == sizes && (!strides.has_value() || impl->strides() == *strides)) {
    return;
  }
  const size_t itemsize = impl->dtype().itemsize();
  const int64_t offset = impl->storage_offset();
  size_t nbytes = 0;
  if (strides.has_value()) {
    impl->set_sizes_and_strides(sizes, *strides);
    nbytes = at::detail::computeStorageNbytes(sizes, *strides, itemsize, offset);
  } else {
    impl->set_sizes_contiguous(sizes);
    nbytes = at::detail::computeStorageNbytesContiguous(sizes, itemsize, offset);
  }
  if (impl->numel() == 0) {
    return;
  }
  const c10::Storage& storage = impl->unsafe_storage();
  if (nbytes > storage.nbytes()) {
    resize_storage_bytes(storage, nbytes);
  }
}

const at::Tensor& pjrt_resize_(
    const at::Tensor& self,
    c10::SymIntArrayRef size,
    std::optional<at::MemoryFormat> memory_format) {
  c10::IntArrayRef sizes = C10_AS_INTARRAYREF_SLOW(size);
  for (int64_t s : sizes) {
    TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", sizes);
  }
  resize_impl(self.unsafeGetTensorImpl(), sizes, std::nullopt);
  if (memory_format.has_value()) {
    TORCH_CHECK(
        *memory_format != at::MemoryFormat::Preserve,
        "Unsupported memory format ",
        *memory_format);
    self.unsafeGetTensorImpl()->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage_impl(
    at::Tensor& self,
    at::Storage source,
    int64_t offset,
    c10::IntArrayRef sizes,
    c10::IntArrayRef strides) {
  if (strides.empty()) {
    strides = c10::IntArrayRef();  // no strides: contiguous
  }
  at::native::checkSetStorage(self, source, offset, sizes, strides);
  self.unsafeGetTensorImpl()->set_storage_offset(offset);
  at::OptionalIntArrayRef stride_opt =
      strides.data() != nullptr ? at::OptionalIntArrayRef(strides) : std::nullopt;
  resize_impl(self.unsafeGetTensorImpl(), sizes, stride_opt);
  return self;
}

at::Tensor& pjrt_set_storage_offset(
    at::Tensor& self,
    at::Storage source,
    c10::SymInt storage_offset,
    c10::SymIntArrayRef size,
    c10::SymIntArrayRef stride) {
  return set_storage_impl(
      self,
      std::move(source),
      storage_offset.expect_int(),
      C10_AS_INTARRAYREF_SLOW(size),
      C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& pjrt_set_storage(at::Tensor& self, at::Storage source) {
  const auto itemsize = static_cast<int64_t>(self.dtype().itemsize());
  const int64_t numel = static_cast<int64_t>(source.nbytes()) / itemsize;
  const int64_t sizes[1] = {numel};
  return set_storage_impl(self, std::move(source), 0, sizes, {});
}

at::Tensor& pjrt_set_tensor(at::Tensor& self, const at::Tensor& source) {
  TORCH_CHECK(
      self.dtype() == source.dtype(),
      "Could not set tensor of type ",
      self.dtype(),
      " to a tensor of type ",
      source.dtype());
  if (self.is_same(source)) {
    return self;
  }
  return set_storage_impl(
      self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& pjrt_set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &g_allocator, /*resizable=*/true);
  const int64_t sizes[1] = {0};
  return set_storage_impl(self, std::move(storage), 0, sizes, {});
}

// PyTorch's own rule lists only its built-in dense backends, so `param.data = t` would refuse a
// pjrt tensor and `Module.to("pjrt")` would make new Parameters, untying shared (tied) weights.
// pjrt tensors are plain strided dense tensors: they may take a CPU tensor's place and back.
bool pjrt_has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) {
    return true;
  }
  constexpr auto backends =
      c10::DispatchKeySet({c10::BackendComponent::CPUBit, c10::BackendComponent::PrivateUse1Bit});
  constexpr auto dense_k = c10::DispatchKeySet(c10::DispatchKey::Dense);
  auto dense = [&](const at::Tensor& t) {
    const c10::DispatchKeySet ks = t.key_set();
    return ks.has_any(dense_k) && ks.has_any(backends) && t.layout() == at::kStrided;
  };
  return dense(self) && dense(from);
}

// Negates the elements `t`'s storage holds (not its logical values): `t` read without its
// negative bit.
void negate_stored(const at::Tensor& t) {
  at::NoGradGuard no_grad;
  if (t.is_neg()) {
    at::_neg_view(t).neg_();
  } else {
    t.neg_();
  }
}

// Conjugates the elements `t`'s storage holds: `t` read without its conjugate bit.
void conjugate_stored(const at::Tensor& t) {
  at::NoGradGuard no_grad;
  (t.is_conj() ? t.conj() : t).conj_physical_();
}

// A copy wrote `dst`'s logical values into its storage as they are: where `dst` is a negative
// or conjugate view, the storage must hold them negated or conjugated.
void apply_view_bits(const at::Tensor& dst) {
  if (dst.is_neg()) {
    negate_stored(dst);
  }
  if (dst.is_conj()) {
    conjugate_stored(dst);
  }
}

at::Tensor pjrt_copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  const at::Tensor& src = self;
  // PyTorch's copy_ hands a device it does not know to `_copy_from` before it applies the
  // negative bits itself: they are applied here.
  if (is_pjrt(src) && is_pjrt(dst)) {
    // The engine reads a negative or conjugate source's logical values (`OpCall::input`).
    copy_device_to_device(src, dst);
    apply_view_bits(dst);
  } else if (is_pjrt(dst)) {
    // The host source is resolved (its logical values are written).
    copy_host_to_device(src.device().is_cpu() ? src : src.cpu(), dst);
    apply_view_bits(dst);
  } else if (is_pjrt(src)) {
    if (dst.device().is_cpu() && !src.is_neg() && !src.is_conj()) {
      copy_device_to_host(src, dst);
    } else {
      // Staged through the host (another device, or a source with its negative or conjugate
      // bit): the host copy holds the source's stored elements, its logical values once
      // negated or conjugated.
      at::Tensor host = at::empty(src.sizes(), src.options().device(c10::kCPU));
      copy_device_to_host(src, host);
      if (src.is_neg()) {
        host.neg_();
      }
      if (src.is_conj()) {
        host.conj_physical_();
      }
      dst.copy_(host);
    }
  } else {
    TORCH_CHECK(false, "pjrt's _copy_from was called without a pjrt tensor");
  }
  return dst;
}

// `copy_` itself, not only `_copy_from`: PyTorch's generic copy_ reaches `_copy_from` through the
// negation fallback, whose schema does not mark `dst` as written, so a negative view `dst` would
// be resolved into a copy and the write lost.
at::Tensor& pjrt_copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (self.is_same(src)) {
    return self;
  }
  if (src._is_zerotensor()) {
    return self.zero_();
  }
  pjrt_copy_from(src, self, non_blocking);
  return self;
}

at::Tensor pjrt_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    if (is_pjrt(dst)) {
      pjrt_resize_(dst, c10::fromIntArrayRefSlow(self.sizes()), std::nullopt);
    } else {
      dst.resize_(self.sizes());
    }
  }
  return pjrt_copy_from(self, dst, false);
}

at::Scalar pjrt_local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(
      self.numel() == 1,
      "a Tensor with ",
      self.numel(),
      " elements cannot be converted to Scalar");
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  TpjrtTensor d = describe(self);
  check(api().read_host(&d, host.mutable_data_ptr(), host.nbytes()), "reading a pjrt scalar");
  mark_started();
  return host_value(host);
}

// ----- the CPU fallback -----

std::mutex g_warned_mutex;
std::unordered_set<std::string> g_warned;

enum class FallbackMode { Cpu, Error };

FallbackMode fallback_mode() {
  const char* value = std::getenv("TORCH_PJRT_FALLBACK");
  if (value == nullptr || value[0] == '\0' || std::strcmp(value, "cpu") == 0) {
    return FallbackMode::Cpu;
  }
  if (std::strcmp(value, "error") == 0) {
    return FallbackMode::Error;
  }
  TORCH_CHECK_VALUE(
      false,
      "TORCH_PJRT_FALLBACK=",
      value,
      " is not a valid setting: expected 'cpu' (run unsupported ops on the CPU, warning once per "
      "op) or 'error' (raise NotImplementedError)");
}

// Checks TORCH_PJRT_FALLBACK, counts the fallback in the engine's metrics and warns once per op.
void note_cpu_fallback(const std::string& name) {
  if (fallback_mode() == FallbackMode::Error) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        false,
        "The operator '",
        name,
        "' is not implemented for the pjrt device, and TORCH_PJRT_FALLBACK=error forbids running "
        "it on the CPU. Unset TORCH_PJRT_FALLBACK (or set it to 'cpu') to run it on the CPU with "
        "a copy to the host and back.");
  }
  if (const TpjrtApi* table = g_api.load()) {
    (void)table->note_fallback(name.c_str());
  }
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(g_warned_mutex);
    first = g_warned.insert(name).second;
  }
  if (first) {
    TORCH_WARN(
        "The operator '",
        name,
        "' is not implemented for the pjrt device; it runs on the CPU instead, with its tensors "
        "copied to the host and back (counted in torch_pjrt.metrics()['fallback_ops']). Set "
        "TORCH_PJRT_FALLBACK=error to raise instead.");
  }
}

}  // namespace

void pjrt_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string name = c10::toString(op.schema().operator_name());
  note_cpu_fallback(name);
  // torch.profiler shows the op's run on the CPU, its copies included, as one named range.
  // The range may keep a view of its name until it ends.
  std::string label;
  at::RecordFunction range(at::RecordScope::USER_SCOPE);
  if (range.isActive()) {
    label = "pjrt cpu fallback: " + name;
    range.before(std::string_view(label));
  }
  at::native::cpu_fallback(op, stack);
}

void note_kernel_cpu_fallback(const std::string& name) {
  note_cpu_fallback(name);
}

void check_out_device(const char* op, const at::Tensor& self, const at::Tensor& out) {
  TORCH_CHECK(
      out.device() == self.device(),
      op,
      ": expected self and out to be on the same device, but got out on ",
      out.device(),
      " and self on ",
      self.device());
}

// PyTorch's check that a result can be written into a given tensor (`out=`, or `self` in place).
static void check_result_casts_to(const at::Tensor& result, const at::Tensor& into) {
  TORCH_CHECK(
      c10::canCast(result.scalar_type(), into.scalar_type()),
      "result type ",
      result.scalar_type(),
      " can't be cast to the desired output type ",
      into.scalar_type());
}

at::Tensor& write_out(const at::Tensor& result, at::Tensor& out) {
  check_out_device("out=", result, out);
  check_result_casts_to(result, out);
  at::native::resize_output(out, result.sizes());
  out.copy_(result);
  return out;
}

at::Tensor& write_in_place(const at::Tensor& result, at::Tensor& self) {
  check_result_casts_to(result, self);
  return self.copy_(result);
}

// `_copy_from` and `_copy_from_and_resize` write the bits of a conjugate or negative `dst`
// themselves (`apply_view_bits`). PyTorch's conjugation and negation fallbacks would otherwise
// hand them a resolved temporary for `dst` and drop the write: the CPU fallback's write-back of
// an in-place op on a conjugate view (complex `addmm_`, `baddbmm_`) was lost. Only backends
// without their own `copy_` (pjrt here) reach these two ops.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&pjrt_cpu_fallback>());
}

// ===== batch norm ===================================================================================

// native_batch_norm returns its results and, in training, also writes the new running statistics
// into running_mean/running_var (the schema does not mark them as written). That is two engine
// ops: the normalization, then the running statistics as outputs written into those tensors.
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_impl(
    const char* aten_name,
    const at::Tensor& input,
    const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var,
    bool training,
    double momentum,
    double eps) {
  // Kernels run only once the engine table is installed; a lookup that raises is retried.
  static const auto norm_op = engine_op(ops::native_batch_norm);
  static const auto stats_op = engine_op(ops::_batch_norm_running_stats);
  OpCall c(norm_op, aten_name, {
      .has_weight = present(weight),
      .has_bias = present(bias),
      .has_running_mean = present(running_mean),
      .has_running_var = present(running_var),
      .training = training,
      .eps = eps,
  });
  c.input(input);
  for (const std::optional<at::Tensor>* t : {&weight, &bias, &running_mean, &running_var}) {
    c.opt_input(*t);
  }
  std::vector<at::Tensor> r = c.run_functional_n(3);
  if (training && present(running_mean) && present(running_var)) {
    OpCall update(stats_op, aten_name);
    update.input(input);
    update.input(*running_mean);
    update.input(*running_var);
    update.scalar(momentum);
    update.out(*running_mean);
    update.out(*running_var);
    update.run_inplace();
  }
  return std::make_tuple(std::move(r[0]), std::move(r[1]), std::move(r[2]));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_native_batch_norm(
    const at::Tensor& input,
    const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var,
    bool training,
    double momentum,
    double eps) {
  return batch_norm_impl(
      "aten::native_batch_norm", input, weight, bias, running_mean, running_var, training,
      momentum, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_batch_norm_legit(
    const at::Tensor& input,
    const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias,
    at::Tensor& running_mean,
    at::Tensor& running_var,
    bool training,
    double momentum,
    double eps) {
  return batch_norm_impl(
      "aten::_native_batch_norm_legit", input, weight, bias, running_mean, running_var, training,
      momentum, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_batch_norm_legit_no_stats(
    const at::Tensor& input,
    const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias,
    bool training,
    double momentum,
    double eps) {
  return batch_norm_impl(
      "aten::_native_batch_norm_legit", input, weight, bias, std::nullopt, std::nullopt,
      training, momentum, eps);
}

// `_batch_norm_with_update`: training batch norm that updates the running statistics (what
// functionalized and exported graphs call); its fourth result is the CPU's empty reserve.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pjrt_batch_norm_with_update(
    const at::Tensor& input,
    const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias,
    at::Tensor& running_mean,
    at::Tensor& running_var,
    double momentum,
    double eps) {
  auto [out, mean, invstd] = batch_norm_impl(
      "aten::_batch_norm_with_update", input, weight, bias, running_mean, running_var,
      /*training=*/true, momentum, eps);
  return std::make_tuple(
      std::move(out), std::move(mean), std::move(invstd), at::empty({0}, input.options().dtype(at::kByte)));
}

// `_batch_norm_no_update`: batch norm without touching the running statistics (evaluation,
// where they are given); PyTorch's own kernel is the CPU's.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pjrt_batch_norm_no_update(
    const at::Tensor& input,
    const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var,
    double momentum,
    double eps) {
  const bool batch_statistics = !present(running_mean) || !present(running_var);
  auto [out, mean, invstd] = batch_norm_impl(
      "aten::_batch_norm_no_update", input, weight, bias, running_mean, running_var, batch_statistics,
      momentum, eps);
  return std::make_tuple(
      std::move(out), std::move(mean), std::move(invstd), at::empty({0}, input.options().dtype(at::kByte)));
}

// `batch_norm_backward`, the backward of `_batch_norm_with_update` and `_batch_norm_no_update`:
// `native_batch_norm_backward`'s, the reserve unused (as on the CPU).
std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_batch_norm_backward(
    const at::Tensor& grad_out,
    const at::Tensor& input,
    const at::Tensor& weight,
    const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& save_mean,
    const std::optional<at::Tensor>& save_var,
    bool update,
    double eps,
    std::array<bool, 3> output_mask,
    const at::Tensor& reserve) {
  (void)reserve;
  return at::native_batch_norm_backward(
      grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask);
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/backend_kernels.inc"

// ===== what the Python module calls =================================================================

namespace module {

std::string set_engine_api(std::uintptr_t address) {
  try {
    return set_api(reinterpret_cast<const TpjrtApi*>(address));
  } catch (const std::exception& e) {
    return e.what();
  }
}

void set_engine_unavailable(const std::string& reason) {
  set_unavailable(reason);
}

bool engine_loaded() {
  return api_loaded();
}

bool engine_started() {
  return torch_pjrt::engine_started();
}

void note_engine_started() {
  mark_started();
}

std::vector<std::string> missing_ops() {
  return g_missing_ops;
}

int current_device() {
  return static_cast<int>(t_device);
}

void set_device(int index) {
  if (index >= 0) {
    t_device = static_cast<c10::DeviceIndex>(index);
  }
}

void reset_fallback_warnings() {
  std::lock_guard<std::mutex> lock(g_warned_mutex);
  g_warned.clear();
}

}  // namespace module

}  // namespace torch_pjrt
