"""The machinery of the OpInfo parity test (`test_opinfo.py`): running PyTorch's OpInfo samples on
pjrt and on the CPU, comparing what comes back, and keeping the tally that the summary prints.

An op is checked sample by sample. Each sample is copied (storage and layout included) to the CPU
and to pjrt, run on both, and compared: structure, dtypes, shapes, strides (by PyTorch's layout
rules) and values; then, where the OpInfo supports autograd for the dtype, the gradients of the
sample's inputs. A sample is skipped, with its reason, when it cannot run natively on pjrt:
`TORCH_PJRT_FALLBACK=error` turns a CPU fallback into a `NotImplementedError` naming the ATen op,
and an unsupported feature is a `NotImplementedError` (or a `TypeError` for a dtype) from the
engine. Anything else that differs is a mismatch.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import math
import os
import re
import time
import warnings
import zlib

import torch
from torch._prims_common import check_significant_strides
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._python_dispatch import TorchDispatchMode

import torch_pjrt

FULL = os.environ.get("TORCH_PJRT_OPINFO_FULL", "") == "1"

# The modes in report order. Each op runs defer_and_fuse first: there a CPU fallback raises before
# anything is compiled, so the samples that fall back are known before the op-by-op modes run.
MODES = ("strict", "debug", "defer_and_fuse") if FULL else ("strict", "defer_and_fuse")
RUN_ORDER = ("defer_and_fuse",) + tuple(m for m in MODES if m != "defer_and_fuse")

# Gradients compile a backward per sample in the op-by-op modes; CI checks them fused only.
GRAD_MODES = MODES if FULL else ("defer_and_fuse",)

# complex64 stands for the complex dtypes (RFC 0038); the full sweep runs complex128 as well.
CI_DTYPES = (torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.complex64)

# The element types the engine stores; any other is a TypeError at the first pjrt tensor.
PJRT_DTYPES = frozenset(
    {
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool, torch.uint16, torch.uint32, torch.uint64,
        torch.complex64, torch.complex128,
    }
)

# Every distinct shape compiles an executable (~10-50 ms on the CPU plugin), so the CI run takes at
# most this many samples per (op, dtype), spread over the OpInfo's list; the full sweep takes all.
CI_SAMPLE_CAP = 3

# (rtol, atol) for values. The engine computes bf16/f16 in f32 and rounds once, as PyTorch does;
# XLA's transcendental approximations and fusion's FMA contraction cost a few f32 ulps. A value
# outside these still passes when it is as close to a float64 run as the CPU's own result is
# (`_within_cpu_error`): sums of many products round differently in every summation order.
VALUE_TOL = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    # Complex results (Fourier transforms): the precision of their parts.
    torch.complex128: (1e-7, 1e-7),
    torch.complex64: (1e-5, 1e-5),
}
# Gradients chain several ops, each rounding on its own.
GRAD_TOL = {
    torch.float64: (1e-6, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
    torch.complex128: (1e-6, 1e-7),
    torch.complex64: (1e-4, 1e-5),
}

# Looser tolerances where the reference itself is computed differently, with the reason:
# op -> (reason, {dtype: (rtol, atol)}).
TOL_OVERRIDES: dict[str, tuple[str, dict]] = {}


def tolerances(name: str, table: dict) -> dict:
    """(rtol, atol) per result dtype for op `name`; exact for integers and bool."""
    if name in TOL_OVERRIDES:
        return {**table, **TOL_OVERRIDES[name][1]}
    return table


# Ops whose outputs are uninitialized memory: their values are not compared, only the metadata.
UNINITIALIZED = frozenset(
    {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
     "resize_", "resize_as_"}
)

# Positional arguments PyTorch requires on the CPU whatever the device of the op, by op.
KEEP_ON_CPU = {"tensor_split": (0,)}

# Known layout gaps: outputs whose strides differ from PyTorch's, with the reason. Their values
# are still compared; a stride mismatch of an op listed here is counted as an expected failure.
KNOWN_LAYOUT_GAPS: dict[str, str] = {
    "cat": "the engine returns contiguous results; PyTorch's cat keeps the memory format "
    "(e.g. channels_last) that all its inputs share",
    **{
        f"fft.{name}": "the engine returns contiguous results; PyTorch's CPU transforms return "
        "the layout their library computed in (the transformed dimension innermost), which "
        "PyTorch does not promise and its CUDA kernels do not share"
        for name in (
            "fft", "fft2", "fftn", "ifft", "ifft2", "ifftn", "rfft", "rfft2", "rfftn",
            "irfft", "irfft2", "irfftn", "hfft", "hfft2", "hfftn", "ihfft", "ihfft2", "ihfftn",
        )
    },
}


# Outputs whose columns are defined only up to sign: each run's are turned so that every
# column's largest component is positive, inside the differentiated function (so gradients
# follow), before comparing. Eigenvectors are unique up to sign; LAPACK's choice depends on its
# algorithm (and on UPLO), and XLA's Jacobi solver makes another.
SIGN_FREE_COLUMNS: dict[str, tuple[int, ...]] = {"linalg.eigh": (1,)}


# Outputs defined only up to a gauge (singular vectors: a sign shared by a column of U and a
# row of Vh, and any orthonormal basis of the complement that `full_matrices` adds): their
# values are compared after the sample's `output_process_fn_grad` (|U|, S, |Vh| and U Vh), as
# PyTorch's own test_compare_cpu compares CUDA's SVD with the CPU's; their layouts raw.
GAUGE_FREE_VALUES: dict[str, str] = {
    name: "singular vectors are unique only up to sign; LAPACK and the Jacobi eigensolver pick "
    "different ones"
    for name in ("linalg.svd", "svd")
}


def _mode_value_repeats(sample) -> bool:
    """Whether a slice's most frequent value occurs more than once (its index is then any of
    those positions)."""
    x = sample.input.detach().cpu()
    if x.dim() == 0 or x.numel() == 0:
        return False
    dim = sample.args[0] if sample.args else sample.kwargs.get("dim", -1)
    values = torch.mode(x, dim, keepdim=True).values
    return bool(((x == values).sum(dim) > 1).any())


# Samples whose gradient is any element of a subdifferential, with the reason: the CPU's
# backward picks one element, a correct backward may pick another.
ARBITRARY_SUBGRADIENTS: dict[str, tuple[str, object]] = {
    "mode": (
        "the gradient of a most frequent value that occurs several times goes to the occurrence "
        "its index names, which is any of them",
        _mode_value_repeats,
    ),
    "linalg.norm.subgradients_at_zero": (
        "the spectral and nuclear norms' subgradient at a zero matrix is u v^T for any unit "
        "singular vectors, which the CPU's LAPACK and the device's eigensolver choose differently",
        lambda sample: bool(sample.args) and sample.args[0] in (2, -2, "nuc"),
    ),
}


def _with_canonical_signs(op, out):
    positions = SIGN_FREE_COLUMNS.get(op_id(op))
    if not positions or not isinstance(out, tuple):
        return out
    fixed = list(out)
    for i in positions:
        v = fixed[i]
        if not isinstance(v, torch.Tensor) or v.dim() < 2 or v.numel() == 0:
            continue
        largest = v.detach().abs().argmax(dim=-2, keepdim=True)
        sign = torch.where(v.detach().gather(-2, largest) < 0, -1.0, 1.0).to(v.dtype)
        # Into the run's own layout, which the comparison checks too.
        turned = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
        fixed[i] = turned.copy_(v * sign)
    return type(out)(fixed)


# Ops whose index output may be any position holding the value found: `mode`'s most frequent
# value occurs several times, and which occurrence the CPU reports depends on its unstable sort.
# Each run's indices become the first occurrence before comparing.
ANY_OCCURRENCE_INDICES: dict[str, str] = {
    "mode": "the index of a value that occurs several times is any of its positions; the CPU's "
    "comes from an unstable sort",
}


def _with_first_occurrences(op, inp, args, kwargs, out):
    if op_id(op) not in ANY_OCCURRENCE_INDICES or not isinstance(out, tuple) or inp.dim() == 0:
        return out
    values, _ = out
    dim = args[0] if args else kwargs.get("dim", -1)
    keepdim = args[1] if len(args) > 1 else kwargs.get("keepdim", False)
    kept = values if keepdim else values.unsqueeze(dim)
    first = (inp.detach() == kept.detach()).to(torch.uint8).argmax(dim, keepdim=keepdim)
    return type(out)((values, first))


def _call(op, inp, args, kwargs):
    out = op(inp, *args, **kwargs)
    return _with_first_occurrences(op, inp, args, kwargs, _with_canonical_signs(op, out))


def op_id(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


# `TORCH_PJRT_OPINFO_SHARD=k/n` checks every n-th OpInfo from the k-th (1-based), so the full
# sweep can run in pieces (on several machines or days); each piece saves its tally (see
# `Report.save`) and `python opinfo_harness.py merge FILES...` prints the summary of them all.
SHARD = os.environ.get("TORCH_PJRT_OPINFO_SHARD", "")


def _shard(ops: list) -> list:
    if not SHARD:
        return ops
    try:
        k, n = (int(x) for x in SHARD.split("/"))
    except ValueError:
        raise ValueError(f"TORCH_PJRT_OPINFO_SHARD must be k/n (e.g. 3/8), got {SHARD!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"TORCH_PJRT_OPINFO_SHARD={SHARD!r}: k must be between 1 and n")
    return [op for i, op in enumerate(ops) if i % n == k - 1]


OPS = _shard(sorted(op_db, key=op_id))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ----- the tally ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Counts:
    run: int = 0
    passed: int = 0
    grad_run: int = 0
    grad_passed: int = 0
    xfail: int = 0


class Report:
    """What the harness saw, for the summary at the end of the session."""

    def __init__(self):
        self.counts: dict[tuple[str, str], Counts] = collections.defaultdict(Counts)
        self.ops_run: set[str] = set()
        self.ops_checked: set[str] = set()
        # reason -> op -> number of samples (per dtype and mode)
        self.skips: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.grad_skips: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)
        # reason -> ops that have no sample running natively
        self.unsupported: dict[str, list[str]] = collections.defaultdict(list)
        self.metadata_only: dict[str, set[str]] = collections.defaultdict(set)
        self.mismatches: list[str] = []
        self.xfails: list[str] = []
        # op -> samples whose values passed only by being as accurate as the CPU's (float64 ref)
        self.rescued: collections.Counter = collections.Counter()
        self.op_seconds: dict[str, float] = {}
        self.op_compilations: dict[str, int] = {}
        self.started = time.monotonic()
        # Set for a merged report: the shards' wall times added up, and which shards.
        self.merged_seconds: float | None = None
        self.shards: list[str] = []
        self.full = FULL

    def has_results(self) -> bool:
        return bool(self.ops_checked)

    def seconds(self) -> float:
        if self.merged_seconds is not None:
            return self.merged_seconds
        return time.monotonic() - self.started

    def save(self, path: str) -> None:
        """Writes the tally as JSON, for `merge`."""
        state = {
            "full": FULL,
            "shard": SHARD,
            "seconds": self.seconds(),
            "counts": {f"{d}|{m}": dataclasses.asdict(c) for (d, m), c in self.counts.items()},
            "ops_run": sorted(self.ops_run),
            "ops_checked": sorted(self.ops_checked),
            "skips": {r: dict(c) for r, c in self.skips.items()},
            "grad_skips": {r: dict(c) for r, c in self.grad_skips.items()},
            "unsupported": dict(self.unsupported),
            "metadata_only": {r: sorted(o) for r, o in self.metadata_only.items()},
            "mismatches": self.mismatches,
            "xfails": self.xfails,
            "rescued": dict(self.rescued),
            "op_seconds": self.op_seconds,
            "op_compilations": self.op_compilations,
        }
        with open(path, "w") as f:
            json.dump(state, f, indent=1, sort_keys=True)

    @classmethod
    def merged(cls, states: list[dict]) -> "Report":
        """One report adding up saved tallies (of disjoint shards)."""
        report = cls()
        report.merged_seconds = 0.0
        report.full = all(state["full"] for state in states)
        for state in states:
            report.merged_seconds += state["seconds"]
            report.shards.append(state["shard"] or "all")
            for key, c in state["counts"].items():
                d, m = key.split("|")
                total = report.counts[(d, m)]
                for field, value in c.items():
                    setattr(total, field, getattr(total, field) + value)
            report.ops_run |= set(state["ops_run"])
            report.ops_checked |= set(state["ops_checked"])
            for name in ("skips", "grad_skips"):
                for reason, ops in state[name].items():
                    getattr(report, name)[reason].update(ops)
            for reason, ops in state["unsupported"].items():
                report.unsupported[reason] += ops
            for reason, ops in state["metadata_only"].items():
                report.metadata_only[reason] |= set(ops)
            report.mismatches += state["mismatches"]
            report.xfails += state["xfails"]
            report.rescued.update(state["rescued"])
            report.op_seconds.update(state["op_seconds"])
            report.op_compilations.update(state["op_compilations"])
        return report

    def summary(self, full_lists: bool) -> str:
        dtypes = sorted({d for d, _ in self.counts}, key=lambda d: (d not in _CI_NAMES, d))
        # The modes that ran (a merged report knows them from its tallies, not the environment).
        seen = {m for _, m in self.counts}
        modes = [m for m in ("strict", "debug", "defer_and_fuse") if m in seen] or list(MODES)
        lines = [
            f"## OpInfo parity ({'full sweep' if self.full else 'CI subset'})",
            "",
            f"OpInfos checked: {len(self.ops_checked)}; with at least one sample run natively on "
            f"pjrt: {len(self.ops_run)}; wall time {self.seconds():.0f} s, "
            f"{sum(self.op_compilations.values())} compilations"
            + (f"; merged from shards {', '.join(self.shards)}." if self.shards else "."),
            "",
            "Samples passed/run (gradients passed/run) per dtype and mode:",
            "",
            "| dtype | " + " | ".join(modes) + " |",
            "| --- | " + " | ".join("---" for _ in modes) + " |",
        ]
        total = {m: Counts() for m in modes}
        for d in dtypes:
            cells = []
            for m in modes:
                c = self.counts.get((d, m), Counts())
                t = total[m]
                t.run, t.passed = t.run + c.run, t.passed + c.passed
                t.grad_run, t.grad_passed = t.grad_run + c.grad_run, t.grad_passed + c.grad_passed
                t.xfail += c.xfail
                cells.append(_cell(c))
            lines.append(f"| {d} | " + " | ".join(cells) + " |")
        lines.append("| all | " + " | ".join(_cell(total[m]) for m in modes) + " |")
        lines.append("")
        if self.mismatches:
            lines += [f"### Mismatches ({len(self.mismatches)})", ""]
            lines += [f"- {m}" for m in (self.mismatches if full_lists else self.mismatches[:40])]
            if not full_lists and len(self.mismatches) > 40:
                lines.append(f"- ... {len(self.mismatches) - 40} more in the summary file")
            lines.append("")
        if self.xfails:
            lines += [f"### Known layout gaps (expected failures: {len(self.xfails)})", ""]
            lines += [f"- {x}" for x in (self.xfails if full_lists else self.xfails[:20])]
            lines.append("")
        lines += _reason_section("Skipped samples of supported ops, by reason", self.skips,
                                 full_lists)
        lines += _reason_section("Skipped gradients, by reason", self.grad_skips, full_lists)
        if self.rescued:
            lines += [
                "### Passed outside the tolerance but within the CPU's own rounding error "
                "(against float64)",
                "",
                ", ".join(f"{op} ({n})" for op, n in sorted(self.rescued.items())),
                "",
            ]
        if self.metadata_only:
            lines += ["### Compared without values (metadata only)", ""]
            for reason, ops in sorted(self.metadata_only.items()):
                lines.append(f"- {reason}: {', '.join(sorted(ops))}")
            lines.append("")
        n_unsupported = sum(len(v) for v in self.unsupported.values())
        lines += [f"### OpInfos with no sample running natively ({n_unsupported}), by reason", ""]
        for reason, ops in sorted(self.unsupported.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            listed = ", ".join(sorted(ops)) if full_lists else ", ".join(sorted(ops)[:6]) + (
                ", ..." if len(ops) > 6 else "")
            lines.append(f"- {reason} ({len(ops)}): {listed}")
        lines.append("")
        if full_lists and self.op_seconds:
            lines += ["### Slowest ops", ""]
            slow = sorted(self.op_seconds.items(), key=lambda kv: -kv[1])[:25]
            lines += [f"- {name}: {secs:.1f} s, {self.op_compilations.get(name, 0)} compilations"
                      for name, secs in slow]
            unsupported = {op for ops in self.unsupported.values() for op in ops}
            spent = sum(t for op, t in self.op_seconds.items() if op in unsupported)
            lines += [f"- (all {len(unsupported)} unsupported OpInfos together: {spent:.1f} s)"]
            lines.append("")
        return "\n".join(lines) + "\n"


_CI_NAMES = {dtype_name(d) for d in CI_DTYPES}


def _cell(c: Counts) -> str:
    text = f"{c.passed}/{c.run}"
    if c.grad_run:
        text += f" ({c.grad_passed}/{c.grad_run})"
    if c.xfail:
        text += f" [{c.xfail} xfail]"
    return text


def _reason_section(title, table, full_lists) -> list[str]:
    if not table:
        return []
    lines = [f"### {title}", ""]
    rows = sorted(table.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    for reason, ops in rows if full_lists else rows[:40]:
        names = sorted(ops)
        listed = ", ".join(names if full_lists else names[:6])
        if not full_lists and len(names) > 6:
            listed += ", ..."
        lines.append(f"- {reason}: {sum(ops.values())} ({listed})")
    if not full_lists and len(rows) > 40:
        lines.append(f"- ... {len(rows) - 40} more reasons in the summary file")
    lines.append("")
    return lines


REPORT = Report()


# ----- copying samples ---------------------------------------------------------------------------


def _options_as_on_pjrt(options, dtype: torch.dtype):
    """`linear_cross_entropy`'s options with the "auto" choices PyTorch makes for a pjrt tensor.

    PyTorch picks the accumulation policy per device type: "accurate" with float32 logits on the
    CPU, "compact" in the input dtype on any device it does not list. The same call therefore
    computes float16 losses in float16 on pjrt; the CPU reference is run with the choices PyTorch
    made for pjrt, so both sides compute the same thing."""
    from torch.nn.modules import linear_cross_entropy_options as lce

    if options.acc_policy != "auto" and options.acc_dtype is not None:
        return options
    device = torch.device("pjrt")
    chosen = lce._AUTO_DEFAULTS.get((device.type, dtype), lce._AUTO_FALLBACK)
    acc_dtype = options.acc_dtype
    if acc_dtype is None and options.acc_policy == "auto":
        acc_dtype = lce.LinearCrossEntropyOptions._resolve_auto_acc_dtype(dtype, device)
    chunking = options.chunking_method
    if chunking == "auto" and options.batch_chunk_size is None:
        chunking = chosen.chunking_method
    return dataclasses.replace(
        options,
        acc_policy=chosen.acc_policy if options.acc_policy == "auto" else options.acc_policy,
        acc_dtype=acc_dtype if acc_dtype is not None else dtype,
        chunking_method=chunking,
    )


def _device_choices(inp, kwargs: dict) -> dict:
    """`kwargs` with the choices an op makes from its input's device type resolved for pjrt, for
    the CPU reference (see `_options_as_on_pjrt`)."""
    options = kwargs.get("options")
    if type(options).__name__ != "LinearCrossEntropyOptions" or not isinstance(inp, torch.Tensor):
        return kwargs
    return {**kwargs, "options": _options_as_on_pjrt(options, inp.dtype)}


def _replicate(t: torch.Tensor, device) -> torch.Tensor:
    """A copy of `t` on `device` with the same storage contents, sizes, strides and offset, so
    that expanded, sliced and transposed inputs keep their layout."""
    requires_grad = t.requires_grad
    t = t.detach()
    n = t.untyped_storage().nbytes() // t.element_size()
    flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
    base = flat.to(device, copy=True)
    copy = base.as_strided(t.size(), t.stride(), t.storage_offset())
    if requires_grad:
        copy.requires_grad_(True)
    return copy


def _map(obj, device):
    if isinstance(obj, torch.Tensor):
        return _replicate(obj, device)
    if isinstance(obj, torch.device) or (isinstance(obj, str) and obj == "cpu"):
        return torch.device(device) if isinstance(obj, torch.device) else device
    if isinstance(obj, list):
        return [_map(o, device) for o in obj]
    if isinstance(obj, tuple):
        return tuple(_map(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: (device if k == "device" and isinstance(v, str) else _map(v, device))
                for k, v in obj.items()}
    return obj


def _sample_on(sample, device, keep_on_cpu=()):
    args = tuple(_map(a, "cpu" if i in keep_on_cpu else device) for i, a in enumerate(sample.args))
    return _map(sample.input, device), args, _map(sample.kwargs, device)


def _leaves(obj) -> list:
    """The leaves of an op's result (tensors, numbers, ...), flattening tuples and lists."""
    if isinstance(obj, (list, tuple)):
        out = []
        for o in obj:
            out += _leaves(o)
        return out
    return [obj]


def _input_tensors(args) -> list[torch.Tensor]:
    found = []

    def walk(o):
        if isinstance(o, torch.Tensor):
            found.append(o)
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)
        elif isinstance(o, dict):
            for x in o.values():
                walk(x)

    walk(args)
    return found


# ----- outcomes ----------------------------------------------------------------------------------


_FALLBACK_RE = re.compile(r"The operator '([^']+)' is not implemented for the pjrt device")


def _skip_reason(e: BaseException) -> str | None:
    """The reason to skip for an exception raised on pjrt, or None when it is a failure."""
    text = str(e)
    m = _FALLBACK_RE.search(text)
    if m:
        return f"falls back to CPU: {m.group(1)}"
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    if isinstance(e, NotImplementedError):
        return f"not implemented on pjrt: {first[:160]}"
    if isinstance(e, TypeError) and "not supported on pjrt" in text:
        return f"not supported on pjrt: {first[:160]}"
    return None


def _describe_exc(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _within_cpu_error(got: torch.Tensor, expected: torch.Tensor, precise, rtol: float,
                      atol: float) -> bool:
    """Whether `got` is as close to the float64 result `precise` as PyTorch's own CPU result
    `expected` is (up to twice its largest error, plus the tolerance): a sum of many products
    in bf16, or a float32 convolution, carries rounding error that depends on the order of
    summation, and pjrt must not be held to the CPU's particular order. Where the CPU's
    low-precision arithmetic overflowed (inf or NaN) but the float64 result is finite, a value
    close to the float64 one passes too, as does an infinity where the float64 result lies beyond
    the dtype's range; elsewhere a non-finite result must be the CPU's."""
    if not isinstance(precise, torch.Tensor) or precise.shape != expected.shape:
        return False
    if not expected.dtype.is_floating_point or not precise.dtype.is_floating_point:
        return False
    r = precise.detach().to(torch.float64)
    e, g = expected.detach().to(torch.float64), got.to(torch.float64)
    same = (g == e) | (torch.isnan(g) & torch.isnan(e))
    finite_r = torch.isfinite(r)
    both = finite_r & torch.isfinite(e)
    cpu_error = (e - r).abs()[both].max() if bool(both.any()) else torch.tensor(0.0)
    bound = atol + rtol * r.abs() + 2 * cpu_error
    close = finite_r & ((g - r).abs() <= bound)
    overflow = (torch.isinf(g) & finite_r & (r.abs() > torch.finfo(expected.dtype).max)
                & (torch.sign(g) == torch.sign(r)))
    return bool((same | close | overflow).all())


def _compare_leaf(expected, actual, tol, where: str, problems: list[str], layout: list[str],
                  device: str, precise=None, rescued: list | None = None):
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            problems.append(f"{where}: expected a tensor, got {type(actual).__name__}")
            return
        if actual.device.type != device:
            problems.append(f"{where}: result on {actual.device}, not on {device}")
            return
        if actual.dtype != expected.dtype:
            problems.append(f"{where}: dtype {dtype_name(actual.dtype)}, "
                            f"expected {dtype_name(expected.dtype)}")
            return
        if actual.shape != expected.shape:
            problems.append(f"{where}: shape {tuple(actual.shape)}, "
                            f"expected {tuple(expected.shape)}")
            return
        if expected.numel() > 1:
            if expected.is_contiguous():
                ok = actual.is_contiguous()
            else:
                ok, _ = check_significant_strides(expected, actual, only_cuda=False)
            if not ok:
                layout.append(
                    f"{where}: strides {actual.stride()}, expected {expected.stride()} "
                    f"(shape {tuple(expected.shape)})"
                )
        if tol is None:
            return
        got = actual.detach().cpu()
        rtol, atol = tol.get(expected.dtype, (0.0, 0.0))
        try:
            torch.testing.assert_close(
                got, expected.detach(), rtol=rtol, atol=atol, equal_nan=True, check_stride=False
            )
        except AssertionError as e:
            if _within_cpu_error(got, expected, precise, rtol, atol):
                if rescued is not None:
                    rescued.append(where)
                return
            detail = " ".join(str(e).split())
            problems.append(f"{where}: values differ: {detail[:300]}")
        return
    if isinstance(actual, torch.Tensor):
        problems.append(f"{where}: expected {type(expected).__name__} {expected!r}, got a tensor")
        return
    if type(expected) is not type(actual):
        problems.append(f"{where}: expected {type(expected).__name__}, got {type(actual).__name__}")
    elif isinstance(expected, float) and tol is not None:
        rtol, atol = tol.get(torch.float64, (0.0, 0.0))
        if not (math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol)
                or (math.isnan(actual) and math.isnan(expected))):
            problems.append(f"{where}: {actual!r}, expected {expected!r}")
    elif tol is not None and expected != actual:
        problems.append(f"{where}: {actual!r}, expected {expected!r}")


def compare(expected, actual, tol, label: str, device: str = "pjrt", precise=None,
            rescued: list | None = None) -> tuple[list[str], list[str]]:
    """(problems, layout problems) between a CPU result and a result on `device`. With
    `precise` (the float64 result, same structure), float values outside the tolerance still
    pass when they are as accurate as the CPU's; their labels are appended to `rescued`."""
    exp, act = _leaves(expected), _leaves(actual)
    if len(exp) != len(act):
        return [f"{label}: {len(act)} results, expected {len(exp)}"], []
    pre = _leaves(precise) if precise is not None else []
    if len(pre) != len(exp):
        pre = [None] * len(exp)
    problems: list[str] = []
    layout: list[str] = []
    for i, (e, a) in enumerate(zip(exp, act)):
        where = label if len(exp) == 1 else f"{label}[{i}]"
        _compare_leaf(e, a, tol, where, problems, layout, device, pre[i], rescued)
    return problems, layout


def _upcast(obj):
    """`obj` with every floating tensor converted to float64 (requires_grad kept)."""
    if isinstance(obj, torch.Tensor):
        if not obj.dtype.is_floating_point:
            return obj
        return obj.detach().to(torch.float64).requires_grad_(obj.requires_grad)
    if isinstance(obj, list):
        return [_upcast(o) for o in obj]
    if isinstance(obj, tuple):
        return tuple(_upcast(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _upcast(v) for k, v in obj.items()}
    return obj


# ----- one op ------------------------------------------------------------------------------------


def _seed(op, dtype) -> int:
    return zlib.crc32(f"{op_id(op)}/{dtype}".encode())


def dtypes_for(op) -> list[torch.dtype]:
    on_cpu = op.supported_dtypes("cpu")
    if FULL:
        return sorted(on_cpu, key=str)
    return [d for d in CI_DTYPES if d in on_cpu]


def _samples(op, dtype, with_grad: bool) -> list:
    torch.manual_seed(_seed(op, dtype))
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=with_grad))
    if FULL or len(samples) <= CI_SAMPLE_CAP:
        return samples
    # Evenly spread, and shifted per dtype so that the dtypes together cover more samples.
    step = len(samples) / CI_SAMPLE_CAP
    shift = (CI_DTYPES.index(dtype) if dtype in CI_DTYPES else 0) / len(CI_DTYPES)
    return [samples[int((i + shift) * step)] for i in range(CI_SAMPLE_CAP)]


@dataclasses.dataclass
class Reference:
    """The CPU result of one sample."""

    output: object = None
    error: str | None = None
    random: bool = False
    args: tuple = ()  # the CPU copies the sample ran on, kept for the backward
    grads_done: bool = False
    grads: list | None = None  # one per input tensor that requires grad (None where unused)
    grad_outputs: list | None = None
    grad_error: str | None = None
    precise_done: bool = False
    precise: object = None  # the output in float64, computed only when values differ
    precise_grads: list | None = None
    # Whether the float64 run happened once the CPU gradients existed: a float64 run made for an
    # output mismatch comes before the backward, and has no gradients to compare against.
    precise_grads_tried: bool = False


def _differentiable(outputs) -> list[torch.Tensor]:
    return [o for o in _leaves(outputs)
            if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point]


class _SeededOps(TorchDispatchMode):
    """Notes whether any ATen op that draws random numbers ran (OpInfos of random ops seed the
    generator themselves, so their CPU results repeat, but pjrt's generator is another one)."""

    def __init__(self):
        super().__init__()
        self.seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.seen = True
        return func(*args, **(kwargs or {}))


class _StableTies(TorchDispatchMode):
    """Gives the CPU reference PyTorch's stable order for equal elements where its kernels leave
    that order unspecified (`sort` with stable=False and `topk` use std::sort and
    std::nth_element on long rows; `kthvalue` and `median` along a dim use quickselect, and
    PyTorch documents their index among equal values as unspecified): pjrt orders ties stably,
    and either order is a correct result, but the indices (and the gradients, which follow them)
    differ."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func is aten.sort.default:
            given = {**dict(zip(("self", "dim", "descending"), args)), **kwargs}
            return aten.sort.stable(given["self"], stable=True, dim=given.get("dim", -1),
                                    descending=given.get("descending", False))
        if func is aten.sort.stable:
            return func(*args, **{**kwargs, "stable": True})
        if func is aten.topk.default:
            names = ("self", "k", "dim", "largest", "sorted")
            given = {**dict(zip(names, args)), **kwargs}
            x, k = given["self"], given["k"]
            dim, largest = given.get("dim", -1), given.get("largest", True)
            values, indices = aten.sort.stable(x, stable=True, dim=dim, descending=largest)
            if x.dim() > 0:
                values, indices = values.narrow(dim, 0, k), indices.narrow(dim, 0, k)
            return values.contiguous(), indices.contiguous()
        if func in (aten.kthvalue.default, aten.median.dim):
            kth = func is aten.kthvalue.default
            names = ("self", "k", "dim", "keepdim") if kth else ("self", "dim", "keepdim")
            given = {**dict(zip(names, args)), **kwargs}
            x = given["self"]
            # A row with a NaN has its own rule (NaN, at its first NaN): the CPU's result stands.
            if x.dim() > 0 and not (x.is_floating_point() and bool(torch.isnan(x).any())):
                dim = given.get("dim", -1) % x.dim()
                position = given["k"] - 1 if kth else (x.shape[dim] - 1) // 2
                values, indices = aten.sort.stable(x, stable=True, dim=dim)
                values, indices = values.narrow(dim, position, 1), indices.narrow(dim, position, 1)
                if not given.get("keepdim", False):
                    values, indices = values.squeeze(dim), indices.squeeze(dim)
                return values.contiguous(), indices.contiguous()
        return func(*args, **kwargs)


def _reference(op, sample, seed: int) -> Reference:
    """The CPU result of a sample (forward only; `_reference_grads` adds the gradients)."""
    ref = Reference()
    seeded = _SeededOps()
    try:
        torch.manual_seed(seed)
        inp, args, kwargs = _sample_on(sample, "cpu")
        kwargs = _device_choices(inp, kwargs)
        with seeded, _StableTies():
            out = _call(op, inp, args, kwargs)
    except Exception as e:  # noqa: BLE001 - any CPU failure makes the sample unusable
        ref.error = _describe_exc(e)
        return ref
    ref.output, ref.args, ref.random = out, (inp, args, kwargs), seeded.seen
    return ref


def _reference_grads(ref: Reference, sample, seed: int) -> None:
    """Fills in the CPU gradients of the sample's inputs for a random output gradient."""
    ref.grads_done = True
    if ref.random:
        return
    outs = _differentiable(sample.output_process_fn_grad(ref.output))
    inputs = [t for t in _input_tensors(ref.args) if t.requires_grad]
    if not outs or not inputs:
        return
    torch.manual_seed(seed + 2)
    ref.grad_outputs = [torch.randn_like(o) for o in outs]
    try:
        ref.grads = list(torch.autograd.grad(outs, inputs, ref.grad_outputs, allow_unused=True))
    except Exception as e:  # noqa: BLE001
        ref.grad_error = _describe_exc(e)
        ref.grads = None


def _precise_reference(ref: Reference, op, sample, seed: int) -> None:
    """Runs the sample on the CPU in float64 (floating inputs upcast), and its backward for the
    same output gradient, for `_within_cpu_error`; leaves None where that is not possible."""
    ref.precise_done = True
    if ref.random:
        return
    try:
        torch.manual_seed(seed)
        inp, args, kwargs = _upcast(_sample_on(sample, "cpu"))
        kwargs = _device_choices(inp, kwargs)
        with _StableTies():
            out = _call(op, inp, args, kwargs)
    except Exception:  # noqa: BLE001 - not every op takes float64 inputs
        return
    ref.precise = out
    if ref.grad_outputs is None or ref.grads is None:
        return
    ref.precise_grads_tried = True
    outs = _differentiable(sample.output_process_fn_grad(out))
    inputs = [t for t in _input_tensors((inp, args, kwargs)) if t.requires_grad]
    if len(outs) != len(ref.grad_outputs) or len(inputs) != len(ref.grads):
        return
    try:
        grad_outputs = [g.to(o.dtype) for g, o in zip(ref.grad_outputs, outs)]
        ref.precise_grads = list(torch.autograd.grad(outs, inputs, grad_outputs, allow_unused=True))
    except Exception:  # noqa: BLE001
        return


@dataclasses.dataclass
class OpResult:
    ran: int = 0
    mismatches: list = dataclasses.field(default_factory=list)
    skip_reasons: collections.Counter = dataclasses.field(default_factory=collections.Counter)


def _fallbacks_now() -> dict:
    return dict(torch_pjrt.metrics().get("fallback_ops") or {})


@contextlib.contextmanager
def _cheap_seeding():
    """`torch.manual_seed` also seeds CUDA, XPU and MTIA; where they are absent, each of those
    only queues a lazy call with a formatted stack (~1 ms), and OpInfo sampling reseeds before
    every sample: that was most of the time spent on ops pjrt does not support."""
    patched = []
    for module in (torch.cuda, torch.xpu, torch.mtia):
        if not module.is_available():
            patched.append((module, module.manual_seed_all))
            module.manual_seed_all = lambda seed: None
    try:
        yield
    finally:
        for module, original in patched:
            module.manual_seed_all = original


def check_op(op) -> OpResult:
    """Runs every sample of `op` in every dtype and mode; records the outcome in REPORT."""
    name = op_id(op)
    started = time.monotonic()
    compiled = torch_pjrt.metrics()["compilations"]
    result = OpResult()
    skips: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    grad_skips: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    counts: dict[tuple[str, str], Counts] = collections.defaultdict(Counts)
    metadata_only: dict[str, set] = collections.defaultdict(set)
    mismatches, xfails = [], []
    rescued: collections.Counter = collections.Counter()
    dtypes = dtypes_for(op)
    if not dtypes:
        reason = "supports none of " + ", ".join(dtype_name(d) for d in CI_DTYPES) + " on the CPU"
        REPORT.ops_checked.add(name)
        REPORT.unsupported[reason].append(name)
        result.skip_reasons[reason] += 1
        return result
    with warnings.catch_warnings(), _cheap_seeding():
        warnings.simplefilter("ignore")
        for dtype in dtypes:
            dn = dtype_name(dtype)
            if dtype not in PJRT_DTYPES:
                skips[f"dtype {dn} is not supported on pjrt"][name] += 1
                continue
            with_grad = op.supports_autograd and dtype in op.supported_backward_dtypes("cpu") \
                and dtype.is_floating_point
            try:
                samples = _samples(op, dtype, with_grad)
            except Exception as e:  # noqa: BLE001
                skips[f"sample generation fails on the CPU: {_describe_exc(e)[:120]}"][name] += 1
                continue
            refs: dict[int, Reference] = {}
            fallback: dict[int, str] = {}
            for mode in RUN_ORDER:
                runs = []
                for i, sample in enumerate(samples):
                    if i in fallback:
                        skips[fallback[i]][name] += 1
                        continue
                    seed = _seed(op, dtype) + 7919 * i
                    runs.append(_Run(i, sample, seed, f"{name} {dn} {mode} sample {i}"))
                _run_mode(op, runs, mode, refs, with_grad and mode in GRAD_MODES)
                for run in runs:
                    outcome, ref, where = run.outcome, run.ref, run.where
                    if outcome.skip is not None:
                        fallback[run.index] = outcome.skip
                        skips[outcome.skip][name] += 1
                        continue
                    c = counts[(dn, mode)]
                    c.run += 1
                    result.ran += 1
                    if op.name in UNINITIALIZED:
                        metadata_only["uninitialized values"].add(name)
                    elif ref.random:
                        metadata_only["random values"].add(name)
                    summary = run.sample.summary()[:300]
                    if outcome.rescued:
                        rescued[name] += 1
                    if outcome.problems:
                        mismatches.append(f"{where}: {'; '.join(outcome.problems)} [{summary}]")
                    elif outcome.layout and name in KNOWN_LAYOUT_GAPS:
                        c.xfail += 1
                        xfails.append(f"{where}: {'; '.join(outcome.layout)} "
                                      f"({KNOWN_LAYOUT_GAPS[name]})")
                    elif outcome.layout:
                        mismatches.append(f"{where}: {'; '.join(outcome.layout)} [{summary}]")
                    else:
                        c.passed += 1
                    if outcome.grad_skip is not None:
                        grad_skips[outcome.grad_skip][name] += 1
                    elif outcome.grad_ran:
                        c.grad_run += 1
                        if outcome.grad_problems:
                            mismatches.append(f"{where} (gradients): "
                                              f"{'; '.join(outcome.grad_problems)} [{summary}]")
                        else:
                            c.grad_passed += 1
    REPORT.ops_checked.add(name)
    REPORT.op_seconds[name] = time.monotonic() - started
    REPORT.op_compilations[name] = torch_pjrt.metrics()["compilations"] - compiled
    if result.ran == 0:
        # Not natively supported at all: listed once, under its most common reason.
        total = collections.Counter()
        for reason, per_op in skips.items():
            total[reason] += per_op[name]
        reason = total.most_common(1)[0][0] if total else "no samples"
        REPORT.unsupported[reason].append(name)
        result.skip_reasons = total
        return result
    REPORT.ops_run.add(name)
    for table, dest in ((skips, REPORT.skips), (grad_skips, REPORT.grad_skips)):
        for reason, per_op in table.items():
            dest[reason].update(per_op)
    for key, c in counts.items():
        t = REPORT.counts[key]
        t.run += c.run
        t.passed += c.passed
        t.grad_run += c.grad_run
        t.grad_passed += c.grad_passed
        t.xfail += c.xfail
    for why, ops in metadata_only.items():
        REPORT.metadata_only[why] |= ops
    REPORT.mismatches += mismatches
    REPORT.xfails += xfails
    REPORT.rescued.update(rescued)
    result.mismatches = mismatches
    return result


@dataclasses.dataclass
class SampleOutcome:
    skip: str | None = None
    problems: list = dataclasses.field(default_factory=list)
    layout: list = dataclasses.field(default_factory=list)
    grad_ran: bool = False
    grad_skip: str | None = None
    grad_problems: list = dataclasses.field(default_factory=list)
    rescued: list = dataclasses.field(default_factory=list)  # within the CPU's own error


@dataclasses.dataclass
class _Run:
    """One sample of an (op, dtype) in one mode."""

    index: int
    sample: object
    seed: int
    where: str
    ref: Reference | None = None
    error: str | None = None  # what pjrt raised when the op was called
    out: object = None
    args: tuple = ()
    grads: tuple | None = None
    outcome: SampleOutcome = dataclasses.field(default_factory=SampleOutcome)


def _call_on_pjrt(op, run: _Run):
    torch.manual_seed(run.seed)
    inp, args, kwargs = _sample_on(run.sample, "pjrt", KEEP_ON_CPU.get(op.name, ()))
    run.args = (inp, args, kwargs)
    if _input_tensors(run.args):
        run.out = _call(op, inp, args, kwargs)
    else:
        # A factory sample without a device argument creates on the default device.
        with torch.device("pjrt"):
            run.out = _call(op, inp, args, kwargs)


def _run_mode(op, runs: list[_Run], mode: str, refs: dict, with_grad: bool) -> None:
    """Runs the samples of one (op, dtype) in `mode` and fills in their outcomes. Every sample is
    issued before any result is read: strict mode then compiles them in parallel, and
    defer_and_fuse fuses them into one region (one compile instead of one per sample). CPU
    references are computed only for samples that ran on pjrt, and kept across modes."""
    name = op_id(op)
    before = _fallbacks_now()
    with torch_pjrt.eager_mode(mode):
        for run in runs:
            try:
                _call_on_pjrt(op, run)
            except Exception as e:  # noqa: BLE001
                reason = _skip_reason(e)
                if reason is not None:
                    run.outcome.skip = reason
                else:
                    run.error = _describe_exc(e)
        _settle()
        live = []
        for run in runs:
            if run.outcome.skip is not None:
                continue
            if run.index not in refs:
                refs[run.index] = _reference(op, run.sample, run.seed)
            run.ref = refs[run.index]
            if run.ref.error is not None:
                run.outcome.skip = f"the CPU reference raises {run.ref.error[:120]}"
            elif run.error is not None:
                run.outcome.problems.append(f"pjrt raised {run.error}")
            else:
                live.append(run)
        for run in live:
            ref = run.ref
            tol = None if (ref.random or op.name in UNINITIALIZED) else tolerances(name, VALUE_TOL)
            try:
                if name in GAUGE_FREE_VALUES and tol is not None:
                    problems, layout = compare(ref.output, run.out, None, "output")
                    problems += compare(run.sample.output_process_fn_grad(ref.output),
                                        run.sample.output_process_fn_grad(run.out), tol, "output")[0]
                    run.outcome.problems, run.outcome.layout = problems, layout
                    continue
                problems, layout = compare(ref.output, run.out, tol, "output")
                if any("values differ" in p for p in problems):
                    if not ref.precise_done:
                        _precise_reference(ref, op, run.sample, run.seed)
                    problems, layout = compare(ref.output, run.out, tol, "output",
                                               precise=ref.precise, rescued=run.outcome.rescued)
                run.outcome.problems, run.outcome.layout = problems, layout
            except Exception as e:  # noqa: BLE001 - an error of a region surfaces at the read
                run.outcome.problems.append(f"pjrt raised {_describe_exc(e)}")
        backward = []
        for run in live:
            ref, outcome = run.ref, run.outcome
            if not with_grad or outcome.problems:
                continue
            if not ref.grads_done:
                _reference_grads(ref, run.sample, run.seed)
            if ref.grad_outputs is None:
                continue
            if ref.grad_error is not None:
                outcome.grad_skip = f"the CPU backward raises {ref.grad_error[:120]}"
                continue
            arbitrary = ARBITRARY_SUBGRADIENTS.get(name)
            if arbitrary is not None and arbitrary[1](run.sample):
                outcome.grad_skip = arbitrary[0]
                continue
            outs = _differentiable(run.sample.output_process_fn_grad(run.out))
            inputs = [t for t in _input_tensors(run.args) if t.requires_grad]
            outcome.grad_ran = True
            if len(outs) != len(ref.grad_outputs):
                outcome.grad_problems.append(
                    f"{len(outs)} differentiable outputs, expected {len(ref.grad_outputs)}")
                continue
            try:
                grad_outputs = [g.to("pjrt") for g in ref.grad_outputs]
                run.grads = torch.autograd.grad(outs, inputs, grad_outputs, allow_unused=True)
                backward.append(run)
            except Exception as e:  # noqa: BLE001
                reason = _skip_reason(e)
                if reason is not None:
                    outcome.grad_ran = False
                    outcome.grad_skip = "backward " + reason
                else:
                    outcome.grad_problems.append(f"pjrt backward raised {_describe_exc(e)}")
        _settle()
        grad_tol = tolerances(name, GRAD_TOL)
        for run in backward:
            problems, ref = run.outcome.grad_problems, run.ref
            try:
                for k, (g, r) in enumerate(zip(run.grads, ref.grads)):
                    if (g is None) != (r is None):
                        problems.append(f"grad[{k}]: {'None' if g is None else 'a tensor'}, "
                                        f"expected {'None' if r is None else 'a tensor'}")
                    elif g is not None:
                        found = compare(r, g, grad_tol, f"grad[{k}]")[0]
                        if any("values differ" in p for p in found):
                            if not ref.precise_grads_tried:
                                _precise_reference(ref, op, run.sample, run.seed)
                            precise = ref.precise_grads[k] if ref.precise_grads else None
                            found = compare(r, g, grad_tol, f"grad[{k}]", precise=precise,
                                            rescued=run.outcome.rescued)[0]
                        problems += found
            except Exception as e:  # noqa: BLE001
                problems.append(f"pjrt backward raised {_describe_exc(e)}")
    after = _fallbacks_now()
    if after != before:
        # A fallback that did not raise cannot be told apart per sample: skip them all.
        new = sorted(k for k in after if after[k] != before.get(k))
        for run in runs:
            if run.outcome.skip is None:
                run.outcome = SampleOutcome(skip=f"falls back to CPU: {', '.join(new)}")


def _settle():
    """Runs everything pending; a failed region surfaces again where its values are read."""
    try:
        torch_pjrt.sync()
    except Exception:  # noqa: BLE001
        pass


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 3 or sys.argv[1] != "merge":
        sys.exit("usage: python opinfo_harness.py merge SHARD.json... (prints the summary)")
    states = []
    for path in sys.argv[2:]:
        with open(path) as f:
            states.append(json.load(f))
    print(Report.merged(states).summary(full_lists=True))
