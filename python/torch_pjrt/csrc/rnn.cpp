// The fused recurrent cells PyTorch calls on every non-CPU device: `_thnn_fused_lstm_cell`,
// `_thnn_fused_gru_cell` and their backward ops. ATen's LSTM, GRU, LSTMCell and GRUCell call them
// for each time step once the input is not on the CPU, and they have no CPU kernel to fall back on,
// so without them `nn.LSTM` on pjrt fails outright.
//
// Each is composed from ATen ops on the device (sigmoid, tanh, products, sums), so a whole time
// step, forward or backward, is captured like any other ops and fuses into the surrounding region
// in DeferAndFuse. The workspace tensors carry what the backward needs, laid out as PyTorch's CUDA
// kernels lay them out: the LSTM's four activated gates, and the GRU's reset, input and new gates,
// the previous hidden state and the hidden new-gate term.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

#include "pjrt_backend.h"

namespace torch_pjrt {
namespace {

// `gates` ([batch, chunks * hidden]) checked against the state `state` ([batch, hidden]).
void check_gates(
    const char* op,
    const at::Tensor& input_gates,
    const at::Tensor& hidden_gates,
    const at::Tensor& state,
    int64_t chunks) {
  TORCH_CHECK(
      input_gates.dim() == 2 && state.dim() == 2,
      op,
      ": expected 2-D gates [batch, ",
      chunks,
      " * hidden] and a 2-D state [batch, hidden], but got gates of shape ",
      input_gates.sizes(),
      " and a state of shape ",
      state.sizes());
  TORCH_CHECK(
      input_gates.sizes() == hidden_gates.sizes(),
      op,
      ": expected the input and hidden gates to have the same shape, but got ",
      input_gates.sizes(),
      " and ",
      hidden_gates.sizes());
  TORCH_CHECK(
      input_gates.size(0) == state.size(0) && input_gates.size(1) == chunks * state.size(1),
      op,
      ": expected gates of shape [",
      state.size(0),
      ", ",
      chunks * state.size(1),
      "] for a state of shape ",
      state.sizes(),
      ", but got ",
      input_gates.sizes());
}

at::Tensor with_bias(at::Tensor gates, const std::optional<at::Tensor>& bias) {
  return present(bias) ? gates + *bias : gates;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_fused_lstm_cell(
    const at::Tensor& input_gates,
    const at::Tensor& hidden_gates,
    const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias,
    const std::optional<at::Tensor>& hidden_bias) {
  check_gates("_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, 4);
  TORCH_CHECK(
      present(input_bias) == present(hidden_bias),
      "_thnn_fused_lstm_cell: expected both biases or neither, but got only the ",
      present(input_bias) ? "input" : "hidden",
      " bias");
  at::Tensor gates = with_bias(with_bias(input_gates + hidden_gates, input_bias), hidden_bias);
  auto chunks = gates.chunk(4, 1);
  at::Tensor in_gate = chunks[0].sigmoid();
  at::Tensor forget_gate = chunks[1].sigmoid();
  at::Tensor cell_gate = chunks[2].tanh();
  at::Tensor out_gate = chunks[3].sigmoid();
  at::Tensor cy = forget_gate * cx + in_gate * cell_gate;
  at::Tensor hy = out_gate * cy.tanh();
  at::Tensor workspace = at::cat({in_gate, forget_gate, cell_gate, out_gate}, 1);
  return {hy, cy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pjrt_fused_lstm_cell_backward_impl(
    const std::optional<at::Tensor>& grad_hy,
    const std::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx,
    const at::Tensor& cy,
    const at::Tensor& workspace,
    bool has_bias) {
  if (!present(grad_hy) && !present(grad_cy)) {
    return {};
  }
  TORCH_CHECK(
      workspace.dim() == 2 && workspace.size(1) == 4 * cy.size(1),
      "_thnn_fused_lstm_cell_backward_impl: expected a workspace of shape [",
      cy.size(0),
      ", ",
      4 * cy.size(1),
      "] (the forward's four gates), but got ",
      workspace.sizes());
  auto gates = workspace.chunk(4, 1);
  const at::Tensor& in_gate = gates[0];
  const at::Tensor& forget_gate = gates[1];
  const at::Tensor& cell_gate = gates[2];
  const at::Tensor& out_gate = gates[3];
  at::Tensor tanh_cy = cy.tanh();
  // The cell state's gradient: what reaches it through hy, plus its own incoming gradient.
  at::Tensor grad_c;
  at::Tensor grad_out_gate;
  if (present(grad_hy)) {
    grad_c = *grad_hy * out_gate * (1 - tanh_cy * tanh_cy);
    grad_out_gate = *grad_hy * tanh_cy * (1 - out_gate) * out_gate;
    if (present(grad_cy)) {
      grad_c = grad_c + *grad_cy;
    }
  } else {
    grad_c = *grad_cy;
    grad_out_gate = at::zeros_like(out_gate);
  }
  at::Tensor grad_in_gate = grad_c * cell_gate * (1 - in_gate) * in_gate;
  at::Tensor grad_forget_gate = grad_c * cx * (1 - forget_gate) * forget_gate;
  at::Tensor grad_cell_gate = grad_c * in_gate * (1 - cell_gate * cell_gate);
  at::Tensor grad_gates =
      at::cat({grad_in_gate, grad_forget_gate, grad_cell_gate, grad_out_gate}, 1);
  at::Tensor grad_cx = grad_c * forget_gate;
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> pjrt_fused_gru_cell(
    const at::Tensor& input_gates,
    const at::Tensor& hidden_gates,
    const at::Tensor& hx,
    const std::optional<at::Tensor>& input_bias,
    const std::optional<at::Tensor>& hidden_bias) {
  check_gates("_thnn_fused_gru_cell", input_gates, hidden_gates, hx, 3);
  TORCH_CHECK(
      present(input_bias) == present(hidden_bias),
      "_thnn_fused_gru_cell: expected both biases or neither, but got only the ",
      present(input_bias) ? "input" : "hidden",
      " bias");
  auto in = with_bias(input_gates, input_bias).chunk(3, 1);
  auto hidden = with_bias(hidden_gates, hidden_bias).chunk(3, 1);
  at::Tensor reset_gate = (in[0] + hidden[0]).sigmoid();
  at::Tensor input_gate = (in[1] + hidden[1]).sigmoid();
  const at::Tensor& hidden_new = hidden[2];
  at::Tensor new_gate = (in[2] + reset_gate * hidden_new).tanh();
  at::Tensor hy = new_gate + input_gate * (hx - new_gate);
  at::Tensor workspace = at::cat({reset_gate, input_gate, new_gate, hx, hidden_new}, 1);
  return {hy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
pjrt_fused_gru_cell_backward(const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  TORCH_CHECK(
      grad_hy.dim() == 2 && workspace.dim() == 2 && workspace.size(0) == grad_hy.size(0) &&
          workspace.size(1) == 5 * grad_hy.size(1),
      "_thnn_fused_gru_cell_backward: expected a workspace of shape [",
      grad_hy.size(0),
      ", ",
      5 * grad_hy.size(1),
      "] (the forward's gates and state) for a gradient of shape ",
      grad_hy.sizes(),
      ", but got ",
      workspace.sizes());
  auto saved = workspace.chunk(5, 1);
  const at::Tensor& reset_gate = saved[0];
  const at::Tensor& input_gate = saved[1];
  const at::Tensor& new_gate = saved[2];
  const at::Tensor& hx = saved[3];
  const at::Tensor& hidden_new = saved[4];
  at::Tensor grad_input_gate = grad_hy * (hx - new_gate) * (1 - input_gate) * input_gate;
  at::Tensor grad_hx = grad_hy * input_gate;
  at::Tensor grad_new = grad_hy * (1 - input_gate) * (1 - new_gate * new_gate);
  at::Tensor grad_hidden_new = grad_new * reset_gate;
  at::Tensor grad_reset_gate = grad_new * hidden_new * (1 - reset_gate) * reset_gate;
  at::Tensor grad_input_gates = at::cat({grad_reset_gate, grad_input_gate, grad_new}, 1);
  at::Tensor grad_hidden_gates = at::cat({grad_reset_gate, grad_input_gate, grad_hidden_new}, 1);
  at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias};
}

}  // namespace

// Kernel registrations, generated from the rows of hand_written_kernels.py.
#include "generated/rnn_kernels.inc"

}  // namespace torch_pjrt
