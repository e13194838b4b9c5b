"""Smoke test of the benchmark suite (benches/python/suite.py): one small workload on CPU eager and
pjrt Strict/DeferAndFuse/compiled through the suite's entry point, checking the shape of what it writes.
The full suite is `make bench`, not part of `make test`."""

import json
import os
import subprocess
import sys

from conftest import ENGINE_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUITE = os.path.join(ROOT, "benches", "python", "suite.py")
BACKENDS = ("cpu", "pjrt-strict", "pjrt-defer_and_fuse", "pjrt-compiled")


def test_suite_quick_run_writes_results(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_ENV}
    env.update(BENCH_QUICK="1", BENCH_REPS="2", BENCH_WARMUP="1")
    proc = subprocess.run(
        [sys.executable, SUITE, "--backends", ",".join(BACKENDS), "--workloads", "tiny_ops",
         "--out-dir", str(tmp_path), "--no-chart"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    data = json.loads((tmp_path / "latest.json").read_text())
    assert data["meta"]["quick"] is True
    assert data["meta"]["backends"] == list(BACKENDS)
    results = {r["backend"]: r for r in data["results"]}
    assert set(results) == set(BACKENDS)
    for backend, r in results.items():
        assert r["ok"], (backend, r.get("error"), r.get("traceback"))
        assert r["workload"] == "tiny_ops"
        assert r["peak_rss_mb"] >= 0
        (case,) = r["cases"]
        assert "error" not in case, (backend, case)
        assert case["per"] == "op" and case["count"] == 1000
        assert case["reps"] == len(case["samples_s"]) >= 1
        assert 0 < case["median_s"] < 1e-2  # seconds per op
        if backend.startswith("pjrt-"):
            assert isinstance(case["compiles"], int)
            assert case["profile"]["executions"] > 0
            # Where the time went: the op calls and the device were timed.
            assert case["profile"]["host_op_seconds"] > 0
            assert case["profile"]["device_seconds"] > 0
            assert r["versions"]["torch_pjrt"]
        else:
            assert case["compiles"] is None

    statuses = {t["target"]: t["status"] for t in data["meta"]["targets"]}
    assert any(t.startswith("Tiny op") for t in statuses)
    report = (tmp_path / "latest.md").read_text()
    assert "## Summary" in report and "pjrt DeferAndFuse" in report
    assert "## Where the time goes (pjrt)" in report
    rows = [line for line in report.splitlines() if line.startswith("| tiny_ops |")
            and ("host (" in line or "device (" in line)]
    assert len(rows) == 3, rows  # Strict, DeferAndFuse and compiled
    assert any(t.startswith("Tiny op: compiled") for t in statuses)


JAX_PYTHON = os.path.join(ROOT, ".venv-jax", "bin", "python")


def test_jax_is_reported_unavailable_without_its_venv(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_ENV}
    env.update(BENCH_QUICK="1", BENCH_REPS="1", BENCH_WARMUP="1")
    proc = subprocess.run(
        [sys.executable, SUITE, "--backends", "cpu,jax", "--workloads", "norms",
         "--jax-python", str(tmp_path / "no-such-python"), "--out-dir", str(tmp_path),
         "--no-chart"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    assert data["meta"]["backends"] == ["cpu"]
    assert "venv-jax" in data["meta"]["unavailable"]["jax"]
    report = (tmp_path / "latest.md").read_text()
    assert "jax.jit: **unavailable**" in report


def test_jax_runs_the_same_cases_as_the_torch_workers(tmp_path):
    """Where `make venv-jax` has built the JAX venv (`make bench` does; `make test` does not):
    JAX's cases carry the torch cases' names, so the report lines them up."""
    if not os.path.exists(JAX_PYTHON):
        import pytest

        pytest.skip("no .venv-jax here (`make venv-jax` builds it)")
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_ENV}
    env.update(BENCH_QUICK="1", BENCH_REPS="1", BENCH_WARMUP="1")
    proc = subprocess.run(
        [sys.executable, SUITE, "--backends", "cpu,jax", "--workloads", "norms,tiny_ops",
         "--out-dir", str(tmp_path), "--no-chart"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    cases = {(r["backend"], r["workload"]): [c["case"] for c in r["cases"]] for r in data["results"]}
    assert ("jax", "tiny_ops") not in cases  # no jax.jit counterpart of an eager op loop
    assert cases[("jax", "norms")] == cases[("cpu", "norms")]
    jax_norms = next(r for r in data["results"] if r["backend"] == "jax")
    assert all("error" not in c and c["median_s"] > 0 and c["compiles"] == 0 for c in jax_norms["cases"])
    report = (tmp_path / "latest.md").read_text()
    assert "| softmax 256x1024 | jax.jit |" in report
    assert any(t["target"].startswith("DeferAndFuse within 1.15× of jax.jit") for t in data["meta"]["targets"])


PEER_PYTHON = os.path.join(ROOT, ".venv-peer", "bin", "python")


def test_openxla_is_reported_unavailable_without_the_peer_venv(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_ENV}
    env.update(BENCH_QUICK="1", BENCH_REPS="1", BENCH_WARMUP="1")
    proc = subprocess.run(
        [sys.executable, SUITE, "--backends", "cpu,openxla", "--workloads", "norms",
         "--peer-python", str(tmp_path / "no-such-python"), "--out-dir", str(tmp_path),
         "--no-chart"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    assert data["meta"]["backends"] == ["cpu"]
    assert "venv-peer" in data["meta"]["unavailable"]["openxla"]
    assert "openxla: **unavailable**" in (tmp_path / "latest.md").read_text()


def test_openxla_compiles_the_tiny_op_blocks_once(tmp_path):
    """Where `make venv-peer` has built torch_xla's venv (`make bench` does; `make test` does
    not): the openxla column runs torch_xla's Dynamo backend on the compiled-mode cases, with no
    compilation after warm-up."""
    if not os.path.exists(PEER_PYTHON):
        import pytest

        pytest.skip("no .venv-peer here (`make venv-peer` builds it)")
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_ENV}
    env.update(BENCH_QUICK="1", BENCH_REPS="1", BENCH_WARMUP="1")
    proc = subprocess.run(
        [sys.executable, SUITE, "--backends", "openxla", "--workloads", "tiny_ops",
         "--peer-python", PEER_PYTHON, "--out-dir", str(tmp_path), "--no-chart"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    (result,) = data["results"]
    assert result["backend"] == "openxla" and result["ok"], result
    (case,) = result["cases"]
    assert "error" not in case and case["median_s"] > 0, case
    assert case["compiles"] == 0 and case["note"] == "compiled blocks of 100 adds", case
    assert "| tiny_ops | 1000 adds, 16 floats | " in (tmp_path / "latest.md").read_text()
