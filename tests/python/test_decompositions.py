"""Long-tail ops that pjrt runs through PyTorch's own decompositions (`torch_pjrt._decompositions`,
RFC 0045): each against the CPU kernel, forward and backward, in every eager mode and under
`torch.inference_mode`, with nothing sent to the CPU; and each decomposition against the CPU
kernel on the CPU, so a torch whose decomposition drifts from its kernel fails here first."""

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt import _decompositions
from conftest import check_against_cpu as check, in_mode_without_fallbacks, seeded

X = torch.randn(6, 5, generator=seeded(0))
TARGET = torch.randint(0, 5, (6,), generator=seeded(1))
WEIGHT = torch.rand(5, generator=seeded(2)) + 0.5

CASES = {
    "multi_margin_loss": (lambda x, t: F.multi_margin_loss(x, t), (X, TARGET)),
    "multi_margin_loss_p2_weight_sum": (
        lambda x, t, w: F.multi_margin_loss(x, t, p=2, margin=0.7, weight=w, reduction="sum"),
        (X, TARGET, WEIGHT),
    ),
    "multi_margin_loss_none_1d": (
        lambda x, t: F.multi_margin_loss(x, t, reduction="none"),
        (X[0], TARGET[:1].reshape(())),
    ),
}


def test_every_decomposed_op_is_registered():
    from torch._decomp import decomposition_table

    for name in _decompositions.DECOMPOSED:
        assert getattr(torch.ops.aten, name).default in decomposition_table, name
        assert _decompositions.kernel(name) is not None, name


@pytest.mark.parametrize("name", list(CASES))
def test_decomposed_ops_match_the_cpu(mode, name):
    fn, inputs = CASES[name]
    check(fn, inputs)


@pytest.mark.parametrize("name", list(CASES))
def test_decomposed_ops_run_under_inference_mode(name):
    fn, inputs = CASES[name]
    expected = fn(*inputs)
    with in_mode_without_fallbacks("strict"), torch.inference_mode():
        got = fn(*[t.to("pjrt") for t in inputs])
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_decompositions_agree_with_the_cpu_kernels(name):
    fn, inputs = CASES[name]
    # The same call with every decomposed op replaced by the kernel pjrt registers, on the CPU.
    with torch.library._scoped_library("aten", "IMPL") as lib:
        for op in _decompositions.DECOMPOSED:
            lib.impl(op, _decompositions.kernel(op), "CPU")
        decomposed = fn(*inputs)
    torch.testing.assert_close(decomposed, fn(*inputs), rtol=1e-6, atol=1e-6)
