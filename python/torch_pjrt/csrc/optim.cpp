// Fused optimizer steps on pjrt: `_fused_adam_`, `_fused_adamw_` and `_fused_sgd_` (and their
// `tensor_lr` overloads), which `torch.optim` calls with `fused=True`; and GradScaler's two
// helpers, `_amp_foreach_non_finite_check_and_unscale_` and `_amp_update_scale_`, composed from
// ATen ops on the device so the scale never leaves it.
//
// Each takes lists of tensors, which the kernel table cannot describe: the kernels here issue one
// engine op per parameter, writing the new parameter and optimizer state in place. The
// hyper-parameters travel as lifted scalars (a learning-rate schedule never recompiles); a
// learning rate given as a pjrt tensor stays on the device. With `grad_scale` the gradients are
// unscaled in place first, as PyTorch's fused kernels do, unless `found_inf` is 1, which also
// leaves the parameters and state unchanged. The branches PyTorch's kernels take on a
// hyper-parameter's value (a zero weight decay, the side lerp starts from) are static params.
#include <ATen/ATen.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <cmath>
#include <type_traits>

#include "pjrt_backend.h"

namespace torch_pjrt {
namespace {


void check_length(const char* op, at::TensorList list, size_t n, const char* what) {
  TORCH_CHECK(
      list.size() == n,
      op,
      ": expected one tensor of ",
      what,
      " per parameter (",
      n,
      "), but got ",
      list.size());
}

// `grad /= grad_scale` in place, skipped where `found_inf` is 1.
void unscale_grads(
    at::TensorList grads,
    const std::optional<at::Tensor>& grad_scale,
    const std::optional<at::Tensor>& found_inf) {
  if (!present(grad_scale)) {
    return;
  }
  for (const at::Tensor& g : grads) {
    at::Tensor unscaled = g / *grad_scale;
    if (present(found_inf)) {
      unscaled = at::where(found_inf->eq(1), g, unscaled);
    }
    g.copy_(unscaled);
  }
}

// The learning rate: a pjrt tensor stays an input; a CPU tensor is read as a number.
struct LearningRate {
  double value = 0.0;
  const at::Tensor* tensor = nullptr;
};

LearningRate learning_rate(double lr) {
  return LearningRate{lr};
}

LearningRate learning_rate(const at::Tensor& lr) {
  LearningRate r;
  if (is_pjrt(lr)) {
    r.tensor = &lr;
  } else {
    r.value = lr.item<double>();
  }
  return r;
}

void fused_adam(
    const char* name,
    bool adamw,
    at::TensorList params,
    at::TensorList grads,
    at::TensorList exp_avgs,
    at::TensorList exp_avg_sqs,
    at::TensorList max_exp_avg_sqs,
    at::TensorList state_steps,
    LearningRate lr,
    double beta1,
    double beta2,
    double weight_decay,
    double eps,
    bool amsgrad,
    bool maximize,
    const std::optional<at::Tensor>& grad_scale,
    const std::optional<at::Tensor>& found_inf) {
  static const auto op = engine_op(ops::_fused_adam_);
  const size_t n = params.size();
  check_length(name, grads, n, "grads");
  check_length(name, exp_avgs, n, "exp_avgs");
  check_length(name, exp_avg_sqs, n, "exp_avg_sqs");
  check_length(name, state_steps, n, "state_steps");
  if (amsgrad) {
    check_length(name, max_exp_avg_sqs, n, "max_exp_avg_sqs");
  }
  unscale_grads(grads, grad_scale, found_inf);
  const bool skip_flag = present(found_inf);
  const params::FusedAdamFlags flags{
      .amsgrad = amsgrad,
      .maximize = maximize,
      .adamw = adamw,
      .lr_is_tensor = lr.tensor != nullptr,
      .has_found_inf = skip_flag,
      .weight_decay = weight_decay != 0.0,
      .small_lerp_weight = std::abs(1.0 - beta1) < 0.5,
  };
  for (const auto i : c10::irange(n)) {
    OpCall c(op, name, flags);
    c.input(params[i]);
    c.input(grads[i]);
    c.input(exp_avgs[i]);
    c.input(exp_avg_sqs[i]);
    c.input(state_steps[i]);
    if (amsgrad) {
      c.input(max_exp_avg_sqs[i]);
    }
    if (lr.tensor != nullptr) {
      c.input(*lr.tensor);
    } else {
      c.scalar(lr.value);
    }
    if (skip_flag) {
      c.input(*found_inf);
    }
    c.scalar(beta1);
    c.scalar(beta2);
    c.scalar(weight_decay);
    c.scalar(eps);
    c.out(params[i]);
    c.out(exp_avgs[i]);
    c.out(exp_avg_sqs[i]);
    if (amsgrad) {
      c.out(max_exp_avg_sqs[i]);
    }
    c.run_inplace();
  }
}

// The four `_fused_adam(w)_` overloads differ only in the variant and in the learning rate's
// type (a double, or a tensor in `.tensor_lr`): one kernel, instantiated for each.
template <bool AdamW, typename Lr>
void pjrt_fused_adam(
    at::TensorList self,
    at::TensorList grads,
    at::TensorList exp_avgs,
    at::TensorList exp_avg_sqs,
    at::TensorList max_exp_avg_sqs,
    at::TensorList state_steps,
    Lr lr,
    double beta1,
    double beta2,
    double weight_decay,
    double eps,
    bool amsgrad,
    bool maximize,
    const std::optional<at::Tensor>& grad_scale,
    const std::optional<at::Tensor>& found_inf) {
  constexpr bool tensor_lr = !std::is_same_v<Lr, double>;
  const char* name = AdamW ? (tensor_lr ? "aten::_fused_adamw_.tensor_lr" : "aten::_fused_adamw_")
                           : (tensor_lr ? "aten::_fused_adam_.tensor_lr" : "aten::_fused_adam_");
  fused_adam(name, AdamW, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
      learning_rate(lr), beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale,
      found_inf);
}

void fused_sgd(
    const char* name,
    at::TensorList params,
    at::TensorList grads,
    at::TensorList momentum_buffers,
    double weight_decay,
    double momentum,
    LearningRate lr,
    double dampening,
    bool nesterov,
    bool maximize,
    bool is_first_step,
    const std::optional<at::Tensor>& grad_scale,
    const std::optional<at::Tensor>& found_inf) {
  static const auto op = engine_op(ops::_fused_sgd_);
  const size_t n = params.size();
  check_length(name, grads, n, "grads");
  // As on the CPU, a zero momentum keeps no buffer.
  const bool has_buffer = momentum != 0.0;
  if (has_buffer) {
    check_length(name, momentum_buffers, n, "momentum_buffer_list");
  }
  unscale_grads(grads, grad_scale, found_inf);
  const bool skip_flag = present(found_inf);
  const params::FusedSgdFlags flags{
      .nesterov = nesterov,
      .maximize = maximize,
      .is_first_step = is_first_step,
      .has_momentum_buffer = has_buffer,
      .lr_is_tensor = lr.tensor != nullptr,
      .has_found_inf = skip_flag,
      .weight_decay = weight_decay != 0.0,
  };
  for (const auto i : c10::irange(n)) {
    OpCall c(op, name, flags);
    c.input(params[i]);
    c.input(grads[i]);
    if (has_buffer) {
      c.input(momentum_buffers[i]);
    }
    if (lr.tensor != nullptr) {
      c.input(*lr.tensor);
    } else {
      c.scalar(lr.value);
    }
    if (skip_flag) {
      c.input(*found_inf);
    }
    c.scalar(weight_decay);
    c.scalar(momentum);
    c.scalar(dampening);
    c.out(params[i]);
    if (has_buffer) {
      c.out(momentum_buffers[i]);
    }
    c.run_inplace();
  }
}

// `_fused_sgd_` and its `.tensor_lr` overload: one kernel, instantiated for each learning-rate
// type.
template <typename Lr>
void pjrt_fused_sgd(
    at::TensorList self,
    at::TensorList grads,
    at::TensorList momentum_buffer_list,
    double weight_decay,
    double momentum,
    Lr lr,
    double dampening,
    bool nesterov,
    bool maximize,
    bool is_first_step,
    const std::optional<at::Tensor>& grad_scale,
    const std::optional<at::Tensor>& found_inf) {
  const char* name =
      std::is_same_v<Lr, double> ? "aten::_fused_sgd_" : "aten::_fused_sgd_.tensor_lr";
  fused_sgd(name, self, grads, momentum_buffer_list, weight_decay, momentum, learning_rate(lr),
      dampening, nesterov, maximize, is_first_step, grad_scale, found_inf);
}

// Multiplies every gradient by `inv_scale`; `found_inf` becomes 1 if any element is not finite.
void pjrt_amp_non_finite_check_and_unscale_(
    at::TensorList scaled_grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  TORCH_CHECK(inv_scale.numel() == 1, "inv_scale must be a 1-element tensor.");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  TORCH_CHECK(inv_scale.scalar_type() == at::kFloat, "inv_scale must be a float tensor.");
  TORCH_CHECK(found_inf.scalar_type() == at::kFloat, "found_inf must be a float tensor.");
  for (const at::Tensor& g : scaled_grads) {
    TORCH_CHECK(
        g.device() == found_inf.device(),
        "scaled_grads must be on the same device as found_inf (",
        found_inf.device(),
        "), but one is on ",
        g.device());
    const at::Tensor bad = at::isfinite(g).logical_not().any().to(found_inf.scalar_type());
    found_inf.copy_(at::maximum(found_inf, bad));
    g.mul_(inv_scale);
  }
}

// The scale's update after a step: backed off when `found_inf`, grown after `growth_interval`
// successful steps in a row (when the grown scale is finite).
at::Tensor& pjrt_amp_update_scale_(
    at::Tensor& current_scale,
    at::Tensor& growth_tracker,
    const at::Tensor& found_inf,
    double growth_factor,
    double backoff_factor,
    int64_t growth_interval) {
  TORCH_CHECK(growth_tracker.numel() == 1, "growth_tracker must be a 1-element tensor.");
  TORCH_CHECK(current_scale.numel() == 1, "current_scale must be a 1-element tensor.");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  const at::Tensor found = found_inf.ne(0);
  const at::Tensor successful = growth_tracker + 1;
  const at::Tensor grow = successful.eq(growth_interval);
  const at::Tensor grown = current_scale * growth_factor;
  const at::Tensor take_grown = at::logical_and(grow, at::isfinite(grown));
  const at::Tensor kept = at::where(take_grown, grown, current_scale);
  const at::Tensor scale = at::where(found, current_scale * backoff_factor, kept);
  const at::Tensor zero = at::zeros_like(growth_tracker);
  const at::Tensor tracker =
      at::where(at::logical_or(found, grow), zero, successful.to(growth_tracker.scalar_type()));
  current_scale.copy_(scale);
  growth_tracker.copy_(tracker);
  return current_scale;
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/optim_kernels.inc"

}  // namespace torch_pjrt
