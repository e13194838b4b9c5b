"""Cache tools: `torch_pjrt.cache_stats()` per program, `TORCH_PJRT_CACHE_ONLY=1` (a miss in
every tier is an error) and `TORCH_PJRT_CACHE_MAX_MB` (the persistent tier's bound)."""

import json
import os

import torch

import torch_pjrt
from conftest import run_python


def test_cache_stats_lists_each_program_with_its_source_and_hits():
    x = torch.randn(13, 3)
    p = x.to("pjrt")
    with torch_pjrt.eager_mode("defer_and_fuse"):
        for _ in range(4):
            torch.testing.assert_close((p.cos() * 7 - 1).sum(0).cpu(), (x.cos() * 7 - 1).sum(0))
    stats = torch_pjrt.cache_stats()
    mine = [s for s in stats if "cos" in s["region"]]
    assert mine, stats[:5]
    program = mine[0]
    assert program["source"] == "compiled" and program["compile_seconds"] > 0
    assert program["hits"] >= 3, program
    assert len(program["key"]) >= 16


PROBE = """
import json, torch, torch_pjrt
x = torch.arange(12.0).reshape(3, 4).to("pjrt")
try:
    print(json.dumps({"value": float((x.exp() * 2).sum()), "stats": torch_pjrt.cache_stats()}))
except RuntimeError as e:
    print(json.dumps({"error": str(e)}))
"""


def test_cache_only_mode_loads_what_the_cache_holds_and_refuses_the_rest(tmp_path):
    cache = str(tmp_path / "cache")
    first = run_python(PROBE, env={"TORCH_PJRT_CACHE_DIR": cache})
    assert first.returncode == 0, first.stderr[-2000:]
    filled = json.loads(first.stdout.strip().splitlines()[-1])
    only = {"TORCH_PJRT_CACHE_DIR": cache, "TORCH_PJRT_CACHE_ONLY": "1"}
    again = run_python(PROBE, env=only)
    assert again.returncode == 0, again.stderr[-2000:]
    loaded = json.loads(again.stdout.strip().splitlines()[-1])
    assert loaded["value"] == filled["value"]
    assert {s["source"] for s in loaded["stats"]} <= {"tier3"}, loaded["stats"]
    empty = run_python(PROBE, env={"TORCH_PJRT_CACHE_DIR": str(tmp_path / "empty"), "TORCH_PJRT_CACHE_ONLY": "1"})
    assert empty.returncode == 0, empty.stderr[-2000:]
    refused = json.loads(empty.stdout.strip().splitlines()[-1])
    assert "TORCH_PJRT_CACHE_ONLY" in refused["error"], refused


BOUND_PROBE = """
import torch, torch_pjrt
x = torch.randn(64, 64).to("pjrt")
with torch_pjrt.eager_mode("strict"):
    for k in range(40):
        (x * (k + 2) + x.sin()).sum(1 - k % 2).cpu()
        (x[: k + 1] @ x).cpu()
"""


def _entries(root):
    return [
        os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".pjrt")
    ]


def test_the_persistent_tier_stays_within_its_bound(tmp_path):
    unbounded = tmp_path / "unbounded"
    proc = run_python(BOUND_PROBE, env={"TORCH_PJRT_CACHE_DIR": str(unbounded)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # A third of what the probe writes unbounded (executables' sizes change with the compiler's
    # options), still room for several entries.
    sizes = [os.path.getsize(f) for f in _entries(unbounded)]
    bound = sum(sizes) // 3
    assert 3 * max(sizes) < bound, (len(sizes), max(sizes), bound)
    cache = tmp_path / "bounded"
    env = {"TORCH_PJRT_CACHE_DIR": str(cache), "TORCH_PJRT_CACHE_MAX_MB": str(bound / 2**20)}
    proc = run_python(BOUND_PROBE, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entries = _entries(cache)
    total = sum(os.path.getsize(f) for f in entries)
    assert entries and total <= bound, (len(entries), total)
