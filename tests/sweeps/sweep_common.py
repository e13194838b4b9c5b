"""What the model sweeps (`hf_sweep.py`, `tv_sweep.py`) share: running each model in a child
process, the JSONL results file, comparing the device's values with the CPU's, and the markdown
table and summary of a results file.

A sweep script runs itself as the child: `SCRIPT --child NAME... MODES STAGE_FILE`, with MODES the
comma-separated eager modes still to run. The child appends one JSON record per stage to the
staging file as it goes: {"stage": "cpu", "ok": ...} once, then per mode {"stage": MODE,
"started": true} and the mode's record. The parent reads the file after the child exits, so a
crash or a timeout loses only the mode in flight; the modes not reached run in a fresh child.
Each model's row ({name fields, "cpu": ..., MODE: ..., "seconds": ...}) is appended to the results
file as one JSON line, and a later run skips the names already there.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterable

MODES = ("strict", "defer_and_fuse")
# The largest error allowed on outputs and on parameter gradients (see `tensor_error`).
OUT_TOL, GRAD_TOL = 1e-4, 1e-3
CHILD_FLAG = "--child"
# Results that mean the mode did not finish; the rest ("pass", "fallback", "wrong", "unchecked")
# compared values.
FAILED_RESULTS = ("error", "crash", "timeout")


# --------------------------------------------------------------------------------------------
# The results file


def load_results(path: str) -> list[dict]:
    """The rows of a JSONL results file; none if it does not exist."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def append_result(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def names_done(rows: Iterable[dict], name_key: str) -> set[str]:
    return {row[name_key] for row in rows}


def only_names(names: list[str], only: str | None) -> list[str]:
    """The names listed in the comma-separated `only` (all of them when it is empty), in the order
    of `names`."""
    if not only:
        return list(names)
    wanted = set(only.split(","))
    return [name for name in names if name in wanted]


def take_shard(items: list, shard: str) -> list:
    """Shard "i/n": every n-th item from the i-th (0-based)."""
    index, count = map(int, shard.split("/"))
    return items[index::count]


def json_safe(value):
    """The value with infinite and NaN floats as strings ("inf", "nan"), which JSON lacks."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# The child process


def parse_child_call(argv: list[str]) -> tuple[list[str], list[str], str] | None:
    """(names, modes, stage file) when `argv` is a child call, else None."""
    if len(argv) < 2 or argv[1] != CHILD_FLAG:
        return None
    names, modes, stage_file = argv[2:-2], argv[-2], argv[-1]
    return names, [mode for mode in modes.split(",") if mode], stage_file


def stage_writer(stage_file: str) -> Callable[[dict], None]:
    """A function that appends a stage record to the staging file and syncs it to disk at once,
    so that the parent reads it even when the child crashes right after."""

    def emit(record: dict) -> None:
        with open(stage_file, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    return emit


def exception_reason(error: BaseException) -> str:
    """An exception's type and the first line of its message (240 characters at most)."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:240] if lines else ''}"


def tensor_error(actual, expected) -> float:
    """Largest absolute difference, divided by the expected tensor's magnitude when above 1.

    Infinite where the shapes differ, integer tensors differ, or NaNs and infinities are not in
    the same places (with the same signs)."""
    import torch

    if actual.shape != expected.shape:
        return float("inf")
    a, e = actual.detach().cpu(), expected.detach()
    if not e.is_floating_point():
        return 0.0 if torch.equal(a, e) else float("inf")
    a, e = a.double(), e.double()
    both_nan = a.isnan() & e.isnan()
    if (a.isnan() ^ e.isnan()).any():
        return float("inf")
    a, e = a.masked_fill(both_nan, 0), e.masked_fill(both_nan, 0)
    finite = e.isfinite()
    if (a.isfinite() != finite).any() or (a[~finite] != e[~finite]).any():
        return float("inf")
    if e.numel() == 0:
        return 0.0
    diff = (a - e)[finite].abs().max().item() if finite.any() else 0.0
    scale = max(1.0, e[finite].abs().max().item() if finite.any() else 1.0)
    return diff / scale


def errors_by_name(actual: dict, expected: dict) -> dict[str, float]:
    """`tensor_error` of each expected tensor, infinite where `actual` lacks it."""
    return {k: tensor_error(actual[k], v) if k in actual else float("inf") for k, v in expected.items()}


def _over_tolerance(errors: dict[str, float], tolerance: float) -> list[tuple[float, str]]:
    # `not <=` so that a NaN error counts as over
    return sorted(((e, k) for k, e in errors.items() if not e <= tolerance), reverse=True)


def grade(
    out_errors: dict[str, float], grad_errors: dict[str, float], extra_grads: list[str], fallback_ops: dict
) -> dict:
    """The result of a mode whose values were compared, with the worst offenders when wrong:
    "wrong" (an output or gradient over its tolerance, or gradients the CPU did not have), else
    "fallback" when some op ran on the CPU, else "pass"."""
    bad_outputs = _over_tolerance(out_errors, OUT_TOL)
    bad_grads = _over_tolerance(grad_errors, GRAD_TOL)
    if not (bad_outputs or bad_grads or extra_grads):
        return {"result": "fallback" if fallback_ops else "pass"}
    found = {
        "result": "wrong",
        "bad_outputs": [[k, e] for e, k in bad_outputs[:5]],
        "bad_grads": [[k, e] for e, k in bad_grads[:8]],
        "n_bad_grads": len(bad_grads),
    }
    if extra_grads:
        found["extra_grads"] = extra_grads[:5]
    return found


def run_device_modes(modes: list[str], emit: Callable[[dict], None], run_step: Callable, judge: Callable) -> None:
    """Run one step on "pjrt" in each eager mode and emit each mode's record.

    `run_step()` builds the device copy, runs it and returns its results moved to the CPU and
    the device objects it made (the model, the inputs). Those stay alive until the mode's last
    sync: freeing them earlier changes what DeferAndFuse fuses, and with it the rounding.
    `judge(results, fallback_ops)` returns two dicts for the record: the errors measured, then
    (after the mode's seconds) the findings, `grade`'s or the sweep's own. An exception from the
    step makes the mode an "error"."""
    import torch_pjrt

    for mode in modes:
        started = time.time()
        emit({"stage": mode, "started": True})
        record = {"stage": mode}
        try:
            with torch_pjrt.eager_mode(mode):
                torch_pjrt.sync()
                torch_pjrt.reset_metrics()
                results, device_objects = run_step()
                torch_pjrt.sync()
                record["fallback_ops"] = dict(torch_pjrt.metrics()["fallback_ops"])
                del device_objects
        except Exception as e:  # noqa: BLE001 - the reason is the result
            record.update(result="error", reason=exception_reason(e), seconds=round(time.time() - started, 1))
            emit(record)
            continue
        errors, findings = judge(results, record["fallback_ops"])
        record.update(errors)
        record["seconds"] = round(time.time() - started, 1)
        record.update(findings)
        emit(record)


# --------------------------------------------------------------------------------------------
# The parent process


def run_in_child(script: str, names: list[str], row: dict, timeout: float, modes: Iterable[str] = MODES) -> dict:
    """One model's row: `row` (its name fields) with the records of `script`'s child calls.

    A child that crashes or times out costs the mode in flight (recorded as "crash" or "timeout")
    and the modes after it run in a new child; a child that fails before its CPU record makes the
    model unsupported on CPU."""
    row = dict(row)
    started = time.time()
    pending = list(modes)
    prefix = os.path.splitext(os.path.basename(script))[0] + "_"
    first = True
    while first or pending:
        fd, stage_file = tempfile.mkstemp(prefix=prefix, suffix=".jsonl")
        os.close(fd)
        cmd = [sys.executable, os.path.abspath(script), CHILD_FLAG, *names, ",".join(pending), stage_file]
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
        for record in stages:
            stage = record.pop("stage")
            if stage == "cpu":
                row["cpu"] = record
            elif record.get("started"):
                in_flight = stage
            else:
                row[stage] = record
                in_flight = None
                pending.remove(stage)
        if first and "cpu" not in row:
            if failure:
                reason = failure + (f" ({tail[0][:200]})" if tail else "")
            else:
                reason = "no result"
            row["cpu"] = {"ok": False, "reason": reason}
        first = False
        if not row["cpu"].get("ok"):
            break
        if failure and in_flight:
            kind = "timeout" if failure.startswith("timeout") else "crash"
            row[in_flight] = {"result": kind, "reason": failure + (f": {tail[0][:200]}" if tail else "")}
            pending.remove(in_flight)
        elif failure or pending:
            # The child stopped without starting the remaining modes: a retry would do the same.
            for mode in pending:
                row[mode] = {"result": "crash", "reason": failure or "no result"}
            break
    row["seconds"] = round(time.time() - started, 1)
    return json_safe(row)


def progress_line(row: dict, name_key: str, name_width: int, modes: Iterable[str] = MODES) -> str:
    """The line printed for a finished row: name, seconds, CPU status, each mode's result."""
    results = " ".join(f"{mode}={row.get(mode, {}).get('result', '-')}" for mode in modes)
    cpu = row["cpu"]
    cpu_status = "cpu=ok" if cpu.get("ok") else f"cpu=unsupported ({cpu.get('reason', '')[:80]})"
    return f"{row[name_key]:{name_width}} {row['seconds']:6.1f}s {cpu_status} {results}"


def add_common_options(
    parser: argparse.ArgumentParser, *, names: str, unit: str, default_out: str, default_timeout: float
) -> None:
    """The options every sweep has. `names` says what --only lists ("model types"), `unit` what
    one row is ("architecture")."""
    parser.add_argument("--only", help=f"comma-separated {names}")
    parser.add_argument("--limit", type=int, help="at most this many new rows")
    parser.add_argument("--timeout", type=float, default=default_timeout, help=f"seconds per {unit} process")
    parser.add_argument("--budget-min", type=float, help="start no new row after this many minutes")
    parser.add_argument("--out", default=default_out, help="JSONL results, appended to")
    parser.add_argument("--list", action="store_true", help=f"print the {unit}s and exit")
    parser.add_argument("--table", action="store_true", help="print the markdown table of --out and exit")
    parser.add_argument("--summary", action="store_true", help="print counts and failures by cause and exit")


def run_sweep(
    names: list[str],
    run_one: Callable[[str], dict],
    *,
    out_path: str,
    name_key: str,
    name_width: int,
    unit: str,
    limit: int | None = None,
    budget_min: float | None = None,
    jobs: int = 1,
) -> None:
    """Run `run_one` on the names that `out_path` has no row for yet (the first `limit` of them),
    appending each row there as it finishes and printing its `progress_line`. No new row starts
    after `budget_min` minutes; `jobs` rows run at once."""
    done = names_done(load_results(out_path), name_key)
    todo = [name for name in names if name not in done]
    if limit is not None:
        todo = todo[:limit]
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    deadline = time.time() + budget_min * 60 if budget_min else None
    print(f"{len(todo)} {unit}s to run ({len(done)} already in {out_path})", flush=True)

    def report(row: dict) -> None:
        append_result(out_path, row)
        print(progress_line(row, name_key, name_width), flush=True)

    if jobs <= 1:
        for name in todo:
            if deadline and time.time() > deadline:
                print("time budget spent", flush=True)
                break
            report(run_one(name))
        return
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    queue = list(todo)
    with ThreadPoolExecutor(jobs) as pool:
        running = set()
        while queue or running:
            while queue and len(running) < jobs and not (deadline and time.time() > deadline):
                running.add(pool.submit(run_one, queue.pop(0)))
            if not running:
                break
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                report(future.result())


# --------------------------------------------------------------------------------------------
# Tables and summaries


def format_error(value) -> str:
    """An error for a table: "" when absent, strings ("inf", "nan") as they are, else 1.2e-03."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return f"{value:.1e}"


def escape_cell(text: str) -> str:
    """Text that cannot end a markdown table cell early."""
    return text.replace("|", "\\|")


def mode_records(row: dict, modes: Iterable[str] = MODES) -> list[dict]:
    """Each mode's record of a row, empty where the mode did not run."""
    return [row.get(mode) or {} for mode in modes]


def largest_error(records: list[dict], field: str, strings_are_infinite: bool = True):
    """The largest number in `field` of the records (None if there is none), or "inf" when
    `strings_are_infinite` and some record holds a string there (an infinite or NaN error)."""
    if strings_are_infinite and any(isinstance(r.get(field), str) for r in records):
        return "inf"
    return max((r[field] for r in records if isinstance(r.get(field), (int, float))), default=None)


def fallback_ops_cell(records: list[dict]) -> str:
    """The ops that fell back to the CPU in any of the records, sorted, in backquotes."""
    ops = set()
    for record in records:
        ops.update(record.get("fallback_ops") or {})
    return ", ".join(f"`{op}`" for op in sorted(ops))


def failure_note(row: dict, modes: Iterable[str] = MODES) -> str:
    """Why a row's first mode that did not pass did not: its error, the reason its values went
    unchecked, or its two worst values."""
    for mode in modes:
        record = row.get(mode) or {}
        result = record.get("result")
        if result in FAILED_RESULTS:
            return f"{mode}: {record.get('reason', '')}"
        if result in ("unchecked", "fallback") and record.get("reason"):
            return f"{mode}: {record['reason']}"
        if result == "wrong":
            bad = (record.get("bad_grads") or []) + (record.get("bad_outputs") or [])
            worst = ", ".join(f"{k} {format_error(e)}" for k, e in bad[:2])
            n_bad_grads = record.get("n_bad_grads", 0)
            return f"{mode}: wrong values: {worst}" + (f" ({n_bad_grads} gradients off)" if n_bad_grads > 2 else "")
    return ""


def failure_cause(record: dict, generalize: bool = False) -> str:
    """A failed mode's result and reason, by which the summary groups failures. `generalize`
    replaces what differs between models (bracketed and parenthesized parts, numbers) with an
    ellipsis, so that one cause groups them all."""
    reason = record.get("reason", "")
    if generalize:
        reason = re.sub(r"\[[^\]]*\]|\([^)]*\)|\b\d+\b", "…", reason)
    return f"{record.get('result')}: {reason[:160]}"


def mode_summary(
    built: list[dict], name_key: str, unit: str, generalize_causes: bool = False, modes: Iterable[str] = MODES
) -> list[str]:
    """The summary's lines about the rows that ran on the CPU: how many pass in every mode, the
    results of each mode, the ops that fell back (with the rows they fell back in), the wrong
    values and the failures grouped by cause (see `failure_cause`)."""
    modes = tuple(modes)
    passing = [r for r in built if all((r.get(m) or {}).get("result") == "pass" for m in modes)]
    share = f" ({100 * len(passing) / len(built):.0f}%)" if built else ""
    lines = [f"- pass in both modes (right values, no fallback): {len(passing)}{share}"]
    for mode in modes:
        counts = collections.Counter((r.get(mode) or {}).get("result", "-") for r in built)
        lines.append(f"- {mode}: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    fallbacks = collections.defaultdict(set)
    wrong, failures = [], collections.defaultdict(list)
    for row in built:
        for mode in modes:
            record = row.get(mode) or {}
            for op in record.get("fallback_ops") or {}:
                fallbacks[op].add(row[name_key])
            if record.get("result") == "wrong":
                wrong.append((row[name_key], mode, record))
            elif record.get("result") in FAILED_RESULTS:
                failures[failure_cause(record, generalize_causes)].append(f"{row[name_key]} ({mode})")
    lines += ["", f"Fallback ops ({unit}s):"]
    for op, names in sorted(fallbacks.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"- `{op}`: {len(names)}: {', '.join(sorted(names))}")
    lines += ["", "Wrong values (largest errors, relative to the magnitude where above 1):"]
    for name, mode, record in sorted(wrong):
        bad = (record.get("bad_grads") or [])[:3] + (record.get("bad_outputs") or [])[:2]
        lines.append(f"- {name} ({mode}): " + ", ".join(f"{k} {format_error(e)}" for k, e in bad))
    lines += ["", "Errors, crashes and timeouts:"]
    for cause, names in sorted(failures.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"- {len(names)}x {cause}: {', '.join(names)}")
    return lines
