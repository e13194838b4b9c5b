// Creation ops whose values are a function of their sizes alone: `tril_indices` and
// `triu_indices`, built on the host and uploaded once.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "pjrt_backend.h"

#include <optional>

namespace torch_pjrt {
namespace {

// ----- creation ----------------------------------------------------------------------------------

// The index lists are a function of the sizes alone: built on the host, uploaded once.
at::Tensor triangle_indices(
    bool lower,
    int64_t row,
    int64_t col,
    int64_t offset,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Device> device) {
  at::TensorOptions host = at::TensorOptions().dtype(dtype.value_or(at::kLong));
  at::Tensor indices = lower ? at::tril_indices(row, col, offset, host) : at::triu_indices(row, col, offset, host);
  return indices.to(device.value_or(at::Device(c10::DeviceType::PrivateUse1, 0)));
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/creation_kernels.inc"

}  // namespace torch_pjrt
