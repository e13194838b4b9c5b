"""Long-tail ops composed on the device as rows of `csrc/hand_written_kernels.py`: `nansum`,
`nanmedian`, `take` and `put_` (so `put` and `take`'s gradient), `addbmm`, `renorm`, `polygamma` of every order,
`max_unpool2d`/`max_unpool3d`, `mode`, `frexp`, `pdist`, `unique_consecutive`, `nonzero_static`, `histogram`, `histogramdd` and fractional max pooling, with the in-place and
`out=` forms the generator derives. Values and gradients against the CPU in every eager mode,
and the CPU's errors. Nothing may fall back to the CPU (the `mode` fixture checks)."""

import math

import pytest
import torch
import torch.nn.functional as F
import torch_pjrt

from conftest import assert_close, check_against_cpu as check, seeded

nan, inf = math.nan, math.inf


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=seeded(seed))


NAN_MATRIX = torch.tensor([[1.0, nan, 3.0, -inf], [nan, nan, 2.0, 0.5], [0.0, -1.0, nan, 4.0]])


@pytest.mark.parametrize(
    "call",
    [
        lambda t: torch.nansum(t),
        lambda t: torch.nansum(t, 1),
        lambda t: torch.nansum(t, (0, 1), keepdim=True),
        lambda t: torch.nansum(t, 0, dtype=torch.float64),
        lambda t: torch.nanmean(t, 1),
    ],
)
def test_nansum_reads_nan_as_zero(mode, call):
    assert_close(call(NAN_MATRIX.to("pjrt")), call(NAN_MATRIX))
    for ints in [torch.tensor([[1, 2], [3, 4]]), torch.tensor([True, False, True])]:
        assert_close(torch.nansum(ints.to("pjrt")), torch.nansum(ints))


def test_nansum_gradient_and_out_form(mode):
    check(lambda t: torch.nansum(t * 2, 1), (NAN_MATRIX.nan_to_num(0.0) + randn(3, 4),))
    out = torch.empty(0, device="pjrt")
    torch.nansum(NAN_MATRIX.to("pjrt"), 0, out=out)
    assert_close(out, torch.nansum(NAN_MATRIX, 0))
    with pytest.raises(RuntimeError, match="nansum does not support complex inputs"):
        torch.nansum(torch.ones(2, dtype=torch.complex64, device="pjrt"))


def test_take_reads_positions_of_the_flattened_tensor(mode):
    src = randn(3, 4)
    index = torch.tensor([[0, -1], [5, 11]])
    assert_close(torch.take(src.to("pjrt"), index.to("pjrt")), torch.take(src, index))
    # A transposed input is read in its logical order; its gradient scatters back.
    assert_close(torch.take(src.t().to("pjrt"), index.to("pjrt")), torch.take(src.t(), index))
    check(lambda t: torch.take(t, index.to(t.device)), (src,))
    empty = torch.tensor([], dtype=torch.long)
    assert_close(torch.take(torch.randn(0).to("pjrt"), empty.to("pjrt")), torch.take(torch.randn(0), empty))


def test_put_writes_and_adds_at_positions(mode):
    index = torch.tensor([1, -1, 4, 1])
    source = torch.tensor([10.0, 20.0, 30.0, 40.0])
    for accumulate in [False, True]:
        # Distinct positions when writing: which of two writes wins is unspecified.
        idx = index if accumulate else index[:3]
        src = source if accumulate else source[:3]
        for base in [randn(2, 3), randn(3, 2).t()]:
            expected = base.clone().put_(idx, src, accumulate)
            actual = base.to("pjrt").put_(idx.to("pjrt"), src.to("pjrt"), accumulate)
            assert_close(actual, expected)
            assert_close(torch.put(base.to("pjrt"), idx.to("pjrt"), src.to("pjrt"), accumulate),
                         torch.put(base, idx, src, accumulate))


@pytest.mark.parametrize(
    "call",
    [
        lambda t, i, s: torch.take(t, i.to(torch.int32)),
        lambda t, i, s: t.put_(i, s[:2]),
        lambda t, i, s: t.put_(i, s.double()),
        lambda t, i, s: torch.renorm(t, 2, 0, -1.0),
        lambda t, i, s: torch.renorm(t[0], 2, 0, 1.0),
        lambda t, i, s: torch.renorm(t, 0, 0, 1.0),
    ],
)
def test_errors_are_the_cpus(mode, call):
    args = (randn(3, 4), torch.tensor([0, 5, 7]), torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(Exception) as on_cpu:
        call(*args)
    with pytest.raises(Exception) as on_pjrt:
        call(*(a.to("pjrt") for a in args))
    assert on_pjrt.type is on_cpu.type
    assert str(on_pjrt.value).splitlines()[0] == str(on_cpu.value).splitlines()[0]


def test_an_index_out_of_range_raises(mode):
    with pytest.raises((IndexError, RuntimeError), match="out of"):
        torch.take(randn(2, 3).to("pjrt"), torch.tensor([6]).to("pjrt")).cpu()


def test_addbmm_sums_the_batch_products(mode):
    b1, b2, m = randn(5, 3, 4, seed=1), randn(5, 4, 2, seed=2), randn(3, 2, seed=3)
    check(lambda m, a, b: torch.addbmm(m, a, b, beta=0.5, alpha=2.0), (m, b1, b2), grads_of=(0, 1, 2))
    # beta = 0 ignores self, NaNs included; self broadcasts; no batches leaves beta * self.
    assert_close(torch.addbmm(torch.full((3, 2), nan).to("pjrt"), b1.to("pjrt"), b2.to("pjrt"), beta=0),
                 torch.addbmm(torch.full((3, 2), nan), b1, b2, beta=0))
    assert_close(torch.addbmm(randn(2).to("pjrt"), b1.to("pjrt"), b2.to("pjrt")), torch.addbmm(randn(2), b1, b2))
    z1, z2 = torch.randn(0, 3, 4), torch.randn(0, 4, 2)
    assert_close(torch.addbmm(m.to("pjrt"), z1.to("pjrt"), z2.to("pjrt"), beta=3), torch.addbmm(m, z1, z2, beta=3))
    actual = m.to("pjrt").addbmm_(b1.to("pjrt"), b2.to("pjrt"))
    assert_close(actual, m.clone().addbmm_(b1, b2), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="batch1 and batch2 must have same number of batches"):
        torch.addbmm(m.to("pjrt"), b1.to("pjrt"), b2[:4].to("pjrt"))


@pytest.mark.parametrize("p, dim, maxnorm", [(2, 1, 4.0), (1, 0, 2.0), (inf, -1, 1.0), (3.5, 2, 100.0)])
def test_renorm_scales_slices_down_to_maxnorm(mode, p, dim, maxnorm):
    x = randn(4, 3, 5, seed=4) * 3
    check(lambda t: torch.renorm(t, p, dim, maxnorm), (x,))
    half = x.bfloat16()
    assert_close(torch.renorm(half.to("pjrt"), p, dim, maxnorm), torch.renorm(half, p, dim, maxnorm))
    y = x.to("pjrt")
    y.renorm_(p, dim, maxnorm)
    assert_close(y, torch.renorm(x, p, dim, maxnorm), rtol=1e-5, atol=1e-5)


def test_nanmedian_skips_nans(mode):
    # All NaN (NaN, index 0), some NaN, none, ties: the lower median of the numbers, and where.
    x = torch.tensor([[nan, nan, nan], [1.0, nan, 0.0], [3.0, 2.0, 1.0], [5.0, nan, 5.0]])
    for dim, keepdim in [(1, False), (0, True), (-1, True)]:
        values, indices = x.nanmedian(dim, keepdim)
        actual = x.to("pjrt").nanmedian(dim, keepdim)
        assert_close(actual.values, values, equal_nan=True)
        assert_close(actual.indices, indices)
    assert_close(x.to("pjrt").nanmedian(), x.nanmedian())
    assert_close(torch.tensor([]).to("pjrt").nanmedian(), torch.tensor([]).nanmedian(), equal_nan=True)
    assert_close(torch.nanquantile(x.to("pjrt"), 0.5, dim=1), torch.nanquantile(x, 0.5, dim=1), equal_nan=True)
    values, indices = torch.empty(0, device="pjrt"), torch.empty(0, dtype=torch.long, device="pjrt")
    torch.nanmedian(x.to("pjrt"), 1, out=(values, indices))
    assert_close(values, x.nanmedian(1).values, equal_nan=True)
    rows = x[1:]  # with numbers in every row: a NaN result has no gradient to compare
    check(lambda t: t.nanmedian(1).values, (torch.where(rows.isnan(), rows, rows + randn(3, 3)),))
    with pytest.raises(IndexError, match="Expected reduction dim 1 to have non-zero size"):
        torch.zeros(2, 0, device="pjrt").nanmedian(1)


def test_polygamma_of_every_order_on_the_device(mode):
    # Below zero trigamma is reflected (pi^2 / sin^2(pi x) - psi1(1 - x)), as PyTorch's kernel;
    # higher orders reflect through the derivatives of cot(pi x), where PyTorch's Hurwitz zeta
    # sums its series from the negative argument up: the same values.
    x = torch.tensor([-8.4784, -2.5, -1.001, -0.1, 0.3, 2.0, 17.5])
    x64 = torch.linspace(-6.3, 6.3, 41, dtype=torch.float64)
    for n in [0, 1, 2, 3, 4, 7]:
        assert_close(torch.polygamma(n, x.to("pjrt")), torch.polygamma(n, x), rtol=1e-5, atol=1e-5)
        assert_close(torch.polygamma(n, x64.to("pjrt")), torch.polygamma(n, x64), rtol=1e-9, atol=1e-9)
    # The non-positive integers are poles of every order above 1, with the CPU's signs.
    poles = torch.tensor([0.0, -1.0, -3.0])
    for n in [2, 3]:
        assert_close(torch.polygamma(n, poles.to("pjrt")), torch.polygamma(n, poles))
    assert_close(torch.polygamma(1, x.to("pjrt", torch.bfloat16)), torch.polygamma(1, x.bfloat16()))
    assert_close(torch.polygamma(3, x.to("pjrt", torch.bfloat16)), torch.polygamma(3, x.bfloat16()))
    assert_close(torch.polygamma(1, torch.arange(1, 5).to("pjrt")), torch.polygamma(1, torch.arange(1, 5)))
    # The gradient of order n is order n + 1.
    positive = torch.rand(6, generator=seeded(3)) * 4 + 0.2
    for n in [0, 2]:
        check(lambda t: torch.polygamma(n, t), (positive,), rtol=1e-4, atol=1e-4)
    with pytest.raises(RuntimeError, match="does not support negative n"):
        torch.polygamma(-1, x.to("pjrt"))


@pytest.mark.parametrize("dims", [2, 3])
def test_max_unpool_writes_each_value_at_its_index(mode, dims):
    pool, unpool = {2: (F.max_pool2d, F.max_unpool2d), 3: (F.max_pool3d, F.max_unpool3d)}[dims]
    x = randn(2, 3, *([6] * dims), seed=4)
    values, indices = pool(x, 2, return_indices=True)
    assert_close(unpool(values.to("pjrt"), indices.to("pjrt"), 2), unpool(values, indices, 2))
    size = (7,) * dims
    assert_close(unpool(values[0].to("pjrt"), indices[0].to("pjrt"), 2, output_size=size),
                 unpool(values[0], indices[0], 2, output_size=size))
    check(lambda v: unpool(v, indices.to(v.device), 2) * 3, (values,))


def test_max_unpool_keeps_channels_last_and_checks_its_arguments(mode):
    x = randn(1, 4, 4, 4, seed=5).contiguous(memory_format=torch.channels_last)
    values, indices = F.max_pool2d(x, 2, return_indices=True)
    got = F.max_unpool2d(values.to("pjrt"), indices.to("pjrt"), 2)
    expected = F.max_unpool2d(values, indices, 2)
    assert got.stride() == expected.stride()
    assert_close(got, expected)
    with pytest.raises(RuntimeError, match="elements in indices should be type int64"):
        torch.ops.aten.max_unpool2d(values.to("pjrt"), indices.int().to("pjrt"), [4, 4])
    with pytest.raises(RuntimeError, match="Expected shape of indices to be same"):
        torch.ops.aten.max_unpool2d(values.to("pjrt"), indices[:, :, :1].to("pjrt"), [4, 4])


def test_mode_finds_the_smallest_most_frequent_value_and_its_last_index(mode):
    g = seeded(11)
    cases = [torch.randint(0, 4, (6, 9), generator=g).float(), torch.randint(0, 3, (3, 4, 5), generator=g),
             torch.tensor([3.0, 1, 3, 1, 2, 2]), torch.tensor([[1.0, nan, nan, 2]]),
             torch.randint(0, 2, (4, 7), generator=g).bool(), torch.tensor(5.0)]
    for x in cases:
        for dim in range(-1, max(x.dim(), 1)):
            for keepdim in [False, True]:
                values, indices = torch.mode(x.to("pjrt"), dim, keepdim)
                expected = torch.mode(x, dim, keepdim)
                assert_close(values, expected.values, equal_nan=True)
                assert_close(indices, expected.indices)
    values, indices = torch.empty(0, device="pjrt"), torch.empty(0, dtype=torch.long, device="pjrt")
    torch.mode(cases[0].to("pjrt"), 0, out=(values, indices))
    assert_close(values, torch.mode(cases[0], 0).values)
    check(lambda t: t.mode(1).values, (cases[0] + torch.rand(6, 9, generator=g) * 0.01,))
    with pytest.raises(IndexError, match="Expected reduction dim 1 to have non-zero size"):
        torch.zeros(2, 0, device="pjrt").mode(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_frexp_reads_the_bits_exactly(mode, dtype):
    info = torch.finfo(dtype)
    x = torch.cat([
        (torch.randn(200, generator=seeded(4), dtype=torch.float64) * 1000).to(dtype),
        # Subnormals of either sign: XLA's CPU compiler treats them as zero in arithmetic.
        torch.tensor([1.5, -3.0, 0.0, -0.0, info.tiny, info.tiny / 8, -info.tiny / 3, info.max, -info.max,
                      info.eps, 0.5, inf, -inf, nan], dtype=dtype),
    ])
    mantissa, exponent = torch.frexp(x.to("pjrt"))
    expected = torch.frexp(x)
    bits = {torch.float64: torch.int64, torch.float32: torch.int32}.get(dtype, torch.int16)
    assert torch.equal(mantissa.cpu()[:-1].view(bits), expected.mantissa[:-1].view(bits))
    assert mantissa.cpu()[-1].isnan()
    assert_close(exponent, expected.exponent)
    out = (torch.empty(0, dtype=dtype, device="pjrt"), torch.empty(0, dtype=torch.int32, device="pjrt"))
    torch.frexp(x.to("pjrt"), out=out)
    assert_close(out[1], expected.exponent)
    if dtype == torch.float32:
        check(lambda t: torch.frexp(t).mantissa, (x[:50],))
        with pytest.raises(RuntimeError, match="only supports floating-point dtypes"):
            torch.frexp(torch.arange(3, device="pjrt"))


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, inf, 0.5])
def test_pdist_values_and_gradients(mode, p):
    x = torch.randn(6, 3, generator=seeded(8), dtype=torch.float64)
    x[3] = x[1]  # a zero distance: its gradient is zero, as PyTorch's _pdist_backward gives
    check(lambda t: F.pdist(t, p), (x,), rtol=1e-10, atol=1e-10)
    single = torch.randn(1, 3, device="pjrt", requires_grad=True)
    no_pairs = F.pdist(single)
    assert no_pairs.shape == (0,)
    no_pairs.sum().backward()  # still part of the graph, as PyTorch's
    assert_close(single.grad, torch.zeros(1, 3))
    with pytest.raises(NotImplementedError, match="not implemented for 'BFloat16'"):
        F.pdist(x.bfloat16().to("pjrt"), p)
    with pytest.raises(RuntimeError, match="requires contiguous input"):
        torch.ops.aten._pdist_forward(x.to("pjrt").t(), p)


def test_unique_consecutive_runs(mode):
    x = torch.tensor([[1, 1, 2], [1, 1, 2], [3, 3, 3], [1, 1, 2]])
    cases = [(x, None), (x, 0), (x, 1), (x, -1), (torch.zeros(0, 3), None), (torch.zeros(0, 3), 0),
             (torch.tensor([1.0, nan, nan, 2.0, 2.0]), None), (torch.tensor(5), None)]
    for t, dim in cases:
        got = torch.unique_consecutive(t.to("pjrt"), return_inverse=True, return_counts=True, dim=dim)
        expected = torch.unique_consecutive(t, return_inverse=True, return_counts=True, dim=dim)
        for g, e in zip(got, expected):
            assert g.stride() == e.stride()  # along a dim, PyTorch's layout moves the dim back
            assert_close(g, e, equal_nan=True)
    assert_close(torch.unique_consecutive(x.to("pjrt")), torch.unique_consecutive(x))
    # One slice along the dim; and PyTorch's refusal of empty slices.
    single = torch.randn(5, 1, 5, generator=seeded(15))
    for got, expected in zip(torch.unique_consecutive(single.to("pjrt"), return_counts=True, dim=1),
                             torch.unique_consecutive(single, return_counts=True, dim=1)):
        assert_close(got, expected)
    with pytest.raises(RuntimeError, match="There are 0 sized dimensions, and they aren't selected"):
        torch.unique_consecutive(torch.zeros(5, 0, 5, device="pjrt"), dim=0)


def test_nonzero_static_reads_nothing_to_the_host(mode):
    g = seeded(12)
    cases = [(torch.tensor([[0, 1, 0], [2, 0, 3]]), 5, -1), (torch.tensor([[0, 1, 0], [2, 0, 3]]), 2, 7),
             (torch.tensor(3), 2, -1), (torch.zeros(0, 3), 2, -1), (torch.rand(3, 4, 5, generator=g) > 0.6, 20, -1),
             (torch.tensor([0.5, 0.0, -1.0]), 4, 0)]
    for x, size, fill in cases:
        expected = torch.nonzero_static(x, size=size, fill_value=fill)
        device_x = x.to("pjrt")
        torch_pjrt.sync()
        reads = torch_pjrt.metrics()["device_to_host"]
        got = torch.nonzero_static(device_x, size=size, fill_value=fill)
        assert torch_pjrt.metrics()["device_to_host"] == reads
        assert got.stride() == expected.stride()
        assert_close(got, expected)
    with pytest.raises(RuntimeError, match="'size' must be an non-negative integer"):
        torch.nonzero_static(torch.ones(2, device="pjrt"), size=-1)


def test_histogram_bins_values_as_the_cpu(mode):
    g = seeded(13)
    x = torch.tensor([1.0, 2, 1, 4, 2.5, 4])
    weight = torch.rand(6, generator=g)
    cases = [
        (x, dict(bins=3)), (x, dict(bins=3, range=(0.0, 3.0))), (x, dict(bins=7, range=(0.5, 3.7))),
        (x, dict(bins=3, weight=weight, density=True)),
        (x, dict(bins=torch.tensor([0.0, 1.5, 2.0, 5.0]), density=True)),
        (x, dict(bins=torch.tensor([0.0, 1.5, 2.0, 5.0]), weight=weight)),
        # Every value equal (the range widened by 1/2), no values, and NaN and inf outside a range.
        (torch.tensor([2.0, 2.0]), dict(bins=2)), (torch.tensor([]), dict(bins=2)),
        (torch.tensor([1.0, nan, inf, 3.0]), dict(bins=2, range=(0.0, 4.0))),
        (torch.randn(1000, generator=g, dtype=torch.float64), dict(bins=37)),
        (torch.randn(10, 20, generator=g), dict(bins=13, range=(-1.0, 1.0))),
    ]
    for t, kw in cases:
        expected = torch.histogram(t, **kw)
        on_device = {k: (v.to("pjrt") if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        got = torch.histogram(t.to("pjrt"), **on_device)
        assert_close(got.hist, expected.hist)
        assert_close(got.bin_edges, expected.bin_edges)
    with pytest.raises(RuntimeError, match="min should not exceed max"):
        torch.histogram(x.to("pjrt"), bins=3, range=(3.0, 1.0))
    with pytest.raises(RuntimeError, match="range \\[nan, nan\\] is not finite"):
        torch.histogram(torch.tensor([1.0, nan], device="pjrt"), bins=2)


@pytest.mark.parametrize("dims", [2, 3])
def test_fractional_max_pool_picks_the_cpus_windows(mode, dims):
    g = seeded(14)
    forward = torch.ops.aten.fractional_max_pool2d if dims == 2 else torch.ops.aten.fractional_max_pool3d
    backward = (torch.ops.aten.fractional_max_pool2d_backward if dims == 2
                else torch.ops.aten.fractional_max_pool3d_backward)
    cases = ([((2, 3, 9, 11), [2, 3], [4, 5]), ((3, 10, 10), [3, 3], [5, 5]), ((1, 1, 5, 6), [2, 2], [1, 1])]
             if dims == 2 else [((2, 2, 7, 8, 9), [2, 2, 3], [3, 4, 5]), ((2, 6, 6, 6), [2, 2, 2], [3, 3, 3])])
    for shape, kernel, out in cases:
        for dtype in [torch.float32, torch.float64]:
            x = torch.randn(*shape, generator=g, dtype=dtype)
            x.view(-1)[3] = nan  # a NaN wins its windows, as on the CPU
            batch = shape[0] if len(shape) == dims + 2 else 1
            samples = torch.rand(batch, shape[-dims - 1], dims, generator=g, dtype=dtype)
            values, indices = forward(x, kernel, out, samples)
            got_values, got_indices = forward(x.to("pjrt"), kernel, out, samples.to("pjrt"))
            assert_close(got_values, values, rtol=0, atol=0, equal_nan=True)
            assert_close(got_indices, indices)
            grad = torch.randn(values.shape, generator=g, dtype=dtype)
            assert_close(backward(grad.to("pjrt"), x.to("pjrt"), kernel, out, got_indices),
                         backward(grad, x, kernel, out, indices))
    # An empty batch.
    empty = torch.zeros(0, 1, *([6] * dims))
    samples = torch.rand(0, 1, dims, generator=g)
    assert forward(empty.to("pjrt"), [2] * dims, [3] * dims, samples.to("pjrt"))[0].shape == (0, 1, *([3] * dims))


def test_histogramdd_bins_points_as_the_cpu(mode):
    g = seeded(16)
    x = torch.tensor([[0.0, 1.0], [1.0, 0.0], [2.0, 0.0], [2.0, 2.0]])
    cases = [
        (x, dict(bins=[3, 3], weight=torch.tensor([1.0, 2.0, 4.0, 8.0]))),
        (x, dict(bins=[2, 2], range=[0.0, 1.0, 0.0, 1.0], density=True)),
        (x, dict(bins=[torch.tensor([0.0, 1.0, 2.0]), torch.tensor([0.0, 1.0, 2.0])])),
        (torch.zeros(0, 2), dict(bins=[2, 2])),
        (torch.randn(500, 3, generator=g, dtype=torch.float64), dict(bins=[4, 5, 6], density=True)),
        (torch.randn(7, 20, 2, generator=g), dict(bins=[5, 7], range=[-1.0, 1.0, -2.0, 2.0],
                                                  weight=torch.rand(7, 20, generator=g))),
    ]
    for t, kw in cases:
        expected = torch.histogramdd(t, **kw)
        on_device = {k: ([b.to("pjrt") for b in v] if isinstance(v, list) and isinstance(v[0], torch.Tensor)
                         else v.to("pjrt") if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        got = torch.histogramdd(t.to("pjrt"), **on_device)
        assert_close(got.hist, expected.hist)
        for got_edges, expected_edges in zip(got.bin_edges, expected.bin_edges):
            assert_close(got_edges, expected_edges)
    with pytest.raises(RuntimeError, match="The size of bins must be equal to the innermost dimension"):
        torch.histogramdd(x.to("pjrt"), bins=[2, 2, 2])
    with pytest.raises(RuntimeError, match="expected 2 sequences of bin edges"):
        torch.histogramdd(x.to("pjrt"), bins=[torch.tensor([0.0, 1.0], device="pjrt")] * 3)
