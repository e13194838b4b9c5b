"""The in-place and `out=` forms the kernel generator derives from a hand-written functional
kernel (`csrc/hand_written_kernels.py`): each runs on the device, equals the CPU's result and
raises the CPU's error for an `out=` or `self` that cannot hold the result. Nothing may fall back
to the CPU."""

import pytest
import torch

from conftest import seeded

aten = torch.ops.aten


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=seeded(seed))


# (name, the call on a device's tensors: fn(to) with `to` moving a CPU tensor there)
OUT_FORMS = {
    "vdot.out": lambda to: aten.vdot.out(to(randn(5)), to(randn(5, seed=1)), out=to(torch.empty(()))),
    "count_nonzero.dim_IntList_out": lambda to: aten.count_nonzero.dim_IntList_out(
        to(torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 0.0]])), [0], out=to(torch.empty(2, dtype=torch.long))
    ),
    "var_mean.correction_out": lambda to: aten.var_mean.correction_out(
        to(randn(4, 6)), [1], correction=1, keepdim=False,
        out0=to(torch.empty(4)), out1=to(torch.empty(4)),
    ),
    "im2col.out": lambda to: aten.im2col.out(
        to(randn(1, 2, 5, 5)), [2, 2], [1, 1], [0, 0], [1, 1], out=to(torch.empty(0))
    ),
    "upsample_bilinear2d_backward.grad_input": lambda to: aten.upsample_bilinear2d_backward.grad_input(
        to(randn(1, 2, 6, 6)), [6, 6], [1, 2, 3, 3], False, None, None, grad_input=to(torch.empty(0))
    ),
    "copysign.Scalar_out": lambda to: aten.copysign.Scalar_out(to(randn(6)), -1.0, out=to(torch.empty(6))),
    "repeat_interleave.Tensor_out": lambda to: aten.repeat_interleave.Tensor_out(
        to(torch.tensor([1, 0, 3])), out=to(torch.empty(0, dtype=torch.long))
    ),
    "max.dim_max": lambda to: aten.max.dim_max(
        to(randn(3, 4)), 1, max=to(torch.empty(0)), max_values=to(torch.empty(0, dtype=torch.long))
    ),
}


@pytest.mark.parametrize("name", list(OUT_FORMS))
def test_out_form_equals_the_cpus(strict_or_fused_mode, name):
    expected = OUT_FORMS[name](lambda t: t)
    actual = OUT_FORMS[name](lambda t: t.to("pjrt"))
    for a, e in zip(*(r if isinstance(r, tuple) else (r,) for r in (actual, expected))):
        assert a.device.type == "pjrt"
        torch.testing.assert_close(a.cpu(), e, rtol=1e-5, atol=1e-5)


def test_in_place_form_derived_from_a_functional_kernel(strict_or_fused_mode):
    # scatter_reduce_ has no kernel of its own: it is scatter_reduce written into `self`.
    def run(to):
        x = to(randn(3, 5))
        x.scatter_reduce_(1, to(torch.tensor([[0, 1, 0, 2, 4]] * 3)), to(randn(3, 5, seed=1)), "amax")
        return x

    torch.testing.assert_close(run(lambda t: t.to("pjrt")).cpu(), run(lambda t: t))


@pytest.mark.parametrize(
    "call",
    [
        lambda to: to(torch.arange(4)).sinh_(),  # a real composition's in-place form
        lambda to: to(torch.arange(4)).xlogy_(to(torch.ones(4))),
        lambda to: aten.copysign.Scalar_out(to(randn(3)), -1.0, out=to(torch.empty(3, dtype=torch.long))),
    ],
)
def test_a_form_that_cannot_hold_the_result_raises_the_cpus_error(strict_or_fused_mode, call):
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type") as on_cpu:
        call(lambda t: t)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type") as on_pjrt:
        call(lambda t: t.to("pjrt"))
    assert str(on_pjrt.value).splitlines()[0] == str(on_cpu.value).splitlines()[0]


def test_mish_gradient_is_pytorchs_composition(strict_or_fused_mode):
    # No kernel of the plugin's: ATen's device-generic composition (math_mish_backward) runs.
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::mish_backward", "PrivateUse1")
    x = torch.cat([randn(20) * 4, torch.tensor([0.0, 25.0, -25.0])])
    expected = torch.autograd.grad(torch.nn.functional.mish(x.requires_grad_()).sum(), x)[0]
    xp = x.detach().to("pjrt").requires_grad_()
    actual = torch.autograd.grad(torch.nn.functional.mish(xp).sum(), xp)[0]
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-5, atol=1e-5)
