"""Ops pjrt runs natively instead of falling back to the CPU: the bitwise shifts, `torch.equal`,
`cummax`/`cummin`, `F.unfold`/`F.fold` (im2col/col2im) and `F.embedding_bag` in its three modes,
with their gradients; and `maximum`/`minimum`, which propagate a NaN from either operand. Values
against the CPU in every eager mode, CPU-like errors, and nothing may fall back to the CPU (the
`mode` fixture checks)."""

import math

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import assert_close, check_against_cpu as check, seeded

nan, inf = math.nan, math.inf
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]


# ---- shifts ------------------------------------------------------------------------------------

def shift_operands(dtype):
    if dtype == torch.uint8:
        return torch.tensor([0, 1, 5, 100, 200, 255, 3], dtype=dtype), \
            torch.tensor([0, 1, 3, 8, 200, 7, 2], dtype=dtype)
    bits = torch.iinfo(dtype).bits
    # Amounts past the width, equal to it, and negative: 0 for left shifts, the sign for right.
    return torch.tensor([-7, -1, 0, 1, 5, 100, 3, -128], dtype=dtype), \
        torch.tensor([0, 1, 3, -1, bits + 2, bits - 1, bits, 2], dtype=dtype)


@pytest.mark.parametrize("dtype", INTS)
def test_shifts_match_the_cpu_at_every_amount(mode, dtype):
    a, b = shift_operands(dtype)
    ap, bp = a.to("pjrt"), b.to("pjrt")
    for fn in [lambda x, y: x << y, lambda x, y: x >> y, lambda x, y: x << 2, lambda x, y: x >> 1,
               torch.bitwise_left_shift, torch.bitwise_right_shift,
               lambda x, y: torch.bitwise_left_shift(3, y),
               lambda x, y: torch.bitwise_right_shift(x, 3)]:
        expected, got = fn(a, b), fn(ap, bp)
        assert got.dtype == expected.dtype
        assert torch.equal(got.cpu(), expected), (got, expected)
    c = ap.clone()
    c <<= 1
    assert torch.equal(c.cpu(), a << 1)
    c = ap.clone()
    c >>= bp
    assert torch.equal(c.cpu(), a >> b)
    out = torch.empty(0, dtype=dtype, device="pjrt")
    torch.bitwise_left_shift(ap, bp, out=out)
    assert torch.equal(out.cpu(), torch.bitwise_left_shift(a, b))
    a.bitwise_right_shift_(b)
    ap.bitwise_right_shift_(bp)
    assert torch.equal(ap.cpu(), a)


def test_shifts_promote_and_refuse_as_the_cpu(mode):
    flags = torch.tensor([True, False])
    assert torch.equal((flags.to("pjrt") << 1).cpu(), flags << 1)  # bool with an int: int64
    assert torch.equal((torch.tensor([3], dtype=torch.int8).to("pjrt") << torch.tensor([1]).to("pjrt")).cpu(),
                       torch.tensor([3], dtype=torch.int8) << torch.tensor([1]))
    for x in [torch.ones(2), flags]:
        y = x if x.dtype == torch.bool else 1
        with pytest.raises(NotImplementedError, match="lshift_cpu\" not implemented for"):
            x.to("pjrt") << (y.to("pjrt") if isinstance(y, torch.Tensor) else y)
    with pytest.raises(NotImplementedError, match="rshift_cpu\" not implemented for 'Float'"):
        torch.ones(2, device="pjrt") >> 1
    # The engine stays usable.
    assert torch.equal((torch.tensor([1, 2]).to("pjrt") << 3).cpu(), torch.tensor([8, 16]))


# ---- maximum and minimum -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_maximum_and_minimum_propagate_nan_from_either_side(mode, dtype):
    a = torch.tensor([nan, 1.0, 2.0, nan, -inf, 0.0], dtype=dtype)
    b = torch.tensor([2.0, nan, 1.0, nan, 3.0, -0.0], dtype=dtype)
    for fn in [torch.maximum, torch.minimum, torch.fmax, torch.fmin]:
        assert_close(fn(a.to("pjrt"), b.to("pjrt")), fn(a, b))
        assert_close(fn(b.to("pjrt"), a.to("pjrt")), fn(b, a))


# ---- equal -------------------------------------------------------------------------------------

def test_equal_matches_the_cpu(mode):
    x = torch.randn(3, 4, generator=seeded(3))
    cases = [
        (x, x.clone()),
        (x, x + 1e-6),
        (x, x.t().contiguous().t()),
        (torch.ones(2), torch.ones(2, dtype=torch.int32)),  # dtypes promote
        (torch.tensor([0.5]), torch.tensor([0])),
        (torch.tensor([nan]), torch.tensor([nan])),  # NaN equals nothing
        (torch.ones(2), torch.ones(1, 2)),  # shapes must match exactly
        (torch.ones(2, 1).expand(2, 2), torch.ones(2, 2)),
        (torch.empty(0, 3), torch.empty(0, 3)),
        (torch.tensor([True, False]), torch.tensor([True, False])),
    ]
    for a, b in cases:
        assert torch.equal(a.to("pjrt"), b.to("pjrt")) is torch.equal(a, b), (a, b)
    # `torch.cov` compares its weights with `equal`.
    data = torch.randn(3, 6, generator=seeded(4))
    assert_close(torch.cov(data.to("pjrt")), torch.cov(data), rtol=1e-5, atol=1e-6)


def test_equal_refuses_tensors_on_two_devices(pjrt):
    with pytest.raises(RuntimeError, match="different devices"):
        torch.equal(torch.ones(2, device="pjrt"), torch.ones(2))


# ---- cummax and cummin -------------------------------------------------------------------------

def extremes_input(dtype):
    x = torch.randn(5, 9, generator=seeded(5)).mul(3)
    if dtype.is_floating_point:
        x[1, 3] = nan
        x[1, 6] = nan  # a later NaN takes the index
        x[3, 0] = -inf
    else:
        x = x.round()
    x[2, 2:5] = 1.0  # ties: the later index
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
@pytest.mark.parametrize("fn", [torch.cummax, torch.cummin])
def test_cummax_and_cummin_match_the_cpu(mode, fn, dtype):
    x = extremes_input(dtype)
    for dim in (0, 1, -1):
        values, indices = fn(x.to("pjrt"), dim)
        expected = fn(x, dim)
        assert_close(values, expected.values)
        assert torch.equal(indices.cpu(), expected.indices), (dim, indices, expected.indices)


def test_cummax_and_cummin_edges(mode):
    flags = torch.rand(20, generator=seeded(6)) > 0.5
    for fn in [torch.cummax, torch.cummin]:
        for x in [flags, torch.tensor(3.0), torch.empty(0, 4), torch.randn(1, 1, 130, generator=seeded(7))]:
            v, i = fn(x.to("pjrt"), -1)
            e = fn(x, -1)
            assert torch.equal(v.cpu(), e.values) and torch.equal(i.cpu(), e.indices), x
    # out= forms.
    x = torch.randn(4, 6, generator=seeded(8))
    values = torch.empty(0, device="pjrt")
    indices = torch.empty(0, dtype=torch.long, device="pjrt")
    torch.cummax(x.to("pjrt"), 1, out=(values, indices))
    assert torch.equal(values.cpu(), torch.cummax(x, 1).values)
    assert torch.equal(indices.cpu(), torch.cummax(x, 1).indices)


def test_cummax_and_cummin_gradients(mode):
    x = torch.randn(4, 7, generator=seeded(9))
    check(lambda t: torch.cummax(t, 1).values, [x])
    check(lambda t: torch.cummin(t, 0).values, [x])


# ---- unfold and fold ---------------------------------------------------------------------------

WINDOWS = [
    dict(kernel_size=3),
    dict(kernel_size=(2, 3), padding=1, stride=2),
    dict(kernel_size=2, dilation=2, padding=(0, 1), stride=(1, 2)),
    dict(kernel_size=(7, 1)),
]


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: ",".join(f"{k}={v}" for k, v in w.items()))
def test_unfold_and_fold_match_the_cpu_with_gradients(mode, window):
    img = torch.randn(2, 3, 7, 6, generator=seeded(10))
    check(lambda t: F.unfold(t, **window), [img])
    check(lambda t: F.unfold(t, **window), [img[0]])  # unbatched
    cols = F.unfold(img, **window)
    check(lambda t: F.fold(t, (7, 6), **window), [cols])
    check(lambda t: F.fold(t, (7, 6), **window), [cols[0]])


def test_unfold_is_a_convolution_as_a_product(mode):
    # The classic use: a convolution as im2col, then a product.
    x = torch.randn(2, 4, 9, 9, generator=seeded(11))
    w = torch.randn(5, 4, 3, 3, generator=seeded(12))

    def conv_by_unfold(x, w):
        cols = F.unfold(x, 3, padding=1)
        return (w.view(5, -1) @ cols).view(2, 5, 9, 9)

    check(conv_by_unfold, [x, w], grads_of=(0, 1), rtol=1e-4, atol=1e-4)
    assert_close(conv_by_unfold(x.to("pjrt"), w.to("pjrt")), F.conv2d(x, w, padding=1),
                 rtol=1e-4, atol=1e-4)


def test_unfold_and_fold_refuse_what_the_cpu_refuses(mode):
    bad = [
        (lambda d: F.unfold(torch.ones(1, 2, 3, 3, device=d), 5), RuntimeError,
         "calculated shape of the array of sliding blocks as \\(-1, -1\\)"),
        (lambda d: F.unfold(torch.ones(1, 2, 3, 3, device=d), 2, stride=0), RuntimeError,
         "stride should be greater than zero"),
        (lambda d: F.unfold(torch.ones(1, 2, 3, 3, device=d), 2, dilation=0), RuntimeError,
         "dilation should be greater than zero"),
        (lambda d: F.unfold(torch.ones(1, 0, 3, 3, device=d), 2), RuntimeError,
         "Expected 3D or 4D"),
        (lambda d: F.fold(torch.ones(1, 5, 4, device=d), (3, 3), 2), RuntimeError,
         "divisible by the product of kernel_size"),
        (lambda d: F.fold(torch.ones(1, 4, 5, device=d), (3, 3), 2), RuntimeError,
         "match the calculated number of sliding blocks 2 \\* 2 = 4, but got input.size\\(2\\)=5"),
    ]
    for make, error, message in bad:
        with pytest.raises(error, match=message):
            make("cpu")
        with pytest.raises(error, match=message):
            make("pjrt")
    assert F.unfold(torch.ones(0, 2, 3, 3, device="pjrt"), 2).shape == (0, 8, 4)


@pytest.mark.parametrize("dim,size,step", [(1, 3, 1), (1, 4, 3), (0, 2, 1), (-1, 10, 1), (1, 1, 5)])
def test_tensor_unfold_is_a_view_with_a_gradient(mode, dim, size, step):
    x = torch.randn(3, 10, generator=seeded(23))
    check(lambda t: t.unfold(dim, size, step), [x])
    base = x.to("pjrt")
    windows = base.unfold(dim, size, step)
    assert windows._base is base
    assert windows.stride() == x.unfold(dim, size, step).stride()
    # Sliding windows for a moving average.
    assert_close(base[0].unfold(0, 4, 1).mean(-1), x[0].unfold(0, 4, 1).mean(-1))
    assert torch.equal(torch.tensor(2.0).to("pjrt").unfold(0, 1, 1).cpu(), torch.tensor([2.0]))


# ---- embedding_bag -----------------------------------------------------------------------------

WEIGHT = torch.tensor([[1.0, 5.0], [3.0, 5.0], [nan, 0.0], [2.0, 7.0], [-inf, 1.0]])
INDICES = torch.tensor([0, 1, 2, 3, 1, 0, 2, 0, 4, 4])
OFFSETS = torch.tensor([0, 4, 6, 6, 8])  # an empty bag, a NaN first in a bag and later in one


@pytest.mark.parametrize("bag_mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 0, 2])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_matches_the_cpu_at_its_edges(mode, bag_mode, padding_idx, include_last_offset):
    offsets = torch.cat([OFFSETS, torch.tensor([len(INDICES)])]) if include_last_offset else OFFSETS
    kwargs = dict(mode=bag_mode, padding_idx=padding_idx, include_last_offset=include_last_offset)
    expected = F.embedding_bag(INDICES, WEIGHT, offsets, **kwargs)
    got = F.embedding_bag(INDICES.to("pjrt"), WEIGHT.to("pjrt"), offsets.to("pjrt"), **kwargs)
    assert_close(got, expected)
    if bag_mode == "max":
        # The index each maximum came from (ties keep the first row, a NaN wins only first).
        mode_code = 2
        pad = -1 if padding_idx is None else padding_idx
        args = (False, mode_code, False, None, include_last_offset, pad)
        e = torch.ops.aten._embedding_bag(WEIGHT, INDICES, offsets, *args)
        g = torch.ops.aten._embedding_bag(WEIGHT.to("pjrt"), INDICES.to("pjrt"), offsets.to("pjrt"), *args)
        assert torch.equal(g[3].cpu(), e[3]), (g[3], e[3])


@pytest.mark.parametrize("bag_mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_embedding_bag_and_its_gradient_match_the_cpu(mode, bag_mode, dtype):
    weight = torch.randn(10, 4, generator=seeded(13), dtype=dtype)
    bags = torch.randint(0, 10, (3, 5), generator=seeded(14))
    flat = torch.randint(0, 10, (12,), generator=seeded(15))
    offsets = torch.tensor([0, 3, 3, 7])
    check(lambda w, i: F.embedding_bag(i, w, mode=bag_mode), [weight, bags])
    check(lambda w, i: F.embedding_bag(i, w, mode=bag_mode, padding_idx=2), [weight, bags])
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=bag_mode), [weight, flat, offsets])
    check(lambda w, i: F.embedding_bag(i, w, mode=bag_mode), [weight, bags.int()])
    # As a layer, as a model would use it.
    layer = torch.nn.EmbeddingBag(10, 4, mode=bag_mode).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
    device_layer = torch.nn.EmbeddingBag(10, 4, mode=bag_mode).to(dtype).to("pjrt")
    device_layer.load_state_dict(layer.state_dict())
    assert_close(device_layer(flat.to("pjrt"), offsets.to("pjrt")), layer(flat, offsets))


def test_embedding_bag_per_sample_weights_and_their_gradient(mode):
    weight = torch.randn(10, 4, generator=seeded(16))
    bags = torch.randint(0, 10, (3, 5), generator=seeded(17))
    per_sample = torch.rand(3, 5, generator=seeded(18))
    check(lambda w, p, i: F.embedding_bag(i, w, per_sample_weights=p, mode="sum"),
          [weight, per_sample, bags], grads_of=(0, 1))
    check(lambda w, p, i: F.embedding_bag(i, w, per_sample_weights=p, mode="sum", padding_idx=3),
          [weight, per_sample, bags], grads_of=(0, 1))


def test_embedding_bag_scales_gradients_by_frequency(mode):
    # Each row's gradient is divided by how often its index occurs in the batch, as
    # `F.embedding` does. (PyTorch's CPU kernel for `embedding_bag` divides the k-th distinct
    # index's gradient by the count of the k-th smallest index instead, so it is no oracle here.)
    weight = torch.randn(10, 3, generator=seeded(19))
    bags = torch.randint(0, 10, (4, 5), generator=seeded(20))
    for bag_mode in ["sum", "mean"]:
        w = weight.to("pjrt").requires_grad_()
        out = F.embedding_bag(bags.to("pjrt"), w, mode=bag_mode, scale_grad_by_freq=True)
        cotangent = torch.randn(out.shape, generator=seeded(21))
        out.backward(cotangent.to("pjrt"))
        w_ref = weight.clone().requires_grad_()
        rows = F.embedding(bags, w_ref, scale_grad_by_freq=True)
        per_bag = rows.sum(1) if bag_mode == "sum" else rows.mean(1)
        per_bag.backward(cotangent)
        assert_close(w.grad, w_ref.grad, rtol=1e-5, atol=1e-6)


def test_embedding_bag_refuses_what_it_cannot_do(mode):
    weight = torch.randn(10, 3, device="pjrt", requires_grad=True)
    bags = torch.randint(0, 10, (2, 4)).to("pjrt")
    with pytest.raises(NotImplementedError, match="sparse"):
        F.embedding_bag(bags, weight, sparse=True).sum().backward()
    with pytest.raises((RuntimeError, ValueError), match="per_sample_weights"):
        F.embedding_bag(bags, weight, mode="mean", per_sample_weights=torch.ones(2, 4).to("pjrt"))
    with pytest.raises(RuntimeError, match="Long or Int"):
        torch.ops.aten._embedding_bag(weight.detach(), bags.float(), torch.tensor([0, 4]).to("pjrt"),
                                      False, 0, False, None, False, -1)
    # Still usable.
    assert F.embedding_bag(bags, weight.detach()).shape == (2, 3)


def test_an_embedding_bag_model_trains_as_on_the_cpu(mode):
    # A bag-of-words classifier: EmbeddingBag, Linear, cross-entropy, SGD.
    class BagOfWords(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = torch.nn.EmbeddingBag(30, 8, mode="mean")
            self.out = torch.nn.Linear(8, 3)

        def forward(self, text, offsets):
            return self.out(self.bag(text, offsets))

    def train(device):
        torch.manual_seed(0)
        model = BagOfWords().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        g = seeded(22)
        losses = []
        for _ in range(5):
            text = torch.randint(0, 30, (16,), generator=g)
            offsets = torch.tensor([0, 5, 9, 12])
            labels = torch.randint(0, 3, (4,), generator=g)
            loss = F.cross_entropy(model(text.to(device), offsets.to(device)), labels.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    assert train("pjrt") == pytest.approx(train("cpu"), rel=1e-5)
