"""uint16, uint32 and uint64 on pjrt. PyTorch stores them and runs few ops on them (its CPU
kernels' "barebones unsigned" set); the engine runs exactly those on the device, equal to the CPU
in Strict and DeferAndFuse with no CPU fallback (the `strict_or_fused_mode` fixture checks). An op
the CPU has no kernel for raises PyTorch's own error: the engine refuses it, the call goes to the
CPU, and the CPU raises. Promotions PyTorch refuses (with any other integer type) raise its
`RuntimeError`."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt

UNSIGNED = [torch.uint16, torch.uint32, torch.uint64]
LARGEST = {torch.uint16: 2**16 - 1, torch.uint32: 2**32 - 1, torch.uint64: 2**64 - 1}


def values(dtype, *extra):
    """Small values, the dtype's largest, and a value past the signed type of its width."""
    return torch.tensor([1, 2, 3, LARGEST[dtype], LARGEST[dtype] // 2 + 7, 0, *extra], dtype=dtype)


def assert_same(got, expected):
    """Exact equality, dtype and shape included (uint64 through Python ints: no float64 or int64
    holds every value)."""
    if isinstance(expected, torch.Tensor):
        assert got.device.type == "pjrt", got.device
        got = got.cpu()
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
        if expected.dtype.is_floating_point:
            torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
        else:
            assert got.tolist() == expected.tolist()
    else:
        assert got == expected


@pytest.mark.parametrize("dtype", UNSIGNED)
def test_creation_copies_and_scalars(strict_or_fused_mode, dtype):
    x = values(dtype)
    p = x.to("pjrt")
    assert p.dtype == dtype
    assert_same(p, x)
    assert p.tolist() == x.tolist()
    assert p[3].item() == LARGEST[dtype]
    assert_same(p.clone(), x)
    assert_same(torch.zeros(2, 3, dtype=dtype, device="pjrt"), torch.zeros(2, 3, dtype=dtype))
    assert_same(torch.ones(4, dtype=dtype, device="pjrt"), torch.ones(4, dtype=dtype))
    assert_same(torch.full((3,), LARGEST[dtype], dtype=dtype, device="pjrt"),
                torch.full((3,), LARGEST[dtype], dtype=dtype))
    # Negative Python ints wrap, as in PyTorch's checked conversion.
    assert_same(torch.full((2,), -1, dtype=dtype, device="pjrt"), torch.full((2,), -1, dtype=dtype))
    assert torch.empty(5, dtype=dtype, device="pjrt").shape == (5,)
    assert_same(p.new_full((2,), 9), x.new_full((2,), 9))
    assert_same(p.clone().fill_(5), x.clone().fill_(5))
    assert_same(p.clone().zero_(), x.clone().zero_())


@pytest.mark.parametrize("dtype", UNSIGNED)
def test_strided_copies_both_ways(strict_or_fused_mode, dtype):
    x = torch.arange(24, dtype=torch.int32).reshape(4, 6).to(dtype)
    x[1, 2] = values(dtype)[3]  # a Python int past int64 does not reach a uint64 tensor
    p = x.to("pjrt")
    assert_same(p.t().contiguous(), x.t().contiguous())
    assert_same(p[:, 1::2], x[:, 1::2])
    assert p.t().cpu().tolist() == x.t().tolist()
    into_pjrt = torch.zeros(6, 4, dtype=dtype, device="pjrt")
    into_pjrt.copy_(x.t())
    assert_same(into_pjrt, x.t().contiguous())
    into_cpu = torch.zeros(6, 4, dtype=dtype)
    into_cpu.copy_(p.t())
    assert into_cpu.tolist() == x.t().tolist()
    # Casts to and from other dtypes, on the device and across.
    assert_same(p.to(torch.int64), x.to(torch.int64))
    assert_same(p.to(torch.float64), x.to(torch.float64))
    assert_same(torch.tensor([-1, -2, 7]).to("pjrt").to(dtype), torch.tensor([-1, -2, 7]).to(dtype))
    small = torch.tensor([0.0, 1.5, 3000.0])
    assert_same(small.to("pjrt").to(dtype), small.to(dtype))


@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("dtype", UNSIGNED)
def test_casts_wrap_as_on_the_cpu(strict_or_fused_mode, source, dtype):
    """Negative and out-of-range values convert as the CPU's (x86's) conversions do. (NaN and
    infinities are left out: the CPU's own results for them change with its vector path, i.e.
    with the tensor's length.)"""
    x = torch.tensor([-300.7, -1.5, 0.4, 127.9, 70000.5, 3e9, 1e19])
    if not source.is_floating_point:
        x = torch.tensor([-300, -1, 0, 127, 70000, 3_000_000_000, -(2**62), 2**62 + 3])
    x = x.to(source)
    assert_same(x.to("pjrt").to(dtype), x.to(dtype))


@pytest.mark.parametrize("dtype", UNSIGNED)
def test_printing(strict_or_fused_mode, dtype):
    x = values(dtype)
    for t in (x, x.reshape(6, 1), x[:0]):
        shown = repr(t.to("pjrt"))
        assert "device='pjrt:0'" in shown
        assert str(t.to("pjrt")) == shown
        # The same text but for the device (which may move a line break).
        compact = "".join(shown.split()).replace(",device='pjrt:0'", "")
        assert compact == "".join(repr(t).split())


SUPPORTED = {
    "mul": lambda a, b: a * b,
    "mul_int": lambda a, b: a * 3,
    "mul_wrapping_int": lambda a, b: a * 70000,
    "mul_float": lambda a, b: a * 2.5,
    "mul_0d_int64": lambda a, b: a * torch.tensor(2, device=a.device),
    "true_div": lambda a, b: a / b,
    "true_div_int": lambda a, b: a / 2,
    "eq": lambda a, b: a == b,
    "eq_int": lambda a, b: a == 2,
    "eq_negative_int": lambda a, b: a == -1,
    "ne": lambda a, b: a != b,
    "bitwise_and": lambda a, b: a & b,
    "bitwise_or": lambda a, b: a | b,
    "bitwise_xor": lambda a, b: a ^ b,
    "bitwise_and_int": lambda a, b: a & 6,
    "sum": lambda a, b: a.sum(),
    "sum_dim": lambda a, b: a.reshape(2, 4).sum(1, keepdim=True),
    "prod": lambda a, b: a[:3].prod(),
    "cumsum": lambda a, b: a.cumsum(0),
    "any": lambda a, b: a.any(),
    "all": lambda a, b: a.reshape(2, 4).all(1),
    "isnan": lambda a, b: a.isnan(),
    "isinf": lambda a, b: a.isinf(),
    "sort": lambda a, b: a.sort().values,
    "sort_descending_indices": lambda a, b: a.sort(descending=True, stable=True).indices,
    "argsort": lambda a, b: a.argsort(stable=True),
    "unique": lambda a, b: torch.cat([a, b]).unique(),
    "unique_counts": lambda a, b: torch.cat([a, b]).unique(return_counts=True)[1],
    "cat": lambda a, b: torch.cat([a, b]),
    "stack": lambda a, b: torch.stack([a, b], 1),
    "roll": lambda a, b: a.roll(3),
    "repeat": lambda a, b: a.repeat(2),
    "pad": lambda a, b: F.pad(a, (1, 2), value=7),
    "where": lambda a, b: torch.where(a == b, a, b),
    "where_int": lambda a, b: torch.where(a == b, a, 0),
    "index": lambda a, b: a[torch.tensor([0, 3, 3], device=a.device)],
    "bool_mask": lambda a, b: a[a == b],
    "diag": lambda a, b: torch.diag(a[:3]),
    "diag_embed": lambda a, b: torch.diag_embed(a[:3]),
    "unfold": lambda a, b: a.unfold(0, 3, 2).contiguous(),
    "select_scatter": lambda a, b: torch.select_scatter(a, b[0], 0, 1),
    "to_bool": lambda a, b: a.bool(),
    "to_float": lambda a, b: a.float(),
    "nan_to_num": lambda a, b: a.nan_to_num(),
    "equal": lambda a, b: torch.equal(a, b),
    "count_nonzero_dim": lambda a, b: a.reshape(2, 4).count_nonzero(1),
}


@pytest.mark.parametrize("dtype", UNSIGNED)
@pytest.mark.parametrize("name", list(SUPPORTED))
def test_ops_pytorch_supports_match_the_cpu(strict_or_fused_mode, dtype, name):
    fn = SUPPORTED[name]
    a = values(dtype, 2, LARGEST[dtype])
    b = torch.tensor([2, 2, 1, LARGEST[dtype], 5, 0, 2, 4], dtype=dtype)
    expected = fn(a, b)
    got = fn(a.to("pjrt"), b.to("pjrt"))
    assert_same(got, expected)


def test_slice_write_keeps_the_rest(strict_or_fused_mode):
    x = values(torch.uint32)
    p = x.to("pjrt")
    x[1:3] = 9
    p[1:3] = 9
    assert_same(p, x)


def test_random_integers_stay_in_range(strict_or_fused_mode):
    for dtype in UNSIGNED:
        drawn = torch.randint(3, 60000, (256,), dtype=dtype, device="pjrt").cpu()
        assert drawn.dtype == dtype
        assert all(3 <= v < 60000 for v in drawn.tolist())


UNSUPPORTED = {
    "add": lambda a: a + a,
    "sub_int": lambda a: a - 1,
    "lt": lambda a: a < a,
    "maximum": lambda a: torch.maximum(a, a),
    "max": lambda a: a.max(),
    "argmax": lambda a: a.argmax(),
    "neg": lambda a: -a,
    "abs": lambda a: a.abs(),
    "bitwise_not": lambda a: ~a,
    "left_shift": lambda a: a << 1,
    "floor_divide": lambda a: a // a,
    "remainder": lambda a: a % 3,
    "pow": lambda a: a**2,
    "clamp": lambda a: a.clamp(1, 2),
    "flip": lambda a: a.flip(0),
    "topk": lambda a: a.topk(1),
    "masked_fill": lambda a: a.masked_fill(a == 2, 0),
    "index_select": lambda a: a.index_select(0, torch.tensor([0], device=a.device)),
}


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("dtype", UNSIGNED)
@pytest.mark.parametrize("name", list(UNSUPPORTED))
def test_ops_the_cpu_lacks_raise_pytorchs_error(pjrt, mode, dtype, name):
    fn = UNSUPPORTED[name]
    x = values(dtype)
    with pytest.raises(NotImplementedError) as on_cpu:
        fn(x)
    with torch_pjrt.eager_mode(mode), warnings.catch_warnings():
        # The fallback's warning (once per op) says the call runs on the CPU, which raises.
        warnings.simplefilter("ignore")
        with pytest.raises(NotImplementedError) as on_pjrt:
            fn(x.to("pjrt"))
    assert str(on_pjrt.value) == str(on_cpu.value)
    # The engine stays usable.
    assert_same(x.to("pjrt") * 2, x * 2)


HAND_WRITTEN = {
    "nonzero": lambda p, i: p.nonzero(),
    "nonzero_out": lambda p, i: torch.nonzero(p, out=torch.empty(0, 1, dtype=torch.long, device=p.device)),
    "argwhere": lambda p, i: torch.argwhere(p),
    "masked_select": lambda p, i: p.masked_select(p == 2),
    "masked_scatter": lambda p, i: p.clone().masked_scatter_(p == 2, p),
    "index_put": lambda p, i: p.clone().index_put_((i,), p[:1]),
    "index_put_accumulate": lambda p, i: p.clone().index_put_((i,), p[:1], accumulate=True),
    "setitem_mask": lambda p, i: p.clone().__setitem__(p == 2, 5),
    "index_add": lambda p, i: p.clone().index_add_(0, i, p[:1]),
    "index_add_functional": lambda p, i: p.index_add(0, i, p[:1]),
    "sum_into_uint16": lambda p, i: p.long().sum(dtype=torch.uint16),
    "prod_into_uint16": lambda p, i: p.long().prod(dtype=torch.uint16),
    "cumsum_into_uint16": lambda p, i: p.long().cumsum(0, dtype=torch.uint16),
    "index_fill": lambda p, i: p.clone().index_fill_(0, i, 5),
    "index_fill_tensor_value": lambda p, i: p.index_fill(0, i, torch.tensor(5, device=p.device)),
    "count_nonzero": lambda p, i: p.count_nonzero(),
}


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("name", list(HAND_WRITTEN))
def test_hand_written_kernels_raise_pytorchs_error(pjrt, mode, name):
    """The indexing kernels written by hand send a call on uint16 to the CPU, as the generated
    ones do, and the engine words the error of an op whose uint16 comes only from its dtype
    argument as PyTorch's CPU kernel does: the same message as on the CPU."""
    fn = HAND_WRITTEN[name]
    x, i = values(torch.uint16), torch.tensor([0])
    with pytest.raises(NotImplementedError) as on_cpu:
        fn(x, i)
    with torch_pjrt.eager_mode(mode), warnings.catch_warnings():
        # The fallback's warning (once per op) says the call runs on the CPU, which raises.
        warnings.simplefilter("ignore")
        with pytest.raises(NotImplementedError) as on_pjrt:
            fn(x.to("pjrt"), i.to("pjrt"))
    assert str(on_pjrt.value) == str(on_cpu.value)
    assert_same(x.to("pjrt") * 2, x * 2)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, i: a * i,
        lambda a, i: a == i,
        lambda a, i: torch.cat([a, i]),
        lambda a, i: torch.where(a == 1, a, i),
    ],
    ids=["mul", "eq", "cat", "where"],
)
@pytest.mark.parametrize("other", [torch.int64, torch.uint8, torch.bool, torch.uint32])
def test_promotion_with_other_integers_is_refused(strict_or_fused_mode, fn, other):
    a = values(torch.uint16)
    i = torch.ones(6, dtype=other)
    with pytest.raises(RuntimeError) as on_cpu:
        fn(a, i)
    assert str(on_cpu.value).startswith("Promotion for uint16, uint32, uint64 types is not supported")
    with pytest.raises(RuntimeError) as on_pjrt:
        fn(a.to("pjrt"), i.to("pjrt"))
    assert str(on_pjrt.value) == str(on_cpu.value)
    # Floats do promote.
    h = torch.ones(6, dtype=torch.float16)
    assert_same(a.to("pjrt") * h.to("pjrt"), a * h)


def test_overflowing_fill_values_raise(strict_or_fused_mode):
    with pytest.raises(RuntimeError, match="value cannot be converted to type uint16_t without overflow"):
        torch.full((2,), 70000, dtype=torch.uint16)
    with pytest.raises(RuntimeError, match="value cannot be converted to type uint16_t without overflow"):
        torch.full((2,), 70000, dtype=torch.uint16, device="pjrt")
