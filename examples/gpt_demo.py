"""Trains a small GPT-style character language model on examples/data/corpus.txt: on the CPU, then
on pjrt in Strict and in DeferAndFuse, from the same initial weights and the same batches.

Prints the loss curve of each run, the largest loss difference from the CPU run, the median step
time per mode, compilations after warm-up and CPU fallbacks, and writes a PNG of loss and step time
per mode (examples/out/gpt_demo.png).

Environment: DEMO_STEPS (default 200), DEMO_MODES (default "cpu,strict,defer_and_fuse"),
DEMO_PLOT=0 to skip the PNG.
"""

from __future__ import annotations

import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt

HERE = os.path.dirname(os.path.abspath(__file__))
CONTEXT = 64
BATCH = 16
WIDTH = 64
HEADS = 4
LAYERS = 2
WARMUP_STEPS = 10  # excluded from step-time medians: the first steps compile


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, WIDTH)
        self.positions = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.Sequential(*[Block(WIDTH, HEADS) for _ in range(LAYERS)])
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tokens(idx) + self.positions(pos)
        return self.head(self.ln(self.blocks(x)))


def load_corpus():
    with open(os.path.join(HERE, "data", "corpus.txt"), encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    index = {ch: i for i, ch in enumerate(chars)}
    return torch.tensor([index[ch] for ch in text], dtype=torch.long), len(chars)


def batches(data, steps: int):
    """The same batches for every run: drawn on the CPU from a fixed generator."""
    g = torch.Generator().manual_seed(1234)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=g)
        x = torch.stack([data[s : s + CONTEXT] for s in starts])
        y = torch.stack([data[s + 1 : s + CONTEXT + 1] for s in starts])
        yield x, y


def lr_at(step: int, steps: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < 10:
        return (step + 1) / 10
    progress = (step - 10) / max(1, steps - 10)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def train(mode: str, data, vocab: int, steps: int):
    device = "cpu" if mode == "cpu" else "pjrt"
    torch.manual_seed(0)
    model = TinyGPT(vocab)  # initialised on the CPU, then moved
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, steps))
    losses, times = [], []
    context = torch_pjrt.eager_mode(mode) if device == "pjrt" else _NoMode()
    compilations_after_warmup = None
    with context:
        if device == "pjrt":
            torch_pjrt.reset_metrics()
        for step, (x, y) in enumerate(batches(data, steps)):
            start = time.perf_counter()
            x, y = x.to(device), y.to(device)
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, vocab), y.view(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            schedule.step()
            losses.append(loss.item())  # one read per step: the only sync the loop has
            times.append(time.perf_counter() - start)
            if device == "pjrt" and step == WARMUP_STEPS:
                compilations_after_warmup = torch_pjrt.metrics()["compilations"]
        metrics = torch_pjrt.metrics() if device == "pjrt" else None
    return losses, times, metrics, compilations_after_warmup


class _NoMode:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def plot(results: dict, path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_time) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, (losses, times, _, _) in results.items():
        ax_loss.plot(losses, label=mode, linewidth=1)
        ax_time.plot([t * 1e3 for t in times], label=mode, linewidth=1)
    ax_loss.set(title="training loss", xlabel="step", ylabel="cross-entropy")
    ax_time.set(title="step time", xlabel="step", ylabel="ms", yscale="log")
    ax_loss.legend()
    ax_time.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)


def main():
    steps = int(os.environ.get("DEMO_STEPS", "200"))
    modes = os.environ.get("DEMO_MODES", "cpu,strict,defer_and_fuse").split(",")
    data, vocab = load_corpus()
    n_params = sum(p.numel() for p in TinyGPT(vocab).parameters())
    print(f"torch {torch.__version__}, torch_pjrt {torch_pjrt.__version__}")
    print(f"character GPT: {LAYERS} layers, width {WIDTH}, {HEADS} heads, context {CONTEXT}, "
          f"{n_params} parameters, vocabulary {vocab}; {steps} steps of batch {BATCH}, AdamW, "
          "warm-up + cosine schedule, gradient clipping")
    results = {}
    for mode in modes:
        results[mode] = train(mode, data, vocab, steps)
        print(f"  {mode}: done")

    print("\nloss every tenth of the run:")
    marks = sorted({0, *range(steps // 10, steps, max(1, steps // 10)), steps - 1})
    print("  step " + "".join(f"{m:>16}" for m in results))
    for i in marks:
        print(f"  {i:4d} " + "".join(f"{r[0][i]:16.5f}" for r in results.values()))

    print("\nper mode:")
    reference = results.get("cpu")
    for mode, (losses, times, metrics, warm) in results.items():
        timed = times[WARMUP_STEPS:] or times
        line = f"  {mode:15s} median step {statistics.median(timed) * 1e3:8.2f} ms"
        if reference and mode != "cpu":
            first = abs(losses[0] - reference[0][0]) / abs(reference[0][0])
            worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference[0]))
            line += f"   loss vs CPU: first step {first:.1e}, max {worst:.1e}"
        if metrics is not None:
            fallbacks = sum(metrics["fallback_ops"].values())
            after = metrics["compilations"] - (warm or 0)
            line += (f"   compilations {int(metrics['compilations'])} "
                     f"({int(after)} after warm-up), CPU fallbacks {fallbacks}")
            if metrics["fallback_ops"]:
                line += f" {dict(metrics['fallback_ops'])}"
        print(line)
    if reference:
        cpu_median = statistics.median(reference[1][WARMUP_STEPS:] or reference[1])
        for mode, (_, times, _, _) in results.items():
            if mode != "cpu":
                ratio = cpu_median / statistics.median(times[WARMUP_STEPS:] or times)
                print(f"  {mode} runs at {ratio:.2f}x the CPU's speed")

    if os.environ.get("DEMO_PLOT", "1") != "0":
        path = os.path.join(HERE, "out", "gpt_demo.png")
        plot(results, path)
        print(f"\nwrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
