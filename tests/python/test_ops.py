"""Ops on pjrt against the same ops on the CPU (contiguous tensors)."""

import copy

import pytest
import torch

import torch_pjrt
from conftest import assert_close

UNARY = [
    torch.neg, torch.abs, torch.exp, torch.log1p, torch.sin, torch.cos, torch.tanh,
    torch.sigmoid, torch.relu, torch.floor, torch.ceil, torch.trunc, torch.sign, torch.erf,
    torch.nn.functional.silu, torch.nn.functional.gelu,
    lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    lambda x: x.abs().sqrt(), lambda x: x.abs().add(0.5).log(), lambda x: x.abs().add(0.5).rsqrt(),
    lambda x: x.round(), lambda x: x.round(decimals=1), lambda x: x.reciprocal(),
]

BINARY = [
    torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.minimum, torch.atan2,
    lambda a, b: torch.add(a, b, alpha=2.5), lambda a, b: torch.sub(a, b, alpha=-1),
    lambda a, b: torch.div(a, b, rounding_mode="floor"),
    lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    lambda a, b: a.abs().add(0.1).pow(b), torch.eq, torch.ne, torch.lt, torch.le, torch.gt,
    torch.ge, lambda a, b: torch.where(a > b, a, b), lambda a, b: torch.lerp(a, b, 0.3),
    lambda a, b: torch.addcmul(a, a, b, value=0.5), lambda a, b: a.clamp(min=b),
]

WITH_SCALARS = [
    lambda x: x + 2, lambda x: 2 + x, lambda x: x - 0.5, lambda x: 1 - x, lambda x: x * 3,
    lambda x: x / 4, lambda x: 3 / (x.abs() + 1), lambda x: x ** 2, lambda x: x.abs() ** 0.5,
    lambda x: 2 ** x, lambda x: x * torch.tensor(2.5), lambda x: torch.tensor(2.5) * x,
    lambda x: x > 0, lambda x: x == 0.5, lambda x: x.clamp(-0.5, 0.5), lambda x: x.clamp(max=0.1),
    lambda x: torch.where(x > 0, x, 0.0), lambda x: torch.where(x > 0, 1.0, x),
    lambda x: x.remainder(0.7), lambda x: x.fmod(0.7),
]

REDUCTIONS = [
    torch.sum, torch.mean, torch.prod, torch.amax, torch.amin, torch.argmax, torch.argmin,
    lambda x: torch.logsumexp(x, dim=1),
    lambda x: x.sum(0), lambda x: x.sum(dim=(0, 1), keepdim=True), lambda x: x.mean(1, keepdim=True),
    lambda x: x.amax(1), lambda x: x.argmax(1), lambda x: x.var(1), lambda x: x.std(),
    lambda x: x.var(0, correction=0), lambda x: x.norm(), lambda x: x.norm(p=1, dim=1),
    lambda x: (x > 0).any(), lambda x: (x > -10).all(1), lambda x: x.softmax(-1),
    lambda x: x.log_softmax(0), lambda x: x.sum(dtype=torch.float64), lambda x: x.max(),
    lambda x: x.min(),
]


def _data(*shape):
    return torch.randn(*shape)


@pytest.mark.parametrize("op", UNARY, ids=range(len(UNARY)))
def test_unary(pjrt, op):
    x = _data(4, 5)
    assert_close(op(x.to(pjrt)), op(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", BINARY, ids=range(len(BINARY)))
def test_binary(pjrt, op):
    a, b = _data(4, 5), _data(4, 5)
    assert_close(op(a.to(pjrt), b.to(pjrt)), op(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", WITH_SCALARS, ids=range(len(WITH_SCALARS)))
def test_with_python_scalars(pjrt, op):
    x = _data(3, 6)
    assert_close(op(x.to(pjrt)), op(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", REDUCTIONS, ids=range(len(REDUCTIONS)))
def test_reductions(pjrt, op):
    x = _data(6, 7)
    assert_close(op(x.to(pjrt)), op(x), rtol=1e-4, atol=1e-4)


def test_broadcasting(pjrt):
    a, b = _data(4, 1, 3), _data(5, 1)
    assert_close(a.to(pjrt) * b.to(pjrt) + 1, a * b + 1)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_and_bool_dtypes(pjrt, dtype):
    x = torch.arange(12).reshape(3, 4).to(dtype)
    y = x.to(pjrt)
    assert_close(y, x)
    if dtype is not torch.bool:
        assert_close(y + 1, x + 1)
        assert_close(y * 2, x * 2)
        assert_close(y.sum(), x.sum())
        assert_close(y // 2, x // 2)
        assert_close(y / 2, x / 2)
    assert_close(y == x.to(pjrt), x == x)


def test_type_promotion(pjrt):
    i = torch.arange(6)
    f = torch.randn(6)
    h = torch.randn(6).half()
    assert_close(i.to(pjrt) + f.to(pjrt), i + f)
    assert_close(i.to(pjrt) * 1.5, i * 1.5)
    assert_close(h.to(pjrt) + 1.5, h + 1.5)
    assert_close(h.to(pjrt) + torch.tensor(1.5, dtype=torch.float64), h + torch.tensor(1.5, dtype=torch.float64))
    assert_close(i.to(pjrt) + torch.tensor(2.5), i + torch.tensor(2.5))


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.bool, torch.float16, torch.float64])
@pytest.mark.parametrize("shape", [(), (3,)])
def test_a_python_number_in_a_tensor_argument_promotes_as_a_number(pjrt, dtype, shape):
    # `torch.sub(5, x)` passes 5 as a wrapped number tensor: it yields to the tensor's dtype
    # within its category, and gives its category's default dtype above it.
    x = torch.tensor([1, 0, 1] if shape else 1).to(dtype)
    d = x.to(pjrt)
    calls = [
        lambda t: torch.sub(5, t),
        lambda t: torch.add(3, t, alpha=2),
        lambda t: torch.mul(True, t),
        lambda t: torch.sub(2.5, t),
        lambda t: torch.maximum(torch.tensor(4), t),
        lambda t: torch.rsub(t, 7),
        lambda t: torch.true_divide(3, t.to(torch.float32) + 1),
    ]
    for call in calls:
        try:
            expected = call(x)
        except RuntimeError:
            continue  # refused on the CPU too (subtracting from a bool)
        got = call(d)
        assert got.dtype == expected.dtype, (dtype, shape, got.dtype, expected.dtype)
        assert_close(got, expected)


def test_integer_division_by_zero_raises_only_when_there_is_something_to_divide(pjrt):
    empty = torch.empty(0, 3, dtype=torch.long)
    for call in (lambda t: t // 0, lambda t: torch.remainder(t, 0), lambda t: torch.fmod(t, 0),
                 lambda t: torch.div(t, 0, rounding_mode="trunc")):
        got = call(empty.to(pjrt))
        assert got.shape == (0, 3) and got.dtype == torch.long
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            call(torch.ones(2, dtype=torch.long).to(pjrt))
    # PyTorch's reference triu_indices divides its empty ranges by the zero column count.
    import torch._refs as refs

    for rows, cols in ((3, 0), (0, 0), (20, 0), (4, 5)):
        expected = torch.triu_indices(rows, cols)
        assert torch.equal(torch.triu_indices(rows, cols, device=pjrt).cpu(), expected)
        got = refs.triu_indices(rows, cols, dtype=torch.long, device=pjrt)
        assert torch.equal(got.cpu(), expected), (rows, cols)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_float_dtypes(pjrt, dtype):
    x = torch.randn(5, 3).to(dtype)
    tol = {"rtol": 1e-2, "atol": 1e-2} if dtype in (torch.bfloat16, torch.float16) else {}
    assert_close((x.to(pjrt) * 2).exp(), (x * 2).exp(), **tol)
    assert_close(x.to(pjrt).to(torch.float32), x.to(torch.float32))


def test_matmul_family(pjrt):
    a, b, c = _data(4, 5), _data(5, 3), _data(4, 3)
    assert_close(a.to(pjrt) @ b.to(pjrt), a @ b, rtol=1e-5, atol=1e-5)
    assert_close(torch.mm(a.to(pjrt), b.to(pjrt)), torch.mm(a, b), rtol=1e-5, atol=1e-5)
    assert_close(
        torch.addmm(c.to(pjrt), a.to(pjrt), b.to(pjrt), beta=0.5, alpha=2.0),
        torch.addmm(c, a, b, beta=0.5, alpha=2.0),
        rtol=1e-5,
        atol=1e-5,
    )
    x, y = _data(2, 4, 5), _data(2, 5, 3)
    assert_close(torch.bmm(x.to(pjrt), y.to(pjrt)), torch.bmm(x, y), rtol=1e-5, atol=1e-5)
    assert_close(x.to(pjrt) @ y.to(pjrt), x @ y, rtol=1e-5, atol=1e-5)
    v, w = _data(7), _data(7)
    assert_close(torch.dot(v.to(pjrt), w.to(pjrt)), torch.dot(v, w), rtol=1e-5, atol=1e-5)
    lin = torch.nn.Linear(5, 3)
    assert_close(lin.to(pjrt)(a.to(pjrt)), lin.cpu()(a), rtol=1e-5, atol=1e-5)


def test_shape_and_index_ops(pjrt):
    a, b = _data(3, 4), _data(3, 4)
    idx = torch.tensor([[0, 2], [1, 1], [3, 0]])
    assert_close(torch.cat([a.to(pjrt), b.to(pjrt)], 1), torch.cat([a, b], 1))
    assert_close(torch.stack([a.to(pjrt), b.to(pjrt)]), torch.stack([a, b]))
    assert_close(a.to(pjrt).flip(0), a.flip(0))
    assert_close(a.to(pjrt).roll(1, 1), a.roll(1, 1))
    assert_close(torch.nn.functional.pad(a.to(pjrt), (1, 2)), torch.nn.functional.pad(a, (1, 2)))
    assert_close(a.to(pjrt).repeat(2, 1), a.repeat(2, 1))
    assert_close(a.to(pjrt).tril(), a.tril())
    assert_close(a.to(pjrt).triu(1), a.triu(1))
    assert_close(a.to(pjrt).gather(1, idx.to(pjrt)), a.gather(1, idx))
    assert_close(a.to(pjrt).index_select(1, torch.tensor([3, 0]).to(pjrt)), a.index_select(1, torch.tensor([3, 0])))
    emb = torch.nn.functional.embedding
    assert_close(emb(torch.tensor([2, 0]).to(pjrt), a.to(pjrt)), emb(torch.tensor([2, 0]), a))
    z = torch.zeros(3, 4)
    assert_close(z.to(pjrt).scatter_add(1, idx.to(pjrt), b[:, :2].contiguous().to(pjrt)), z.scatter_add(1, idx, b[:, :2]))


ISIN = [
    lambda e, t: torch.isin(e, t),
    lambda e, t: torch.isin(e, t, invert=True),
    lambda e, t: torch.isin(e, t.float() + 0.5),  # promoted: int elements, float test elements
    lambda e, t: torch.isin(e.to(torch.uint8), t[:1]),
    lambda e, t: torch.isin(e, t[:0]),  # no test elements
    lambda e, t: torch.isin(e, t[1]),  # a 0-d test element
    lambda e, t: torch.isin(e[0, 0], t),
    lambda e, t: torch.isin(e, 3),
    lambda e, t: torch.isin(e, 3.5, invert=True),
    lambda e, t: torch.isin(e.float(), torch.tensor([float("nan"), 2.0]).to(e.device)),
]


@pytest.mark.parametrize("op", ISIN, ids=range(len(ISIN)))
def test_isin(pjrt, op):
    e, t = torch.randint(0, 8, (3, 5)), torch.tensor([[1, 3], [5, 3]])
    assert_close(op(e.to(pjrt), t.to(pjrt)), op(e, t))
    assert torch_pjrt.metrics()["fallback_ops"] == {}


def test_isin_refuses_bool(pjrt):
    with pytest.raises(RuntimeError, match="Unsupported input type encountered for isin"):
        torch.isin(torch.tensor([1, 2]).to(pjrt), torch.tensor([True]).to(pjrt))


def test_creation(pjrt):
    assert_close(torch.zeros(2, 3, device=pjrt), torch.zeros(2, 3))
    assert_close(torch.ones(4, dtype=torch.int32, device=pjrt), torch.ones(4, dtype=torch.int32))
    assert_close(torch.full((2, 2), 7.5, device=pjrt), torch.full((2, 2), 7.5))
    assert_close(torch.arange(5, device=pjrt), torch.arange(5))
    assert_close(torch.arange(0, 1, 0.25, device=pjrt), torch.arange(0, 1, 0.25))
    assert_close(torch.linspace(0, 1, 5, device=pjrt), torch.linspace(0, 1, 5))
    assert_close(torch.eye(3, device=pjrt), torch.eye(3))
    x = torch.randn(2, 3)
    assert_close(torch.zeros_like(x.to(pjrt)), torch.zeros_like(x))
    assert_close(torch.ones_like(x.to(pjrt)), torch.ones_like(x))
    assert torch.empty(2, 3, device=pjrt).shape == (2, 3)


def test_in_place_and_out_variants(pjrt):
    a, b = _data(3, 4), _data(3, 4)
    pa = a.to(pjrt)
    pa.add_(b.to(pjrt), alpha=2).mul_(0.5).exp_()
    assert_close(pa, a.add(b, alpha=2).mul(0.5).exp())
    out = torch.empty(0, device=pjrt)
    torch.mul(a.to(pjrt), b.to(pjrt), out=out)
    assert_close(out, a * b)
    out64 = torch.empty(3, 4, dtype=torch.float64, device=pjrt)
    torch.add(a.to(pjrt), b.to(pjrt), out=out64)
    assert_close(out64, (a + b).double())
    z = a.to(pjrt)
    z.zero_()
    assert_close(z, torch.zeros(3, 4))
    z.fill_(2.5)
    assert_close(z, torch.full((3, 4), 2.5))


def test_copies_between_devices(pjrt):
    x = torch.randn(3, 4)
    p = x.to(pjrt)
    assert p.device.type == "pjrt" and p.is_pjrt
    assert_close(p.to(torch.float64), x.double())
    assert_close(p.clone(), x)
    d = torch.empty(3, 4, dtype=torch.float64, device=pjrt)
    d.copy_(p)
    assert_close(d, x.double())
    d.copy_(torch.arange(4.0))  # broadcast from the host
    assert_close(d, torch.arange(4.0, dtype=torch.float64).expand(3, 4))
    host = torch.empty(3, 4, dtype=torch.float64)
    host.copy_(p)  # cast on the way to the host
    torch.testing.assert_close(host, x.double())
    torch.testing.assert_close(p.cpu(), x)
    torch.testing.assert_close(p.to("cpu", torch.int64), x.to(torch.int64))


def test_module_to_keeps_shared_parameters(pjrt):
    """`Module.to` moves a Parameter in place (`param.data = ...`), so a Parameter shared by two
    modules (tied weights) stays one Parameter and its gradient sums both uses, as on the CPU."""
    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head)
    expected = copy.deepcopy(model)
    param = emb.weight
    model.to(pjrt)
    assert model[1].weight is model[0].weight is param and param.device.type == "pjrt"
    ids = torch.tensor([[1, 4, 2]])
    model(ids.to(pjrt)).square().sum().backward()
    expected(ids).square().sum().backward()
    assert_close(param.grad, expected[0].weight.grad)
    model.cpu()
    assert model[1].weight is model[0].weight is param and param.grad.device.type == "cpu"


def test_scalars_to_python(pjrt):
    x = torch.tensor([[1.5, -2.0], [3.0, 4.25]])
    p = x.to(pjrt)
    assert p.sum().item() == pytest.approx(6.75)
    assert p.tolist() == x.tolist()
    assert bool(p.sum() > 0) is True
    assert bool(p.sum() < 0) is False
    assert int(p.max()) == 4
    assert float(p.min()) == -2.0
    assert torch.tensor(3, device=pjrt).item() == 3
    with pytest.raises(RuntimeError):
        bool(p)  # more than one value


def test_numpy_is_a_type_error(pjrt):
    p = torch.ones(3, device=pjrt)
    with pytest.raises(TypeError):
        p.numpy()
    assert p.cpu().numpy().tolist() == [1.0, 1.0, 1.0]


def test_errors_are_pytorch_errors(pjrt):
    a = torch.ones(3, 4, device=pjrt)
    with pytest.raises(RuntimeError, match="must match"):
        a + torch.ones(5, device=pjrt)
    with pytest.raises(RuntimeError, match="same device"):
        a + torch.ones(3, 4)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(3, dtype=torch.int64, device=pjrt).add_(1.5)
    with pytest.raises(IndexError):
        a.sum(5)
    with pytest.raises(TypeError, match="not supported on pjrt"):
        torch.ones(2, dtype=torch.float8_e4m3fn, device=pjrt)
    with pytest.raises(RuntimeError, match="numel"):
        torch.ones(0, device=pjrt).max()
    # the device stays usable
    assert_close(a + 1, torch.full((3, 4), 2.0))


def test_training_step_matches_cpu(pjrt):
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
    model.load_state_dict(ref.state_dict())
    model.to(pjrt)
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for mode in ("strict", "defer_and_fuse"):
        with torch_pjrt.eager_mode(mode):
            for _ in range(3):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x.to(pjrt)), y.to(pjrt))
                loss.backward()
                opt.step()
                ref_opt.zero_grad()
                ref_loss = torch.nn.functional.cross_entropy(ref(x), y)
                ref_loss.backward()
                ref_opt.step()
                assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-4, abs=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-5)
    assert torch_pjrt.metrics()["fallback_ops"] == {}


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_same_dtype_ops_refuse_an_out_of_another_dtype(pjrt, mode):
    # PyTorch's neg, abs, floor, ceil, round, trunc, sign and bitwise_not write only into a
    # destination of their result's dtype; float ops such as sqrt cast into any wider one.
    x = torch.tensor([1.5, -2.25], device="pjrt")
    with torch_pjrt.eager_mode(mode):
        for op in (torch.neg, torch.abs, torch.floor, torch.ceil, torch.round, torch.trunc,
                   torch.sign):
            with pytest.raises(RuntimeError, match="Found dtype Double but expected Float"):
                op(x, out=torch.empty(0, dtype=torch.float64, device="pjrt"))
            out = torch.empty(0, dtype=torch.float32, device="pjrt")
            op(x, out=out)
            assert torch.equal(out.cpu(), op(x.cpu()))
        with pytest.raises(RuntimeError, match="Found dtype Double but expected Float"):
            torch.nan_to_num(x, out=torch.empty(0, dtype=torch.float64, device="pjrt"))
        with pytest.raises(RuntimeError, match="Found dtype Int but expected Long"):
            torch.bitwise_not(x.long(), out=torch.empty(0, dtype=torch.int32, device="pjrt"))
        wide = torch.empty(0, dtype=torch.float64, device="pjrt")
        torch.sqrt(x.abs(), out=wide)
        assert torch.allclose(wide.cpu(), x.cpu().abs().sqrt().double())
        y = x.clone()
        y.neg_()
        assert torch.equal(y.cpu(), -x.cpu())


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_clamp_propagates_nan_bounds(pjrt, mode, dtype):
    nan = float("nan")
    x = torch.tensor([1.0, nan, 3.0, -1.0, 5.0], dtype=dtype)
    lo = torch.tensor([0.0, 0.0, nan, 0.0, nan], dtype=dtype)
    hi = torch.tensor([2.0, 2.0, 2.0, nan, 4.0], dtype=dtype)
    cases = [
        lambda x, lo, hi: torch.clamp(x, lo, hi),
        lambda x, lo, hi: torch.clamp(x, min=lo),
        lambda x, lo, hi: torch.clamp(x, max=hi),
        lambda x, lo, hi: torch.clamp(x, min=nan),
        lambda x, lo, hi: torch.clamp(x, -0.5, nan),
    ]
    with torch_pjrt.eager_mode(mode):
        for fn in cases:
            got = fn(x.to("pjrt"), lo.to("pjrt"), hi.to("pjrt")).cpu()
            torch.testing.assert_close(got, fn(x, lo, hi), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_solve_triangular_and_its_gradients_match_the_cpu(pjrt, mode, dtype):
    # Linear-attention models solve triangular systems per chunk; nothing may fall back.
    gen = torch.Generator().manual_seed(31)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}
    with torch_pjrt.eager_mode(mode):
        torch_pjrt.reset_metrics()
        for upper, left, unit in [(True, True, False), (False, True, True), (True, False, False), (False, False, True)]:
            a = torch.randn(3, 4, 4, generator=gen, dtype=dtype) + 4 * torch.eye(4, dtype=dtype)
            b = torch.randn(2, 1, 4, 5, generator=gen, dtype=dtype) if left else torch.randn(5, 4, generator=gen, dtype=dtype)
            results = []
            for device in ("cpu", "pjrt"):
                ad = a.detach().to(device).requires_grad_()
                bd = b.detach().to(device).requires_grad_()
                x = torch.linalg.solve_triangular(ad, bd, upper=upper, left=left, unitriangular=unit)
                (x * torch.arange(x.numel(), dtype=dtype, device=device).view(x.shape).cos()).sum().backward()
                results.append((x.detach().cpu(), ad.grad.cpu(), bd.grad.cpu()))
            for got, want in zip(results[1], results[0]):
                torch.testing.assert_close(got, want, **tol)
        assert torch_pjrt.metrics()["fallback_ops"] == {}
    with pytest.raises(RuntimeError, match="must be batches of square matrices"):
        torch.linalg.solve_triangular(torch.ones(2, 3).to(pjrt), torch.ones(2, 2).to(pjrt), upper=True)
    with pytest.raises(RuntimeError, match="Incompatible shapes"):
        torch.linalg.solve_triangular(torch.eye(3).to(pjrt), torch.ones(2, 2).to(pjrt), upper=True)
