"""The benchmark suite: CPU eager, torch.compile (inductor), torch_xla on its CPU PJRT client (eager,
and `torch.compile(backend="openxla")` where inductor compiles), `jax.jit` and pjrt in Strict, Debug and DeferAndFuse, timed in one run on the workloads of workloads.py (JAX's
from jax_workloads.py: the same computations compiled by the same XLA CPU compiler).

    python benches/python/suite.py                     # everything; what `make bench` runs
    python benches/python/suite.py --backends cpu,pjrt-strict --workloads chains

Each (workload, backend) pair runs in a fresh process (torch_xla and openxla run under the peer
venv's python, JAX under the JAX venv's, and fresh processes keep one workload's memory and caches out of the next); the cold/warm
start pairs run in fresh processes too, with an empty cache directory and then the same one
filled. The results go to <out-dir>/latest.json, latest.md and latest.png.

Environment: BENCH_QUICK=1 (small sizes, few repetitions: a smoke run), BENCH_REPS,
BENCH_WARMUP, BENCH_BUDGET_S (see workloads.py), BENCH_COLD_REPS (cold/warm pairs per backend),
BENCH_TIMEOUT (seconds one worker process may take).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "workloads.py")
JAX_WORKER = os.path.join(HERE, "jax_workloads.py")

BACKENDS = (
    "cpu", "inductor", "torch_xla", "openxla", "jax", "pjrt-strict", "pjrt-debug", "pjrt-defer_and_fuse",
    "pjrt-compiled",
)
# Workloads JAX runs (jax_workloads.py); the others have no `jax.jit` counterpart.
JAX_WORKLOADS = ("chains", "norms", "mlp", "adam", "attention", "item_loop")
STEADY_WORKLOADS = (
    "tiny_ops", "chains", "norms", "mlp", "adam", "attention", "item_loop", "generate", "prompts",
    "padded_batches",
)
WORKLOADS = STEADY_WORKLOADS + ("first_step",)
TITLES = {
    "tiny_ops": "Tiny-op loop (per op)",
    "chains": "Elementwise chains, then .sum().item() (per call)",
    "norms": "LayerNorm, softmax, GELU forward (per call)",
    "mlp": "MLP 784-256-256-10 training step, batch 64 (per step)",
    "adam": "Adam with an LR schedule (per step, synced)",
    "attention": "Attention block forward + backward (per call)",
    "item_loop": "MLP training step with loss.item() every step (per step)",
    "first_step": "Cold vs warm start: first MLP step in a fresh process",
    "generate": "Tiny GPT-2 and Llama generate(): repeated request (median), first request (first rep)",
    "prompts": "Tiny GPT-2 generate() with a prompt of a new length at every request (per request)",
    "padded_batches": "Tiny BERT fine-tune, batches padded to random lengths 8..128 (per step)",
}
LABELS = {
    "cpu": "CPU eager",
    "inductor": "inductor",
    "torch_xla": "torch_xla",
    "openxla": "openxla",
    "jax": "jax.jit",
    "pjrt-strict": "pjrt Strict",
    "pjrt-debug": "pjrt Debug",
    "pjrt-defer_and_fuse": "pjrt DeferAndFuse",
    "pjrt-compiled": "pjrt compiled",
}
# The suite picks these itself (mode by context manager, cache directories per cold/warm pair):
# inherited values would skew the comparison.
CONTROLLED_ENV = (
    "TORCH_PJRT_DEFER_AND_FUSE",
    "TORCH_PJRT_LAUNCH_BLOCKING",
    "TORCH_PJRT_CACHE_DIR",
    "TORCH_PJRT_SHARED_CACHE",
    "BENCH_XLA_CACHE_DIR",
)

QUICK = os.environ.get("BENCH_QUICK", "0") not in ("", "0")
COLD_REPS = max(1, int(os.environ.get("BENCH_COLD_REPS", "1" if QUICK else "3")))
TIMEOUT_S = float(os.environ.get("BENCH_TIMEOUT", "1800"))


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def worker_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CONTROLLED_ENV}
    env.setdefault("PJRT_DEVICE", "CPU")
    env.update(extra or {})
    return env


def probe_peer(python: str | None) -> tuple[bool, str]:
    """Whether torch_xla can run under `python`, and its versions or why not."""
    if not python or not os.path.exists(python):
        return False, f"no peer python at {python} (`make venv-peer` builds .venv-peer)"
    code = (
        "import torch, torch_xla, torch_xla.core.xla_model as xm; "
        "t = torch.ones(2).to(torch_xla.device()); "
        "print(torch.__version__, torch_xla.__version__, (t + 1).sum().item())"
    )
    try:
        p = subprocess.run(
            [python, "-c", code], env=worker_env(), capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired:
        return False, "torch_xla probe timed out"
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"torch_xla does not run: {tail[:300]}"
    return True, p.stdout.strip()


def probe_jax(python: str | None) -> tuple[bool, str]:
    """Whether JAX runs on the CPU under `python`, and its version or why not."""
    if not python or not os.path.exists(python):
        return False, f"no JAX python at {python} (`make venv-jax` builds .venv-jax)"
    code = "import jax, jax.numpy as jnp; print(jax.__version__, float(jax.jit(lambda x: x + 1)(jnp.ones(2)).sum()))"
    try:
        p = subprocess.run(
            [python, "-c", code], env=worker_env({"JAX_PLATFORMS": "cpu"}), capture_output=True,
            text=True, timeout=300,
        )
    except subprocess.TimeoutExpired:
        return False, "JAX probe timed out"
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"JAX does not run: {tail[:300]}"
    return True, p.stdout.strip()


def run_worker(python: str, backend: str, workload: str, env_extra: dict | None = None) -> dict:
    """Runs one workload for one backend in a fresh process; returns its JSON result, or an error
    result when the process failed."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        out = os.path.join(tmp, "result.json")
        if backend == "jax":
            cmd = [python, JAX_WORKER, "--workload", workload, "--json-out", out]
        else:
            cmd = [python, WORKER, "--backend", backend, "--workload", workload, "--json-out", out]
        t0 = time.perf_counter()
        try:
            p = subprocess.run(
                cmd, env=worker_env(env_extra), capture_output=True, text=True, timeout=TIMEOUT_S
            )
            stderr, rc = p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            stderr = e.stderr.decode("utf-8", "replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            rc = f"timeout after {TIMEOUT_S:.0f} s"
        wall = time.perf_counter() - t0
        if os.path.exists(out):
            with open(out) as f:
                result = json.load(f)
        else:
            tail = "\n".join(stderr.strip().splitlines()[-15:])
            result = {
                "backend": backend,
                "workload": workload,
                "ok": False,
                "error": f"worker exited with {rc} and no result",
                "traceback": tail,
            }
    result["wall_s"] = wall
    return result


def run_cold_warm(python: str, backend: str) -> dict:
    """Cold/warm pairs for one backend: a process with an empty cache directory, then one with
    the directory it filled. Medians over BENCH_COLD_REPS pairs."""
    cold, warm, pairs = [], [], []
    for _ in range(COLD_REPS):
        cache = tempfile.mkdtemp(prefix="bench-cache-")
        try:
            env = {}
            if backend.startswith("pjrt-"):
                env["TORCH_PJRT_CACHE_DIR"] = cache
            elif backend == "inductor":
                env["TORCHINDUCTOR_CACHE_DIR"] = cache
            elif backend in ("torch_xla", "openxla"):
                env["BENCH_XLA_CACHE_DIR"] = cache
            c = run_worker(python, backend, "first_step", env)
            w = run_worker(python, backend, "first_step", env)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        for r, sink in ((c, cold), (w, warm)):
            case = (r.get("cases") or [{}])[0]
            if r.get("ok") and "median_s" in case:
                sink.append(dict(case, loadavg=r.get("loadavg_start", 0)))
            else:
                return {
                    "backend": backend,
                    "workload": "first_step",
                    "ok": False,
                    "error": r.get("error") or case.get("error") or "no result",
                    "traceback": r.get("traceback", ""),
                }
        pairs.append((c, w))

    def summary(cases):
        return {
            "loadavg": [c.get("loadavg", 0) for c in cases],
            "median_s": statistics.median(c["median_s"] for c in cases),
            "samples_s": [c["median_s"] for c in cases],
            "second_s": statistics.median(c["second_s"] for c in cases),
            "compiles": cases[-1].get("compiles"),
            "profile": cases[-1].get("profile", {}),
        }

    last_cold = pairs[-1][0]
    return {
        "backend": backend,
        "workload": "first_step",
        "ok": True,
        "versions": last_cold.get("versions"),
        "peak_rss_mb": max(r.get("peak_rss_mb", 0) for pair in pairs for r in pair),
        "cold": summary(cold),
        "warm": summary(warm),
        "reps": COLD_REPS,
    }


# --- analysis ---------------------------------------------------------------------------------


def index(results: list) -> dict:
    """(workload, case, backend) -> case result, for the steady-state workloads."""
    out = {}
    for r in results:
        if r.get("workload") == "first_step":
            continue
        for c in r.get("cases") or []:
            out[(r["workload"], c["case"], r["backend"])] = c
    return out


def median_of(idx, workload, case, backend):
    c = idx.get((workload, case, backend))
    return c.get("median_s") if c and "error" not in c else None


def cases_of(results: list, workload: str) -> list:
    """The case names of a workload in the order the workers ran them."""
    seen = []
    for r in results:
        if r.get("workload") == workload:
            for c in r.get("cases") or []:
                if c["case"] not in seen:
                    seen.append(c["case"])
    return seen


def is_diagnostic(idx, workload, case):
    """A case that explains another (a part of a step timed alone) rather than a workload of its
    own: it stays out of the geomean."""
    return any(
        (e.get("params") or {}).get("diagnostic")
        for (w, c, _), e in idx.items()
        if w == workload and c == case
    )


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fmt_time(s) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.2f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_ratio(x) -> str:
    return "—" if x is None else f"{x:.2f}×"


def speedup(ref, t):
    return ref / t if ref and t else None


def targets(results: list, idx: dict) -> tuple[list, dict]:
    """The targets of the suite: (rows of (target, figures, status), extra figures)."""
    D, S, C, X = "pjrt-defer_and_fuse", "pjrt-strict", "cpu", "torch_xla"
    rows = []

    def status(ok, missing=None):
        if missing:
            return f"n/a ({missing})"
        return "**met**" if ok else "**missed**"

    # 1. DeferAndFuse vs Strict, geometric mean over every steady-state case both ran.
    ratios = []
    for w in STEADY_WORKLOADS:
        for case in cases_of(results, w):
            if is_diagnostic(idx, w, case):
                continue
            s, d = median_of(idx, w, case, S), median_of(idx, w, case, D)
            if s and d:
                ratios.append(s / d)
    g = geomean(ratios)
    rows.append(
        (
            "DeferAndFuse ≥ 1.5× Strict (geomean over the suite)",
            f"{fmt_ratio(g)} over {len(ratios)} cases" if g else "—",
            status(g is not None and g >= 1.5, None if g else "Strict or DeferAndFuse missing"),
        )
    )

    # 2. Chains, k=8 at the largest size run (16M floats in a full run).
    chain_cases = [c for c in cases_of(results, "chains") if c.startswith("k=8 ")]
    sizes = {c: (idx.get(("chains", c, D)) or idx.get(("chains", c, C)) or {}).get("params", {}).get("n", 0) for c in chain_cases}
    case = max(chain_cases, key=lambda c: sizes[c]) if chain_cases else None
    if case:
        d, c, x = (median_of(idx, "chains", case, b) for b in (D, C, X))
        vs_x, vs_c = speedup(x, d), speedup(c, d)
        fig = f"{case}: DeferAndFuse {fmt_time(d)}, torch_xla {fmt_time(x)} ({fmt_ratio(vs_x)}), CPU {fmt_time(c)} ({fmt_ratio(vs_c)})"
        rows.append(("Chains k=8/16M: DeferAndFuse ≥ torch_xla", fig, status(vs_x is not None and vs_x >= 1, None if vs_x else "missing figures")))
        rows.append(("Chains k=8/16M: DeferAndFuse ≥ 3× CPU", fig, status(vs_c is not None and vs_c >= 3, None if vs_c else "missing figures")))
    else:
        rows.append(("Chains k=8/16M", "—", "n/a (chains not run)"))

    # 3. Tiny ops, per op.
    tiny = cases_of(results, "tiny_ops")
    if tiny:
        d, c, x = (median_of(idx, "tiny_ops", tiny[0], b) for b in (D, C, X))
        fig = f"DeferAndFuse {fmt_time(d)}/op, torch_xla {fmt_time(x)}/op, CPU {fmt_time(c)}/op"
        ok_x = d is not None and x is not None and d <= x / 3
        ok_c = d is not None and c is not None and d <= c
        rows.append(("Tiny op: DeferAndFuse ≤ 1/3 torch_xla per op", fig, status(ok_x, None if (d and x) else "missing figures")))
        rows.append(("Tiny op: DeferAndFuse ≤ CPU per op", fig, status(ok_c, None if (d and c) else "missing figures")))

    # 4. MLP without a sync per step.
    mlp = [c for c in cases_of(results, "mlp") if c.startswith("no sync")]
    if mlp:
        d, c, x = (median_of(idx, "mlp", mlp[0], b) for b in (D, C, X))
        vs_c, vs_x = speedup(c, d), speedup(x, d)
        fig = f"DeferAndFuse {fmt_time(d)}/step, CPU {fmt_time(c)} ({fmt_ratio(vs_c)}), torch_xla {fmt_time(x)} ({fmt_ratio(vs_x)})"
        gemms = [c for c in cases_of(results, "mlp") if is_diagnostic(idx, "mlp", c)]
        if gemms:
            gd, gc = (median_of(idx, "mlp", gemms[0], b) for b in (D, C))
            if gd and gc:
                fig += f"; the step's 8 GEMMs alone: DeferAndFuse {fmt_time(gd)}, CPU {fmt_time(gc)}"
        rows.append(("MLP, no sync: DeferAndFuse ≥ CPU", fig, status(vs_c is not None and vs_c >= 1, None if vs_c else "missing figures")))
        rows.append(("MLP, no sync: DeferAndFuse ≥ 2.5× torch_xla", fig, status(vs_x is not None and vs_x >= 2.5, None if vs_x else "missing figures")))

    # 5. Adam: compilations after warm-up.
    adam = cases_of(results, "adam")
    if adam:
        e = idx.get(("adam", adam[0], D)) or {}
        n = e.get("compiles")
        others = ", ".join(
            f"{LABELS[b]} {idx[('adam', adam[0], b)].get('compiles')}"
            for b in (S, "pjrt-debug", X, "inductor", "openxla", "pjrt-compiled")
            if ("adam", adam[0], b) in idx and idx[("adam", adam[0], b)].get("compiles") is not None
        )
        fig = f"DeferAndFuse {n} compilations over {e.get('reps', 0) * e.get('count', 0)} timed steps" + (f" (others: {others})" if others else "")
        rows.append(("Adam + LR schedule: zero recompiles after warm-up", fig, status(n == 0, None if n is not None else "missing figures")))

    # 6. The compiled mode (torch.compile(backend="pjrt")) against DeferAndFuse and inductor,
    # on the workloads inductor compiles.
    P, I = "pjrt-compiled", "inductor"

    def compiled_against(other: str, name: str, label: str):
        """A row: compiled pjrt's speed against `other`'s on the compiled workloads."""
        compared, slower = [], []
        for w in ("tiny_ops", "mlp", "item_loop", "adam", "attention", "norms", "chains"):
            for case in cases_of(results, w):
                if is_diagnostic(idx, w, case):
                    continue
                p, o = median_of(idx, w, case, P), median_of(idx, w, case, other)
                if p and o:
                    compared.append(o / p)
                    if p > o:
                        slower.append(f"{w}/{case} {fmt_ratio(o / p)}")
        if compared:
            fig = f"compiled vs {name}: geomean {fmt_ratio(geomean(compared))} over {len(compared)} cases"
            if slower:
                fig += "; slower on " + ", ".join(slower)
            rows.append((label, fig, status(not slower)))

    compiled_against(D, "DeferAndFuse", "Compiled ≥ DeferAndFuse on every case")
    # ... and against torch_xla's Dynamo backend, openxla, on the same cases.
    compiled_against("openxla", "openxla", "Compiled ≥ openxla (torch_xla's Dynamo backend) on every case")
    if tiny:
        p, i = (median_of(idx, "tiny_ops", tiny[0], b) for b in (P, I))
        fig = f"compiled {fmt_time(p)}/op, inductor {fmt_time(i)}/op (blocks of 100 adds)"
        rows.append(("Tiny op: compiled within 2× inductor per op", fig,
                     status(p is not None and i is not None and p <= 2 * i, None if (p and i) else "missing figures")))

    # 7. DeferAndFuse against jax.jit of the same computation, the same XLA CPU compiler.
    J = "jax"
    gaps, ratios_j = [], []
    for w in STEADY_WORKLOADS:
        for case in cases_of(results, w):
            if is_diagnostic(idx, w, case):
                continue
            d, j = median_of(idx, w, case, D), median_of(idx, w, case, J)
            if d and j:
                ratios_j.append(d / j)
                if d > 1.15 * j:
                    gaps.append(f"{w}/{case} {d / j:.2f}×")
    if ratios_j:
        fig = (f"DeferAndFuse time / jax.jit time: geomean {geomean(ratios_j):.2f} over {len(ratios_j)} cases"
               + ("; beyond 1.15 on " + ", ".join(gaps) if gaps else ""))
        rows.append(("DeferAndFuse within 1.15× of jax.jit on every case JAX has", fig, status(not gaps)))
    else:
        rows.append(("DeferAndFuse within 1.15× of jax.jit on every case JAX has", "—", "n/a (jax or DeferAndFuse not run)"))

    # 8. Cold vs warm start.
    fs = {r["backend"]: r for r in results if r.get("workload") == "first_step" and r.get("ok")}
    r = fs.get(D)
    if r:
        cold, warm = r["cold"]["median_s"], r["warm"]["median_s"]
        ratio = cold / warm if warm else None
        fig = f"DeferAndFuse first step: cold {fmt_time(cold)}, warm (tier 3) {fmt_time(warm)}: {fmt_ratio(ratio)}"
        rows.append(("Tier-3 warm first step ≥ 10× faster than cold", fig, status(ratio is not None and ratio >= 10)))
    else:
        rows.append(("Tier-3 warm first step ≥ 10× faster than cold", "—", "n/a (first_step not run for DeferAndFuse)"))
    return rows, {"geomean_daf_vs_strict": g, "geomean_cases": len(ratios)}


# --- report -----------------------------------------------------------------------------------


def write_markdown(path: str, results: list, meta: dict, chart_name: str | None) -> None:
    idx = index(results)
    backends = meta["backends"]
    lines = ["# Benchmark suite: torch-pjrt against CPU eager, inductor and torch_xla", ""]
    lines += [
        f"Run {meta['date']} on {meta['host']} ({meta['cpus']} CPUs), {meta['elapsed_min']:.1f} min in all.",
        f"Project venv: torch {meta['versions'].get('torch', '?')}, torch_pjrt {meta['versions'].get('torch_pjrt', '?')}. "
        f"Peer venv: {meta['peer']}. JAX venv: {meta.get('jax', 'not used')}.",
        f"Load average (1 min) seen by the workers: {meta['loadavg']}; on a machine shared with other "
        "jobs, multi-threaded CPU work (CPU eager, inductor, the XLA CPU runtimes) is noisier than "
        "single-threaded host work.",
        f"Medians of {meta['reps']} timed repetitions after {meta['warmup']} warm-up ones "
        f"(fewer where a case ran past its time budget: marked †), the device synced before the clock stops; "
        "pjrt's timed repetitions start once the background recompiles of quick programs that warm-up "
        "started (RFC 0041) have finished"
        + (" — **BENCH_QUICK run: small sizes, not comparable to a full run**." if meta["quick"] else "."),
        "",
        "How to read the tables: *vs X* is the speed relative to backend X, time(X) / time(row): above 1 "
        "the row is faster. *compiles* counts compilations during the timed repetitions (pjrt: executables "
        "built; torch_xla: the CompileTime counter; inductor: dynamo graphs; openxla: both the "
        "CompileTime counter and dynamo graphs); non-zero means the "
        "workload kept compiling after warm-up. *first rep* is the first warm-up repetition (compilation "
        "included), per the same unit.",
        "",
    ]
    for note in meta.get("notes", []):
        lines += [f"**Note:** {note}", ""]
    if len(meta.get("engine_builds", [])) > 1:
        lines += [
            "**The pjrt engine or plugin was rebuilt during this run** (builds of "
            + ", ".join(meta["engine_builds"])
            + "): pjrt figures of different workloads may come from different builds.",
            "",
        ]
    if meta.get("unavailable"):
        for b, why in meta["unavailable"].items():
            lines.append(f"- {LABELS[b]}: **unavailable** — {why}")
        lines.append("")

    lines += ["## Summary", "", "| target | figures | status |", "| --- | --- | --- |"]
    rows, extra = targets(results, idx)
    for t, fig, st in rows:
        lines.append(f"| {t} | {fig} | {st} |")
    lines.append("")
    if chart_name:
        lines += [f"![speed relative to CPU eager]({chart_name})", ""]

    # Summary table: one row per case, one column per backend.
    lines += ["### All cases (median time)", ""]
    lines.append("| workload | case | " + " | ".join(LABELS[b] for b in backends) + " |")
    lines.append("| --- | --- | " + " | ".join("---:" for _ in backends) + " |")
    for w in STEADY_WORKLOADS:
        for case in cases_of(results, w):
            cells = []
            for b in backends:
                c = idx.get((w, case, b))
                cells.append("err" if c and "error" in c else fmt_time(median_of(idx, w, case, b)))
            lines.append(f"| {w} | {case} | " + " | ".join(cells) + " |")
    lines.append("")

    # Peak memory.
    lines += [
        "## Peak memory",
        "",
        "Peak RSS growth of each workload's process over the workload (inputs included, MiB). On "
        "the XLA CPU client device buffers live in host memory, so this covers pjrt and torch_xla "
        "device memory too, along with compilers and caches. In parentheses, where the runtime "
        "reports one: the peak of live device buffers (MiB). Device-side peak counters: "
        + meta.get("device_peak_note", "n/a")
        + ".",
        "",
        "| workload | " + " | ".join(LABELS[b] for b in backends) + " |",
        "| --- | " + " | ".join("---:" for _ in backends) + " |",
    ]
    by = {(r["workload"], r["backend"]): r for r in results}
    for w in WORKLOADS:
        if not any((w, b) in by for b in backends):
            continue
        cells = []
        for b in backends:
            r = by.get((w, b))
            if not r or r.get("peak_rss_mb") is None:
                cells.append("—")
            elif r.get("device_peak_mb") is not None:
                cells.append(f"{r['peak_rss_mb']:.0f} ({r['device_peak_mb']:.0f})")
            else:
                cells.append(f"{r['peak_rss_mb']:.0f}")
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    lines.append("")

    # One table per workload.
    for w in STEADY_WORKLOADS:
        cases = cases_of(results, w)
        failed = [r for r in results if r.get("workload") == w and not r.get("ok")]
        if not cases and not failed:
            continue
        lines += [f"## {TITLES[w]}", ""]
        for r in failed:
            lines.append(f"- {LABELS[r['backend']]}: failed — {r.get('error')}")
        if failed:
            lines.append("")
        if not cases:
            continue
        lines += [
            "| case | backend | median | vs Strict | vs CPU | vs torch_xla | vs jax.jit | compiles | first rep | note |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for case in cases:
            refs = {b: median_of(idx, w, case, b) for b in ("pjrt-strict", "cpu", "torch_xla", "jax")}
            for b in backends:
                c = idx.get((w, case, b))
                if c is None:
                    continue
                if "error" in c:
                    lines.append(f"| {case} | {LABELS[b]} | error | | | | | | | {c['error'][:160]} |")
                    continue
                t = c["median_s"]
                mark = " †" if c.get("budget_hit") else ""
                comp = "—" if c.get("compiles") is None else str(c["compiles"])
                lines.append(
                    f"| {case} | {LABELS[b]} | {fmt_time(t)}{mark} | {fmt_ratio(speedup(refs['pjrt-strict'], t))} | "
                    f"{fmt_ratio(speedup(refs['cpu'], t))} | {fmt_ratio(speedup(refs['torch_xla'], t))} | "
                    f"{fmt_ratio(speedup(refs['jax'], t))} | {comp} | "
                    f"{fmt_time(c.get('first_s'))} | {c.get('note', '')} |"
                )
        lines.append("")

    # Cold vs warm.
    fs = [r for r in results if r.get("workload") == "first_step"]
    if fs:
        lines += [
            f"## {TITLES['first_step']}",
            "",
            f"Medians over {fs[0].get('reps', COLD_REPS)} pairs of fresh processes: *cold* starts with an empty cache "
            "directory, *warm* with the one the cold process filled (pjrt: `TORCH_PJRT_CACHE_DIR`, tier 3; "
            "inductor: `TORCHINDUCTOR_CACHE_DIR`; torch_xla: its persistent cache, "
            "`torch_xla.runtime.initialize_cache`; CPU eager has none). The step ends in `loss.item()` and a "
            "sync, so its backward and update are done too; runtime start-up and model set-up are "
            "outside the clock.",
            "",
            "| backend | cold first step | warm first step | cold / warm | second step (warm) | compiles (warm) | note |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in fs:
            if not r.get("ok"):
                lines.append(f"| {LABELS[r['backend']]} | error | | | | | {r.get('error', '')[:160]} |")
                continue
            cold, warm = r["cold"]["median_s"], r["warm"]["median_s"]
            prof = r["warm"].get("profile", {})
            note = ""
            if r["backend"].startswith("pjrt-"):
                note = f"tier-3 hits {prof.get('cache_hits_tier3', 0):.0f}, deserialize {fmt_time(prof.get('deserialize_seconds'))}"
            elif prof.get("PersistentCacheDeserializeFailure"):
                # The XLA CPU client cannot deserialize executables: the cache is written, never read.
                note = (
                    f"{prof['PersistentCacheDeserializeFailure']:.0f} persistent-cache entries failed to load "
                    "(the XLA CPU client does not deserialize executables)"
                )
            elif "PersistentCacheHit" in prof:
                note = f"persistent-cache hits {prof['PersistentCacheHit']:.0f}"
            lines.append(
                f"| {LABELS[r['backend']]} | {fmt_time(cold)} | {fmt_time(warm)} | {fmt_ratio(cold / warm if warm else None)} | "
                f"{fmt_time(r['warm']['second_s'])} | {'—' if r['warm'].get('compiles') is None else r['warm']['compiles']} | {note} |"
            )
        lines.append("")

    # pjrt profiles.
    lines += [
        "## pjrt profiles",
        "",
        "Engine counters per timed repetition (from `torch_pjrt.metrics()`): executions, compilations, "
        "ops per executed region, transfers each way, and ops that ran on the CPU fallback. *compiled* "
        "rows count a recorded graph's replay as an execution and not as a region; *replays* is the "
        "replays among the executions.",
        "",
        "| workload | case | mode | executions | replays | compilations | ops/region | largest region | host→device | device→host | CPU fallbacks |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for w in STEADY_WORKLOADS:
        for case in cases_of(results, w):
            for b in ("pjrt-strict", "pjrt-debug", "pjrt-defer_and_fuse", "pjrt-compiled"):
                c = idx.get((w, case, b))
                if not c or "profile" not in c:
                    continue
                p = c["profile"]
                ex = p.get("executions", 0)
                per_region = p.get("region_ops", 0) / p["regions"] if p.get("regions") else None
                fb = ", ".join(f"{k} ×{v:g}" for k, v in sorted(p.get("fallback_ops", {}).items())) or "none"
                lines.append(
                    f"| {w} | {case} | {b[5:]} | {ex:g} | {p.get('graph_replays', 0):g} | {p.get('compilations', 0):g} | "
                    f"{'—' if per_region is None else f'{per_region:.1f}'} | {p.get('largest_region', '—')} | "
                    f"{p.get('host_to_device', 0):g} | {p.get('device_to_host', 0):g} | {fb} |"
                )
    lines.append("")
    lines += time_breakdown(results, idx)

    errors = [r for r in results if not r.get("ok")]
    if errors:
        lines += ["## Failures", ""]
        for r in errors:
            lines.append(f"- {r['workload']} / {LABELS[r['backend']]}: {r.get('error')}")
        lines.append("")
    lines += [
        "## Engine stages (criterion)",
        "",
        "`make bench` also runs the criterion benches of the Rust crates; their HTML reports are "
        "copied to `criterion/report/index.html` beside this file.",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))


# The engine's time counters (RFC 0032) shown per repetition, in this order.
TIME_COLUMNS = (
    ("host_op_seconds", "op calls"),
    ("host_flush_seconds", "flush"),
    ("host_wait_seconds", "waiting"),
    ("host_transfer_seconds", "copies"),
    ("exec_launch_seconds", "launch"),
    ("device_seconds", "device"),
)


def bound_by(rep_s: float, profile: dict) -> str:
    """Whether a repetition's time is mostly the device's or the host's: the device's time
    (launch to completion) against the wall time."""
    device = profile.get("device_seconds", 0.0)
    if not rep_s:
        return "—"
    share = device / rep_s
    return f"device ({share:.0%})" if share >= 0.5 else f"host ({1 - share:.0%})"


def time_breakdown(results: list, idx: dict) -> list:
    """Markdown lines: where each pjrt repetition's time went, from the engine's counters."""
    lines = [
        "## Where the time goes (pjrt)",
        "",
        "Per timed repetition, from `torch_pjrt.metrics()`: host time in the engine's op calls, in "
        "planning and launching regions, blocked on the device for reads, and copying; the "
        "launches' time and the device's (each launch to its completion event). *Bound* compares "
        "the device's time with the repetition's: device-bound at half or more.",
        "",
        "| workload | case | mode | repetition | "
        + " | ".join(label for _, label in TIME_COLUMNS)
        + " | bound |",
        "| --- | --- | --- | ---: | " + " | ".join("---:" for _ in TIME_COLUMNS) + " | --- |",
    ]
    for w in STEADY_WORKLOADS:
        for case in cases_of(results, w):
            for b in ("pjrt-strict", "pjrt-defer_and_fuse", "pjrt-compiled"):
                c = idx.get((w, case, b))
                if not c or "profile" not in c or "median_s" not in c:
                    continue
                p = c["profile"]
                rep = c["median_s"] * c.get("count", 1)
                cells = " | ".join(fmt_time(p.get(k, 0.0)) for k, _ in TIME_COLUMNS)
                lines.append(
                    f"| {w} | {case} | {b[5:]} | {fmt_time(rep)} | {cells} | {bound_by(rep, p)} |"
                )
    lines.append("")
    return lines


def write_chart(path: str, results: list, backends: list, quick: bool = False) -> bool:
    """A horizontal grouped bar chart: speed relative to CPU eager, per case and backend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        log(f"no chart: matplotlib unavailable ({e})")
        return False
    idx = index(results)
    rows = [(w, c) for w in STEADY_WORKLOADS for c in cases_of(results, w)]
    shown = [b for b in backends if b != "cpu"]
    if not rows or not shown:
        return False
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(rows) + 1.6))
    height = 0.8 / len(shown)
    colors = {
        "inductor": "#8c8c8c",
        "torch_xla": "#d62728",
        "openxla": "#e377c2",
        "jax": "#ff7f0e",
        "pjrt-strict": "#9ecae1",
        "pjrt-debug": "#c6dbef",
        "pjrt-defer_and_fuse": "#08519c",
        "pjrt-compiled": "#2ca02c",
    }
    for j, b in enumerate(shown):
        ys, xs = [], []
        for i, (w, c) in enumerate(rows):
            ref, t = median_of(idx, w, c, "cpu"), median_of(idx, w, c, b)
            if ref and t:
                ys.append(i + (j - (len(shown) - 1) / 2) * height)
                xs.append(ref / t)
        ax.barh(ys, xs, height=height, label=LABELS[b], color=colors.get(b))
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{w}: {c}" for w, c in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("speed relative to CPU eager (time_cpu / time), log scale: right of 1 is faster")
    ax.set_title("torch-pjrt benchmark suite" + (" (BENCH_QUICK)" if quick else ""))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def describe(results: list, meta: dict) -> dict:
    """Completes a run's metadata with what is derived from its results: versions, load, engine
    builds, device-peak notes and the targets."""
    versions, notes = {}, {}
    for r in results:
        b = r.get("backend", "")
        if b.startswith("pjrt-"):
            versions.update(r.get("versions") or {})
        elif b == "cpu":
            versions.setdefault("torch", (r.get("versions") or {}).get("torch"))
        family = "pjrt" if b.startswith("pjrt-") else b
        if family in ("pjrt", "torch_xla", "openxla") and r.get("device_peak_source"):
            found = r.get("device_peak_mb") is not None
            notes[family] = f"from {r['device_peak_source']}" if found else f"n/a ({r['device_peak_source']})"
    loads = [r[k] for r in results for k in ("loadavg_start", "loadavg_end") if k in r]
    for r in results:
        for part in ("cold", "warm"):
            loads += list(r.get(part, {}).get("loadavg", []))
    meta = dict(meta)
    meta.update(
        versions=versions,
        device_peak_note="; ".join(f"{k}: {v}" for k, v in sorted(notes.items())) or "n/a",
        loadavg=f"{min(loads):.1f}–{max(loads):.1f}" if loads else "n/a",
        engine_builds=sorted({(r.get("versions") or {}).get("engine_build") for r in results} - {None}),
    )
    rows, extra = targets(results, index(results))
    meta["targets"] = [{"target": t, "figures": f, "status": st.strip("*")} for t, f, st in rows]
    meta.update(extra)
    return meta


def write_outputs(out_dir: str, results: list, meta: dict, chart: bool = True) -> None:
    meta = describe(results, meta)
    with open(os.path.join(out_dir, "latest.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    name = None
    if chart and write_chart(os.path.join(out_dir, "latest.png"), results, meta["backends"], meta["quick"]):
        name = "latest.png"
    write_markdown(os.path.join(out_dir, "latest.md"), results, meta, name)
    log(f"wrote {os.path.join(out_dir, 'latest.md')} ({meta['elapsed_min']:.1f} min of runs)")
    for t in meta["targets"]:
        log(f"  {t['status']:<8} {t['target']}: {t['figures']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, from: " + ", ".join(BACKENDS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, from: " + ", ".join(WORKLOADS))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "benches", "results"))
    ap.add_argument("--peer-python", default=os.path.join(ROOT, ".venv-peer", "bin", "python"), help="python with torch_xla")
    ap.add_argument("--jax-python", default=os.path.join(ROOT, ".venv-jax", "bin", "python"), help="python with jax")
    ap.add_argument("--no-chart", action="store_true")
    ap.add_argument("--from-json", help="rewrite the report and chart from a saved latest.json, running nothing")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        write_outputs(args.out_dir, saved["results"], saved["meta"], chart=not args.no_chart)
        return 0

    backends = [b for b in args.backends.split(",") if b]
    workloads = [w for w in args.workloads.split(",") if w]
    for b in backends:
        if b not in BACKENDS:
            ap.error(f"unknown backend {b!r}")
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}")
    os.makedirs(args.out_dir, exist_ok=True)
    started = time.perf_counter()

    pythons = {b: sys.executable for b in backends}
    unavailable = {}
    peer = "not used"
    peer_backends = [b for b in ("torch_xla", "openxla") if b in backends]
    if peer_backends:
        ok, info = probe_peer(args.peer_python)
        if ok:
            for b in peer_backends:
                pythons[b] = args.peer_python
            torch_v, xla_v = info.split()[:2]
            peer = f"torch {torch_v}, torch_xla {xla_v} (PJRT_DEVICE=CPU)"
        else:
            for b in peer_backends:
                unavailable[b] = info
            peer = f"torch_xla unavailable ({info})"
            log(f"torch_xla unavailable: {info}")
    jax_info = "not used"
    if "jax" in backends:
        ok, info = probe_jax(args.jax_python)
        if ok:
            pythons["jax"] = args.jax_python
            jax_info = f"jax {info.split()[0]} (CPU)"
        else:
            unavailable["jax"] = info
            jax_info = f"jax unavailable ({info})"
            log(f"jax unavailable: {info}")
    runnable = [b for b in backends if b not in unavailable]

    results = []
    for w in workloads:
        for b in runnable:
            if b == "jax" and w not in JAX_WORKLOADS:
                continue
            log(f"{w} on {b}")
            r = run_cold_warm(pythons[b], b) if w == "first_step" else run_worker(pythons[b], b, w)
            if not r.get("ok"):
                log(f"  failed: {r.get('error')}")
            for c in r.get("cases") or []:
                if "error" in c:
                    log(f"  {c['case']}: {c['error']}")
            results.append(r)

    meta = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "host": platform.node() or "this host",
        "cpus": os.cpu_count(),
        "quick": QUICK,
        "reps": int(os.environ.get("BENCH_REPS", "2" if QUICK else "5")),
        "warmup": int(os.environ.get("BENCH_WARMUP", "1" if QUICK else "2")),
        "backends": runnable,
        "requested_backends": backends,
        "unavailable": unavailable,
        "peer": peer,
        "jax": jax_info,
        "elapsed_min": (time.perf_counter() - started) / 60,
    }
    write_outputs(args.out_dir, results, meta, chart=not args.no_chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
