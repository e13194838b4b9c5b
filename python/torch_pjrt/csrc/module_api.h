// What the Python module init (module.cpp, the only translation unit that includes pybind11) needs
// from the backend. Deliberately free of ATen headers so that unit stays cheap to compile.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torch_pjrt::module {

// Installs the engine function table at `address` and registers the per-op kernels. Returns an
// empty string on success, else why the table was refused.
std::string set_engine_api(std::uintptr_t address);
// Records why the engine library could not be loaded (raised at the first device use).
void set_engine_unavailable(const std::string& reason);
bool engine_loaded();
bool engine_started();
// Python started the engine through the same table (eager mode, metrics, sync).
void note_engine_started();
// ATen kernels of the table whose engine op this engine does not know (they fall back to CPU).
std::vector<std::string> missing_ops();
// Every ATen overload that has a generated pjrt kernel.
std::vector<std::string> kernel_names();
int current_device();
void set_device(int index);
// Ops that fell back to the CPU and have already warned.
void reset_fallback_warnings();
// Growth counters (growth.cpp): capacity buffers allocated, appends written into capacity.
std::vector<int64_t> growth_counters();
void reset_growth_counters();

// The default generator of device `index` (random.cpp).
void manual_seed(int index, uint64_t seed);
// Seeds nondeterministically; returns the seed.
uint64_t seed(int index);
uint64_t initial_seed(int index);
// The generator state: 16 bytes (the seed, then the number of draws since seeding).
std::string get_rng_state(int index);
void set_rng_state(int index, const std::string& bytes);

}  // namespace torch_pjrt::module
