"""The user-facing API: eager modes, sync and metrics."""

from __future__ import annotations

import contextlib
import ctypes
import json

from . import _compiled, _native
from . import distributed as _distributed

EAGER_MODES = ("strict", "debug", "defer_and_fuse")


def _mode_code(mode: str) -> int:
    if not isinstance(mode, str) or mode not in EAGER_MODES:
        raise ValueError(
            f"unknown eager mode {mode!r}: expected one of "
            + ", ".join(repr(m) for m in EAGER_MODES)
        )
    return EAGER_MODES.index(mode)


class eager_mode(contextlib.ContextDecorator):
    """Runs the enclosed code in an eager mode: ``"strict"`` (op by op, asynchronous),
    ``"debug"`` (op by op, synchronous) or ``"defer_and_fuse"`` (ops deferred and fused at
    materialization points).

    The mode is process-wide, so it also covers autograd's backward threads; contexts nest, and
    leaving one restores the mode that was active when it was entered.
    """

    def __init__(self, mode: str):
        self._code = _mode_code(mode)
        self.mode = mode

    def __enter__(self) -> "eager_mode":
        engine = _native.ensure_started()
        _native.check(engine.tpjrt_mode_push(self._code))
        return self

    def __exit__(self, *exc) -> bool:
        _native.check(_native.lib().tpjrt_mode_pop())
        return False


def set_eager_mode(mode: str) -> None:
    """Replaces the current (innermost) eager mode."""
    code = _mode_code(mode)
    _native.check(_native.ensure_started().tpjrt_mode_set(code))


def get_eager_mode() -> str:
    """The name of the current eager mode."""
    code = ctypes.c_int32(0)
    _native.check(_native.ensure_started().tpjrt_mode_get(ctypes.byref(code)))
    return EAGER_MODES[code.value]


class recompile_limit(contextlib.ContextDecorator):
    """Allows at most ``n`` recompiles (compiles of a program structure already compiled with
    other shapes, dtypes or static parameters) while active; the next one raises a
    ``RuntimeError`` that says what changed (``action="warn"``: prints a warning instead and
    compiles). Enter it after warm-up; contexts nest, and each counts its own recompiles. The
    process-wide form is ``TORCH_PJRT_RECOMPILE_LIMIT=<n>`` (or ``<n>:warn``)."""

    def __init__(self, n: int, action: str = "raise"):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"recompile_limit: expected a non-negative int, got {n!r}")
        if action not in ("raise", "warn"):
            raise ValueError(
                f"recompile_limit: unknown action {action!r}: expected 'raise' or 'warn'"
            )
        self.n = n
        self.action = action

    def __enter__(self) -> "recompile_limit":
        engine = _native.ensure_started()
        _native.check(engine.tpjrt_recompile_limit_push(self.n, int(self.action == "warn")))
        return self

    def __exit__(self, *exc) -> bool:
        _native.check(_native.lib().tpjrt_recompile_limit_pop())
        return False


def sync() -> None:
    """Materializes everything pending and waits for the device."""
    _native.check(_native.ensure_started().tpjrt_sync())


def _upgrade_quick_programs() -> int:
    """Queues the full recompile (RFC 0041) of every quick program not upgraded yet, however
    often it has run; returns how many. With :func:`_wait_compile_upgrades` after it, a benchmark
    times the programs a long-running loop settles on: one that runs once per request (a
    prefill) is otherwise upgraded only at its eighth run."""
    queued = ctypes.c_int64(0)
    _native.check(_native.ensure_started().tpjrt_upgrade_quick_programs(ctypes.byref(queued)))
    return int(queued.value)


def _wait_compile_upgrades(limit_s: float = 60.0) -> bool:
    """Waits, at most ``limit_s`` seconds, until no quick program is being compiled again in full
    in the background (RFC 0041); returns whether none is. Benchmarks call it after warm-up so
    that they time the programs a loop settles on, not a transient."""
    settled = ctypes.c_int32(0)
    _native.check(
        _native.ensure_started().tpjrt_wait_compile_upgrades(int(limit_s * 1000), ctypes.byref(settled))
    )
    return bool(settled.value)


def _json_from(function) -> str:
    length = ctypes.c_uint64(0)
    capacity = 4096
    while True:
        buffer = ctypes.create_string_buffer(capacity)
        _native.check(function(buffer, capacity, ctypes.byref(length)))
        if length.value < capacity:
            return buffer.value.decode("utf-8", "replace")
        capacity = int(length.value) + 1


def _metrics_json() -> str:
    return _json_from(_native.ensure_started().tpjrt_metrics_json)


def cache_stats() -> list:
    """The programs in the in-process cache (tier 1), most used first: each a dict with ``key``,
    ``region`` (its label), ``source`` (``"compiled"`` here, loaded from ``"tier2"`` or
    ``"tier3"``, or ``"upgraded"``: a quick program compiled again in full, RFC 0041), ``compile_seconds`` (when compiled here) and ``hits`` (lookups that found
    it). ``TORCH_PJRT_CACHE_ONLY=1`` makes any program missing from every tier an error, and
    ``TORCH_PJRT_CACHE_MAX_MB`` bounds the persistent tier."""
    return json.loads(_json_from(_native.ensure_started().tpjrt_cache_stats_json))


def metrics() -> dict:
    """The engine's counters: ``compilations``, ``cache_hits``, ``executions``, ``deferred_ops``,
    ``materializations``, ``host_to_device``, ``device_to_host``, ``recompiles`` and more, plus
    ``fallback_ops`` (ATen op name -> number of CPU fallbacks) and ``recompile_reasons`` (the
    latest recompiles, oldest first: each a dict with ``op``, ``op_index``, ``what``, ``old``,
    ``new``, ``location``, ``message`` and every kept change under ``changes``) and
    ``compiled_programs`` (the latest compiles, oldest first: ``region``, ``seconds``, ``fast``,
    ``quick``;
    ``compile_seconds`` is the total and ``compile_seconds_max`` the slowest;
    ``compile_upgrades`` and ``compile_upgrade_seconds`` count quick programs compiled again in
    full in the background, which are not compilations; ``adaptive_switches`` and
    ``adaptive_one_op_ops`` count DeferAndFuse's stretches of one-op programs for code whose
    regions never repeat, since the process started), ``collectives``,
    ``collective_bytes`` and ``collective_seconds`` (the pjrt c10d backend's). The compiled
    mode (``torch.compile(backend="pjrt")``) adds ``compiled_graphs`` (graphs built),
    ``compiled_graph_runs``, ``compiled_graph_replays`` (runs of a recorded program),
    ``compiled_graph_seconds`` (compiling their programs),
    ``compiled_graph_list`` (the latest graphs: ``graph``, ``kind``, ``ops``, ``host_ops``
    (CPU ops run before the graph's device part), ``programs``, ``compile_seconds``,
    ``first_run_seconds``) and ``graph_breaks`` (Dynamo's, this
    process)."""
    m = json.loads(_metrics_json())
    native = _native.native()
    if native is not None:
        # Sequences grown by appends (RFC 0028): capacity buffers allocated, appends into one.
        m["capacity_buffers"], m["capacity_appends"] = native._growth_counters()
    m.update(_compiled.metrics())
    m.update(_distributed.counters())
    return m


def reset_metrics() -> None:
    """Zeroes every metric."""
    _native.check(_native.ensure_started().tpjrt_reset_metrics())
    native = _native.native()
    if native is not None:
        native._reset_growth_counters()
    _compiled.reset_metrics()
    _distributed.reset_counters()


def mark_dynamic(tensor, dim: int, max: int | None = None) -> None:
    """Says that ``tensor``'s size along ``dim`` changes from step to step (up to ``max``, when
    given), so programs reading it should not be compiled once per size.

    - The outermost dimension larger than one (every dimension before ``dim`` of size 1, as
      ``input_ids`` of a single sequence): the sequence grows by ``torch.cat([tensor, piece],
      dim)``; its first append gets a capacity of at least ``max`` along ``dim``, so no later
      append up to ``max`` compiles anything new (RFC 0028). The engine finds such sequences by
      itself after two appends.
    - An inner dimension (``[batch, length]`` token ids, a batch of features): ``tensor`` is
      kept padded along ``dim`` to a bucket of at least ``max`` elements, and so is every later
      upload of the same dtype and other sizes, whatever its length there; the ops reading them
      run at the bucket's size with the true length as a runtime argument (RFC 0029). PyTorch
      still sees true sizes. Integer batches whose length keeps changing are found by the
      engine itself from their third length on.
    """
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"mark_dynamic expects a tensor, got {type(tensor).__name__}")
    if tensor.device.type != "pjrt":
        raise ValueError(
            f"mark_dynamic expects a tensor on the pjrt device, got one on {tensor.device}; "
            "move it with .to('pjrt') first"
        )
    if tensor.dim() == 0:
        raise ValueError("mark_dynamic expects a tensor with a dimension, got a 0-d one")
    if not -tensor.dim() <= dim < tensor.dim():
        raise IndexError(
            f"mark_dynamic: dimension out of range (expected to be in range of "
            f"[{-tensor.dim()}, {tensor.dim() - 1}], but got {dim})"
        )
    dim %= tensor.dim()
    torch.ops.torch_pjrt.mark_dynamic(tensor, dim, max)


def metrics_report() -> str:
    """The metrics as human-readable text."""
    m = metrics()
    fallbacks = m.pop("fallback_ops", {}) or {}
    m.pop("last_recompile_reason", None)
    reasons = m.pop("recompile_reasons", []) or []
    programs = m.pop("compiled_programs", []) or []
    graphs = m.pop("compiled_graph_list", []) or []
    lines = ["torch-pjrt metrics"]
    width = max([len(k) for k in m] + [12])
    for key in sorted(m):
        value = m[key]
        text = f"{value:.6f}" if isinstance(value, float) else str(value)
        lines.append(f"  {key:<{width}}  {text}")
    if fallbacks:
        lines.append("  fallback_ops (ran on the CPU):")
        for op, count in sorted(fallbacks.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"    {op:<{width}}  {count}")
    else:
        lines.append(f"  {'fallback_ops':<{width}}  none")
    if programs:
        lines.append("  latest compiles (seconds, oldest first):")
        for p in programs:
            effort = " [fast]" if p["fast"] else " [quick]" if p.get("quick") else ""
            lines.append(f"    {p['seconds']:8.4f}  {p['region']}{effort}")
    if graphs:
        lines.append("  compiled graphs (torch.compile, oldest first):")
        for g in graphs:
            host = f"  ({g['host_ops']} on the host)" if g.get("host_ops") else ""
            lines.append(
                f"    {g['graph']:<14} {g['ops']:5d} ops  {g['programs']:3d} programs  "
                f"{g['compile_seconds']:8.4f} s compiling{host}"
            )
    if reasons:
        lines.append("  recent recompiles (oldest first):")
        for r in reasons:
            lines.append(f"    {r['message']}")
    return "\n".join(lines) + "\n"
