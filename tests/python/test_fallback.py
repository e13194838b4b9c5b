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
            assert_close(torch.special.bessel_j0(p), torch.special.bessel_j0(x))
        assert_close(torch.special.bessel_y0(p), torch.special.bessel_y0(x))
    messages = [str(w.message) for w in _fallback_warnings(record)]
    assert len(messages) == 2, messages
    assert "aten::special_bessel_j0" in messages[0] and "TORCH_PJRT_FALLBACK=error" in messages[0]
    assert "aten::special_bessel_y0" in messages[1]
    counts = torch_pjrt.metrics()["fallback_ops"]
    j0 = [k for k in counts if k.startswith("aten::special_bessel_j0")]
    assert j0 and counts[j0[0]] == 3, counts


def test_fallback_error_mode_raises_naming_the_op(pjrt, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_FALLBACK", "error")
    p = torch.randn(5).to(pjrt)
    with pytest.raises(NotImplementedError, match="aten::special_bessel_j0"):
        torch.special.bessel_j0(p)
    # supported ops are unaffected
    assert_close(p + 1, p.cpu() + 1)


def test_fallback_invalid_setting_is_a_value_error(pjrt, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_FALLBACK", "gpu")
    with pytest.raises(ValueError, match="TORCH_PJRT_FALLBACK"):
        torch.special.bessel_j0(torch.randn(5).to(pjrt))


def test_fallback_error_mode_from_the_environment():
    out = assert_ok(
        run_python(
            """
            import torch
            p = torch.arange(4.0).to("pjrt")
            print((p * 2).sum().item())
            try:
                torch.special.bessel_j0(p)
            except NotImplementedError as e:
                print("NotImplementedError", "aten::special_bessel_j0" in str(e))
            """,
            env={"TORCH_PJRT_FALLBACK": "error"},
        )
    )
    assert out.split() == ["12.0", "NotImplementedError", "True"]


def test_fallback_with_out_argument_and_mutation(pjrt):
    x = torch.randn(6).abs() + 0.1
    a = torch.rand(6) + 0.5
    p = x.to(pjrt)
    out = torch.empty(0, device=pjrt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.special.bessel_j0(p, out=out)
        assert_close(out, torch.special.bessel_j0(x))
        q = p.clone()
        q.igamma_(a.to(pjrt))  # in-place op: runs on the CPU, result written back
    assert_close(q, torch.igamma(x, a))


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
