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
import copy
import os
import sys
import time

from sweep_common import (
    add_common_options,
    errors_by_name,
    escape_cell,
    exception_reason,
    failure_note,
    fallback_ops_cell,
    format_error,
    grade,
    largest_error,
    load_results,
    mode_records,
    mode_summary,
    only_names,
    parse_child_call,
    run_device_modes,
    run_in_child,
    run_sweep,
    stage_writer,
    tensor_error,
)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "results", "tv_sweep.jsonl")
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
        return 0.0 if tensor_error(actual, expected) == 0.0 else float("inf")
    return tensor_error(actual / scale, expected / scale)


def child(name: str, modes: list[str], stage_file: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torchvision

    emit = stage_writer(stage_file)
    t0 = time.time()
    reasons = []
    found = None
    for size in sizes_for(name):
        try:
            torch.manual_seed(0)
            model = torchvision.models.get_model(name, **build_kwargs(name, size)).float().eval()
        except Exception as e:  # noqa: BLE001 - the reason is the result
            reasons.append(f"build at {size}: " + exception_reason(e))
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
            reasons.append(f"cpu at {size}: " + exception_reason(e))
            continue
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
        try:
            cpu_out, cpu_grads = _run(model, x, weights)
        except Exception as e:  # noqa: BLE001
            reasons.append(f"cpu backward at {size}: " + exception_reason(e))
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

    def run_step():
        dev_model = copy.deepcopy(pristine).to("pjrt")
        out, grads = _run(dev_model, x.to("pjrt"), weights)
        return (out.cpu(), {k: v.cpu() for k, v in grads.items()}), dev_model

    def judge(results, fallback_ops):
        out, grads = results
        out_err = tensor_error(out, cpu_out)
        grad_errors = errors_by_name(grads, cpu_grads)
        errors = {"out_err": out_err, "grad_err": max(grad_errors.values(), default=0.0)}
        # The same, relative to each tensor's largest magnitude however small: random weights
        # can leave the logits and the early gradients tiny, where the absolute test says little.
        findings = {
            "out_rel": _rel(out, cpu_out),
            "grad_rel": max((_rel(grads[k], v) for k, v in cpu_grads.items() if k in grads), default=0.0),
            **grade({"logits": out_err}, grad_errors, sorted(set(grads) - set(cpu_grads)), fallback_ops),
        }
        return errors, findings

    run_device_modes(modes, emit, run_step, judge)


# --------------------------------------------------------------------------------------------
# The sweep (parent)


def run_one(name: str, timeout: float) -> dict:
    return run_in_child(__file__, [name], {"model": name}, timeout)


def main() -> None:
    child_call = parse_child_call(sys.argv)
    if child_call:
        (name,), modes, stage_file = child_call
        child(name, modes, stage_file)
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_options(p, names="model names", unit="model", default_out=DEFAULT_OUT, default_timeout=300)
    p.add_argument("--as-given", action="store_true", help="run the --only models in that order")
    args = p.parse_args()

    if args.table:
        print(table(load_results(args.out)))
        return
    if args.summary:
        print(summary(load_results(args.out)))
        return
    names = only_names(models(), args.only)
    sizes = {n: param_count(n) for n in names}
    names.sort(key=lambda n: (sizes[n], n))
    if args.only and args.as_given:
        names = [n for n in args.only.split(",") if n in sizes]
    if args.list:
        for n in names:
            print(f"{n:24} {sizes[n] / 1e6:8.1f}M")
        return
    run_sweep(
        names,
        lambda n: run_one(n, args.timeout),
        out_path=args.out,
        name_key="model",
        name_width=24,
        unit="model",
        limit=args.limit,
        budget_min=args.budget_min,
    )


# --------------------------------------------------------------------------------------------
# The coverage table


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
        records = mode_records(r)
        results = " | ".join(rec.get("result") or "-" for rec in records)
        errors = [largest_error(records, "out_err"), largest_error(records, "grad_err")]
        # the relative columns leave out "inf" and "nan" instead of showing them
        errors += [largest_error(records, k, strings_are_infinite=False) for k in ("out_rel", "grad_rel")]
        lines.append(
            f"| {r['model']} | {cpu['params'] / 1e6:.1f}M | {cpu['size']} | {results} "
            f"| {' | '.join(format_error(e) for e in errors)} | {fallback_ops_cell(records)} "
            f"| {r.get('seconds', '')} | {escape_cell(failure_note(r))} |"
        )
    missing = [r for r in rows if not r["cpu"].get("ok")]
    if missing:
        lines += ["", "Not run on CPU:", "", "| model | reason |", "| --- | --- |"]
        for r in missing:
            lines.append(f"| {r['model']} | {escape_cell(r['cpu'].get('reason', '')[:200])} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    built = [r for r in rows if r["cpu"].get("ok")]
    lines = [
        f"- models tried: {len(rows)}",
        f"- did not run forward and backward on the CPU within the limit: {len(rows) - len(built)}",
        f"- ran on CPU: {len(built)}",
    ]
    lines += mode_summary(built, "model", "model")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
