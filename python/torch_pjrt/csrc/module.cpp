// The `torch_pjrt._C` Python module: only the handful of functions Python needs to install the
// engine table. Kernels, allocator, device guard and hooks register themselves when this library
// is loaded (static initializers in the other translation units).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>

#include "module_api.h"

namespace py = pybind11;
namespace m = torch_pjrt::module;

namespace torch_pjrt::distributed {
void add_bindings(py::module& mod);
}

namespace torch_pjrt::devices {
void add_bindings(py::module& mod);
}

PYBIND11_MODULE(_C, mod) {
  mod.doc() = "torch-pjrt PrivateUse1 backend (device 'pjrt')";
  mod.def(
      "_set_engine_api",
      [](std::uintptr_t address) {
        std::string error = m::set_engine_api(address);
        if (!error.empty()) {
          throw std::runtime_error(error);
        }
      },
      py::arg("address"),
      "Install the engine's TpjrtApi table (an address from tpjrt_api()) and register kernels.");
  mod.def("_set_engine_unavailable", &m::set_engine_unavailable, py::arg("reason"));
  mod.def("_engine_loaded", &m::engine_loaded);
  mod.def("_engine_started", &m::engine_started);
  mod.def("_note_engine_started", &m::note_engine_started);
  mod.def("_missing_ops", &m::missing_ops);
  mod.def("_kernel_names", &m::kernel_names);
  mod.def("_current_device", &m::current_device);
  mod.def("_set_device", &m::set_device, py::arg("index"));
  mod.def("_reset_fallback_warnings", &m::reset_fallback_warnings);
  mod.def("_growth_counters", &m::growth_counters);
  mod.def("_reset_growth_counters", &m::reset_growth_counters);
  mod.def("_manual_seed", &m::manual_seed, py::arg("index"), py::arg("seed"));
  mod.def("_seed", &m::seed, py::arg("index"));
  mod.def("_initial_seed", &m::initial_seed, py::arg("index"));
  mod.def(
      "_get_rng_state",
      [](int index) { return py::bytes(m::get_rng_state(index)); },
      py::arg("index"));
  mod.def("_set_rng_state", &m::set_rng_state, py::arg("index"), py::arg("state"));
  torch_pjrt::distributed::add_bindings(mod);
  torch_pjrt::devices::add_bindings(mod);
}
