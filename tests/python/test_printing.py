"""print/repr of pjrt tensors: one device-to-host transfer, PyTorch's formatting."""

import re

import torch

import torch_pjrt


def _transfers():
    return torch_pjrt.metrics()["device_to_host"]


def test_repr_copies_to_the_host_once(pjrt):
    x = torch.randn(30, 30)
    p = x.to(pjrt)
    torch_pjrt.sync()
    before = _transfers()
    text = repr(p)
    assert _transfers() - before == 1
    assert text.endswith("device='pjrt:0')")
    body = re.sub(r",\s*device='pjrt:0'\)$", ")", text)
    assert body == repr(x)


def test_print_small_and_scalar_tensors(pjrt, capsys):
    p = torch.tensor([1.5, 2.0, -3.0]).to(pjrt)
    before = _transfers()
    print(p)
    print(p.sum())
    assert _transfers() - before == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "tensor([ 1.5000,  2.0000, -3.0000], device='pjrt:0')"
    assert out[1] == "tensor(0.5000, device='pjrt:0')"


def test_str_of_int_bool_and_grad_tensors(pjrt):
    assert str(torch.arange(3).to(pjrt)) == "tensor([0, 1, 2], device='pjrt:0')"
    assert str(torch.tensor([True, False]).to(pjrt)) == (
        "tensor([ True, False], device='pjrt:0')"
    )
    w = torch.ones(2).to(pjrt).requires_grad_()
    assert "requires_grad=True" in repr(w)
    assert "grad_fn=<MulBackward0>" in repr(w * 2)
    assert str(torch.empty(0, device=pjrt)) == "tensor([], device='pjrt:0')"


def test_print_in_defer_and_fuse_materializes(pjrt):
    x = torch.arange(4, dtype=torch.float32).to(pjrt)
    with torch_pjrt.eager_mode("defer_and_fuse"):
        y = x * 2 + 1
        assert str(y) == "tensor([1., 3., 5., 7.], device='pjrt:0')"
        assert torch_pjrt.metrics()["materializations"] >= 1
