// Several devices in one process (RFC 0046): where a tensor's buffer lives, and collectives across
// the process's devices, each run by the engine as one replicated StableHLO program.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <vector>

#include "pjrt_backend.h"

namespace py = pybind11;

namespace torch_pjrt::devices {
namespace {

// The PJRT device id of the buffer holding `t`'s storage, once computed (-1: never written).
int storage_device(const at::Tensor& t) {
  TORCH_CHECK(is_pjrt(t), "storage_device: expected a pjrt tensor, got one on ", t.device());
  int32_t device = -1;
  check(api().storage_device(storage_id(t.storage()), &device), "storage_device");
  return device;
}

// `kind` 0 all_reduce, 1 all_gather, 2 reduce_scatter; `reduction` 0 sum, 1 product, 2 max,
// 3 min; `dim` the gathered or scattered dimension (non-negative).
std::vector<at::Tensor> collective(
    int kind,
    int reduction,
    int64_t dim,
    const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(!tensors.empty(), "a collective needs at least one tensor");
  std::vector<at::Tensor> wholes;
  std::vector<TpjrtTensor> described;
  wholes.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(
        is_pjrt(t),
        "a collective across pjrt devices takes pjrt tensors, got one on ",
        t.device());
    const c10::DeviceGuard guard(t.device());
    at::Tensor whole = t.resolve_conj().resolve_neg();
    if (!(whole.is_contiguous() && whole.storage_offset() == 0 &&
          whole.storage().nbytes() == whole.nbytes())) {
      whole = whole.clone(at::MemoryFormat::Contiguous);
    }
    wholes.push_back(whole);
  }
  for (const at::Tensor& w : wholes) {
    described.push_back(describe(w));
  }
  std::vector<uint64_t> storages(wholes.size(), 0);
  check(
      api().collective(kind, reduction, dim, described.data(), described.size(), storages.data()),
      "collective across pjrt devices");
  mark_started();
  std::vector<int64_t> sizes = wholes[0].sizes().vec();
  const int64_t replicas = static_cast<int64_t>(wholes.size());
  if (kind == 1) {
    sizes[dim] *= replicas;
  } else if (kind == 2) {
    sizes[dim] /= replicas;
  }
  int64_t numel = 1;
  for (int64_t s : sizes) {
    numel *= s;
  }
  std::vector<at::Tensor> results;
  results.reserve(wholes.size());
  for (size_t i = 0; i < wholes.size(); ++i) {
    const size_t nbytes = static_cast<size_t>(numel) * wholes[i].element_size();
    c10::Storage storage = wrap_storage(storages[i], nbytes, wholes[i].device());
    at::Tensor r = at::detail::make_tensor<c10::TensorImpl>(
        std::move(storage),
        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        wholes[i].dtype());
    r.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace

void add_bindings(py::module& mod) {
  mod.def("_storage_device", &storage_device, py::arg("tensor"));
  mod.def(
      "_collective",
      &collective,
      py::arg("kind"),
      py::arg("reduction"),
      py::arg("dim"),
      py::arg("tensors"));
}

}  // namespace torch_pjrt::devices
