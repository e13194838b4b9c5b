"""Recurrent layers on pjrt against the CPU, in every eager mode: LSTM, GRU, LSTMCell and GRUCell,
forward and backward (outputs, final states, input, state and weight gradients), and a few
training steps of an LSTM language model. ATen calls the fused cell ops
(`_thnn_fused_lstm_cell`, `_thnn_fused_gru_cell` and their backward ops) for every time step on
any non-CPU device; nothing may fall back to the CPU, and in DeferAndFuse a whole sequence's
steps fuse into one region."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt
from conftest import in_mode_without_fallbacks, seeded

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _run_module(make, inputs, device):
    """Builds the module from seed 0, runs it on `device`, backpropagates a fixed cotangent through
    every output; returns the outputs, the inputs' gradients and the weights' gradients."""
    torch.manual_seed(0)
    module = make().to(device)
    ts = [t.to(device).detach().requires_grad_() for t in inputs]
    out = module(*ts)
    flat = [o for o in (out if isinstance(out, tuple) else (out,))]
    flat = [x for o in flat for x in (o if isinstance(o, tuple) else (o,))]
    loss = sum((o * torch.randn(o.shape, generator=seeded(10 + i)).to(device)).sum()
               for i, o in enumerate(flat))
    loss.backward()
    return (
        [o.detach().cpu() for o in flat],
        [t.grad.cpu() for t in ts],
        {name: p.grad.cpu() for name, p in module.named_parameters()},
    )


def check_module(make, inputs, **tol):
    tol = {**TOL, **tol}
    expected = _run_module(make, inputs, "cpu")
    actual = _run_module(make, inputs, "pjrt")
    for a, e in zip(actual[0], expected[0]):
        torch.testing.assert_close(a, e, **tol)
    for a, e in zip(actual[1], expected[1]):
        torch.testing.assert_close(a, e, **tol)
    assert actual[2].keys() == expected[2].keys()
    for name in expected[2]:
        torch.testing.assert_close(actual[2][name], expected[2][name], **tol, msg=name)


SEQ, BATCH, FEATURES, HIDDEN = 5, 3, 4, 6
X = torch.randn(SEQ, BATCH, FEATURES, generator=seeded(0))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"num_layers": 2},
        {"bidirectional": True},
        {"bias": False},
        {"num_layers": 2, "bidirectional": True, "batch_first": True},
    ],
    ids=["plain", "two_layers", "bidirectional", "no_bias", "stacked_bidirectional_batch_first"],
)
def test_a_recurrent_layer_matches_the_cpu_forward_and_backward(mode, kind, options):
    layer = getattr(nn, kind)
    x = X.transpose(0, 1).contiguous() if options.get("batch_first") else X
    check_module(lambda: layer(FEATURES, HIDDEN, **options), [x])


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_a_recurrent_layer_takes_initial_states(mode, kind):
    h0 = torch.randn(1, BATCH, HIDDEN, generator=seeded(1))
    c0 = torch.randn(1, BATCH, HIDDEN, generator=seeded(2))

    class WithState(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(nn, kind)(FEATURES, HIDDEN)

        def forward(self, x, h, c=None):
            return self.rnn(x, (h, c) if kind == "LSTM" else h)

    check_module(WithState, [X, h0, c0] if kind == "LSTM" else [X, h0])


def test_cells_match_the_cpu_forward_and_backward(mode):
    hx = torch.randn(BATCH, HIDDEN, generator=seeded(3))
    cx = torch.randn(BATCH, HIDDEN, generator=seeded(4))

    class Cells(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTMCell(FEATURES, HIDDEN)
            self.gru = nn.GRUCell(FEATURES, HIDDEN)

        def forward(self, x, h, c):
            for step in x:
                h, c = self.lstm(step, (h, c))
                h = self.gru(step, h)
            return h, c

    check_module(Cells, [X, hx, cx])


def test_only_the_cell_state_may_carry_a_gradient(mode):
    # The LSTM cell's backward gets a gradient for cy alone when hy is unused.
    cell_cpu = nn.LSTMCell(FEATURES, HIDDEN)
    cell = nn.LSTMCell(FEATURES, HIDDEN).to("pjrt")
    cell.load_state_dict(cell_cpu.state_dict())
    grads = []
    for c, device in ((cell_cpu, "cpu"), (cell, "pjrt")):
        x = X[0].to(device).requires_grad_()
        _, cy = c(x)
        cy.sum().backward()
        grads.append(x.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], **TOL)


def test_a_sequence_of_cell_steps_is_one_fused_region():
    lstm = nn.LSTM(FEATURES, HIDDEN, num_layers=2).to("pjrt")
    x = X.to("pjrt")
    with in_mode_without_fallbacks("defer_and_fuse"):
        out, (h, c) = lstm(x)
        out.sum().backward()
        torch_pjrt.sync()
        metrics = torch_pjrt.metrics()
    # Two layers of five steps, forward and backward: all of it captured before the sync.
    assert metrics["regions"] == 1, metrics
    assert metrics["deferred_ops"] > 2 * SEQ * 10, metrics


class LstmLanguageModel(nn.Module):
    def __init__(self, vocab=11, width=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        return self.head(self.lstm(self.embed(tokens))[0])


def _train_lstm(device, steps=6):
    torch.manual_seed(0)
    model = LstmLanguageModel().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = torch.randint(0, 11, (4, 9), generator=seeded(5))
    losses = []
    for _ in range(steps):
        tokens = data.to(device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 11), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


def test_an_lstm_language_model_trains_with_the_cpus_losses(mode):
    expected = _train_lstm("cpu")
    actual = _train_lstm("pjrt")
    assert actual[0] == pytest.approx(expected[0], rel=1e-5)
    assert actual == pytest.approx(expected, rel=1e-4)
    assert actual[-1] < actual[0]


def test_mismatched_gates_are_a_clear_error(pjrt):
    gates = torch.randn(2, 12).to(pjrt)
    with pytest.raises(RuntimeError, match=r"_thnn_fused_lstm_cell: expected gates of shape \[2, 16\]"):
        torch.ops.aten._thnn_fused_lstm_cell(gates, gates, torch.randn(2, 4).to(pjrt))
    with pytest.raises(RuntimeError, match="input and hidden gates to have the same shape"):
        torch.ops.aten._thnn_fused_gru_cell(gates, gates[:, :9], torch.randn(2, 4).to(pjrt))
    # The engine is still usable.
    assert (gates + 1).sum().item() == pytest.approx((gates.cpu() + 1).sum().item(), rel=1e-5)
