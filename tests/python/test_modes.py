"""Eager modes: from the environment, the context manager, nesting, and autograd's threads."""

import threading

import pytest
import torch

import torch_pjrt
from conftest import assert_ok, run_python

MODE_PROBE = """
import torch, torch_pjrt
print(torch_pjrt.get_eager_mode())
torch_pjrt.reset_metrics()
x = torch.ones(4, device="pjrt")
y = (x * 2 + 1).sum()
print(torch_pjrt.metrics()["deferred_ops"], y.item())
"""


@pytest.mark.parametrize(
    "env, mode, deferred",
    [
        ({}, "strict", 0),
        ({"TORCH_PJRT_LAUNCH_BLOCKING": "1"}, "debug", 0),
        ({"TORCH_PJRT_DEFER_AND_FUSE": "1"}, "defer_and_fuse", 4),  # ones, mul, add, sum
        ({"TORCH_PJRT_DEFER_AND_FUSE": "0", "TORCH_PJRT_LAUNCH_BLOCKING": "1"}, "debug", 0),
    ],
)
def test_mode_from_environment(env, mode, deferred):
    out = assert_ok(run_python(MODE_PROBE, env=env)).split()
    assert out[0] == mode
    assert int(out[1]) == deferred
    assert float(out[2]) == 12.0


def test_context_manager_nests_and_restores(pjrt):
    assert torch_pjrt.get_eager_mode() == "strict"
    with torch_pjrt.eager_mode("defer_and_fuse"):
        assert torch_pjrt.get_eager_mode() == "defer_and_fuse"
        with torch_pjrt.eager_mode("debug"):
            assert torch_pjrt.get_eager_mode() == "debug"
            with torch_pjrt.eager_mode("strict"):
                assert torch_pjrt.get_eager_mode() == "strict"
            assert torch_pjrt.get_eager_mode() == "debug"
        assert torch_pjrt.get_eager_mode() == "defer_and_fuse"
    assert torch_pjrt.get_eager_mode() == "strict"


def test_context_manager_restores_on_exception(pjrt):
    with pytest.raises(KeyError):
        with torch_pjrt.eager_mode("defer_and_fuse"):
            raise KeyError("boom")
    assert torch_pjrt.get_eager_mode() == "strict"


def test_decorator(pjrt):
    @torch_pjrt.eager_mode("debug")
    def f():
        return torch_pjrt.get_eager_mode()

    assert f() == "debug"
    assert torch_pjrt.get_eager_mode() == "strict"


def test_set_eager_mode_replaces_the_innermost(pjrt):
    with torch_pjrt.eager_mode("debug"):
        torch_pjrt.set_eager_mode("defer_and_fuse")
        assert torch_pjrt.get_eager_mode() == "defer_and_fuse"
    assert torch_pjrt.get_eager_mode() == "strict"


def test_unknown_mode_is_a_value_error_listing_the_valid_ones():
    with pytest.raises(ValueError) as info:
        torch_pjrt.eager_mode("lazy")
    for name in ("strict", "debug", "defer_and_fuse"):
        assert name in str(info.value)
    with pytest.raises(ValueError):
        torch_pjrt.set_eager_mode("fast")


def test_defer_and_fuse_defers_and_strict_does_not(pjrt):
    x = torch.randn(8).to(pjrt)
    torch_pjrt.reset_metrics()
    (x.exp() + 1).sum().item()
    assert torch_pjrt.metrics()["deferred_ops"] == 0
    with torch_pjrt.eager_mode("defer_and_fuse"):
        torch_pjrt.reset_metrics()
        y = (x.exp() + 1).sum()
        m = torch_pjrt.metrics()
        assert m["deferred_ops"] == 3
        assert m["materializations"] == 0
        expected = (x.cpu().exp() + 1).sum()
        torch.testing.assert_close(y.cpu(), expected)
        assert torch_pjrt.metrics()["materializations"] == 1


def test_backward_in_defer_and_fuse_is_deferred(pjrt):
    """Autograd runs a pjrt backward on its own device thread: the process-wide mode covers it."""
    x_cpu = torch.randn(16)
    w_cpu = torch.randn(16)
    x = x_cpu.to(pjrt).requires_grad_()
    w = w_cpu.to(pjrt)
    threads = set()

    def hook(grad):
        threads.add(threading.get_ident())
        return grad

    with torch_pjrt.eager_mode("defer_and_fuse"):
        y = x.exp() * w
        y.register_hook(hook)
        torch_pjrt.sync()
        torch_pjrt.reset_metrics()
        y.backward(torch.ones(16, device=pjrt))
        m = torch_pjrt.metrics()
        assert m["deferred_ops"] >= 2, m  # grad * w, then * exp(x)
        assert m["materializations"] == 0, m
        grad = x.grad.cpu()
    assert threading.get_ident() not in threads, "backward was expected on autograd's thread"
    torch.testing.assert_close(grad, w_cpu * x_cpu.exp())


def test_debug_mode_runs_op_by_op(pjrt):
    x = torch.randn(4).to(pjrt)
    with torch_pjrt.eager_mode("debug"):
        torch_pjrt.reset_metrics()
        y = x * 3 - 1
        m = torch_pjrt.metrics()
        assert m["deferred_ops"] == 0 and m["executions"] == 2
    torch.testing.assert_close(y.cpu(), x.cpu() * 3 - 1)
