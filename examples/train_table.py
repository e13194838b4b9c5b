"""Trains the two models of tests/python/test_train_models.py (a GPT-style language model with
AdamW, a warm-up + cosine schedule and gradient clipping; a CNN with BatchNorm and SGD with
momentum) on the CPU and on pjrt in each eager mode, from the same weights and batches, and prints
a markdown table: the largest relative loss difference from the CPU, the median step time, the
peak device bytes of the steady-state steps and the number of CPU fallbacks per model and mode. Then the number of ops that
run natively on pjrt.

Environment: TABLE_STEPS (default 50), TABLE_MODES (default "strict,debug,defer_and_fuse"),
TABLE_THREADS (torch's intra-op threads for the CPU runs; on a busy machine 1 avoids the
spin-waiting of oversubscribed threads that makes tiny CPU steps look ten times slower).
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time

import torch

import torch_pjrt

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import test_train_models as models  # noqa: E402

WARMUP_STEPS = 5  # excluded from the medians: the first steps compile


class StepTimer:
    """Step times; on pjrt, the peak is restarted before step `WARM_STEPS` so it covers the
    steady-state steps only (not moving the model or creating the optimizer's state)."""

    WARM_STEPS = 3

    def __init__(self, device="cpu"):
        self.times = []
        self.device = device
        self.warm_fallbacks = 0

    def start(self):
        if self.device != "cpu" and len(self.times) == self.WARM_STEPS:
            torch_pjrt.sync()
            self.warm_fallbacks = sum(torch_pjrt.metrics()["fallback_ops"].values())
            torch_pjrt.reset_metrics()
        self._t = time.perf_counter()

    def stop(self):
        self.times.append(time.perf_counter() - self._t)


def run(train, device, mode, steps):
    timer = StepTimer(device)
    if device == "cpu":
        losses, _ = train("cpu", steps, timer)
        return losses, timer.times, None
    with torch_pjrt.eager_mode(mode):
        torch_pjrt.sync()
        torch_pjrt.reset_metrics()  # also starts a new peak
        losses, model = train("pjrt", steps, timer)
        del model
        torch_pjrt.sync()
        metrics = torch_pjrt.metrics()
    metrics["warm_fallbacks"] = timer.warm_fallbacks
    return losses, timer.times, metrics


def native_op_counts():
    """(ATen overloads with a pjrt kernel, ops in the engine's catalogue)."""
    torch.empty(0, device="pjrt")  # registers the kernels
    aten = [n for n in torch._C._dispatch_get_all_op_names()
            if n.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(n, "PrivateUse1")]
    with open(os.path.join(HERE, "..", "ops", "src", "op_id.rs")) as f:
        catalogue = re.findall(r"^\s+[A-Z]\w* = \"[^\"]+\",", f.read(), re.M)
    return len(aten), len(catalogue)


def main():
    steps = int(os.environ.get("TABLE_STEPS", "50"))
    modes = os.environ.get("TABLE_MODES", "strict,debug,defer_and_fuse").split(",")
    if os.environ.get("TABLE_THREADS"):
        torch.set_num_threads(int(os.environ["TABLE_THREADS"]))
    trainers = {"GPT (AdamW, schedule, clipping)": models.train_gpt,
                "CNN (BatchNorm, SGD momentum)": models.train_cnn}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s), load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {steps} steps per run, step-time "
          f"medians after {WARMUP_STEPS} warm-up steps\n")
    rows = []
    for name, train in trainers.items():
        ref_losses, ref_times, _ = run(train, "cpu", None, steps)
        rows.append((name, "cpu", "—", statistics.median(ref_times[WARMUP_STEPS:]), None, None))
        for mode in modes:
            losses, times, metrics = run(train, "pjrt", mode, steps)
            err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
            fallbacks = sum(metrics["fallback_ops"].values()) + metrics["warm_fallbacks"]
            rows.append((name, mode, f"{err:.1e}", statistics.median(times[WARMUP_STEPS:]),
                         int(metrics["peak_device_bytes"]), fallbacks))
    print("| model | mode | max loss error vs CPU | median step | peak device bytes | CPU fallbacks |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, mode, err, median, peak, fallbacks in rows:
        peak_s = "—" if peak is None else f"{peak:,} ({peak / 2**20:.2f} MiB)"
        fb = "—" if fallbacks is None else str(fallbacks)
        print(f"| {name} | {mode} | {err} | {median * 1e3:.2f} ms | {peak_s} | {fb} |")
    aten, catalogue = native_op_counts()
    print(f"\nnative ops: {aten} ATen overloads have a pjrt kernel, lowered through {catalogue} "
          "ops of the engine's catalogue (ops/src/op_id.rs)")


if __name__ == "__main__":
    main()
