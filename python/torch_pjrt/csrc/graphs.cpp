// Compiled-mode graphs as programs (RFC 0033): `torch_pjrt::graph_begin_record` opens a graph
// that will be recorded (a few pending ops making only its inputs join its region);
// `torch_pjrt::graph_end_record` closes a graph and records its region over the storages of the graph's inputs and fresh outputs;
// `torch_pjrt::graph_replay` runs that program on new tensors without capturing the graph's ops.
// The Python backend (_compiled.py) decides when a graph may be recorded and builds the output
// tensors; these only hand the tensors' storages to the engine.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "pjrt_backend.h"

namespace torch_pjrt {
namespace {

std::vector<uint64_t> storage_ids(at::TensorList tensors, const char* what) {
  std::vector<uint64_t> ids;
  ids.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(
        t.device().type() == c10::DeviceType::PrivateUse1,
        "torch.compile(backend='pjrt'): the graph's ",
        what,
        " must be pjrt tensors, got one on ",
        t.device());
    ids.push_back(storage_id(t.storage()));
  }
  return ids;
}

void graph_begin_record(at::TensorList inputs) {
  const std::vector<uint64_t> in = storage_ids(inputs, "inputs");
  check(
      api().graph_begin_record(in.data(), in.size()),
      "torch.compile(backend='pjrt') opening a graph to record");
}

int64_t graph_end_record(at::TensorList inputs, at::TensorList fresh) {
  const std::vector<uint64_t> in = storage_ids(inputs, "inputs");
  const std::vector<uint64_t> out = storage_ids(fresh, "outputs");
  uint64_t handle = 0;
  check(
      api().graph_end_record(in.data(), in.size(), out.data(), out.size(), &handle),
      "torch.compile(backend='pjrt') recording a graph");
  return static_cast<int64_t>(handle);
}

bool graph_replay(int64_t handle, at::TensorList inputs, at::TensorList fresh) {
  const std::vector<uint64_t> in = storage_ids(inputs, "inputs");
  const std::vector<uint64_t> out = storage_ids(fresh, "outputs");
  int32_t replayed = 0;
  check(
      api().graph_replay(
          static_cast<uint64_t>(handle), in.data(), in.size(), out.data(), out.size(), &replayed),
      "torch.compile(backend='pjrt') running a recorded graph");
  return replayed != 0;
}

}  // namespace
}  // namespace torch_pjrt

TORCH_LIBRARY_FRAGMENT(torch_pjrt, m) {
  m.def("graph_begin_record(Tensor[] inputs) -> ()", &torch_pjrt::graph_begin_record);
  m.def("graph_end_record(Tensor[] inputs, Tensor[] fresh) -> int", &torch_pjrt::graph_end_record);
  m.def(
      "graph_replay(int handle, Tensor[] inputs, Tensor[] fresh) -> bool",
      &torch_pjrt::graph_replay);
}
