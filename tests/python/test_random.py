"""Random numbers on pjrt: the device's generator (seeds, states, generator objects), the
distributions drawn on the device, dropout forward and backward, and no recompiles per draw."""

import math

import pytest
import torch

import torch_pjrt

MODES = ["strict", "debug", "defer_and_fuse"]


def draws(mode, seed, make):
    with torch_pjrt.eager_mode(mode):
        torch.manual_seed(seed)
        out = make()
        torch_pjrt.sync()
    return out.cpu()


@pytest.mark.parametrize("mode", MODES)
def test_seeds_reproduce_and_modes_agree(pjrt, mode):
    make = lambda: torch.rand(64, device=pjrt) + torch.randn(64, device=pjrt)  # noqa: E731
    a = draws(mode, 1234, make)
    b = draws(mode, 1234, make)
    c = draws(mode, 1235, make)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert (a != c).float().mean() > 0.9
    # The keys come from the host-side generator, so every mode draws the same numbers.
    torch.testing.assert_close(a, draws("strict", 1234, make), rtol=0, atol=0)
    assert torch_pjrt.metrics()["fallback_ops"] == {}


def test_rng_state_round_trips(pjrt):
    torch.manual_seed(7)
    torch.rand(3, device=pjrt)
    state = torch.pjrt.get_rng_state()
    assert state.dtype == torch.uint8 and state.shape == (16,)
    first = torch.rand(10, device=pjrt).cpu()
    second = torch.randn(10, device=pjrt).cpu()
    torch.pjrt.set_rng_state(state)
    torch.testing.assert_close(torch.rand(10, device=pjrt).cpu(), first, rtol=0, atol=0)
    torch.testing.assert_close(torch.randn(10, device=pjrt).cpu(), second, rtol=0, atol=0)
    assert torch.pjrt.initial_seed() == 7
    assert torch.pjrt.get_rng_state_all()[0].shape == (16,)


def test_bad_states_are_refused(pjrt):
    with pytest.raises(TypeError, match="ByteTensor"):
        torch.pjrt.set_rng_state(torch.zeros(16))
    with pytest.raises(RuntimeError, match="16 contiguous bytes"):
        torch.pjrt.set_rng_state(torch.zeros(8, dtype=torch.uint8))
    # The generator still works afterwards.
    assert torch.rand(2, device=pjrt).cpu().shape == (2,)


def test_generator_objects_are_independent_of_the_default(pjrt):
    g = torch.Generator(device=pjrt)
    assert g.device.type == "pjrt"
    g.manual_seed(99)
    a = torch.rand(20, device=pjrt, generator=g).cpu()
    torch.rand(5, device=pjrt)  # the default generator moves, g does not
    g.manual_seed(99)
    b = torch.rand(20, device=pjrt, generator=g).cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    saved = g.get_state()
    c = torch.randn(4, device=pjrt, generator=g).cpu()
    g.set_state(saved)
    torch.testing.assert_close(torch.randn(4, device=pjrt, generator=g).cpu(), c, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="pjrt generator"):
        torch.rand(3, device=pjrt, generator=torch.Generator())


def normal_cdf(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def ks_statistic(samples, cdf):
    xs = sorted(samples)
    n = len(xs)
    return max(max((i + 1) / n - cdf(x), cdf(x) - i / n) for i, x in enumerate(xs))


def test_distributions(pjrt):
    n = 20000
    torch.manual_seed(2024)
    u = torch.empty(n, device=pjrt).uniform_(-1, 3).cpu()
    assert u.min() >= -1 and u.max() < 3
    assert abs(u.mean() - 1) < 0.03 and abs(u.var() - 16 / 12) < 0.05
    # Kolmogorov-Smirnov at the 1% level: D < 1.63 / sqrt(n).
    assert ks_statistic(u.tolist(), lambda x: min(max((x + 1) / 4, 0), 1)) < 1.63 / math.sqrt(n)

    z = torch.empty(n, device=pjrt).normal_(2.0, 0.5).cpu()
    assert abs(z.mean() - 2) < 0.01 and abs(z.std() - 0.5) < 0.01
    assert ks_statistic(z.tolist(), lambda x: normal_cdf((x - 2) / 0.5)) < 1.63 / math.sqrt(n)

    r = torch.randint(-2, 6, (n,), device=pjrt).cpu()
    assert r.dtype == torch.int64 and r.min() == -2 and r.max() == 5
    counts = torch.bincount(r + 2, minlength=8).double()
    expected = n / 8
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.5, chi2  # 7 degrees of freedom, 1%

    b = torch.bernoulli(torch.full((n,), 0.2, device=pjrt)).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0} and abs(b.mean() - 0.2) < 0.01
    p = torch.linspace(0, 1, 11, device=pjrt).repeat(2000)
    hits = torch.bernoulli(p).cpu().view(2000, 11).mean(0)
    torch.testing.assert_close(hits, torch.linspace(0, 1, 11), atol=0.04, rtol=0)
    coin = torch.empty(n, dtype=torch.bool, device=pjrt).bernoulli_(0.5).cpu()
    assert abs(coin.float().mean() - 0.5) < 0.02
    # Means and standard deviations both tensors, broadcast together.
    mean = torch.tensor([-3.0, 0.0, 5.0], dtype=torch.float64, device=pjrt)
    std = torch.tensor([[0.5], [2.0]], device=pjrt).expand(2, 3).repeat(n // 4, 1)
    w = torch.normal(mean, std)
    assert w.shape == (n // 2, 3) and w.dtype == torch.float64
    standardized = ((w - mean) / std).cpu()
    assert abs(standardized.mean()) < 0.02 and abs(standardized.std() - 1) < 0.02
    assert ks_statistic(standardized.flatten().tolist()[:n], normal_cdf) < 1.63 / math.sqrt(n)
    with pytest.raises(RuntimeError, match="normal expects all elements of std >= 0.0"):
        torch.normal(mean, -std)
    assert torch_pjrt.metrics()["fallback_ops"] == {}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_float_dtypes(pjrt, dtype):
    x = torch.rand(4000, device=pjrt, dtype=dtype).cpu()
    assert x.dtype == dtype and x.min() >= 0 and x.max() <= 1
    assert abs(x.double().mean() - 0.5) < 0.03
    z = torch.randn(4000, device=pjrt, dtype=dtype).cpu().double()
    assert abs(z.mean()) < 0.06 and abs(z.std() - 1) < 0.06


@pytest.mark.parametrize(
    "dtype,high", [(torch.uint8, 256), (torch.int32, 2**31), (torch.bool, 2), (torch.float32, 2**24 + 1)]
)
def test_random_fills_the_dtype_range(pjrt, dtype, high):
    x = torch.empty(5000, dtype=dtype, device=pjrt).random_().cpu()
    assert x.dtype == dtype
    values = x.double()
    assert values.min() >= 0 and values.max() < high
    assert values.max() >= (high - 1) * 0.9  # spread over the range, not stuck low
    y = torch.empty(100, dtype=dtype, device=pjrt).random_(0, 2).cpu().double()
    assert set(y.unique().tolist()) == {0.0, 1.0}


def test_random_writes_through_views(pjrt):
    base = torch.zeros(6, 8, device=pjrt)
    base[:, ::2].uniform_(5, 6)
    cpu = base.cpu()
    assert ((cpu[:, ::2] >= 5) & (cpu[:, ::2] < 6)).all()
    assert (cpu[:, 1::2] == 0).all()


def test_bad_arguments_raise_pytorchs_errors(pjrt):
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0"):
        torch.empty(3, device=pjrt).normal_(0, -1)
    with pytest.raises(RuntimeError, match=r"uniform_ expects to return a \[from, to\) range"):
        torch.empty(3, device=pjrt).uniform_(2, 1)
    with pytest.raises(RuntimeError, match="random_ expects 'from' to be less than 'to'"):
        torch.empty(3, device=pjrt).random_(5, 5)
    with pytest.raises(NotImplementedError, match="check_uniform_bounds"):
        torch.empty(3, dtype=torch.int64, device=pjrt).uniform_()
    assert torch.rand(2, device=pjrt).cpu().shape == (2,)


@pytest.mark.parametrize("mode", MODES)
def test_dropout_forward_and_backward(pjrt, mode):
    with torch_pjrt.eager_mode(mode):
        torch.manual_seed(5)
        x = torch.randn(200, 50).to(pjrt).requires_grad_()
        y = torch.nn.functional.dropout(x, p=0.4, training=True)
        y.sum().backward()
        out, grad, xc = y.detach().cpu(), x.grad.cpu(), x.detach().cpu()
    kept = out != 0
    assert abs(kept.float().mean() - 0.6) < 0.02
    torch.testing.assert_close(out[kept], xc[kept] / 0.6)
    # The gradient is the mask times the scale.
    torch.testing.assert_close(grad, kept.float() / 0.6)
    evaluated = torch.nn.functional.dropout(x.detach(), p=0.4, training=False).cpu()
    torch.testing.assert_close(evaluated, xc, rtol=0, atol=0)
    assert torch_pjrt.metrics()["fallback_ops"] == {}


@pytest.mark.parametrize("mode", MODES)
def test_rrelu_draws_slopes_in_training(pjrt, mode):
    with torch_pjrt.eager_mode(mode):
        torch.manual_seed(6)
        x = torch.randn(4000).to(pjrt).requires_grad_()
        y = torch.nn.functional.rrelu(x, 0.1, 0.3, training=True)
        y.backward(torch.ones(4000, device=pjrt))
        out, grad, xc = y.detach().cpu(), x.grad.cpu(), x.detach().cpu()
        inplace = xc.to(pjrt)
        torch.nn.functional.rrelu_(inplace, 0.1, 0.3, training=True)
        inplace = inplace.cpu()
    scaled = xc <= 0
    slopes = out[scaled] / xc[scaled]
    # Uniform on [0.1, 0.3]: mean 0.2, variance 0.04 / 12.
    assert slopes.min() >= 0.1 - 1e-6 and slopes.max() <= 0.3 + 1e-6
    assert abs(slopes.mean() - 0.2) < 0.01 and abs(slopes.var() - 0.04 / 12) < 0.001
    torch.testing.assert_close(out[~scaled], xc[~scaled], rtol=0, atol=0)
    # The gradient is the drawn slope (1 elsewhere).
    torch.testing.assert_close(grad[scaled], slopes)
    torch.testing.assert_close(grad[~scaled], torch.ones(int((~scaled).sum())))
    assert bool(((inplace[scaled] / xc[scaled]) >= 0.1 - 1e-6).all())
    # Evaluation is leaky_relu with the mean slope.
    evaluated = torch.nn.functional.rrelu(x.detach(), 0.1, 0.3, training=False).cpu()
    torch.testing.assert_close(evaluated, torch.nn.functional.leaky_relu(xc, 0.2))
    assert torch_pjrt.metrics()["fallback_ops"] == {}


def test_draws_never_recompile(pjrt):
    with torch_pjrt.eager_mode("defer_and_fuse"):
        for _ in range(3):
            (torch.rand(32, device=pjrt) * torch.randn(32, device=pjrt)).sum().item()
        before = torch_pjrt.metrics()["compilations"]
        for _ in range(20):
            (torch.rand(32, device=pjrt) * torch.randn(32, device=pjrt)).sum().item()
        assert torch_pjrt.metrics()["compilations"] == before
