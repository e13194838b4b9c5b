// The c10d backend of device "pjrt" (RFC 0037): every collective stages its pjrt tensors through
// host memory and runs on a gloo backend over the same store, then writes the results back.
// The XLA CPU plugin cannot join other processes in one program, so this host transport is what
// runs across processes; a collective is a materialization point, so where a region is cut
// around it depends on the op stream alone, never on timing, and every rank runs the same
// programs. Optional dispatch-time checks compare each collective across ranks, so a rank that
// diverges or fails turns into an error on every rank instead of a hang.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "module_api.h"

namespace py = pybind11;

namespace torch_pjrt::distributed {
namespace {

// Process-wide counters, read by torch_pjrt.metrics().
std::atomic<uint64_t> collectives_run{0};
std::atomic<uint64_t> bytes_staged{0};
std::atomic<uint64_t> nanos_in_collectives{0};

const char* reduce_op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      return "sum";
    case c10d::ReduceOp::AVG:
      return "avg";
    case c10d::ReduceOp::PRODUCT:
      return "product";
    case c10d::ReduceOp::MIN:
      return "min";
    case c10d::ReduceOp::MAX:
      return "max";
    case c10d::ReduceOp::BAND:
      return "band";
    case c10d::ReduceOp::BOR:
      return "bor";
    case c10d::ReduceOp::BXOR:
      return "bxor";
    case c10d::ReduceOp::PREMUL_SUM:
      return "premul_sum";
    default:
      return "unused";
  }
}

std::string shape_text(const at::Tensor& t) {
  std::ostringstream out;
  out << c10::toString(t.scalar_type()) << t.sizes();
  return out.str();
}

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ULL;
  for (unsigned char c : text) {
    hash = (hash ^ c) * 1099511628211ULL;
  }
  return hash;
}

// What a rank says of one collective: the facts every rank must agree on (kind, root, reduction,
// and the shapes that are the same on every rank). Per-rank sizes (uneven all_to_all, gather's
// root-only lists) are left out.
struct Signature {
  std::string kind;
  std::string facts;

  std::string text() const {
    return facts.empty() ? kind : kind + " " + facts;
  }
};

class HostStagedBackend final : public c10d::Backend {
 public:
  HostStagedBackend(
      c10::intrusive_ptr<c10d::Store> store,
      int rank,
      int size,
      std::chrono::milliseconds timeout,
      c10::intrusive_ptr<c10d::Backend> host,
      std::string group,
      bool check_every_collective)
      : c10d::Backend(rank, size),
        store_(std::move(store)),
        timeout_(timeout),
        host_(std::move(host)),
        group_(std::move(group)),
        check_every_collective_(check_every_collective) {}

  const std::string getBackendName() const override {
    return "pjrt";
  }

  void setSequenceNumberForGroup() override {}

  uint64_t getSequenceNumberForGroup() override {
    return sequence_;
  }

  void setTimeout(std::chrono::milliseconds timeout) override {
    timeout_ = timeout;
    host_->setTimeout(timeout);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override {
    Signature sig{"broadcast", facts_of(tensors) + " root " + std::to_string(opts.rootRank)};
    auto staged = stage_all(tensors);
    run(sig, [&] { return host_->broadcast(staged, opts); });
    if (getRank() != opts.rootRank) {
      write_back(tensors, staged);
    }
    return completed(tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override {
    Signature sig{"all_reduce", facts_of(tensors) + " " + reduce_op_name(opts.reduceOp.op_)};
    auto staged = stage_all(tensors);
    c10d::AllreduceOptions host_opts = opts;
    host_opts.reduceOp = host_reduction(opts.reduceOp, staged);
    run(sig, [&] { return host_->allreduce(staged, host_opts); });
    finish_reduction(opts.reduceOp, staged);
    write_back(tensors, staged);
    return completed(tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override {
    Signature sig{
        "all_reduce_coalesced", facts_of(tensors) + " " + reduce_op_name(opts.reduceOp.op_)};
    auto staged = stage_all(tensors);
    c10d::AllreduceCoalescedOptions host_opts = opts;
    host_opts.reduceOp = host_reduction(opts.reduceOp, staged);
    run(sig, [&] { return host_->allreduce_coalesced(staged, host_opts); });
    finish_reduction(opts.reduceOp, staged);
    write_back(tensors, staged);
    return completed(tensors);
  }

  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override {
    Signature sig{
        "reduce",
        facts_of(tensors) + " " + reduce_op_name(opts.reduceOp.op_) + " root " +
            std::to_string(opts.rootRank)};
    auto staged = stage_all(tensors);
    c10d::ReduceOptions host_opts = opts;
    host_opts.reduceOp = host_reduction(opts.reduceOp, staged);
    run(sig, [&] { return host_->reduce(staged, host_opts); });
    // Only the root receives the result; the other ranks' tensors are left as they were.
    if (getRank() == opts.rootRank) {
      finish_reduction(opts.reduceOp, staged);
      write_back(tensors, staged);
    }
    return completed(tensors);
  }

  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    Signature sig{"all_gather", facts_of(inputs)};
    auto staged_in = stage_all(inputs);
    auto staged_out = host_like(outputs);
    run(sig, [&] { return host_->allgather(staged_out, staged_in, opts); });
    for (size_t i = 0; i < outputs.size(); ++i) {
      write_back(outputs[i], staged_out[i]);
    }
    return completed(flat(outputs));
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::AllgatherOptions& opts) override {
    Signature sig{"all_gather_into_tensor", shape_text(input)};
    at::Tensor staged_in = stage(input);
    at::Tensor staged_out = host_like(output);
    run(sig, [&] { return host_->_allgather_base(staged_out, staged_in, opts); });
    write_back(output, staged_out);
    return completed({output});
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<std::vector<at::Tensor>> one_out{outputs[i]};
      std::vector<at::Tensor> one_in{inputs[i]};
      allgather(one_out, one_in, opts);
    }
    return completed(flat(outputs));
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    for (size_t i = 0; i < inputs.size(); ++i) {
      _allgather_base(outputs[i], inputs[i], opts);
    }
    return completed(outputs);
  }

  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override {
    Signature sig{"gather", facts_of(inputs) + " root " + std::to_string(opts.rootRank)};
    auto staged_in = stage_all(inputs);
    auto staged_out = host_like(outputs);
    run(sig, [&] { return host_->gather(staged_out, staged_in, opts); });
    for (size_t i = 0; i < outputs.size(); ++i) {
      write_back(outputs[i], staged_out[i]);
    }
    return completed(inputs);
  }

  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override {
    Signature sig{"scatter", facts_of(outputs) + " root " + std::to_string(opts.rootRank)};
    auto staged_out = host_like(outputs);
    std::vector<std::vector<at::Tensor>> staged_in;
    for (auto& list : inputs) {
      staged_in.push_back(stage_all(list));
    }
    run(sig, [&] { return host_->scatter(staged_out, staged_in, opts); });
    write_back(outputs, staged_out);
    return completed(outputs);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    Signature sig{"reduce_scatter", facts_of(outputs) + " " + reduce_op_name(opts.reduceOp.op_)};
    auto staged_out = host_like(outputs);
    std::vector<std::vector<at::Tensor>> staged_in;
    for (auto& list : inputs) {
      staged_in.push_back(stage_all(list));
    }
    c10d::ReduceScatterOptions host_opts = opts;
    for (auto& list : staged_in) {
      host_opts.reduceOp = host_reduction(opts.reduceOp, list);
    }
    run(sig, [&] { return host_->reduce_scatter(staged_out, staged_in, host_opts); });
    finish_reduction(opts.reduceOp, staged_out);
    write_back(outputs, staged_out);
    return completed(outputs);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override {
    Signature sig{
        "reduce_scatter_tensor", shape_text(output) + " " + reduce_op_name(opts.reduceOp.op_)};
    std::vector<at::Tensor> staged_in{stage(input)};
    std::vector<at::Tensor> staged_out{host_like(output)};
    c10d::ReduceScatterOptions host_opts = opts;
    host_opts.reduceOp = host_reduction(opts.reduceOp, staged_in);
    run(sig, [&] { return host_->_reduce_scatter_base(staged_out[0], staged_in[0], host_opts); });
    finish_reduction(opts.reduceOp, staged_out);
    write_back(output, staged_out[0]);
    return completed({output});
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    for (size_t i = 0; i < inputs.size(); ++i) {
      _reduce_scatter_base(outputs[i], inputs[i], opts);
    }
    return completed(outputs);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output,
      at::Tensor& input,
      std::vector<int64_t>& output_splits,
      std::vector<int64_t>& input_splits,
      const c10d::AllToAllOptions& opts) override {
    Signature sig{"all_to_all_single", c10::toString(input.scalar_type())};
    at::Tensor staged_in = stage(input);
    at::Tensor staged_out = host_like(output);
    run(sig, [&] {
      return host_->alltoall_base(staged_out, staged_in, output_splits, input_splits, opts);
    });
    write_back(output, staged_out);
    return completed({output});
  }

  // gloo's list form wants equal sizes; uneven lists go through the single-tensor form, each
  // tensor flattened and its element count a split.
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts) override {
    TORCH_CHECK(
        !inputs.empty() && inputs.size() == outputs.size(),
        "pjrt: all_to_all needs one input and one output tensor per rank, got ",
        inputs.size(),
        " inputs and ",
        outputs.size(),
        " outputs");
    Signature sig{"all_to_all", c10::toString(inputs[0].scalar_type())};
    std::vector<at::Tensor> flat_in;
    std::vector<int64_t> in_splits, out_splits;
    for (const auto& t : inputs) {
      flat_in.push_back(stage(t).reshape({-1}));
      in_splits.push_back(t.numel());
    }
    int64_t out_total = 0;
    for (const auto& t : outputs) {
      out_splits.push_back(t.numel());
      out_total += t.numel();
    }
    at::Tensor staged_in = at::cat(flat_in);
    at::Tensor staged_out = at::empty({out_total}, staged_in.options());
    // The transport may keep (move from) the split vectors it is given: hand it copies.
    std::vector<int64_t> out_counts = out_splits, in_counts = in_splits;
    run(sig, [&] {
      return host_->alltoall_base(staged_out, staged_in, out_counts, in_counts, opts);
    });
    int64_t offset = 0;
    for (size_t i = 0; i < outputs.size(); ++i) {
      at::Tensor piece = staged_out.narrow(0, offset, out_splits[i]).view(outputs[i].sizes());
      offset += out_splits[i];
      if (outputs[i].device().is_cpu()) {
        at::NoGradGuard no_grad;
        outputs[i].copy_(piece);
      } else {
        write_back(outputs[i], piece);
      }
    }
    return completed(outputs);
  }

  c10::intrusive_ptr<c10d::Work> send(
      std::vector<at::Tensor>& tensors,
      int dst_rank,
      int tag) override {
    // Point-to-point messages involve two ranks only: no cross-rank check.
    auto staged = stage_all(tensors);
    run_unchecked("send", [&] { return host_->send(staged, dst_rank, tag); });
    return completed(tensors);
  }

  c10::intrusive_ptr<c10d::Work> recv(
      std::vector<at::Tensor>& tensors,
      int src_rank,
      int tag) override {
    auto staged = host_like(tensors);
    run_unchecked("recv", [&] { return host_->recv(staged, src_rank, tag); });
    write_back(tensors, staged);
    return completed(tensors);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    auto staged = host_like(tensors);
    run_unchecked("recv", [&] { return host_->recvAnysource(staged, tag); });
    write_back(tensors, staged);
    return completed(tensors);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    Signature sig{"barrier", ""};
    run(sig, [&] { return host_->barrier(opts); });
    return completed({});
  }

 private:
  // A tensor's host copy for the transport. CPU tensors go as they are (gloo writes in place);
  // pjrt tensors are materialized and read once.
  at::Tensor stage(const at::Tensor& tensor) {
    if (!tensor.defined() || tensor.device().is_cpu()) {
      return tensor;
    }
    at::NoGradGuard no_grad;
    at::Tensor host = tensor.to(at::kCPU).contiguous();
    bytes_staged += host.nbytes();
    return host;
  }

  std::vector<at::Tensor> stage_all(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> staged;
    staged.reserve(tensors.size());
    for (const auto& t : tensors) {
      staged.push_back(stage(t));
    }
    return staged;
  }

  // A host buffer for a result (nothing read from the device).
  static at::Tensor host_like(const at::Tensor& tensor) {
    if (!tensor.defined() || tensor.device().is_cpu()) {
      return tensor;
    }
    return at::empty(tensor.sizes(), tensor.options().device(at::kCPU));
  }

  static std::vector<at::Tensor> host_like(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) {
      out.push_back(host_like(t));
    }
    return out;
  }

  static std::vector<std::vector<at::Tensor>> host_like(
      const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<std::vector<at::Tensor>> out;
    out.reserve(lists.size());
    for (const auto& list : lists) {
      out.push_back(host_like(list));
    }
    return out;
  }

  void write_back(at::Tensor& tensor, const at::Tensor& host) {
    if (!tensor.defined() || tensor.is_same(host)) {
      return;
    }
    at::NoGradGuard no_grad;
    tensor.copy_(host);
    bytes_staged += host.nbytes();
  }

  void write_back(std::vector<at::Tensor>& tensors, const std::vector<at::Tensor>& hosts) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      write_back(tensors[i], hosts[i]);
    }
  }

  static std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<at::Tensor> out;
    for (const auto& list : lists) {
      out.insert(out.end(), list.begin(), list.end());
    }
    return out;
  }

  static std::string facts_of(const std::vector<at::Tensor>& tensors) {
    std::string text;
    for (const auto& t : tensors) {
      if (!text.empty()) {
        text += ",";
      }
      text += t.defined() ? shape_text(t) : "none";
    }
    return text;
  }

  // gloo has no AVG or PREMUL_SUM: the first sums and divides after, the second scales the
  // staged inputs before summing (the staged copies are the backend's own, so this is safe).
  c10d::ReduceOp host_reduction(const c10d::ReduceOp& op, std::vector<at::Tensor>& staged) {
    if (op.op_ == c10d::ReduceOp::AVG) {
      for (const auto& t : staged) {
        TORCH_CHECK(
            at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()),
            "pjrt: ReduceOp.AVG needs floating-point tensors, got ",
            t.scalar_type(),
            "; use ReduceOp.SUM and divide by the group's size.");
      }
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
    }
    if (op.op_ == c10d::ReduceOp::PREMUL_SUM) {
      auto* factor = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(factor != nullptr, "pjrt: ReduceOp.PREMUL_SUM without its factor");
      for (auto& t : staged) {
        if (factor->tensor_factor.defined()) {
          t.mul_(factor->tensor_factor.to(at::kCPU));
        } else {
          t.mul_(factor->double_factor);
        }
      }
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
    }
    return op;
  }

  void finish_reduction(const c10d::ReduceOp& op, std::vector<at::Tensor>& staged) {
    if (op.op_ != c10d::ReduceOp::AVG) {
      return;
    }
    for (auto& t : staged) {
      t.div_(getSize());
    }
  }

  c10::intrusive_ptr<c10d::Work> completed(std::vector<at::Tensor> tensors) {
    auto future = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(std::move(tensors)));
    return c10d::Work::create_from_future(future);
  }

  // Runs one collective on the host transport and waits for it, with the cross-rank check
  // first when it is on.
  void run(const Signature& sig, const std::function<c10::intrusive_ptr<c10d::Work>()>& launch) {
    uint64_t seq = ++sequence_;
    if (check_every_collective_) {
      compare_across_ranks(seq, sig);
    }
    run_numbered(seq, sig.text(), launch);
  }

  void run_unchecked(
      const std::string& what,
      const std::function<c10::intrusive_ptr<c10d::Work>()>& launch) {
    run_numbered(++sequence_, what, launch);
  }

  void run_numbered(
      uint64_t seq,
      const std::string& what,
      const std::function<c10::intrusive_ptr<c10d::Work>()>& launch) {
    auto start = std::chrono::steady_clock::now();
    try {
      auto work = launch();
      work->wait();
    } catch (const c10::Error& error) {
      fail(seq, what, error.what_without_backtrace());
    } catch (const std::exception& error) {
      fail(seq, what, error.what());
    }
    collectives_run++;
    nanos_in_collectives += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count();
  }

  // Every rank publishes what it is about to run and all-gathers a hash of it; a mismatch
  // raises on every rank with each rank's own description.
  void compare_across_ranks(uint64_t seq, const Signature& sig) {
    std::string mine = "#" + std::to_string(seq) + " " + sig.text();
    store_->set(signature_key(getRank()), std::vector<uint8_t>(mine.begin(), mine.end()));
    at::Tensor hash = at::empty({1}, at::kLong);
    hash[0] = static_cast<int64_t>(fnv1a(mine));
    std::vector<at::Tensor> in{hash};
    std::vector<std::vector<at::Tensor>> out{std::vector<at::Tensor>()};
    for (int r = 0; r < getSize(); ++r) {
      out[0].push_back(at::empty({1}, at::kLong));
    }
    try {
      host_->allgather(out, in, c10d::AllgatherOptions())->wait();
    } catch (const std::exception& error) {
      fail(seq, "the check before " + sig.text(), error.what());
    }
    bool same = true;
    for (const auto& h : out[0]) {
      same = same && h.item<int64_t>() == hash.item<int64_t>();
    }
    if (same) {
      return;
    }
    std::ostringstream msg;
    msg << "pjrt: collective #" << seq << " in group '" << group_
        << "' differs across ranks; every rank must issue the same collectives in the same order "
           "(with the same shapes, reduction and root):";
    for (int r = 0; r < getSize(); ++r) {
      auto text = store_->get(signature_key(r));
      msg << "\n  rank " << r << ": " << std::string(text.begin(), text.end());
    }
    C10_THROW_ERROR(DistBackendError, msg.str());
  }

  std::string signature_key(int rank) const {
    return "pjrt_collective/" + std::to_string(rank);
  }

  // Says what failed and, when another rank published its own failure, that one first.
  [[noreturn]] void fail(uint64_t seq, const std::string& what, const std::string& cause) {
    std::ostringstream msg;
    msg << "pjrt: collective #" << seq << " (" << what << ") in group '" << group_ << "', rank "
        << getRank() << " of " << getSize() << ", did not complete.";
    bool peer_failed = false;
    bool store_gone = false;
    for (int r = 0; r < getSize() && !store_gone; ++r) {
      if (r == getRank()) {
        continue;
      }
      std::string key = "pjrt_failed/" + std::to_string(r);
      try {
        if (store_->check({key})) {
          auto text = store_->get(key);
          msg << "\n  rank " << r << " failed: " << std::string(text.begin(), text.end());
          peer_failed = true;
        }
      } catch (const std::exception&) {
        store_gone = true;
      }
    }
    if (store_gone) {
      msg << "\n  The group's store cannot be reached: the process hosting it (rank 0 under "
             "torchrun) has exited, so another rank ended before this collective.";
    } else if (!peer_failed) {
      msg << "\n  No rank reported a failure: another rank may have stopped, issued a different "
             "collective, or not reached this one within the group's timeout ("
          << timeout_.count() / 1000.0
          << " s). TORCH_PJRT_DIST_CHECK=dispatch compares every collective across ranks.";
    }
    msg << "\n  transport: " << cause;
    C10_THROW_ERROR(DistBackendError, msg.str());
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Backend> host_;
  std::string group_;
  bool check_every_collective_;
  uint64_t sequence_ = 0;
};

// DDP's reducer times its forward, backward and communication per device type. Collectives here
// complete before they return and the host's clock brackets them, so host times are what the
// steps take (the CPU's timer does the same).
class HostClockTimer final : public c10d::Timer {
 public:
  explicit HostClockTimer(c10::Device /* device */) {}

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    int64_t start_time = getTimeRef(start);
    int64_t end_time = getTimeRef(end);
    if (start_time == c10d::kUnsetTime || end_time == c10d::kUnsetTime || end_time < start_time) {
      return std::nullopt;
    }
    return end_time - start_time;
  }
};

}  // namespace
}  // namespace torch_pjrt::distributed

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, torch_pjrt::distributed::HostClockTimer);
}  // namespace c10d

namespace torch_pjrt::distributed {

void add_bindings(py::module& mod) {
  py::class_<HostStagedBackend, c10d::Backend, c10::intrusive_ptr<HostStagedBackend>>(
      mod, "_HostStagedBackend")
      .def(
          py::init([](const c10::intrusive_ptr<c10d::Store>& store,
                      int rank,
                      int size,
                      int64_t timeout_ms,
                      const c10::intrusive_ptr<c10d::Backend>& host,
                      const std::string& group,
                      bool check_every_collective) {
            return c10::make_intrusive<HostStagedBackend>(
                store,
                rank,
                size,
                std::chrono::milliseconds(timeout_ms),
                host,
                group,
                check_every_collective);
          }),
          py::arg("store"),
          py::arg("rank"),
          py::arg("size"),
          py::arg("timeout_ms"),
          py::arg("host"),
          py::arg("group"),
          py::arg("check_every_collective"),
          py::call_guard<py::gil_scoped_release>());
  mod.def("_collective_counters", [] {
    return std::make_tuple(
        collectives_run.load(), bytes_staged.load(), nanos_in_collectives.load() / 1e9);
  });
  mod.def("_reset_collective_counters", [] {
    collectives_run = 0;
    bytes_staged = 0;
    nanos_in_collectives = 0;
  });
}

}  // namespace torch_pjrt::distributed
