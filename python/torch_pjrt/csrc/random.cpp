// Random numbers on pjrt: the device's generator and the kernels that draw from it.
//
// A generator is a seed and a count of draws made since it was seeded. Every random op takes
// the next draw's 64-bit key (a mix of the two) as a lifted scalar and generates its bits on the
// device by hashing a counter with it (SplitMix64, RFC 0010): a new draw never recompiles, ops stay
// independent (no chain through a device-side state, so regions fuse freely), and the state
// `torch.pjrt.get_rng_state()` returns is 16 host bytes that `set_rng_state` restores exactly.
#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>

#include "module_api.h"
#include "pjrt_backend.h"

namespace torch_pjrt {
namespace {

// PyTorch's default seed, so an unseeded pjrt generator starts where CPU's does.
constexpr uint64_t kDefaultSeed = 67280421310721ULL;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct PjrtGeneratorImpl final : public c10::GeneratorImpl {
  explicit PjrtGeneratorImpl(c10::DeviceIndex index, uint64_t seed = kDefaultSeed)
      : c10::GeneratorImpl(
            c10::Device(c10::DeviceType::PrivateUse1, index),
            c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        seed_(seed) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    draws_ = 0;
  }
  uint64_t current_seed() const override {
    return seed_;
  }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_offset(uint64_t offset) override {
    draws_ = offset;
  }
  uint64_t get_offset() const override {
    return draws_;
  }
  // 16 bytes: the seed, then the number of draws, little-endian.
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor state = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    uint8_t* bytes = state.data_ptr<uint8_t>();
    std::memcpy(bytes, &seed_, 8);
    std::memcpy(bytes + 8, &draws_, 8);
    return state.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    TORCH_CHECK_TYPE(
        new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
        "expected a torch.ByteTensor as the pjrt generator state, but got ",
        new_state.dtype().name());
    TORCH_CHECK(
        new_state.numel() == 16 && new_state.is_contiguous(),
        "a pjrt generator state is 16 contiguous bytes (the seed and the number of draws), but "
        "got ",
        new_state.numel(),
        " bytes; pass a state from torch.pjrt.get_rng_state()");
    const auto* bytes = static_cast<const uint8_t*>(new_state.data());
    std::memcpy(&seed_, bytes, 8);
    std::memcpy(&draws_, bytes + 8, 8);
  }
  // The key of the next draw; each draw gets its own.
  int64_t next_key() {
    uint64_t key = splitmix64(seed_ ^ splitmix64(draws_));
    ++draws_;
    return static_cast<int64_t>(key);
  }
  static c10::DeviceType device_type() {
    return c10::DeviceType::PrivateUse1;
  }

 private:
  PjrtGeneratorImpl* clone_impl() const override {
    auto* copy = new PjrtGeneratorImpl(device().index(), seed_);
    copy->draws_ = draws_;
    return copy;
  }

  uint64_t seed_;
  uint64_t draws_ = 0;
};

// One default generator per device, created on first use and kept for the process.
std::mutex g_defaults_mutex;
std::deque<at::Generator> g_defaults;

c10::DeviceIndex checked_index(c10::DeviceIndex index) {
  if (index < 0) {
    index = current_device_index();
  }
  TORCH_CHECK_INDEX(index >= 0 && index < 64, "pjrt device index ", index, " is out of range");
  return index;
}

// A draw's key from `gen` (or the device's default generator), under the generator's lock.
int64_t next_key(const std::optional<at::Generator>& gen, const at::Tensor& like) {
  at::Generator g = gen.has_value() && gen->defined()
      ? *gen
      : default_generator(like.defined() ? like.device().index() : -1);
  TORCH_CHECK(
      g.device().type() == c10::DeviceType::PrivateUse1,
      "expected a pjrt generator for a pjrt tensor, but got a generator of device ",
      g.device().str());
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get<PjrtGeneratorImpl>()->next_key();
}


// The params of a draw of `self`'s dtype and shape.
params::Creation draw_of(const at::Tensor& self) {
  return {.dtype = self.scalar_type(), .sizes = self.sizes()};
}

// A draw (its params from `draw_of(self)`) written into `self` (any strides: the engine writes
// through views).
at::Tensor& draw_into(at::Tensor& self, OpCall& c) {
  c.out(self);
  c.run_inplace();
  return self;
}

at::Tensor& pjrt_uniform_(
    at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  if (self.is_complex()) {
    // As PyTorch: each part drawn from [from, to), through the real view of the storage.
    at::Tensor parts = at::view_as_real(self);
    pjrt_uniform_(parts, from, to, gen);
    return self;
  }
  static const auto op = engine_op(ops::uniform);
  OpCall c(op, "aten::uniform_", draw_of(self));
  c.scalar(from);
  c.scalar(to);
  c.scalar(next_key(gen, self));
  return draw_into(self, c);
}

at::Tensor& pjrt_normal_(
    at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  if (self.is_complex()) {
    // As PyTorch: the parts are independent normals whose variances add up to std^2.
    at::Tensor parts = at::view_as_real(self);
    pjrt_normal_(parts, mean, std / std::sqrt(2.0), gen);
    return self;
  }
  static const auto op = engine_op(ops::normal);
  OpCall c(op, "aten::normal_", draw_of(self));
  c.scalar(mean);
  c.scalar(std);
  c.scalar(next_key(gen, self));
  return draw_into(self, c);
}

// `normal(mean, std)` of two tensors: standard normals drawn in the broadcast shape (mean's
// dtype), scaled and shifted, after PyTorch's checks of std.
at::Tensor pjrt_normal_tensor_tensor(const at::Tensor& mean, const at::Tensor& std, std::optional<at::Generator> gen) {
  TORCH_CHECK(!std.is_complex(), "normal expects standard deviation to be non-complex");
  TORCH_CHECK(std.numel() == 0 || std.min().ge(0).item<bool>(), "normal expects all elements of std >= 0.0");
  at::Tensor out = at::empty(at::infer_size(mean.sizes(), std.sizes()), mean.options());
  pjrt_normal_(out, 0.0, 1.0, std::move(gen));
  return out.mul_(std).add_(mean);
}

// `rrelu_with_noise`: in training every element at or below zero is scaled by a slope drawn
// uniformly from [lower, upper], which `noise` records (1 for the other elements); in evaluation
// `leaky_relu` with the mean slope, `noise` untouched. As PyTorch's kernels.
at::Tensor pjrt_rrelu_with_noise(
    const at::Tensor& self,
    at::Tensor& noise,
    const at::Scalar& lower,
    const at::Scalar& upper,
    bool training,
    std::optional<at::Generator> gen) {
  if (!training) {
    return at::leaky_relu(self, (lower.toDouble() + upper.toDouble()) / 2);
  }
  // PyTorch's training kernel draws for float32, float64 and bfloat16.
  TORCH_CHECK_NOT_IMPLEMENTED(
      self.scalar_type() != at::kHalf, "\"rrelu_with_noise\" not implemented for '",
      c10::toString(self.scalar_type()), "'");
  at::Tensor slopes = at::empty_like(self, at::MemoryFormat::Contiguous);
  pjrt_uniform_(slopes, lower.toDouble(), upper.toDouble(), std::move(gen));
  const at::Tensor scaled = self <= 0;
  noise.copy_(at::where(scaled, slopes, at::ones_like(slopes)));
  return at::where(scaled, self * slopes, self);
}

at::Tensor& pjrt_rrelu_with_noise_(
    at::Tensor& self,
    at::Tensor& noise,
    const at::Scalar& lower,
    const at::Scalar& upper,
    bool training,
    std::optional<at::Generator> gen) {
  return self.copy_(pjrt_rrelu_with_noise(self, noise, lower, upper, training, std::move(gen)));
}

// Its gradient: the recorded slopes in training (when the range is not a single slope),
// `leaky_relu`'s with the mean slope otherwise, as PyTorch's kernel.
at::Tensor pjrt_rrelu_with_noise_backward(
    const at::Tensor& grad_output,
    const at::Tensor& self,
    const at::Tensor& noise,
    const at::Scalar& lower,
    const at::Scalar& upper,
    bool training,
    bool self_is_result) {
  if (training && upper.toDouble() - lower.toDouble() > 1e-6) {
    return grad_output * noise;
  }
  return at::leaky_relu_backward(grad_output, self, (lower.toDouble() + upper.toDouble()) / 2, self_is_result);
}

// `random_` with an exclusive upper bound `to` (none: the dtype's own range, as PyTorch).
at::Tensor& random_between(
    at::Tensor& self, int64_t from, std::optional<int64_t> to, std::optional<at::Generator> gen) {
  static const auto op = engine_op(ops::random_);
  bool full_range = false;
  int64_t upper = 0;
  if (to.has_value()) {
    upper = *to;
  } else {
    const at::ScalarType t = self.scalar_type();
    if (at::isFloatingType(t)) {
      // Integers up to 2^digits: every one is exact in the dtype.
      int digits = t == at::kDouble ? 53 : t == at::kFloat ? 24 : t == at::kHalf ? 11 : 8;
      upper = (int64_t{1} << digits) + 1;
    } else if (t == at::kBool) {
      upper = 2;
    } else if (t == at::kLong) {
      // [from, 2^63 - 1]: from 0 the whole 63-bit range; otherwise the top value is left out.
      full_range = from == 0;
      upper = std::numeric_limits<int64_t>::max();
    } else {
      int64_t max = 0;
      AT_DISPATCH_INTEGRAL_TYPES(t, "random_", [&] {
        max = static_cast<int64_t>(std::numeric_limits<scalar_t>::max());
      });
      upper = max + 1;
    }
  }
  OpCall c(op, "aten::random_", {
      .dtype = self.scalar_type(),
      .full_range = full_range,
      .sizes = self.sizes(),
  });
  c.scalar(from);
  c.scalar(full_range ? from + 1 : upper);
  c.scalar(next_key(gen, self));
  c.out(self);
  c.run_inplace();
  return self;
}

at::Tensor& pjrt_random_(at::Tensor& self, std::optional<at::Generator> gen) {
  return random_between(self, 0, std::nullopt, gen);
}

at::Tensor& pjrt_random_to(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  return random_between(self, 0, to, gen);
}

at::Tensor& pjrt_random_from(
    at::Tensor& self, int64_t from, std::optional<int64_t> to, std::optional<at::Generator> gen) {
  return random_between(self, from, to, gen);
}

at::Tensor& pjrt_bernoulli_float(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  static const auto op = engine_op(ops::bernoulli);
  OpCall c(op, "aten::bernoulli_", draw_of(self));
  c.scalar(p);
  c.scalar(next_key(gen, self));
  return draw_into(self, c);
}

at::Tensor& pjrt_bernoulli_tensor(
    at::Tensor& self, const at::Tensor& p, std::optional<at::Generator> gen) {
  static const auto op = engine_op(ops::bernoulli);
  OpCall c(op, "aten::bernoulli_", draw_of(self));
  c.input(p);
  c.scalar(next_key(gen, self));
  return draw_into(self, c);
}

// `bernoulli(self)`: `self` holds the probabilities; the result has its dtype and shape.
at::Tensor pjrt_bernoulli(const at::Tensor& self, std::optional<at::Generator> gen) {
  static const auto op = engine_op(ops::bernoulli);
  OpCall c(op, "aten::bernoulli", draw_of(self));
  c.input(self);
  c.scalar(next_key(gen, self));
  return c.run_functional();
}

at::Tensor pjrt_bernoulli_p(const at::Tensor& self, double p, std::optional<at::Generator> gen) {
  static const auto op = engine_op(ops::bernoulli);
  OpCall c(op, "aten::bernoulli.p", draw_of(self));
  c.scalar(p);
  c.scalar(next_key(gen, self));
  return c.run_functional();
}

std::tuple<at::Tensor, at::Tensor> pjrt_native_dropout(
    const at::Tensor& input, double p, std::optional<bool> train) {
  static const auto op = engine_op(ops::native_dropout);
  const bool training = train.value_or(true);
  OpCall c(op, "aten::native_dropout", {.train = training});
  c.input(input);
  c.scalar(p);
  // Eval mode draws nothing: the generator does not advance, as on CPU.
  c.scalar(training ? next_key(std::nullopt, input) : int64_t{0});
  auto r = c.run_functional_n(2);
  return std::make_tuple(std::move(r[0]), std::move(r[1]));
}

at::Tensor pjrt_native_dropout_backward(
    const at::Tensor& grad_output, const at::Tensor& mask, double scale) {
  static const auto op = engine_op(ops::native_dropout_backward);
  OpCall c(op, "aten::native_dropout_backward");
  c.input(grad_output);
  c.input(mask);
  c.scalar(scale);
  return c.run_functional();
}

// The generator a Python `torch.Generator(device="pjrt")` gets.
at::Generator make_pjrt_generator(c10::DeviceIndex index) {
  return at::make_generator<PjrtGeneratorImpl>(checked_index(index));
}


void require_floating_self(const char* op, const at::Tensor& self) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      at::isFloatingType(self.scalar_type()),
      op,
      " not implemented for '",
      c10::toString(self.scalar_type()),
      "': expected a floating-point tensor");
}

// Uniform numbers in (0, 1] with self's shape and dtype.
at::Tensor open_unit(const at::Tensor& self, std::optional<at::Generator> gen) {
  return 1 - at::empty_like(self, at::MemoryFormat::Contiguous).uniform_(0, 1, gen);
}

// ----- distributions ----------------------------------------------------------------------------

at::Tensor& pjrt_exponential_(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  TORCH_CHECK(lambd > 0.0, "exponential_ expects lambda > 0.0, but found lambda=", lambd);
  require_floating_self("exponential_", self);
  at::Tensor u = open_unit(self, gen);
  // -log(u) / lambda, never 0: u next to 1 maps to half an epsilon, as PyTorch's CUDA kernel.
  double eps = std::numeric_limits<float>::epsilon();
  if (self.scalar_type() == at::kDouble) {
    eps = std::numeric_limits<double>::epsilon();
  } else if (self.scalar_type() == at::kHalf || self.scalar_type() == at::kBFloat16) {
    u = u.to(at::kFloat);
  }
  at::Tensor log_u = at::where(u >= 1 - eps / 2, at::scalar_tensor(-eps / 2, u.options()), at::log(u));
  return self.copy_(log_u * (-1.0 / lambd));
}

at::Tensor& pjrt_geometric_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 < p && p < 1, "geometric_ expects p to be in (0, 1), but got p=", p);
  at::ScalarType compute = self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor u = open_unit(self.to(compute), gen);
  // The number of Bernoulli(p) trials up to the first success: at least 1.
  return self.copy_(at::ceil(at::log(u) / std::log1p(-p)).clamp_min(1));
}

at::Tensor& pjrt_log_normal_(
    at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std > 0.0, "log_normal_ expects std > 0.0, but found std=", std);
  require_floating_self("log_normal_", self);
  return self.copy_(at::exp(at::empty_like(self).normal_(mean, std, gen)));
}

at::Tensor& pjrt_cauchy_(
    at::Tensor& self, double median, double sigma, std::optional<at::Generator> gen) {
  TORCH_CHECK(sigma > 0.0, "cauchy_ expects sigma > 0.0, but found sigma=", sigma);
  require_floating_self("cauchy_", self);
  at::Tensor u = at::empty_like(self).uniform_(0, 1, gen);
  return self.copy_(median + sigma * at::tan(M_PI * (u - 0.5)));
}

// PyTorch's algorithm (ATen's `multinomial`): without replacement, or for one sample, the
// indices of the largest p / q with q ~ Exp(1) (the Gumbel-max trick, exponentiated); with
// replacement, each sample is the first index whose running sum exceeds a uniform draw scaled
// by the row's total. The distribution is checked first, with one read of the device, as
// PyTorch's CUDA kernel does.
at::Tensor pjrt_multinomial(
    const at::Tensor& self,
    int64_t n_sample,
    bool replacement,
    std::optional<at::Generator> gen) {
  TORCH_CHECK(
      self.dim() > 0 && self.dim() <= 2, "prob_dist must be 1 or 2 dim, but got ", self.dim());
  TORCH_CHECK(
      at::isFloatingType(self.scalar_type()),
      "multinomial only supports floating-point dtypes for input, got: ",
      self.scalar_type());
  TORCH_CHECK(n_sample > 0, "cannot sample n_sample <= 0 samples");
  int64_t categories = self.size(-1);
  TORCH_CHECK(
      replacement || n_sample <= categories,
      "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  TORCH_CHECK(
      categories <= (int64_t{1} << 24),
      "number of categories cannot exceed 2^24");
  at::Tensor p = self.scalar_type() == at::kDouble ? self : self.to(at::kFloat);
  // One read for both of PyTorch's checks: 1 for a bad element, 2 for a row summing to zero.
  at::Tensor bad_element = at::logical_not((p.max() < INFINITY) & (p.min() >= 0));
  at::Tensor zero_row = (p.sum(-1) == 0).any();
  int64_t verdict = at::where(bad_element, 1, at::where(zero_row, 2, 0)).item<int64_t>();
  TORCH_CHECK(verdict != 1, "probability tensor contains either `inf`, `nan` or element < 0");
  TORCH_CHECK(verdict != 2, "invalid multinomial distribution (sum of probabilities <= 0)");
  if (!replacement || n_sample == 1) {
    at::Tensor q = at::empty_like(p).exponential_(1, gen);
    at::Tensor keys = p / q;
    if (n_sample == 1) {
      return at::argmax(keys, -1, /*keepdim=*/true);
    }
    return std::get<1>(at::topk(keys, n_sample));
  }
  at::Tensor cdf = at::cumsum(p, -1);
  at::Tensor total = cdf.narrow(-1, categories - 1, 1);
  std::vector<int64_t> sample_shape(p.sizes().begin(), p.sizes().end());
  sample_shape.back() = n_sample;
  at::Tensor u = at::empty(sample_shape, p.options()).uniform_(0, 1, gen) * total;
  at::Tensor below = at::le(cdf.unsqueeze(-2), u.unsqueeze(-1));
  return below.sum(-1).clamp_max(categories - 1);
}

// A random permutation: the order of n uniform float64 draws from pjrt's generator (53-bit keys,
// so ties, which would bias the order, are vanishingly rare).
at::Tensor pjrt_randperm(
    c10::SymInt n_sym,
    std::optional<at::Generator> generator,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Device> device) {
  int64_t n = n_sym.expect_int();
  TORCH_CHECK(n >= 0, "n must be non-negative, got", n);
  at::TensorOptions options =
      at::TensorOptions().device(device.value_or(at::Device(c10::DeviceType::PrivateUse1, 0)));
  at::Tensor keys = at::rand({n}, generator, options.dtype(at::kDouble));
  return at::argsort(keys, /*stable=*/true, 0, false).to(dtype.value_or(at::kLong));
}

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = checked_index(index);
  std::lock_guard<std::mutex> lock(g_defaults_mutex);
  while (static_cast<c10::DeviceIndex>(g_defaults.size()) <= index) {
    g_defaults.push_back(at::make_generator<PjrtGeneratorImpl>(
        static_cast<c10::DeviceIndex>(g_defaults.size())));
  }
  // A deque never moves its elements: the reference stays valid as devices are added.
  return g_defaults[index];
}

at::Generator new_generator(c10::DeviceIndex index) {
  return make_pjrt_generator(index);
}

namespace module {

void manual_seed(int index, uint64_t seed) {
  at::Generator g = default_generator(static_cast<c10::DeviceIndex>(index));
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(seed);
}

uint64_t seed(int index) {
  at::Generator g = default_generator(static_cast<c10::DeviceIndex>(index));
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.seed();
}

uint64_t initial_seed(int index) {
  at::Generator g = default_generator(static_cast<c10::DeviceIndex>(index));
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.current_seed();
}

std::string get_rng_state(int index) {
  at::Generator g = default_generator(static_cast<c10::DeviceIndex>(index));
  std::lock_guard<std::mutex> lock(g.mutex());
  at::Tensor state = g.get_state();
  return std::string(reinterpret_cast<const char*>(state.data_ptr<uint8_t>()), state.numel());
}

void set_rng_state(int index, const std::string& bytes) {
  at::Generator g = default_generator(static_cast<c10::DeviceIndex>(index));
  at::Tensor state = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(state.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(state);
}

}  // namespace module

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/random_kernels.inc"

}  // namespace torch_pjrt
