"""Shared helpers for the torch-pjrt Python tests (run with `make python-test`)."""

import contextlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_pjrt

# Variables that change the engine's behaviour; subprocess tests start from a clean slate.
ENGINE_ENV = (
    "TORCH_PJRT_DEFER_AND_FUSE",
    "TORCH_PJRT_LAUNCH_BLOCKING",
    "TORCH_PJRT_PLUGIN",
    "TORCH_PJRT_FALLBACK",
    "TORCH_PJRT_CACHE_DIR",
    "TORCH_PJRT_SHARED_CACHE",
    "TORCH_PJRT_DUMP_DIR",
    "TORCH_PJRT_MAX_REGION_OPS",
    "TORCH_PJRT_RECOMPILE_LIMIT",
    "TORCH_PJRT_LOG_RECOMPILES",
    "TORCH_PJRT_TRACEBACKS",
    "TORCH_PJRT_CACHE_ONLY",
    "TORCH_PJRT_CACHE_MAX_MB",
)


def run_python(code: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (the engine is one per process, its environment is read
    once); returns the completed process (check returncode/stdout/stderr)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ENGINE_ENV}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


@pytest.fixture
def pjrt():
    """The pjrt device, in strict mode, with fresh metrics."""
    before = torch_pjrt.get_eager_mode()
    with torch_pjrt.eager_mode("strict"):
        torch_pjrt.sync()
        torch_pjrt.reset_metrics()
        yield torch.device("pjrt")
        assert torch_pjrt.get_eager_mode() == "strict", "a test leaked an eager mode"
    assert torch_pjrt.get_eager_mode() == before


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@contextlib.contextmanager
def in_mode_without_fallbacks(mode):
    """Runs the body in one eager mode with fresh metrics, then syncs and checks that no op fell
    back to the CPU (the body of a per-mode fixture: `with ...: yield mode`)."""
    with torch_pjrt.eager_mode(mode):
        torch_pjrt.sync()
        torch_pjrt.reset_metrics()
        yield mode
        torch_pjrt.sync()
        fallbacks = torch_pjrt.metrics()["fallback_ops"]
    assert fallbacks == {}, f"ops that fell back to the CPU: {fallbacks}"


EAGER_MODES = ["strict", "debug", "defer_and_fuse"]


@pytest.fixture(params=EAGER_MODES)
def mode(request):
    """Runs the test in each eager mode and checks that no op fell back to the CPU (a test
    module may define its own `mode` fixture, or parametrize `mode`, instead)."""
    with in_mode_without_fallbacks(request.param):
        yield request.param


@pytest.fixture(params=["strict", "defer_and_fuse"])
def strict_or_fused_mode(request):
    """As `mode`, in Strict and DeferAndFuse only: for tests whose ops run alike in Debug (each
    op of Strict, waited for), where a third mode would double their compile time."""
    with in_mode_without_fallbacks(request.param):
        yield request.param


def seeded(seed):
    """A CPU generator seeded with `seed`: test inputs that do not depend on the test order."""
    return torch.Generator().manual_seed(seed)


def _run_on(fn, inputs, grads_of, device):
    """`fn(*inputs)` on `device`, then backward of a fixed random cotangent: (output, grads)."""
    ts = [t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs]
    for i in grads_of:
        ts[i] = ts[i].detach().requires_grad_()
    out = fn(*ts)
    cotangent = torch.randn(out.shape, generator=seeded(7)).to(device)
    out.backward(cotangent)
    return out.detach().cpu(), [ts[i].grad.cpu() for i in grads_of]


def check_against_cpu(fn, inputs, grads_of=(0,), **tol):
    """`fn` on pjrt against the CPU: its output and the gradients of the inputs `grads_of`
    (tolerances 1e-5 unless given)."""
    tol = {"rtol": 1e-5, "atol": 1e-5, **tol}
    expected, expected_grads = _run_on(fn, inputs, grads_of, "cpu")
    actual, actual_grads = _run_on(fn, inputs, grads_of, "pjrt")
    torch.testing.assert_close(actual, expected, **tol)
    for a, e in zip(actual_grads, expected_grads):
        torch.testing.assert_close(a, e, **tol)


def assert_close(actual, expected, **kw):
    assert actual.device.type == "pjrt", actual.device
    kw.setdefault("equal_nan", True)
    torch.testing.assert_close(actual.cpu(), expected, **kw)


def pytest_terminal_summary(terminalreporter):
    """The OpInfo parity summary, when test_opinfo.py ran: printed, and written in full to
    tests/python/.opinfo_summary.md."""
    harness = sys.modules.get("opinfo_harness")
    if harness is None or not harness.REPORT.has_results():
        return
    terminalreporter.write_line("")
    terminalreporter.write(harness.REPORT.summary(full_lists=False))
    path = os.path.join(os.path.dirname(__file__), ".opinfo_summary.md")
    with open(path, "w") as f:
        f.write(harness.REPORT.summary(full_lists=True))
    terminalreporter.write_line(f"OpInfo summary written to {path}")
    if harness.SHARD:
        k, n = harness.SHARD.split("/")
        shards = os.path.join(os.path.dirname(__file__), ".opinfo_shards")
        os.makedirs(shards, exist_ok=True)
        kind = "full" if harness.FULL else "ci"
        state = os.path.join(shards, f"{kind}-{k}-of-{n}.json")
        harness.REPORT.save(state)
        terminalreporter.write_line(
            f"OpInfo tally of shard {harness.SHARD} written to {state} (merge the shards with "
            f"`python tests/python/opinfo_harness.py merge {shards}/{kind}-*-of-{n}.json`)")
