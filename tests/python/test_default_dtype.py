"""PyTorch's default float dtype (`torch.set_default_dtype`) on pjrt: integer and bool inputs of
float ops (true division, sqrt, exp, ...) and Python floats beside integer tensors take it, as on
the CPU, in every eager mode; the same program under another default is another program."""

import contextlib

import pytest
import torch

import torch_pjrt


@contextlib.contextmanager
def default_dtype(dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


INTS = torch.tensor([[3, -7, 16777217], [0, 5, 9]])
BOOLS = torch.tensor([True, False, True])

CASES = {
    "div": lambda a: a / 2,
    "true_divide": lambda a: torch.true_divide(a, torch.full_like(a, 3)),
    "sqrt": lambda a: torch.sqrt(a.abs()),
    "exp": lambda a: torch.exp(a.clamp(max=5)),
    "sin": torch.sin,
    "sigmoid": torch.sigmoid,
    "reciprocal": lambda a: torch.reciprocal(a + 100),
    "atan2": lambda a: torch.atan2(a, a + 1),
    "times a float": lambda a: a * 2.5,
    "plus a float": lambda a: a + 0.1,
    "equals a float": lambda a: a == 16777216.0,
    "where": lambda a: torch.where(a > 0, a, 0.5),
    "clamp": lambda a: torch.clamp(a, min=0.5),
    "logsumexp": lambda a: torch.logsumexp(a.clamp(max=5), dim=1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_integer_inputs_take_the_default_dtype(mode, name):
    fn = CASES[name]
    for dtype in (torch.float64, torch.float32, torch.float64):
        with default_dtype(dtype):
            expected = fn(INTS)
            got = fn(INTS.to("pjrt")).cpu()
        assert got.dtype == expected.dtype, (name, dtype, got.dtype, expected.dtype)
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


def test_bool_inputs_and_float_precision(mode):
    with default_dtype(torch.float64):
        got = (BOOLS.to("pjrt") / 3).cpu()
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, BOOLS / 3, rtol=0, atol=0)
        # 2**24 + 1 is exact in float64: the comparison with a Python float is computed there.
        big = torch.tensor([16777217]).to("pjrt")
        assert not bool((big == 16777216.0).cpu())
    # In float32 it rounds to 2**24, as on the CPU.
    assert bool((torch.tensor([16777217]).to("pjrt") == 16777216.0).cpu())


def test_out_and_in_place_follow_the_default(pjrt):
    with default_dtype(torch.float64):
        out = torch.empty(2, 3, dtype=torch.float64, device="pjrt")
        torch.div(INTS.to("pjrt"), 4, out=out)
        torch.testing.assert_close(out.cpu(), INTS / 4, rtol=0, atol=0)
        ints = INTS.to("pjrt")
        with pytest.raises(RuntimeError, match="result type Double can't be cast"):
            ints.div_(4)


def test_each_default_is_its_own_program(pjrt):
    a = INTS.to("pjrt")
    with torch_pjrt.eager_mode("defer_and_fuse"):
        for dtype in (torch.float32, torch.float64):
            with default_dtype(dtype):
                (a / 3).cpu()
        before = torch_pjrt.metrics()["compilations"]
        for dtype in (torch.float32, torch.float64):
            with default_dtype(dtype):
                assert (a / 3).cpu().dtype == dtype
        assert torch_pjrt.metrics()["compilations"] == before
