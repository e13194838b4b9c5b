#!/usr/bin/env python
"""Sweep of torchvision classification models on pjrt against the CPU.

One row per builder of `torchvision.models.list_models(module=torchvision.models)` (the
classification models; detection, segmentation, video, optical flow and quantized models live in
submodules and are not listed). Each is built with random weights from a fixed seed
(`weights=None`; a tensor of 2+ dims initialized to zero, the ViT head and class token, is
redrawn) and 10 classes, in eval mode (BatchNorm uses its running statistics). The input is one
image, the smallest of SIZES that the architecture runs on the CPU; Vision Transformers are built
for that size (`image_size`, two by two patches), MaxViT for its smallest (224). The model runs
forward and backward on the CPU (the loss a fixed random weighting of the logits, summed); then,
in each eager mode, a `copy.deepcopy` moved to "pjrt" runs the same step, its output and every
parameter gradient are compared with the CPU's and the ops that fell back to the CPU are recorded.

Each model runs in a subprocess with a wall-clock limit, so a crash or a hang costs one row (the
modes not reached yet are retried in a fresh process). Rows are appended to a JSONL file and a
rerun skips the models already there. Models run smallest first (by the parameter count torchvision
records for their pretrained weights).

    python tests/sweeps/tv_sweep.py                       # everything not yet in the results
    python tests/sweeps/tv_sweep.py --only resnet18,vit_b_16 --out /tmp/r.jsonl
    python tests/sweeps/tv_sweep.py --list                 # the models, with parameter counts
    python tests/sweeps/tv_sweep.py --table                # the markdown table of a results file
    python tests/sweeps/tv_sweep.py --summary              # counts and failures by cause
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from hf_sweep import _clean, _err, _fmt_err, _reason, load  # noqa: E402

DEFAULT_OUT = os.path.join(HERE, "results", "tv_sweep.jsonl")
MODES = ("strict", "defer_and_fuse")
OUT_TOL, GRAD_TOL = 1e-4, 1e-3
NUM_CLASSES = 10
SIZES = (32, 64, 96, 128, 224)


def models() -> list[str]:
    import torchvision

    return list(torchvision.models.list_models(module=torchvision.models))


def build_kwargs(name: str, size: int) -> dict:
    kw = {"weights": None, "num_classes": NUM_CLASSES}
    if name.startswith("vit_"):
        kw["image_size"] = size
    if name.startswith("maxvit"):
        kw["input_size"] = (size, size)
    if name in ("googlenet", "inception_v3"):
        kw.update(aux_logits=False, init_weights=True)
    return kw


def sizes_for(name: str) -> tuple[int, ...]:
    if name.startswith("maxvit"):  # seven-by-seven partitions after a stem and 4 halvings
        return (224,)
    if name.startswith("vit_"):  # built for two by two patches
        return (2 * int(name.rsplit("_", 1)[1]),)
    if name == "inception_v3":  # needs at least 75 pixels
        return tuple(s for s in SIZES if s >= 75)
    return SIZES


def param_count(name: str) -> int:
    """The parameter count torchvision records for the pretrained weights (1000 classes)."""
    import torchvision

    return torchvision.models.get_model_weights(name).DEFAULT.meta["num_params"]


# --------------------------------------------------------------------------------------------
# One model (runs in the child process)


def _run(model, x, weights):
    out = model(x)
    if not hasattr(out, "shape"):  # named tuples of models with auxiliary heads
        out = out[0]
    (out.float() * weights.to(out.device)).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def _rel(actual, expected) -> float:
    scale = expected.detach().abs().max().item() if expected.numel() else 0.0
    if scale == 0.0:
        return 0.0 if _err(actual, expected) == 0.0 else float("inf")
    return _err(actual / scale, expected / scale)


def child(name: str, modes: list[str], stage_file: str) -> None:
    import copy
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torchvision

    def emit(record):
        with open(stage_file, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    t0 = time.time()
    reasons = []
    found = None
    for size in sizes_for(name):
        try:
            torch.manual_seed(0)
            model = torchvision.models.get_model(name, **build_kwargs(name, size)).float().eval()
        except Exception as e:  # noqa: BLE001 - the reason is the result
            reasons.append(f"build at {size}: " + _reason(e))
            continue
        # A weight initialized to zero (the ViT head) would stop every gradient before it.
        redrawn = []
        with torch.no_grad():
            g = torch.Generator().manual_seed(2)
            for n, p in model.named_parameters():
                if p.dim() >= 2 and not p.any():
                    p.normal_(0.0, 0.02, generator=g)
                    redrawn.append(n)
        x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
        try:
            pristine = copy.deepcopy(model)
            with torch.no_grad():
                out = model(x)
            out = out if hasattr(out, "shape") else out[0]
        except Exception as e:  # noqa: BLE001
            reasons.append(f"cpu at {size}: " + _reason(e))
            continue
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
        try:
            cpu_out, cpu_grads = _run(model, x, weights)
        except Exception as e:  # noqa: BLE001
            reasons.append(f"cpu backward at {size}: " + _reason(e))
            continue
        found = (size, x, weights, cpu_out, cpu_grads, pristine, redrawn)
        break
    if not found:
        emit({"stage": "cpu", "ok": False, "reason": reasons[-1] if reasons else "no size to try"})
        return
    size, x, weights, cpu_out, cpu_grads, pristine, redrawn = found
    emit(
        {
            "stage": "cpu",
            "ok": True,
            "size": size,
            "kwargs": {k: v for k, v in build_kwargs(name, size).items() if k != "weights"},
            "params": sum(p.numel() for p in pristine.parameters()),
            "redrawn": redrawn,
            "seconds": round(time.time() - t0, 1),
        }
    )
    del model

    import torch_pjrt

    for mode in modes:
        t0 = time.time()
        emit({"stage": mode, "started": True})
        rec = {"stage": mode}
        try:
            with torch_pjrt.eager_mode(mode):
                torch_pjrt.sync()
                torch_pjrt.reset_metrics()
                dev_model = copy.deepcopy(pristine).to("pjrt")
                out, grads = _run(dev_model, x.to("pjrt"), weights)
                out = out.cpu()
                grads = {k: v.cpu() for k, v in grads.items()}
                torch_pjrt.sync()
                rec["fallback_ops"] = dict(torch_pjrt.metrics()["fallback_ops"])
                del dev_model
        except Exception as e:  # noqa: BLE001
            rec.update(result="error", reason=_reason(e), seconds=round(time.time() - t0, 1))
            emit(rec)
            continue
        out_err = _err(out, cpu_out)
        grad_errs = {k: _err(grads[k], v) if k in grads else float("inf") for k, v in cpu_grads.items()}
        extra = sorted(set(grads) - set(cpu_grads))
        grad_max = max(grad_errs.values(), default=0.0)
        bad_grad = sorted(((e, k) for k, e in grad_errs.items() if not e <= GRAD_TOL), reverse=True)
        rec.update(out_err=out_err, grad_err=grad_max, seconds=round(time.time() - t0, 1))
        # The same, relative to each tensor's largest magnitude however small: random weights
        # can leave the logits and the early gradients tiny, where the absolute test says little.
        rec["out_rel"] = _rel(out, cpu_out)
        rec["grad_rel"] = max((_rel(grads[k], v) for k, v in cpu_grads.items() if k in grads), default=0.0)
        if not out_err <= OUT_TOL or bad_grad or extra:
            rec["result"] = "wrong"
            rec["bad_outputs"] = [] if out_err <= OUT_TOL else [["logits", out_err]]
            rec["bad_grads"] = [[k, e] for e, k in bad_grad[:8]]
            rec["n_bad_grads"] = len(bad_grad)
            if extra:
                rec["extra_grads"] = extra[:5]
        else:
            rec["result"] = "fallback" if rec["fallback_ops"] else "pass"
        emit(rec)


# --------------------------------------------------------------------------------------------
# The sweep (parent)


def run_one(name: str, timeout: float) -> dict:
    row = {"model": name}
    t0 = time.time()
    pending = list(MODES)
    first = True
    while first or pending:
        fd, stage_file = tempfile.mkstemp(prefix="tv_sweep_", suffix=".jsonl")
        os.close(fd)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, ",".join(pending), stage_file]
        try:
            proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout)
            failure = None if proc.returncode == 0 else f"crash: exit {proc.returncode}"
            tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] if proc.returncode else []
        except subprocess.TimeoutExpired:
            failure, tail = f"timeout after {timeout:.0f} s", []
        with open(stage_file) as f:
            stages = [json.loads(line) for line in f if line.strip()]
        os.unlink(stage_file)
        in_flight = None
        for st in stages:
            stage = st.pop("stage")
            if stage == "cpu":
                row["cpu"] = st
            elif st.get("started"):
                in_flight = stage
            else:
                row[stage] = st
                in_flight = None
                pending.remove(stage)
        if first and "cpu" not in row:
            row["cpu"] = {"ok": False, "reason": failure + (f" ({tail[0][:200]})" if tail else "") if failure else "no result"}
        first = False
        if not row["cpu"].get("ok"):
            break
        if failure and in_flight:
            kind = "timeout" if failure.startswith("timeout") else "crash"
            row[in_flight] = {"result": kind, "reason": failure + (f": {tail[0][:200]}" if tail else "")}
            pending.remove(in_flight)
        elif failure or pending:
            for m in pending:
                row[m] = {"result": "crash", "reason": failure or "no result"}
            break
    row["seconds"] = round(time.time() - t0, 1)
    return _clean(row)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], [m for m in sys.argv[3].split(",") if m], sys.argv[4])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma-separated model names")
    p.add_argument("--as-given", action="store_true", help="run the --only models in that order")
    p.add_argument("--limit", type=int, help="at most this many new rows")
    p.add_argument("--timeout", type=float, default=300, help="seconds per model process")
    p.add_argument("--budget-min", type=float, help="start no new row after this many minutes")
    p.add_argument("--out", default=DEFAULT_OUT, help="JSONL results, appended to")
    p.add_argument("--list", action="store_true", help="print the models and exit")
    p.add_argument("--table", action="store_true", help="print the markdown table of --out and exit")
    p.add_argument("--summary", action="store_true", help="print counts and failures by cause and exit")
    args = p.parse_args()

    if args.table:
        print(table(load(args.out)))
        return
    if args.summary:
        print(summary(load(args.out)))
        return
    names = models()
    if args.only:
        wanted = set(args.only.split(","))
        names = [n for n in names if n in wanted]
    sizes = {n: param_count(n) for n in names}
    names.sort(key=lambda n: (sizes[n], n))
    if args.only and args.as_given:
        names = [n for n in args.only.split(",") if n in sizes]
    if args.list:
        for n in names:
            print(f"{n:24} {sizes[n] / 1e6:8.1f}M")
        return
    done = {r["model"] for r in load(args.out)}
    todo = [n for n in names if n not in done]
    if args.limit is not None:
        todo = todo[: args.limit]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    deadline = time.time() + args.budget_min * 60 if args.budget_min else None
    print(f"{len(todo)} models to run ({len(done)} already in {args.out})", flush=True)
    for n in todo:
        if deadline and time.time() > deadline:
            print("time budget spent", flush=True)
            break
        row = run_one(n, args.timeout)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        modes = " ".join(f"{m}={row.get(m, {}).get('result', '-')}" for m in MODES)
        cpu = "cpu=ok" if row["cpu"].get("ok") else f"cpu=unsupported ({row['cpu'].get('reason', '')[:80]})"
        print(f"{n:24} {row['seconds']:6.1f}s {cpu} {modes}", flush=True)


# --------------------------------------------------------------------------------------------
# The coverage table


def _why(row: dict) -> str:
    for m in MODES:
        rec = row.get(m) or {}
        res = rec.get("result")
        if res in ("error", "crash", "timeout"):
            return f"{m}: {rec.get('reason', '')}"
        if res == "wrong":
            bad = (rec.get("bad_grads") or []) + (rec.get("bad_outputs") or [])
            what = ", ".join(f"{k} {_fmt_err(e)}" for k, e in bad[:2])
            n = rec.get("n_bad_grads", 0)
            return f"{m}: wrong values: {what}" + (f" ({n} gradients off)" if n > 2 else "")
    return ""


def _num(v):
    return v if isinstance(v, (int, float)) else None


def table(rows: list[dict]) -> str:
    rows = sorted(rows, key=lambda r: r["model"])
    lines = [
        "| model | params | input | strict | defer_and_fuse | max output err | max grad err | relative output err "
        "| relative grad err | fallback ops | seconds | failure |",
        "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for r in rows:
        cpu = r["cpu"]
        if not cpu.get("ok"):
            continue
        errs = [r.get(m) or {} for m in MODES]
        out_err = max((e["out_err"] for e in errs if _num(e.get("out_err")) is not None), default=None)
        grad_err = max((e["grad_err"] for e in errs if _num(e.get("grad_err")) is not None), default=None)
        if any(isinstance(e.get("out_err"), str) for e in errs):
            out_err = "inf"
        if any(isinstance(e.get("grad_err"), str) for e in errs):
            grad_err = "inf"
        rel = [
            max((_num(e.get(k)) for e in errs if _num(e.get(k)) is not None), default=None)
            for k in ("out_rel", "grad_rel")
        ]
        fb = collections.Counter()
        for e in errs:
            fb.update(e.get("fallback_ops") or {})
        fb_s = ", ".join(f"`{k}`" for k in sorted(fb))
        why = _why(r).replace("|", "\\|")
        lines.append(
            f"| {r['model']} | {cpu['params'] / 1e6:.1f}M | {cpu['size']} | {(errs[0].get('result') or '-')} "
            f"| {(errs[1].get('result') or '-')} | {_fmt_err(out_err)} | {_fmt_err(grad_err)} "
            f"| {_fmt_err(rel[0])} | {_fmt_err(rel[1])} | {fb_s} "
            f"| {r.get('seconds', '')} | {why} |"
        )
    missing = [r for r in rows if not r["cpu"].get("ok")]
    if missing:
        lines += ["", "Not run on CPU:", "", "| model | reason |", "| --- | --- |"]
        for r in missing:
            reason = r["cpu"].get("reason", "")[:200].replace("|", "\\|")
            lines.append(f"| {r['model']} | {reason} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    built = [r for r in rows if r["cpu"].get("ok")]
    lines = [
        f"- models tried: {len(rows)}",
        f"- did not run forward and backward on the CPU within the limit: {len(rows) - len(built)}",
        f"- ran on CPU: {len(built)}",
    ]
    both = [r for r in built if all((r.get(m) or {}).get("result") == "pass" for m in MODES)]
    pct = f" ({100 * len(both) / len(built):.0f}%)" if built else ""
    lines.append(f"- pass in both modes (right values, no fallback): {len(both)}{pct}")
    for m in MODES:
        c = collections.Counter((r.get(m) or {}).get("result", "-") for r in built)
        lines.append(f"- {m}: " + ", ".join(f"{k} {v}" for k, v in c.most_common()))
    fallbacks = collections.defaultdict(set)
    wrong, errors = [], collections.defaultdict(list)
    for r in built:
        for m in MODES:
            rec = r.get(m) or {}
            for op in rec.get("fallback_ops") or {}:
                fallbacks[op].add(r["model"])
            if rec.get("result") == "wrong":
                wrong.append((r["model"], m, rec))
            elif rec.get("result") in ("error", "crash", "timeout"):
                errors[f"{rec.get('result')}: {rec.get('reason', '')[:160]}"].append(f"{r['model']} ({m})")
    lines += ["", "Fallback ops (models):"]
    for op, ms in sorted(fallbacks.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"- `{op}`: {len(ms)}: {', '.join(sorted(ms))}")
    lines += ["", "Wrong values (largest errors, relative to the magnitude where above 1):"]
    for n, m, rec in sorted(wrong):
        bad = (rec.get("bad_grads") or [])[:3] + (rec.get("bad_outputs") or [])[:2]
        lines.append(f"- {n} ({m}): " + ", ".join(f"{k} {_fmt_err(e)}" for k, e in bad))
    lines += ["", "Errors, crashes and timeouts:"]
    for cause, ms in sorted(errors.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"- {len(ms)}x {cause}: {', '.join(ms)}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
