"""Strided views on pjrt: reads through views, writes through views, storage-level operations."""

import pytest
import torch

import torch_pjrt
from conftest import assert_close

A = torch.arange(24, dtype=torch.float32).reshape(4, 6)

READS = {
    "select": lambda t: t[1],
    "column": lambda t: t[:, 2],
    "slice": lambda t: t[:, 2:5] * 1,
    "step": lambda t: t[::2, ::3] + 1,
    "transpose": lambda t: t.t() @ t,
    "expand": lambda t: t[0].expand(3, 6) * 2,
    "view": lambda t: t.view(6, 4).sum(0),
    "diagonal": lambda t: t.diagonal() - 1,
    "unsqueeze": lambda t: t.unsqueeze(1).expand(4, 2, 6).sum(1),
    "narrow_contiguous": lambda t: t.narrow(1, 1, 3).contiguous(),
    "chunk": lambda t: torch.cat(t.chunk(3, dim=1), 0),
    "view_dtype": lambda t: t.view(torch.int32) + 0,
}

WRITES = {
    "setitem_row": lambda t: t.__setitem__(1, 5.0),
    "fill_column": lambda t: t[:, 2].fill_(-1),
    "mul_through_transpose": lambda t: t.t()[2].mul_(3),
    "add_strided": lambda t: t[::2, 1:4].add_(1),
    "copy_into_slice": lambda t: t[1:3, :2].copy_(torch.ones(2, 2)),
    "zero_row": lambda t: t[3].zero_(),
}


@pytest.mark.parametrize("name", list(READS))
def test_read_through_view(pjrt, name):
    op = READS[name]
    assert_close(op(A.to(pjrt)), op(A))


@pytest.mark.parametrize("name", list(WRITES))
def test_write_through_view(pjrt, name):
    op = WRITES[name]
    q, c = A.to(pjrt), A.clone()
    op(q)
    op(c)
    assert_close(q, c)


def test_view_to_host_scalar_and_print(pjrt):
    p = A.to(pjrt)
    assert p[2, 3].item() == A[2, 3].item()
    assert p[1].tolist() == A[1].tolist()
    assert repr(p[1:, ::2]) == repr(A[1:, ::2]).replace("])", "], device='pjrt:0')")


def test_views_share_storage_and_see_writes(pjrt):
    p = A.clone().to(pjrt)
    row = p[1]
    assert row.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
    assert row.data_ptr() == p.data_ptr() + 6 * 4
    p.add_(1)
    assert_close(row, A[1] + 1)


def test_views_in_defer_and_fuse(pjrt):
    p = A.to(pjrt)
    c = A.clone()
    with torch_pjrt.eager_mode("defer_and_fuse"):
        p[:, 0].mul_(2)
        c[:, 0].mul_(2)
        y = (p.t() @ p).sum(1)
        assert_close(y, (c.t() @ c).sum(1))


def test_resize_and_set_on_fresh_storage(pjrt):
    t = torch.empty(0, device=pjrt)
    t.resize_(2, 3)
    t.fill_(4.0)
    assert_close(t, torch.full((2, 3), 4.0))
    s = torch.empty(0, device=pjrt).untyped_storage()
    s.resize_(16)
    assert s.nbytes() == 16
    u = torch.empty(0, device=pjrt).set_(t.untyped_storage(), 0, (3, 2), (2, 1))
    assert_close(u, torch.full((3, 2), 4.0))


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_negative_views_read_their_logical_values(pjrt, mode):
    # `torch._neg_view` sets the negative bit: PyTorch's negation fallback resolves the inputs of
    # most ops, but `clone` and `copy_` fall through to the device, which applies the bit itself.
    x = torch.tensor([1.0, -2.0, 3.0, -4.5])
    with torch_pjrt.eager_mode(mode):
        n = torch._neg_view(x.to("pjrt"))
        assert n.is_neg()
        expected = -x
        into = torch.zeros(4, device="pjrt")
        into.copy_(n)
        index = torch.tensor([3, 0, 1, 2])
        got = {
            "read": n.cpu(),
            "clone": n.clone().cpu(),
            "resolve_neg": n.resolve_neg().cpu(),
            "flip": torch.flip(n, [0]).cpu(),
            "trunc": torch.trunc(n).cpu(),
            "add": (n + 1).cpu(),
            "copy_": into.cpu(),
            "embedding": torch.nn.functional.embedding(index.to("pjrt"), n.view(4, 1)).cpu(),
        }
    want = {
        "read": expected,
        "clone": expected,
        "resolve_neg": expected,
        "flip": torch.flip(expected, [0]),
        "trunc": torch.trunc(expected),
        "add": expected + 1,
        "copy_": expected,
        "embedding": expected.view(4, 1)[index],
    }
    for name, value in got.items():
        torch.testing.assert_close(value, want[name], rtol=0, atol=0, msg=name)
    # The view's storage is untouched.
    torch.testing.assert_close(x.to("pjrt").cpu(), x)
    # Writes through a negative view land in its storage, negated (PyTorch resolves the view
    # into a copy for the op and copies the result back with `copy_`).
    with torch_pjrt.eager_mode(mode):
        for write, value in [
            (lambda v: v.add_(1.0), -1.0),
            (lambda v: v.copy_(torch.ones(3, device="pjrt")), -1.0),
            (lambda v: v.fill_(2.0), -2.0),
        ]:
            base = torch.zeros(3, device="pjrt")
            write(torch._neg_view(base))
            torch.testing.assert_close(base.cpu(), torch.full((3,), value))


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_results_of_many_dims(pjrt, mode):
    # A view with many size-1 dims has more dims than most tensors; results of that rank (here
    # 18 and 64) are computed like any other.
    x = torch.rand(4, 2, 5, 1, 6, 2, 9, 3).transpose(-1, 2).transpose(-2, 3)
    shape = [1, 1, 2, 1, 4, 3, 1, 1, 9, 1, 2, 1, 2, 3, 1, 5, 1, 1]
    deep = torch.rand([1] * 60 + [2, 3, 1, 2])
    with torch_pjrt.eager_mode(mode):
        p = x.to(pjrt)
        got = torch.isclose(p.view(*shape), p.clone().view(*shape))
        assert got.dim() == 18 and bool(got.all())
        assert_close(p.view(*shape) * 2, x.view(*shape) * 2)
        assert_close(deep.to(pjrt) + 1, deep + 1)
        with pytest.raises(RuntimeError, match="exceeds the ABI's 64"):
            torch.zeros([1] * 65, device=pjrt) + 1


@pytest.mark.parametrize(
    "dtype", [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.float16, torch.int32,
              torch.float32, torch.int64]
)
def test_bool_storage_viewed_as_other_dtypes_and_back(mode, dtype):
    """A bool is a byte in memory but one bit in StableHLO: views between bool and any other
    dtype read bools as the bytes 0 and 1, and bytes as bools by `!= 0`, as PyTorch does."""
    flags = torch.rand(4, 16, generator=torch.Generator().manual_seed(3)) > 0.5
    on_pjrt = flags.to("pjrt")
    assert_close(on_pjrt.view(dtype).clone(), flags.view(dtype))
    assert_close(on_pjrt.view(dtype)[1:3] * 1, flags.view(dtype)[1:3] * 1)
    bytes_ = torch.tensor([0, 1, 2, 255, 0, 0, 7, 1] * 4, dtype=torch.uint8).view(dtype)
    assert_close(bytes_.to("pjrt").view(torch.bool).clone(), bytes_.view(torch.bool))


@pytest.mark.parametrize("name", list(READS))
def test_warm_strict_reads_through_views_run_directly(pjrt, name):
    """The second run of each read finds its programs: Strict runs its view-reading ops by the
    direct path (no capture), with the cold run's values, windows at other offsets included."""
    op = READS[name]
    # Two values in one storage, so a window of the second sits at another offset.
    both = torch.stack([A, A.flip(0) * 3]).to(pjrt)
    with torch_pjrt.eager_mode("strict"):
        for _ in range(2):
            for k in range(2):
                assert_close(op(both[k]), op(torch.stack([A, A.flip(0) * 3])[k]))
        torch_pjrt.reset_metrics()
        for k in range(2):
            assert_close(op(both[k]), op(torch.stack([A, A.flip(0) * 3])[k]))
        m = torch_pjrt.metrics()
    assert m["compilations"] == 0, name
    # Every op ran directly; `select` and `column` are views alone, read by the host copy.
    assert m["direct_ops"] == m["regions"], (name, m["direct_ops"], m["regions"])
    if name not in ("select", "column"):
        assert m["regions"] >= 2, name
