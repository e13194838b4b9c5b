// Automatic mixed precision on pjrt: `torch.autocast("pjrt", dtype=torch.bfloat16)` (or float16).
//
// PyTorch routes every op through the AutocastPrivateUse1 key while autocast is on for this
// device. Ops without a policy fall through to the kernels. The policies are PyTorch's own op
// lists, the ones its CUDA autocast uses (`ATen/autocast_mode.h`), so a script moved from
// "cuda" to "pjrt" casts the same ops:
// - products, convolutions and attention run in the autocast dtype;
// - numerically sensitive ops (exp, log, norms, losses, softmax's dtype) run in float32;
// - mixed-dtype ops (addcmul, index_put, ...) promote to the widest input.
#include <ATen/ATen.h>
#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace torch_pjrt {
namespace {

at::Tensor binary_cross_entropy_under_autocast(
    const at::Tensor&,
    const at::Tensor&,
    const std::optional<at::Tensor>&,
    int64_t) {
  TORCH_CHECK(
      false,
      "binary_cross_entropy cannot run under autocast on pjrt: in a lower precision its log of "
      "a probability near 0 or 1 loses the result. Give the logits to "
      "torch.nn.functional.binary_cross_entropy_with_logits (or nn.BCEWithLogitsLoss) instead, "
      "which is autocast-safe, or leave the loss outside the autocast region.");
}

}  // namespace

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

// The op lists spell their signatures with ATen's unqualified names.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

#define PJRT_AUTOCAST_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define PJRT_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define PJRT_AUTOCAST_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define PJRT_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(PJRT_AUTOCAST_LOWER_PRECISION)
  AT_FORALL_FP32(PJRT_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(PJRT_AUTOCAST_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(PJRT_AUTOCAST_PROMOTE)
  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_under_autocast));
}

}  // namespace torch_pjrt
