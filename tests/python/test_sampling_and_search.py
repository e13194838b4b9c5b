"""Ops pjrt runs natively instead of falling back to the CPU: erfc, erfinv, lgamma and digamma,
and special.i1e, i1, i0e (with i0 and modified_bessel_i0), modified_bessel_i1, spherical_bessel_j0, erfcx, log_ndtr, ndtri, zeta, entr and xlog1py, and nextafter; the
scans cumprod and logcumsumexp; the distributions exponential_, geometric_, log_normal_ and
cauchy_ and multinomial; searchsorted and bucketize; signbit, copysign, logit, sinc, heaviside,
count_nonzero, aminmax, linalg.cross, isposinf and isneginf. Values (and gradients where PyTorch has them) against
the CPU in every eager mode, the random ones statistically and by seed; CPU-like errors. Nothing
may fall back to the CPU (the `mode` fixture checks)."""

import math

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import assert_close, check_against_cpu as check, seeded

inf, nan = math.inf, math.nan
FLOATS = [torch.float32, torch.float64]


# ---- special functions -------------------------------------------------------------------------

ERFINV_X = torch.tensor([-1.0, -0.999, -0.5, 0.0, -0.0, 0.3, 0.999999, 1.0, 1.5, nan, inf, -inf])
# erfc's tail, where 1 - erf(x) cancels to zero in float32 long before erfc underflows.
ERFC_X = torch.tensor([-inf, -30.0, -3.0, -1.0, -0.0, 0.0, 1e-8, 0.5, 2.0, 5.0, 9.0, 10.5, 27.0, 30.0, inf, nan])
GAMMA_X = torch.tensor(
    [-3.0, -2.5, -1.0, -0.0, 0.0, 1e-8, 0.5, 1.0, 2.0, 3.7, 10.0, 170.0, 1e20, inf, -inf, nan])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "name,x", [("erfc", ERFC_X), ("erfinv", ERFINV_X), ("lgamma", GAMMA_X), ("digamma", GAMMA_X)]
)
def test_special_functions_match_the_cpu_at_their_edges(mode, name, x, dtype):
    fn = getattr(torch, name)
    x = x.to(dtype)
    rtol = 1e-5 if dtype == torch.float32 else 1e-10
    assert_close(fn(x.to("pjrt")), fn(x), rtol=rtol, atol=1e-6)
    # In-place and out= forms; integers become floats.
    y = x.to("pjrt")
    getattr(y, name + "_")()
    assert_close(y, fn(x), rtol=rtol, atol=1e-6)
    out = torch.empty(0, dtype=dtype, device="pjrt")
    fn(x.to("pjrt"), out=out)
    assert_close(out, fn(x), rtol=rtol, atol=1e-6)
    ints = torch.tensor([1, 2, 5, 0])
    if name == "erfinv":
        ints = torch.tensor([0, 1, -1, 0])
    assert_close(fn(ints.to("pjrt")), fn(ints), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", FLOATS)
def test_erfc_keeps_its_relative_precision_in_the_tail(mode, dtype):
    # Up to where float32's result turns subnormal (XLA flushes subnormals to zero).
    x = torch.tensor([1.0, 2.0, 5.0, 7.5, 9.0], dtype=dtype)
    assert_close(torch.erfc(x.to("pjrt")), torch.erfc(x), rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0)


def test_special_function_gradients(mode):
    x = torch.rand(20, generator=seeded(1)) * 1.8 - 0.9
    check(torch.erfinv, [x])
    check(torch.erfc, [x * 3])
    check(torch.lgamma, [x.abs() * 5 + 0.1])
    # digamma's gradient is polygamma(1, x), reflected below zero.
    check(torch.digamma, [x * 4], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["isposinf", "isneginf"])
def test_signed_infinity_tests_match_the_cpu(mode, name):
    fn = getattr(torch, name)
    for dtype in [torch.float32, torch.float64, torch.bfloat16, torch.float16]:
        x = torch.tensor([inf, -inf, nan, 0.0, -1.0, 3.0e38 if dtype == torch.float32 else 1.0]).to(dtype)
        assert_close(fn(x.to("pjrt")), fn(x))
        out = torch.empty(0, dtype=torch.bool, device="pjrt")
        fn(x.to("pjrt"), out=out)
        assert_close(out, fn(x))
    # An integer or bool tensor holds no infinity.
    for ints in [torch.tensor([1, -2, 0]), torch.tensor([True, False])]:
        assert_close(fn(ints.to("pjrt")), fn(ints))
    z = torch.tensor([1 + 1j])
    with pytest.raises(RuntimeError, match=f"{name} does not support complex inputs"):
        fn(z)
    with pytest.raises(RuntimeError, match=f"{name} does not support complex inputs"):
        fn(z.to("pjrt"))


# Around zero, the overflow of exp(|x|) for float32 (88.7), large values, both infinities, NaN.
BESSEL_X = torch.tensor(
    [-inf, -100.0, -20.0, -3.0, -1.0, -1e-8, -0.0, 0.0, 1e-8, 0.5, 1.0, 3.0, 20.0, 85.0, 89.0, 100.0, inf, nan])


def _close_with_nans(actual, expected, dtype):
    assert_close(actual, expected, rtol=1e-5 if dtype == torch.float32 else 1e-10, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", ["i1e", "i1", "i0e", "i0", "entr"])
def test_special_unary_functions_match_the_cpu(mode, name, dtype):
    fn = getattr(torch.special, name)
    x = BESSEL_X.to(dtype)
    _close_with_nans(fn(x.to("pjrt")), fn(x), dtype)
    out = torch.empty(0, dtype=dtype, device="pjrt")
    fn(x.to("pjrt"), out=out)
    _close_with_nans(out, fn(x), dtype)
    # Integers compute in the default float dtype; a reduced float rounds once.
    ints = torch.tensor([0, 1, -3, 7])
    assert_close(fn(ints.to("pjrt")), fn(ints), rtol=1e-5, atol=0)
    half = torch.tensor([0.5, -2.0, 6.0], dtype=torch.bfloat16)
    assert_close(fn(half.to("pjrt")), fn(half))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["modified_bessel_i1", "spherical_bessel_j0"])
def test_float_only_special_functions(mode, name, dtype):
    # Float32 and float64 (integers promoted), as PyTorch's CPU and CUDA kernels; reduced floats
    # refuse as theirs do. spherical_bessel_j0 switches from its series to sin(x)/x at 1/2.
    fn = getattr(torch.special, name)
    x = torch.cat([BESSEL_X, torch.tensor([0.49, 0.51, -0.3, 1e-20, 25.0, inf, -inf])]).to(dtype)
    _close_with_nans(fn(x.to("pjrt")), fn(x), dtype)
    out = torch.empty(0, dtype=dtype, device="pjrt")
    fn(x.to("pjrt"), out=out)
    _close_with_nans(out, fn(x), dtype)
    ints = torch.tensor([0, 1, -3, 7])
    assert_close(fn(ints.to("pjrt")), fn(ints), rtol=1e-5, atol=0)
    with pytest.raises(NotImplementedError, match="not implemented for 'BFloat16'"):
        fn(torch.ones(2, dtype=torch.bfloat16, device="pjrt"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normal_distribution_tails(mode, dtype):
    # erfcx across its switch to the asymptotic series at 10, log_ndtr on both sides of zero and
    # far into the lower tail (where ndtr itself underflows), ndtri from the deep tail to 1.
    x = torch.tensor([-40.0, -10.0, -1.0, -1e-3, 0.0, 0.3, 1.0, 5.0, 9.9, 10.1, 30.0, 1e5, inf, -inf, nan], dtype=dtype)
    for fn in [torch.special.erfcx, torch.special.log_ndtr]:
        _close_with_nans(fn(x.to("pjrt")), fn(x), dtype)
    p = torch.tensor([0.0, 1e-30, 1e-20, 1e-5, 0.01, 0.3, 0.5, 0.7, 0.99, 1 - 1e-6, 1.0, 1.5, -0.1, nan], dtype=dtype)
    if dtype == torch.float64:
        p = torch.cat([p, torch.tensor([1e-300, 1 - 1e-12], dtype=dtype)])
    torch.testing.assert_close(torch.special.ndtri(p.to("pjrt")).cpu(), torch.special.ndtri(p), equal_nan=True,
                               rtol=1e-6 if dtype == torch.float32 else 1e-10, atol=0)
    ints = torch.tensor([0, 1, -3])
    assert_close(torch.special.erfcx(ints.to("pjrt")), torch.special.erfcx(ints), rtol=1e-6, atol=0)
    with pytest.raises(NotImplementedError, match="not implemented for 'BFloat16'"):
        torch.special.ndtri(torch.ones(2, dtype=torch.bfloat16, device="pjrt"))


# zeta: poles (x = 1), x < 1, q at and below zero, integer and not, and x = +inf
ZETA_X = torch.tensor(
    [1.0, 1.5, 2.0, 3.0, 10.0, 50.0, 0.5, 2.0, 2.0, 4.0, 3.0, 3.0, 0.5, nan, inf, inf, inf, inf, nan, 2.0,
     0.0, 0.0, 1.0, -1.0])
ZETA_Q = torch.tensor(
    [1.0, 1.0, 2.0, 0.5, 3.0, 1.0, 1.0, -1.5, -2.0, 0.0, 1e-3, -3.0, -2.0, -2.0, 0.5, 1.0, 2.0, -1.0, 1.0, nan,
     0.0, 1.0, 0.0, -2.0])
# nextafter: signed zeros, both directions, infinities, NaN, the smallest subnormal, the largest
NEXT_A = torch.tensor([0.0, -0.0, 1.0, 1.0, 1.0, inf, -inf, nan, 1.0, 3.0e38, -2.5])
NEXT_B = torch.tensor([1.0, 1.0, 2.0, 0.0, 1.0, 0.0, 0.0, 1.0, nan, inf, -inf])


@pytest.mark.parametrize("dtype", FLOATS)
def test_special_binary_functions_match_the_cpu(mode, dtype):
    x, q = ZETA_X.to(dtype), ZETA_Q.to(dtype)
    _close_with_nans(torch.special.zeta(x.to("pjrt"), q.to("pjrt")), torch.special.zeta(x, q), dtype)
    # A Python number for either operand (the scalar overloads).
    _close_with_nans(torch.special.zeta(x.to("pjrt"), 2.0), torch.special.zeta(x, 2.0), dtype)
    _close_with_nans(torch.special.zeta(3.0, q.to("pjrt")), torch.special.zeta(3.0, q), dtype)
    a, b = NEXT_A.to(dtype), NEXT_B.to(dtype)
    expected = torch.nextafter(a, b)
    # Exact: one step of the float's bits.
    assert_close(torch.nextafter(a.to("pjrt"), b.to("pjrt")), expected, rtol=0, atol=0, equal_nan=True)
    y = a.to("pjrt")
    y.nextafter_(b.to("pjrt"))
    assert_close(y, expected, rtol=0, atol=0, equal_nan=True)
    # xlog1py: 0 where x is 0 unless y is NaN; y = -1 gives -inf times x.
    xs = torch.tensor([0.0, 1.0, -2.0, 0.0, 0.0, 3.0, 0.0, 2.0, 0.0], dtype=dtype)
    ys = torch.tensor([-inf, -1.0, -0.5, 0.0, 1e-8, 1.0, 3.0, inf, nan], dtype=dtype)
    _close_with_nans(torch.special.xlog1py(xs.to("pjrt"), ys.to("pjrt")), torch.special.xlog1py(xs, ys), dtype)
    _close_with_nans(torch.special.xlog1py(2.0, ys.to("pjrt")), torch.special.xlog1py(2.0, ys), dtype)
    _close_with_nans(torch.special.xlog1py(xs.to("pjrt"), 0.5), torch.special.xlog1py(xs, 0.5), dtype)


def test_nextafter_refuses_integers_as_the_cpu_does(mode):
    ints = torch.tensor([1, 2])
    with pytest.raises(RuntimeError, match="not implemented for 'Long'"):
        torch.nextafter(ints, ints)
    with pytest.raises(RuntimeError, match="not implemented for 'Long'"):
        torch.nextafter(ints.to("pjrt"), ints.to("pjrt"))


# ---- scans -------------------------------------------------------------------------------------

def scan_input(dtype):
    r = torch.randn(4, 7, generator=seeded(2), dtype=dtype)
    r[1, 3] = 0.0
    r[2, 2] = nan
    r[3, 0] = -inf
    return r


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumprod_and_logcumsumexp_match_the_cpu(mode, dtype, dim):
    r = scan_input(dtype)
    for fn in (lambda t: t.cumprod(dim), lambda t: t.logcumsumexp(dim)):
        assert_close(fn(r.to("pjrt")), fn(r), rtol=1e-5, atol=1e-6)


def test_scans_edge_cases(mode):
    ints = torch.arange(1, 8)
    assert torch.equal(ints.to("pjrt").cumprod(0).cpu(), ints.cumprod(0))
    assert_close(ints.to("pjrt").cumprod(0, dtype=torch.float64), ints.cumprod(0, dtype=torch.float64))
    infs = torch.tensor([[-inf, -inf, 1.0, inf, 2.0, nan, 3.0]])
    assert_close(infs.to("pjrt").logcumsumexp(1), infs.logcumsumexp(1))
    big = torch.tensor([1000.0, 1000.0, -1000.0])
    assert_close(big.to("pjrt").logcumsumexp(0), big.logcumsumexp(0))
    scalar = torch.tensor(2.5)
    assert_close(scalar.to("pjrt").cumprod(0), scalar.cumprod(0))
    empty = torch.empty(0, 3)
    assert empty.to("pjrt").logcumsumexp(0).shape == (0, 3)
    out = torch.empty(0, device="pjrt")
    torch.cumprod(ints.float().to("pjrt"), 0, out=out)
    assert_close(out, ints.float().cumprod(0))
    with pytest.raises(RuntimeError, match="logcumsumexp_out_cpu.* not implemented for 'Long'"):
        ints.to("pjrt").logcumsumexp(0)
    torch.pjrt.synchronize()


def test_scan_gradients(mode):
    x = torch.rand(4, 6, generator=seeded(3)) + 0.5
    check(lambda t: t.cumprod(1), [x])
    check(lambda t: t.logcumsumexp(0), [x])


# ---- distributions -----------------------------------------------------------------------------

N = 200_000


def draw(fill):
    t = torch.empty(N, device="pjrt")
    fill(t)
    return t.cpu().double()


def test_exponential_geometric_log_normal_and_cauchy_follow_their_laws(mode):
    e = draw(lambda t: t.exponential_(2.0))
    assert e.min() > 0 and abs(e.mean() - 0.5) < 0.01 and abs(e.var() - 0.25) < 0.01
    g = draw(lambda t: t.geometric_(0.25))
    assert g.min() >= 1 and torch.equal(g, g.round()) and abs(g.mean() - 4.0) < 0.05
    assert abs((g == 1).double().mean() - 0.25) < 0.01
    ln = draw(lambda t: t.log_normal_(0.5, 0.3)).log()
    assert abs(ln.mean() - 0.5) < 0.01 and abs(ln.std() - 0.3) < 0.01
    c = draw(lambda t: t.cauchy_(1.0, 2.0))
    q = torch.quantile(c[:100_000].float(), torch.tensor([0.25, 0.5, 0.75])).double()
    assert torch.allclose(q, torch.tensor([-1.0, 1.0, 3.0], dtype=torch.float64), atol=0.1), q
    # Half precision draws too.
    h = torch.empty(1000, dtype=torch.bfloat16, device="pjrt").exponential_()
    assert (h.cpu() > 0).all()


def test_distributions_follow_the_seed_and_check_their_parameters(mode):
    def sample():
        torch.manual_seed(5)
        t = torch.empty(64, device="pjrt")
        return torch.cat([t.clone().exponential_(), t.clone().geometric_(0.5),
                          t.clone().log_normal_(), t.clone().cauchy_()]).cpu()

    assert torch.equal(sample(), sample())
    t = torch.empty(4, device="pjrt")
    with pytest.raises(RuntimeError, match="exponential_ expects lambda > 0.0"):
        t.exponential_(0.0)
    with pytest.raises(RuntimeError, match=r"geometric_ expects p to be in \(0, 1\)"):
        t.geometric_(1.5)
    with pytest.raises(RuntimeError, match="log_normal_ expects std > 0.0"):
        t.log_normal_(0.0, -1.0)
    with pytest.raises(RuntimeError, match="cauchy_ expects sigma > 0.0"):
        t.cauchy_(0.0, 0.0)
    with pytest.raises(NotImplementedError, match="exponential_ not implemented for 'Long'"):
        torch.empty(4, dtype=torch.long, device="pjrt").exponential_()
    torch.pjrt.synchronize()


PROBS = torch.tensor([[0.1, 0.0, 0.4, 0.2, 0.3], [0.0, 0.0, 1.0, 0.0, 0.0], [5.0, 0.0, 5.0, 0.0, 10.0]])


def test_multinomial_without_replacement_draws_distinct_possible_categories(mode):
    p = PROBS.to("pjrt")
    for _ in range(20):
        one = torch.multinomial(p, 1)
        assert one.shape == (3, 1) and one.dtype == torch.long
        s = torch.multinomial(p[[0, 2]], 3).cpu()
        for row, probs in zip(s, PROBS[[0, 2]]):
            assert len(set(row.tolist())) == 3
            assert (probs[row] > 0).all(), (row, probs)
        assert one.cpu()[1].item() == 2
    # A 1-d distribution, and the first pick follows the probabilities.
    firsts = torch.stack([torch.multinomial(PROBS[0].to("pjrt"), 2)[0] for _ in range(1)])
    assert firsts.dim() == 1
    counts = torch.bincount(torch.multinomial(PROBS[0].expand(4000, 5).to("pjrt"), 1).view(-1).cpu(),
                            minlength=5).double() / 4000
    assert torch.allclose(counts, PROBS[0].double(), atol=0.03), counts


def test_multinomial_with_replacement_follows_the_probabilities(mode):
    p = PROBS.to("pjrt")
    s = torch.multinomial(p, 20_000, replacement=True).cpu()
    assert s.shape == (3, 20_000)
    for row, probs in zip(s, PROBS):
        freq = torch.bincount(row, minlength=5).double() / row.numel()
        assert torch.allclose(freq, (probs / probs.sum()).double(), atol=0.015), (freq, probs)
    out = torch.empty(0, dtype=torch.long, device="pjrt")
    torch.multinomial(p, 4, replacement=True, out=out)
    assert out.shape == (3, 4)
    torch.manual_seed(9)
    a = torch.multinomial(p, 8, replacement=True).cpu()
    torch.manual_seed(9)
    b = torch.multinomial(p, 8, replacement=True).cpu()
    assert torch.equal(a, b)


def test_multinomial_refuses_what_the_cpu_refuses(mode):
    with pytest.raises(RuntimeError, match="probability tensor contains either `inf`, `nan` or element < 0"):
        torch.multinomial(torch.tensor([0.5, -0.1, 0.6], device="pjrt"), 1)
    with pytest.raises(RuntimeError, match=r"invalid multinomial distribution \(sum of probabilities <= 0\)"):
        torch.multinomial(torch.tensor([[0.5, 0.5], [0.0, 0.0]], device="pjrt"), 1)
    with pytest.raises(RuntimeError, match="cannot sample n_sample > prob_dist.size"):
        torch.multinomial(torch.tensor([0.5, 0.5], device="pjrt"), 3)
    with pytest.raises(RuntimeError, match="prob_dist must be 1 or 2 dim"):
        torch.multinomial(torch.ones(2, 2, 2, device="pjrt"), 1)
    # The engine stays usable.
    assert torch.multinomial(torch.tensor([0.0, 1.0], device="pjrt"), 1).item() == 1


def test_sampling_the_next_token_from_logits(mode):
    # What a language model's generation loop does.
    torch.manual_seed(3)
    logits = torch.randn(2, 50, generator=seeded(4)).to("pjrt")
    tokens = []
    for _ in range(5):
        probs = F.softmax(logits / 0.8, dim=-1)
        nxt = torch.multinomial(probs, num_samples=1)
        tokens.append(nxt)
        logits = logits + F.one_hot(nxt.view(-1), 50).float()
    assert torch.cat(tokens, 1).shape == (2, 5)


# ---- searching sorted sequences ----------------------------------------------------------------

SEQ = torch.tensor([0.0, 1.0, 1.0, 2.5, 4.0, 4.0, 7.0])
VALUES = torch.tensor([[-1.0, 0.0, 1.0, 1.5], [4.0, 7.0, 9.0, nan]])


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("out_int32", [False, True])
def test_searchsorted_and_bucketize_match_the_cpu(mode, right, out_int32):
    for seq, values in [(SEQ, VALUES), (torch.arange(12).view(2, 6) * 2, torch.tensor([[3, 4, 13], [0, 15, 22]]))]:
        expected = torch.searchsorted(seq, values, right=right, out_int32=out_int32)
        actual = torch.searchsorted(seq.to("pjrt"), values.to("pjrt"), right=right, out_int32=out_int32)
        assert actual.dtype == expected.dtype
        assert torch.equal(actual.cpu(), expected), (actual.cpu(), expected)
    side = "right" if right else "left"
    assert torch.equal(torch.searchsorted(SEQ.to("pjrt"), VALUES.to("pjrt"), side=side).cpu(),
                       torch.searchsorted(SEQ, VALUES, side=side))
    assert torch.equal(torch.bucketize(VALUES.to("pjrt"), SEQ.to("pjrt"), right=right, out_int32=out_int32).cpu(),
                       torch.bucketize(VALUES, SEQ, right=right, out_int32=out_int32))
    assert torch.searchsorted(SEQ.to("pjrt"), 2.0, right=right).item() == torch.searchsorted(SEQ, 2.0, right=right).item()


def test_searchsorted_with_a_sorter_and_its_errors(mode):
    unsorted = torch.tensor([4.0, 0.0, 7.0, 1.0, 2.5])
    sorter = torch.argsort(unsorted)
    v = torch.tensor([0.5, 3.0, 8.0])
    assert torch.equal(torch.searchsorted(unsorted.to("pjrt"), v.to("pjrt"), sorter=sorter.to("pjrt")).cpu(),
                       torch.searchsorted(unsorted, v, sorter=sorter))
    out = torch.empty(0, dtype=torch.long, device="pjrt")
    torch.bucketize(v.to("pjrt"), SEQ.to("pjrt"), out=out)
    assert torch.equal(out.cpu(), torch.bucketize(v, SEQ))
    with pytest.raises(RuntimeError, match="side and right can't be set to opposites"):
        torch.searchsorted(SEQ.to("pjrt"), v.to("pjrt"), right=True, side="left")
    with pytest.raises(RuntimeError, match="first N-1 dimensions of boundaries tensor and input value tensor must match"):
        torch.searchsorted(torch.zeros(3, 4, device="pjrt"), torch.zeros(2, 4, device="pjrt"))
    torch.pjrt.synchronize()


# ---- small elementwise ops, reductions and products --------------------------------------------

SIGNED = torch.tensor([-2.5, -0.0, 0.0, 0.3, inf, -inf, 7.0, -1e-30])


def test_signbit_copysign_logit_sinc_heaviside(mode):
    assert torch.equal(torch.signbit(SIGNED.to("pjrt")).cpu(), torch.signbit(SIGNED))
    ints = torch.tensor([-3, 0, 4])
    assert torch.equal(torch.signbit(ints.to("pjrt")).cpu(), torch.signbit(ints))
    mag = torch.tensor([1.0, 2.0, -3.0, 4.0, nan, 5.0, 0.0, -6.0])
    assert_close(torch.copysign(mag.to("pjrt"), SIGNED.to("pjrt")), torch.copysign(mag, SIGNED))
    assert_close(torch.copysign(ints.to("pjrt"), -1.0), torch.copysign(ints, -1.0))
    assert_close(torch.copysign(mag.to("pjrt"), -0.0), torch.copysign(mag, -0.0))
    y = mag.to("pjrt")
    y.copysign_(SIGNED.to("pjrt"))
    assert_close(y, torch.copysign(mag, SIGNED))
    p = torch.tensor([0.0, 0.01, 0.3, 0.5, 0.99, 1.0])
    for eps in (None, 0.05):
        assert_close(torch.logit(p.to("pjrt"), eps), torch.logit(p, eps))
    s = torch.tensor([0.0, 0.5, -1.0, 2.25, 1e-8])
    assert_close(torch.sinc(s.to("pjrt")), torch.sinc(s))
    assert_close(torch.sinc(ints.to("pjrt")), torch.sinc(ints))
    h = torch.tensor([-1.5, 0.0, 2.0, nan])
    vals = torch.tensor([0.5, 0.5, 0.5, 0.5])
    assert_close(torch.heaviside(h.to("pjrt"), vals.to("pjrt")), torch.heaviside(h, vals))
    assert_close(torch.heaviside(h.to("pjrt"), torch.tensor(0.25)), torch.heaviside(h, torch.tensor(0.25)))
    with pytest.raises(RuntimeError, match="heaviside is not yet implemented for tensors with different dtypes"):
        torch.heaviside(h.to("pjrt"), torch.tensor([1, 2, 3, 4], device="pjrt"))
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
        ints.to("pjrt").copysign_(-1.0)
    torch.pjrt.synchronize()


def test_logit_gradient(mode):
    p = torch.rand(12, generator=seeded(6)) * 0.98 + 0.01
    check(torch.logit, [p])
    check(lambda t: torch.logit(t, 0.1), [p])


def test_count_nonzero_aminmax_and_cross(mode):
    x = torch.randn(4, 5, generator=seeded(8)).relu()
    for dims in (None, 0, (0, 1), -1):
        assert torch.equal(torch.count_nonzero(x.to("pjrt"), dims).cpu(), torch.count_nonzero(x, dims))
    for kw in ({}, {"dim": 1}, {"dim": 0, "keepdim": True}, {"keepdim": True}):
        lo, hi = torch.aminmax(x.to("pjrt"), **kw)
        elo, ehi = torch.aminmax(x, **kw)
        assert torch.equal(lo.cpu(), elo) and torch.equal(hi.cpu(), ehi), kw
    lo, hi = torch.empty(0, device="pjrt"), torch.empty(0, device="pjrt")
    torch.aminmax(x.to("pjrt"), dim=1, out=(lo, hi))
    assert torch.equal(lo.cpu(), x.amin(1)) and torch.equal(hi.cpu(), x.amax(1))
    with pytest.raises(RuntimeError, match="cannot compute aminmax over an empty dimension"):
        torch.aminmax(torch.empty(0, device="pjrt"))
    a = torch.randn(4, 3, generator=seeded(9))
    b = torch.randn(1, 3, generator=seeded(10))
    assert_close(torch.linalg.cross(a.to("pjrt"), b.to("pjrt")), torch.linalg.cross(a, b))
    assert_close(torch.linalg.cross(a.T.to("pjrt"), b.T.expand(3, 4).to("pjrt"), dim=0),
                 torch.linalg.cross(a.T, b.T.expand(3, 4), dim=0))
    ia, ib = torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5, 6]])
    assert torch.equal(torch.cross(ia.to("pjrt"), ib.to("pjrt"), dim=1).cpu(), torch.cross(ia, ib, dim=1))
    check(lambda u, v: torch.linalg.cross(u, v), [a, b.expand(4, 3).contiguous()], grads_of=(0, 1))
    with pytest.raises(RuntimeError, match="must have length 3"):
        torch.linalg.cross(torch.zeros(2, 4, device="pjrt"), torch.zeros(2, 4, device="pjrt"))
    torch.pjrt.synchronize()


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, 3.0, inf, 0.5])
def test_cdist_and_its_gradient_match_the_cpu(mode, p):
    a = torch.randn(2, 5, 3, generator=seeded(11))
    b = torch.randn(2, 4, 3, generator=seeded(12))
    b[0, 0] = a[0, 0]  # a zero distance, where the gradient's formula divides by zero
    check(lambda u, v: torch.cdist(u, v, p), [a, b], grads_of=(0, 1), rtol=1e-4, atol=1e-5)
    # Broadcast batch dims.
    c = torch.randn(1, 6, 3, generator=seeded(13))
    assert_close(torch.cdist(a.to("pjrt"), c.to("pjrt"), p), torch.cdist(a, c, p), rtol=1e-5, atol=1e-5)


def test_cdist_refuses_what_the_cpu_refuses(mode):
    with pytest.raises(RuntimeError, match="cdist only supports non-negative p values"):
        torch.cdist(torch.zeros(2, 3, device="pjrt"), torch.zeros(2, 3, device="pjrt"), -1.0)
    with pytest.raises(RuntimeError, match="X1 and X2 must have the same number of columns"):
        torch.cdist(torch.zeros(2, 3, device="pjrt"), torch.zeros(2, 4, device="pjrt"))
    torch.pjrt.synchronize()


def test_i0_across_its_series_and_expansion_and_as_i1s_gradient(mode):
    # Both sides of |x| = 20, where the series gives way to the asymptotic expansion, one
    # element alone (XLA once folded the series' constants into an underflow there), and i1's
    # gradient, which reads i0.
    x = torch.tensor([-30.0, -20.5, -19.5, -8.3, 0.0, 5.0, 19.99, 20.01, 60.0], dtype=torch.float64)
    for fn in [torch.i0, torch.special.i0e, torch.special.modified_bessel_i0]:
        assert_close(fn(x.to("pjrt")), fn(x), rtol=1e-13, atol=0)
        assert_close(fn(x[3:4].float().to("pjrt")), fn(x[3:4].float()), rtol=1e-6, atol=0)
    check(torch.special.i1, (x[2:8],), rtol=1e-10, atol=1e-10)
    check(torch.special.i0e, (x[2:8],), rtol=1e-10, atol=1e-10)
