"""Whole models trained on pjrt against the CPU, in every eager mode, from the same initial weights
(built on the CPU, then moved) and the same batches:

- a GPT-style language model: token and position embeddings, causal self-attention, LayerNorm,
  GELU MLP, AdamW with weight decay, a warm-up + cosine learning-rate schedule and gradient
  clipping;
- a CNN: Conv2d, BatchNorm2d, ReLU, MaxPool2d, AdaptiveAvgPool2d, Linear, cross-entropy and SGD
  with momentum, whose BatchNorm running statistics must match the CPU's after training.

The first step's loss must agree with the CPU's to 1e-5 (relative), every later one to 1e-3, and
no op may fall back to the CPU. Dropout is checked statistically on its own. The models are tiny:
the file must stay fast on a 2-core machine."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt
from conftest import in_mode_without_fallbacks

MODES = ["strict", "debug", "defer_and_fuse"]
STEPS = 20
FIRST_STEP_RTOL = 1e-5
LATER_STEPS_RTOL = 1e-3


# ---- models ----------------------------------------------------------------------------------

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS, BATCH = 23, 8, 16, 2, 2, 4


class Block(nn.Module):
    def __init__(self, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH), nn.Dropout(dropout))
        self.attn_drop = nn.Dropout(dropout)
        # A buffer, so the mask moves with the model.
        self.register_buffer("causal", torch.ones(CONTEXT, CONTEXT, dtype=torch.bool).tril())

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // HEADS)
        scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
        y = self.attn_drop(scores.softmax(dim=-1)) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, dropout: float = 0.0, layers: int = LAYERS):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(CONTEXT, WIDTH)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[Block(dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tokens(idx) + self.positions(pos))
        return self.head(self.ln(self.blocks(x)))


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 12, 3), nn.BatchNorm2d(12), nn.ReLU(), nn.AdaptiveAvgPool2d((2, 2)))
        self.fc = nn.Linear(12 * 4, classes)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


def _gpt_batches(steps):
    g = torch.Generator().manual_seed(1234)
    # A sequence with some structure, so the loss has something to learn.
    data = (torch.arange(512) * 7 + torch.randint(0, 3, (512,), generator=g)) % VOCAB
    for _ in range(steps):
        starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=g)
        x = torch.stack([data[s:s + CONTEXT] for s in starts])
        y = torch.stack([data[s + 1:s + CONTEXT + 1] for s in starts])
        yield x, y


def _cnn_batches(steps):
    g = torch.Generator().manual_seed(4321)
    for _ in range(steps):
        yield torch.randn(6, 3, 10, 10, generator=g), torch.randint(0, 5, (6,), generator=g)


def _lr_lambda(steps):
    def at(step):
        if step < 4:
            return (step + 1) / 4
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - 4) / max(1, steps - 4)))
    return at


def train_gpt(device, steps=STEPS, timer=None):
    """Trains TinyGPT on `device`; returns (losses, model)."""
    torch.manual_seed(0)
    model = TinyGPT().to(device)  # initialised on the CPU, then moved
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(steps))
    losses = []
    for x, y in _gpt_batches(steps):
        if timer:
            timer.start()
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        schedule.step()
        losses.append(loss.item())
        if timer:
            timer.stop()
    return losses, model


def train_cnn(device, steps=STEPS, timer=None):
    """Trains SmallCNN on `device`; returns (losses, model)."""
    torch.manual_seed(0)
    model = SmallCNN().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
    losses = []
    for x, y in _cnn_batches(steps):
        if timer:
            timer.start()
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(loss.item())
        if timer:
            timer.stop()
    return losses, model


# ---- training vs CPU -------------------------------------------------------------------------

_CPU = {}


def _cpu_run(name):
    """The CPU reference, computed once per model for all modes."""
    if name not in _CPU:
        train = {"gpt": train_gpt, "cnn": train_cnn}[name]
        losses, model = train("cpu")
        _CPU[name] = (losses, {k: v.detach().clone() for k, v in model.state_dict().items()})
    return _CPU[name]


def assert_losses_match(losses, reference):
    assert len(losses) == len(reference)
    assert all(math.isfinite(v) for v in losses), losses
    assert losses[0] == pytest.approx(reference[0], rel=FIRST_STEP_RTOL, abs=0)
    for step, (a, e) in enumerate(zip(losses, reference)):
        assert a == pytest.approx(e, rel=LATER_STEPS_RTOL, abs=0), (step, losses, reference)


@pytest.fixture(params=MODES)
def mode(request):
    """Runs the test in one eager mode and checks that no op fell back to the CPU."""
    with in_mode_without_fallbacks(request.param):
        yield request.param


def test_gpt_trains_like_cpu(mode):
    reference, _ = _cpu_run("gpt")
    losses, _ = train_gpt("pjrt")
    assert_losses_match(losses, reference)
    assert losses[-1] < losses[0]


def test_cnn_with_batchnorm_trains_like_cpu(mode):
    reference, ref_state = _cpu_run("cnn")
    losses, model = train_cnn("pjrt")
    assert_losses_match(losses, reference)
    state = model.state_dict()
    for name, expected in ref_state.items():
        if "running" in name or "num_batches_tracked" in name:
            torch.testing.assert_close(state[name].cpu(), expected, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, name=name: f"{name}: {m}")
    assert int(state["features.1.num_batches_tracked"]) == STEPS
    # Evaluation uses the running statistics: same predictions as the CPU model.
    ref_model = SmallCNN()
    ref_model.load_state_dict(ref_state)
    x = torch.randn(3, 3, 10, 10)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x.to("pjrt")).cpu(), ref_model.eval()(x),
                                   rtol=1e-2, atol=1e-3)


# ---- dropout ---------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_statistics(mode, p):
    n = 40_000
    layer = nn.Dropout(p).to("pjrt")
    x = torch.ones(n, device="pjrt", requires_grad=True)
    y = layer(x)
    y.backward(torch.full((n,), 2.0, device="pjrt"))
    out, grad = y.detach().cpu(), x.grad.cpu()
    dropped = (out == 0).float().mean().item()
    # Binomial(n, p): six standard deviations.
    assert abs(dropped - p) < 6 * math.sqrt(p * (1 - p) / n), dropped
    kept = out[out != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - p)))
    # The backward uses the forward's mask and scale.
    torch.testing.assert_close(grad, out * 2.0)
    # A second call draws a different mask.
    assert not torch.equal(layer(x).detach().cpu() == 0, out == 0)
    # eval() turns it off.
    layer.eval()
    torch.testing.assert_close(layer(x).detach().cpu(), torch.ones(n))


def test_gpt_with_dropout_trains_and_eval_is_deterministic(mode):
    torch.manual_seed(0)
    # One layer and three steps: each new region compiles, and this file must stay fast.
    model = TinyGPT(dropout=0.2, layers=1).to("pjrt")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    batches = list(_gpt_batches(3))
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(model(x.to("pjrt")).view(-1, VOCAB), y.to("pjrt").view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    x = batches[0][0].to("pjrt")
    with torch.no_grad():
        train_a, train_b = model(x).cpu(), model(x).cpu()
        model.eval()
        eval_a, eval_b = model(x).cpu(), model(x).cpu()
    assert not torch.equal(train_a, train_b)  # masks differ between calls in training
    torch.testing.assert_close(eval_a, eval_b, rtol=0, atol=0)
    # In eval the model is the CPU model with the same weights.
    cpu_model = TinyGPT(dropout=0.2, layers=1)
    cpu_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    with torch.no_grad():
        torch.testing.assert_close(eval_a, cpu_model.eval()(x.cpu()), rtol=1e-4, atol=1e-5)
