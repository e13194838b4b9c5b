"""Per-op host overhead from Python of `x = x + 1.0` on a tiny tensor: CPU eager, and pjrt in
Strict and DeferAndFuse, in one run. Prints medians over repetitions (device synced before the
clock stops)."""

import statistics
import time

import torch
import torch_pjrt

OPS = 2000
REPS = 15


def run(device, mode=None):
    x = torch.zeros(16, device=device)
    samples = []
    for rep in range(REPS + 2):
        ctx = torch_pjrt.eager_mode(mode) if mode else None
        if ctx:
            ctx.__enter__()
        start = time.perf_counter()
        y = x
        for _ in range(OPS):
            y = y + 1.0
        if device != "cpu":
            torch_pjrt.sync()
        elapsed = time.perf_counter() - start
        if ctx:
            ctx.__exit__(None, None, None)
        assert float(y[0]) == OPS, float(y[0])
        if rep >= 2:  # the first repetitions compile
            samples.append(elapsed / OPS)
    return statistics.median(samples)


def main():
    cpu = run("cpu")
    strict = run("pjrt", "strict")
    fused = run("pjrt", "defer_and_fuse")
    print(f"x = x + 1.0 on 16 floats, median of {REPS} runs of {OPS} ops, synced:")
    print(f"  cpu eager       {cpu * 1e6:8.2f} µs/op")
    print(f"  pjrt strict     {strict * 1e6:8.2f} µs/op  ({strict / cpu:.2f}x cpu)")
    print(f"  pjrt defer+fuse {fused * 1e6:8.2f} µs/op  ({fused / cpu:.2f}x cpu)")
    m = torch_pjrt.metrics()
    print(f"  metrics: compilations={m['compilations']} executions={m['executions']}")


if __name__ == "__main__":
    main()
