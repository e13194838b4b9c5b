"""Ops the engine lacks run on the CPU: counted, warned about once per op, or refused."""

import warnings

import pytest
import torch

import torch_pjrt
from conftest import assert_close, assert_ok, run_python


def _fallback_warnings(record):
    return [w for w in record if "not implemented for the pjrt device" in str(w.message)]


def test_fallback_warns_once_per_op_and_counts(pjrt):
    torch_pjrt._native.native()._reset_fallback_warnings()
    x = torch.randn(5, 4)
    p = x.to(pjrt)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            assert_close(p.logcumsumexp(0), x.logcumsumexp(0))
        assert_close(p.cumprod(1), x.cumprod(1))
    messages = [str(w.message) for w in _fallback_warnings(record)]
    assert len(messages) == 2, messages
    assert "aten::_logcumsumexp" in messages[0] and "TORCH_PJRT_FALLBACK=error" in messages[0]
    assert "aten::cumprod" in messages[1]
    counts = torch_pjrt.metrics()["fallback_ops"]
    logcumsumexp = [k for k in counts if k.startswith("aten::_logcumsumexp")]
    assert logcumsumexp and counts[logcumsumexp[0]] == 3, counts


def test_fallback_error_mode_raises_naming_the_op(pjrt, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_FALLBACK", "error")
    p = torch.randn(5).to(pjrt)
    with pytest.raises(NotImplementedError, match="aten::_logcumsumexp"):
        p.logcumsumexp(0)
    # supported ops are unaffected
    assert_close(p + 1, p.cpu() + 1)


def test_fallback_invalid_setting_is_a_value_error(pjrt, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_FALLBACK", "gpu")
    with pytest.raises(ValueError, match="TORCH_PJRT_FALLBACK"):
        torch.randn(5).to(pjrt).logcumsumexp(0)


def test_fallback_error_mode_from_the_environment():
    out = assert_ok(
        run_python(
            """
            import torch
            p = torch.arange(4.0).to("pjrt")
            print((p * 2).sum().item())
            try:
                p.cumprod(0)
            except NotImplementedError as e:
                print("NotImplementedError", "aten::cumprod" in str(e))
            """,
            env={"TORCH_PJRT_FALLBACK": "error"},
        )
    )
    assert out.split() == ["12.0", "NotImplementedError", "True"]


def test_fallback_with_out_argument_and_mutation(pjrt):
    x = torch.randn(6)
    p = x.to(pjrt)
    out = torch.empty(0, device=pjrt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.logcumsumexp(p, 0, out=out)
        assert_close(out, torch.logcumsumexp(x, 0))
        q = p.clone()
        q.exponential_()  # random in-place op: runs on the CPU, result written back
    assert (q.cpu() > 0).all()


def test_convolution_runs_forward_and_backward(pjrt):
    conv = torch.nn.Conv2d(2, 3, 3, padding=1)
    x = torch.randn(1, 2, 5, 5)
    ref = conv(x)
    ref.sum().backward()
    ref_grad = conv.weight.grad.clone()
    conv.zero_grad()
    conv.to(pjrt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = conv(x.to(pjrt))
        out.sum().backward()
    assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert_close(conv.weight.grad, ref_grad, rtol=1e-4, atol=1e-5)
