"""Trains a small MLP on synthetic data on the pjrt device in each eager mode and on the CPU,
and prints matching losses and step times per mode."""

import statistics
import time

import torch
import torch.nn as nn

import torch_pjrt

STEPS = 60
BATCH = 64


def make_data(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 32, generator=g)
    true_w = torch.randn(32, 4, generator=g)
    y = (x @ true_w).argmax(dim=1)
    return x, y


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def train(device, mode=None):
    x, y = make_data()
    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    xs, ys = x.to(device), y.to(device)
    losses, times = [], []
    ctx = torch_pjrt.eager_mode(mode) if mode else _nullcontext()
    with ctx:
        for step in range(STEPS):
            start = time.perf_counter()
            i = (step * BATCH) % x.shape[0]
            xb, yb = xs[i : i + BATCH], ys[i : i + BATCH]
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())  # a materialization point every step
            times.append(time.perf_counter() - start)
    return losses, times


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main():
    print(f"torch {torch.__version__}, torch_pjrt {torch_pjrt.__version__}")
    results = {"cpu": train("cpu")}
    for mode in ("strict", "debug", "defer_and_fuse"):
        torch_pjrt.reset_metrics()
        results[mode] = train("pjrt", mode)
        m = torch_pjrt.metrics()
        print(
            f"[{mode}] compilations={m['compilations']} cache_hits={m['cache_hits']} "
            f"executions={m['executions']} deferred_ops={m['deferred_ops']} "
            f"fallback_ops={m['fallback_ops'] or '{}'}"
        )
    print()
    print(f"{'step':>5} " + " ".join(f"{k:>15}" for k in results))
    for step in list(range(0, STEPS, 10)) + [STEPS - 1]:
        print(f"{step:>5} " + " ".join(f"{results[k][0][step]:>15.6f}" for k in results))
    print()
    warm = STEPS // 3
    for k, (losses, times) in results.items():
        med = statistics.median(times[warm:]) * 1e3
        diff = max(abs(a - b) for a, b in zip(losses, results["cpu"][0]))
        print(f"{k:>15}: median step {med:8.3f} ms (after {warm} warm-up steps), max |loss - cpu| = {diff:.2e}")


if __name__ == "__main__":
    main()
