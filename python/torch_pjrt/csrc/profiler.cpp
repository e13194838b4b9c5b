// torch.profiler for the pjrt device: a Kineto activity profiler registered for PrivateUse1
// (PyTorch's PrivateUse1ProfilerRegistry). A profile with ProfilerActivity.PrivateUse1 turns the
// engine's trace on (tpjrt_trace_start) while it records, and its events join the profile:
// region launches and compiles on the host's threads beside the ATen ops, executions and host
// transfers on a device track of their own. With the profiler off the engine records nothing.

// The registry (a recent PyTorch) and Kineto's headers serve only a Kineto build of PyTorch, as
// its Linux wheels are; against an older PyTorch this file compiles to nothing.
#if __has_include(<torch/csrc/profiler/standalone/privateuse1_profiler.h>) && \
    __has_include(<libkineto.h>)
#define USE_KINETO 1

// Kineto formats an activity's arguments with fmt, whose functions PyTorch's libraries keep to
// themselves: this file compiles them from fmt's headers, hidden inside the extension.
#define FMT_HEADER_ONLY 1
#pragma GCC visibility push(hidden)
#include <fmt/format.h>
#pragma GCC visibility pop

#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <libkineto.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "pjrt_backend.h"

namespace torch_pjrt {
namespace {

// The device track's process id: PyTorch reads a device activity's process id as its device
// index, and the engine runs its programs on the first device.
constexpr int32_t kDevicePid = 0;
constexpr int32_t kExecutionsRow = 0;
constexpr int32_t kTransfersRow = 1;

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class Session : public libkineto::IActivityProfilerSession {
 public:
  explicit Session(bool wanted) : wanted_(wanted) {}

  void start() override {
    span_start_ = wall_ns();
    recording_ = wanted_ && api_loaded() && api().trace_start() == TPJRT_OK;
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    if (recording_) {
      (void)api().trace_stop();
    }
    span_end_ = wall_ns();
    status_ = libkineto::TraceStatus::READY;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->gpuOpCount = -1;
    buffer_->span = libkineto::TraceSpan(span_start_, span_end_, "pjrt");
    if (recording_) {
      (void)api().trace_take(&Session::receive, this);
      recording_ = false;
    }
    for (auto& activity : buffer_->activities) {
      activity->log(logger);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(
        libkineto::DeviceInfo{kDevicePid, kDevicePid, "pjrt:0", "PJRT device"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> rows{
        {kExecutionsRow, kExecutionsRow, kDevicePid, "pjrt executions"},
        {kTransfersRow, kTransfersRow, kDevicePid, "pjrt host transfers"},
    };
    const int64_t host = libkineto::processId();
    for (int64_t thread : compile_threads_) {
      rows.push_back({thread, thread, host, "pjrt compile"});
    }
    return rows;
  }

  // The activities go with the trace: the logger keeps pointers to them after this session ends.
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

 private:
  static void receive(void* context, const TpjrtTraceEvent* event) {
    static_cast<Session*>(context)->add(*event);
  }

  void add(const TpjrtTraceEvent& event) {
    libkineto::ActivityType type = libkineto::ActivityType::PRIVATEUSE1_RUNTIME;
    int32_t pid = static_cast<int32_t>(libkineto::processId());
    int32_t row = static_cast<int32_t>(event.thread);
    switch (event.track) {
      case TPJRT_TRACK_DEVICE:
        type = libkineto::ActivityType::CONCURRENT_KERNEL;
        pid = kDevicePid;
        row = kExecutionsRow;
        break;
      case TPJRT_TRACK_TRANSFER:
        type = libkineto::ActivityType::GPU_MEMCPY;
        pid = kDevicePid;
        row = kTransfersRow;
        break;
      case TPJRT_TRACK_COMPILE:
        compile_threads_.insert(event.thread);
        break;
      default:
        break;
    }
    auto activity = std::make_unique<libkineto::GenericTraceActivity>(buffer_->span, type, event.name);
    for (uint64_t i = 0; i < event.arg_count; ++i) {
      // The engine's values are JSON already: written unquoted, as they are.
      activity->addMetadata(event.arg_names[i], std::string(event.arg_values[i]));
    }
    activity->startTime = event.start_ns;
    activity->endTime = event.end_ns;
    activity->device = pid;
    activity->resource = row;
    activity->threadId = row;
    buffer_->activities.push_back(std::move(activity));
  }

  bool wanted_;
  bool recording_ = false;
  int64_t span_start_ = 0;
  int64_t span_end_ = 0;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::set<int64_t> compile_threads_;
};

class PjrtProfiler : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<libkineto::ActivityType>& availableActivities() const override {
    return activities_;
  }

  // Every Kineto session configures every child profiler; the engine records only when the
  // device's activities were asked for (ProfilerActivity.PrivateUse1 adds kernels and copies),
  // not for a CPU-only profile (whose types include the PrivateUse1 runtime's).
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& types, const libkineto::Config&) override {
    const bool wanted = types.count(libkineto::ActivityType::CONCURRENT_KERNEL) ||
                        types.count(libkineto::ActivityType::GPU_MEMCPY);
    return std::make_unique<Session>(wanted);
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<libkineto::ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"pjrt"};
  std::set<libkineto::ActivityType> activities_{
      libkineto::ActivityType::PRIVATEUSE1_RUNTIME, libkineto::ActivityType::PRIVATEUSE1_DRIVER,
      libkineto::ActivityType::CONCURRENT_KERNEL, libkineto::ActivityType::GPU_MEMCPY};
};

REGISTER_PRIVATEUSE1_PROFILER(PjrtProfiler);

}  // namespace
}  // namespace torch_pjrt

#endif  // a Kineto build
