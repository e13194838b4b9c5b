"""The orthogonal polynomials of `torch.special` on the device (Chebyshev's four kinds and their
shifted forms, Hermite's two, Laguerre's and Legendre's): each by its recurrence in one loop to
the largest degree, against the CPU's float64 values; float32 recurs in float64, so it is at
least as close to them as the CPU's own float32 kernels. The scalar forms, integer promotion,
`out=`, degrees that are negative, zero or NaN, and PyTorch's refusal of reduced floats; nothing
falls back to the CPU (the `mode` fixture checks)."""

import math

import pytest
import torch

from conftest import assert_close, seeded

NAMES = [
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
    "legendre_polynomial_p",
]


def points_and_degrees():
    g = seeded(5)
    x = torch.cat([torch.rand(60, generator=g, dtype=torch.float64) * 2.4 - 1.2,
                   torch.tensor([-1.0, 1.0, 0.0, 0.5, 2.0, -3.0, 0.25, math.inf])])
    n = torch.cat([torch.randint(-2, 30, (60,), generator=g).double(),
                   torch.tensor([5.0, 7.0, 9.0, 12.0, 3.0, 4.0, 0.0, 2.0])])
    return x, n


@pytest.mark.parametrize("name", NAMES)
def test_values_match_the_cpu(mode, name):
    fn = getattr(torch.special, name)
    x, n = points_and_degrees()
    expected = fn(x, n)
    assert_close(fn(x.to("pjrt"), n.to("pjrt")), expected, rtol=1e-10, atol=1e-10)
    # float32 rounds the float64 recurrence once.
    got = fn(x.float().to("pjrt"), n.float().to("pjrt"))
    assert got.dtype == torch.float32
    assert_close(got, fn(x.float().double(), n), rtol=1e-6, atol=1e-6, check_dtype=False)
    # Scalar points or degrees, integers promoted to the default float dtype, and out=.
    assert_close(fn(x[:8].to("pjrt"), 3), fn(x[:8], 3), rtol=1e-10, atol=1e-10)
    assert_close(fn(0.5, n[:8].to("pjrt")), fn(0.5, n[:8]), rtol=1e-10, atol=1e-10)
    ints = torch.tensor([0, 1, 2, -1])
    assert_close(fn(ints.to("pjrt"), torch.tensor([3, 2, 1, 4]).to("pjrt")), fn(ints, torch.tensor([3, 2, 1, 4])))
    out = torch.empty(0, dtype=torch.float64, device="pjrt")
    fn(x.to("pjrt"), n.to("pjrt"), out=out)
    assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_degrees_negative_zero_nan_and_large(mode):
    x = torch.tensor([0.3, 0.3, 0.3, 0.3, math.nan, 0.99], dtype=torch.float64)
    n = torch.tensor([-1.0, 0.0, math.nan, 2.7, 2.0, 200.0], dtype=torch.float64)
    for name in NAMES:
        fn = getattr(torch.special, name)
        got = fn(x.to("pjrt"), n.to("pjrt")).cpu()
        # Negative and NaN degrees give 0, degree 0 gives 1, and a degree is truncated.
        assert got[:3].tolist() == [0.0, 1.0, 0.0], name
        torch.testing.assert_close(got[3], fn(x[3:4], torch.tensor([2.0], dtype=torch.float64))[0])
        assert got[4].isnan()
    # A NaN degree beside others leaves theirs alone.
    nan_beside = torch.special.hermite_polynomial_he(x[:2].to("pjrt"), torch.tensor([math.nan, 6.0]).double().to("pjrt"))
    assert_close(nan_beside, torch.tensor([0.0, torch.special.hermite_polynomial_he(x[1:2], 6.0).item()],
                                           dtype=torch.float64))
    t = torch.special.chebyshev_polynomial_t(x[5:].to("pjrt"), n[5:].to("pjrt"))
    assert_close(t, torch.cos(200 * torch.acos(x[5:])), rtol=1e-9, atol=1e-9)


def test_reduced_floats_are_refused_as_on_the_cpu(mode):
    with pytest.raises(NotImplementedError, match="not implemented for 'BFloat16'"):
        torch.special.legendre_polynomial_p(torch.ones(2, dtype=torch.bfloat16, device="pjrt"), 2)
