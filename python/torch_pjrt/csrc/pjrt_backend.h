// The PyTorch side of torch-pjrt: a thin PrivateUse1 backend ("pjrt") that marshals tensors into
// the engine's C ABI. Every call into the engine goes through the function table handed over from
// Python (`_C._set_engine_api`), so the process has exactly one engine whichever library loaded it.
#pragma once

#include <ATen/ATen.h>
#include <ATen/native/CPUFallback.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

#include "generated/param_builders.h"
#include "torch_pjrt_engine.h"

namespace torch_pjrt {

// ----- the engine table -----------------------------------------------------------------------

// Installs the engine's function table (checked: ABI version and struct size). Returns an empty
// string on success, else why the table was refused.
std::string set_api(const TpjrtApi* table);
// Records why the engine could not be loaded; the first device use raises it.
void set_unavailable(const std::string& reason);
// The table, or a RuntimeError naming why there is none.
const TpjrtApi& api();
bool api_loaded();
// Whether any engine call that needs a running engine has succeeded in this process.
bool engine_started();
void mark_started();

// Raises the engine's last error as the c10 error matching `code` (RuntimeError, ValueError,
// TypeError, NotImplementedError, IndexError).
[[noreturn]] void raise_engine_error(int32_t code, const char* context);
inline void check(int32_t code, const char* context) {
  if (code != TPJRT_OK) {
    raise_engine_error(code, context);
  }
}

// Whether an optional tensor argument was given.
inline bool present(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined();
}

// PyTorch's check that an `out=` tensor is on the device the op runs on (`self`'s).
void check_out_device(const char* op, const at::Tensor& self, const at::Tensor& out);

// Writes a kernel's result into an `out=` tensor as the generated `.out` kernels do: the result
// type must cast to `out`'s, `out` is resized as PyTorch's `resize_output` resizes it, then
// copied into. Returns `out`.
at::Tensor& write_out(const at::Tensor& result, at::Tensor& out);

// Writes a functional kernel's result into `self`, as a generated in-place form does: the result
// type must cast to `self`'s, as PyTorch's in-place ops check (an integer `self` cannot hold a
// floating result). Returns `self`.
at::Tensor& write_in_place(const at::Tensor& result, at::Tensor& self);

// The dtype a floating-point function computes in: `dtype` itself when it is floating, else (an
// integer or bool input) the default float dtype, as PyTorch does. The kernels that ask are
// composed for real numbers: a complex input is refused rather than cast to its real part.
inline at::ScalarType floating_dtype(at::ScalarType dtype) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      !at::isComplexType(dtype),
      "this pjrt kernel is composed for real numbers; it is not implemented for '",
      dtype,
      "'");
  return at::isFloatingType(dtype) ? dtype
                                   : at::typeMetaToScalarType(at::get_default_dtype());
}

// `self` in the dtype a floating-point function computes it in.
inline at::Tensor as_floating(const at::Tensor& self) {
  return self.to(floating_dtype(self.scalar_type()));
}

// A kernel that hands one case of its op to the CPU (a dtype it has no device path for) calls this
// first: it counts the fallback in the metrics and warns once, or raises NotImplementedError with
// TORCH_PJRT_FALLBACK=error, as the boxed CPU fallback does.
void note_kernel_cpu_fallback(const std::string& name);

// The boxed CPU fallback (counted, warned or refused as TORCH_PJRT_FALLBACK says): the op runs on
// copies of its pjrt arguments on the CPU, and its results and written arguments come back.
void pjrt_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Runs the ATen op `Op` (an `at::_ops` struct: `at::_ops::sinh_out`) through the boxed CPU
// fallback: for a case that a kernel has no device path for (RFC 0038).
template <typename Op, typename... Args>
decltype(auto) run_on_cpu(Args&&... args) {
  return at::native::call_fallback_fn_symint<&pjrt_cpu_fallback, Op>::call(
      std::forward<Args>(args)...);
}

// uint16, uint32 and uint64 (RFC 0038): PyTorch's CPU computes few ops on them, so a kernel
// composed of other ops sends a call on them to the CPU, as the generated kernels' refused calls
// go, and the CPU raises PyTorch's own error (or computes it, where a later PyTorch can).
inline bool wide_unsigned(const at::Tensor& t) {
  const at::ScalarType type = t.scalar_type();
  return type == at::kUInt16 || type == at::kUInt32 || type == at::kUInt64;
}

// ----- storages ---------------------------------------------------------------------------------

at::Allocator* allocator();
// The engine storage id behind a pjrt storage (a RuntimeError for any other storage).
uint64_t storage_id(const c10::Storage& storage);
// A storage for an engine storage the engine created (it takes ownership of the id).
c10::Storage wrap_storage(uint64_t id, size_t nbytes, c10::Device device);
// Changes a storage's byte size (PyTorch's `resizePrivateUse1Bytes`).
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes);

// What growth.cpp keeps per storage: see `append_in_capacity`.
struct StorageGrowth {
  // The storage was allocated with room to grow: its bytes past a tensor's end are a capacity.
  bool capacity = false;
  // `torch_pjrt.mark_dynamic(t, dim, max)`: the elements the storage may grow to, 0 if unmarked.
  int64_t bound_elements = 0;
  // The dimension mark_dynamic named, or -1.
  int64_t marked_dim = -1;
};
// The growth record of a pjrt storage, or null for any other storage.
StorageGrowth* storage_growth(const c10::Storage& storage);

// ----- sequences grown by appends (growth.cpp, RFC 0028) --------------------------------------

// `torch.cat([a, b], dim)` where `a` grows by appends along its outermost non-unit dimension
// (generate()'s input_ids and attention mask): the result goes into a buffer with room to grow,
// so every append of one size up to that capacity runs one program. nullopt: cat as usual.
std::optional<at::Tensor> append_in_capacity(const at::ITensorListRef& tensors, int64_t dim);

// ----- devices ----------------------------------------------------------------------------------

c10::DeviceIndex current_device_index();
void set_current_device_index(c10::DeviceIndex index);
// The engine's device count once it runs; 1 (one nominal device) before, without starting it.
c10::DeviceIndex device_count_nothrow() noexcept;

// ----- tensors ----------------------------------------------------------------------------------

inline bool is_pjrt(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}
inline int32_t dtype_code(at::ScalarType t) {
  return static_cast<int32_t>(t);
}
// `(storage, dtype, sizes, strides, offset)`; the pointers live as long as `t`.
TpjrtTensor describe(const at::Tensor& t);
// A contiguous tensor over a storage the engine created for an op result.
at::Tensor tensor_from_output(const TpjrtOutput& out, c10::Device device);

// Copies between host and device (used by `_copy_from`).
void copy_host_to_device(const at::Tensor& src_cpu, const at::Tensor& dst);
void copy_device_to_host(const at::Tensor& src, const at::Tensor& dst_cpu);
void copy_device_to_device(const at::Tensor& src, const at::Tensor& dst);

// `t` itself, or when it is 4-d and one of `like` is channels-last, a channels-last copy of it on
// the device: the engine's results are contiguous, and PyTorch's CPU kernels (pooling,
// convolution) give such results in channels-last layout.
at::Tensor in_format_of(at::Tensor t, std::initializer_list<at::Tensor> like);
// `t` (a contiguous engine result) in the layout `memory_format` asks for: `Preserve` (or none)
// keeps `like`'s strides when they are dense, else its suggested format; a copy on the device
// when that is not `t`'s own layout. The layout `clone` and `contiguous` promise.
at::Tensor in_memory_format(
    at::Tensor t,
    std::optional<at::MemoryFormat> memory_format,
    const at::Tensor& like);

// ----- random numbers (random.cpp) ---------------------------------------------------------------

// The device's default generator (index -1: the current device), created on first use.
const at::Generator& default_generator(c10::DeviceIndex index);
// A new generator for the device (`torch.Generator(device="pjrt")`).
at::Generator new_generator(c10::DeviceIndex index);

// ----- one op call ------------------------------------------------------------------------------

// Builds one `TpjrtOpCall` from ATen arguments, following the engine's per-op layout (inputs,
// value scalars, static params, outs), and runs it. Generated kernels drive it and place params
// by the layout; hand-written ones give them through the layout's typed builder.
// The engine's id for the op named `name` (its name in the op catalogue); raises when the engine
// has no such op. Kernels resolve ids once: `static const int32_t op = engine_op("...")`.
inline int32_t engine_op(const char* name) {
  int32_t id = -1;
  check(api().op_id(name, &id), name);
  return id;
}
// The same for a typed name (`ops::native_batch_norm`): the id keeps the type of the op's params,
// so an `OpCall` of it takes only those (generated/param_builders.h).
template <typename Layout>
params::EngineOp<Layout> engine_op(params::EngineOpName<Layout> op) {
  return {engine_op(op.name)};
}

class OpCall {
 public:
  OpCall(int32_t op, const char* aten_name) : op_(op), name_(aten_name) {}
  // A call of an op whose params are named in its layout's builder, which places them:
  // `OpCall c(op, "aten::random_", {.dtype = ..., .full_range = ..., .sizes = ...})`.
  template <typename Layout>
  OpCall(params::EngineOp<Layout> op, const char* aten_name, const Layout& op_params)
      : OpCall(op.id, aten_name) {
    op_params.encode(*this);
  }
  // A call of an op that takes no params.
  OpCall(params::EngineOp<params::None> op, const char* aten_name) : OpCall(op.id, aten_name) {}

  // A tensor input. A CPU 0-d tensor is uploaded; any other CPU tensor is an error.
  void input(const at::Tensor& t);
  void opt_input(const std::optional<at::Tensor>& t);
  void inputs(at::ITensorListRef ts);
  // A CPU 0-d tensor becomes a value scalar (a Python number if it is a wrapped number),
  // anything else a tensor input. Returns the operand kind: 1 = tensor, 2 = scalar.
  int64_t input_or_scalar(const at::Tensor& t);
  // The operand kind `input_or_scalar(t)` gives, for a builder's `_kind` field, which is
  // encoded when the call is made, before its inputs are added.
  static int64_t operand_kind(const at::Tensor& t);
  // As above, 0 when absent.
  int64_t opt_input_or_scalar(const std::optional<at::Tensor>& t);
  void scalar(const at::Scalar& s);
  // A trailing scalar whose default is 1 (alpha, beta, value): dropped when it is 1.
  void scalar_default1(const at::Scalar& s);
  // An optional scalar: 2 when present, 0 when absent.
  int64_t opt_scalar(const std::optional<at::Scalar>& s);
  void param(int64_t p) {
    params_.push_back(p);
  }
  void param(const c10::SymInt& p) {
    params_.push_back(p.expect_int());
  }
  void params(c10::IntArrayRef ps) {
    params_.append(ps.begin(), ps.end());
  }
  void out(const at::Tensor& t);

  // Whether the call must run on the CPU instead: a complex Python number among its scalars
  // (the engine's scalars are real), or complex or uint16/32/64 tensors the engine op refuses
  // (its meta raises NotImplementedError for an op whose lowering is not known to be right for
  // them; for the unsigned ones the CPU then raises PyTorch's own error where it has no kernel).
  bool on_cpu() {
    return C10_UNLIKELY(complex_) && complex_on_cpu();
  }

  // Runs the op; the engine creates the results.
  at::Tensor run_functional();
  std::vector<at::Tensor> run_functional_n(size_t n);
  // Runs the op into `outs` that are also inputs (in-place variants): shapes must match.
  void run_inplace();
  // Runs the op into `out=` tensors, resized to the result first.
  void run_out();

 private:
  TpjrtOpCall make_call();
  void trim_default_scalars();
  void upload_wrapped_numbers();
  // Uploads a CPU 0-d tensor, kept alive for the call; its description.
  TpjrtTensor upload_scalar(const at::Tensor& host);
  void check_outs(bool resize);
  // Conjugates the memory of the outputs that carry the conjugate bit, after the op wrote them,
  // for the products PyTorch's conjugation fallback lets through with such outputs.
  void conjugate_conjugate_outs();
  c10::Device result_device() const;
  bool complex_on_cpu();
  TpjrtScalar real_scalar(const at::Scalar& s);
  void note_complex(const at::Tensor& t) {
    const at::ScalarType type = t.scalar_type();
    complex_ = complex_ || t.is_complex() || type == at::kUInt16 || type == at::kUInt32 ||
        type == at::kUInt64;
  }

  int32_t op_;
  const char* name_;
  c10::SmallVector<TpjrtTensor, 4> inputs_;
  c10::SmallVector<TpjrtScalar, 4> scalars_;
  c10::SmallVector<bool, 4> trimmable_;
  c10::SmallVector<int64_t, 8> params_;
  c10::SmallVector<TpjrtTensor, 2> outs_;
  c10::SmallVector<at::Tensor, 2> out_tensors_;
  c10::SmallVector<at::Tensor, 2> keep_alive_;
  // Python numbers passed where the op takes a tensor (`torch.sub(5, x)`): uploaded when the
  // call is made, in the dtype type promotion gives them beside the other inputs.
  c10::SmallVector<std::pair<size_t, at::Tensor>, 1> wrapped_;
  std::optional<c10::Device> device_;
  // A complex (or uint16/32/64) tensor or a complex number was passed; a complex number cannot
  // reach the engine.
  bool complex_ = false;
  bool complex_scalar_ = false;
};

// ----- param encoders used by the kernel table --------------------------------------------------

namespace enc {
inline int64_t b(bool v) {
  return v ? 1 : 0;
}
inline int64_t dt(std::optional<at::ScalarType> t) {
  return t ? static_cast<int64_t>(*t) : -1;
}
inline int64_t code(const at::Tensor& t) {
  return static_cast<int64_t>(t.scalar_type());
}
int64_t f64(double x);
inline int64_t f64(const at::Scalar& s) {
  return f64(s.toDouble());
}
inline c10::IntArrayRef dims(at::OptionalIntArrayRef d) {
  return d.has_value() ? *d : c10::IntArrayRef();
}
inline c10::IntArrayRef sym(c10::SymIntArrayRef s) {
  return C10_AS_INTARRAYREF_SLOW(s);
}
inline int64_t sym1(const c10::SymInt& s) {
  return s.expect_int();
}
inline c10::SmallVector<int64_t, 1> opt1(std::optional<int64_t> v) {
  c10::SmallVector<int64_t, 1> r;
  if (v) {
    r.push_back(*v);
  }
  return r;
}
int64_t rounding(std::optional<c10::string_view> mode);
int64_t gelu_approx(c10::string_view approximate);
int64_t correction(const std::optional<at::Scalar>& c);
// `max()`/`min()` over all elements: PyTorch's error for an empty tensor; returns keepdim = 0.
int64_t full_reduction(const at::Tensor& self, const char* op);
c10::SmallVector<int64_t, 4> nan_to_num(
    std::optional<double> nan,
    std::optional<double> posinf,
    std::optional<double> neginf);
// A list as its length followed by its values, for params that hold several lists.
inline c10::SmallVector<int64_t, 4> counted(c10::IntArrayRef v) {
  c10::SmallVector<int64_t, 4> r;
  r.push_back(static_cast<int64_t>(v.size()));
  r.append(v.begin(), v.end());
  return r;
}
inline c10::SmallVector<int64_t, 4> counted(c10::SymIntArrayRef v) {
  return counted(C10_AS_INTARRAYREF_SLOW(v));
}
}  // namespace enc

// Registers the generated per-op kernels for the ops this engine knows (called once the table is
// installed); returns the ATen names whose engine op is missing.
std::vector<std::string> register_generated_kernels();

}  // namespace torch_pjrt
