"""complex64 and complex128 on pjrt: creation and copies, casts between complex and real, the
arithmetic, functions, reductions and products the engine lowers for complex values, the views
between complex and real tensors (`real`, `imag`, `view_as_real`, `view_as_complex`) and the
conjugate bit, against the CPU in Strict and DeferAndFuse. The `strict_or_fused_mode` fixture
(conftest.py) asserts that none of these fell back to the CPU; ops the engine does not lower for
complex values run on the CPU with the CPU's values (the last tests)."""

import warnings

import pytest
import torch

import torch_pjrt
from conftest import seeded

COMPLEX = [torch.complex64, torch.complex128]
TOL = {torch.complex64: dict(rtol=2e-6, atol=1e-6), torch.complex128: dict(rtol=1e-13, atol=1e-13)}


def sample(dtype, *shape, seed=0):
    g = seeded(seed)
    real = torch.randn(*shape, generator=g, dtype=torch.float64)
    imag = torch.randn(*shape, generator=g, dtype=torch.float64)
    return torch.complex(real, imag).to(dtype)


def same(got, expected, **tol):
    assert got.device.type == "pjrt"
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    torch.testing.assert_close(got.cpu(), expected, **(tol or TOL.get(expected.dtype, {})))


@pytest.mark.parametrize("dtype", COMPLEX)
def test_creation_and_round_trips(strict_or_fused_mode, dtype):
    same(torch.zeros(2, 3, dtype=dtype, device="pjrt"), torch.zeros(2, 3, dtype=dtype))
    same(torch.ones(2, dtype=dtype, device="pjrt"), torch.ones(2, dtype=dtype))
    same(torch.full((3,), 2.5, dtype=dtype, device="pjrt"), torch.full((3,), 2.5, dtype=dtype))
    assert torch.empty(4, dtype=dtype, device="pjrt").dtype == dtype
    x = sample(dtype, 3, 4)
    p = x.to("pjrt")
    assert torch.equal(p.cpu(), x)
    assert torch.equal(torch.tensor([1 + 2j, -3j], dtype=dtype, device="pjrt").cpu(),
                       torch.tensor([1 + 2j, -3j], dtype=dtype))
    assert torch.equal(p.clone().cpu(), x)
    dst = torch.zeros(3, 4, dtype=dtype, device="pjrt")
    dst.copy_(p)
    assert torch.equal(dst.cpu(), x)
    dst[1].copy_(p[0])  # a write through a view of a complex storage
    expected = x.clone()
    expected[1] = x[0]
    assert torch.equal(dst.cpu(), expected)
    assert torch.equal(p.t().contiguous().cpu(), x.t().contiguous())
    assert p[1, 2].item() == x[1, 2].item()


@pytest.mark.parametrize("dtype", COMPLEX)
def test_casts_between_complex_and_real(strict_or_fused_mode, dtype):
    x = sample(dtype, 5)
    p = x.to("pjrt")
    real = torch.tensor([1.5, -2.0, 0.0], dtype=torch.float64)
    # Real to complex: imaginary part 0; complex to real: the real part, as PyTorch casts.
    same(real.to("pjrt").to(dtype), real.to(dtype))
    same(torch.arange(3, device="pjrt").to(dtype), torch.arange(3).to(dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same(p.to(torch.float32), x.to(torch.float32))
        same(p.to(torch.int64), x.to(torch.int64))
    same(p.to(torch.bool), x.to(torch.bool))
    other = torch.complex128 if dtype == torch.complex64 else torch.complex64
    same(p.to(other), x.to(other))


@pytest.mark.parametrize("dtype", COMPLEX)
def test_arithmetic_and_promotion(strict_or_fused_mode, dtype):
    x, y = sample(dtype, 4, 3, seed=1), sample(dtype, 3, seed=2)
    px, py = x.to("pjrt"), y.to("pjrt")
    r = torch.randn(4, 3, generator=seeded(3))
    pr = r.to("pjrt")
    for fn in [torch.add, torch.sub, torch.mul, torch.div,
               lambda a, b: a + 2 * b, lambda a, b: torch.add(a, b, alpha=3),
               lambda a, b: -a, lambda a, b: a * 1.5, lambda a, b: 2.0 - a,
               lambda a, b: a + 1j, lambda a, b: (2 - 1j) * a, lambda a, b: a / (1 + 1j)]:
        same(fn(px, py), fn(x, y))
    # Complex with real tensors: complex results of the wider precision.
    same(px * pr, x * r)
    same(pr - px, r - x)
    same(pr.double() + px, r.double() + x)
    same(torch.ones(3, dtype=torch.int64, device="pjrt") * py,
         torch.ones(3, dtype=torch.int64) * y)
    z = px.clone()
    z += py
    z *= 2
    same(z, (x + y) * 2)


@pytest.mark.parametrize("dtype", COMPLEX)
@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "sin", "cos", "tanh", "reciprocal"])
def test_functions(strict_or_fused_mode, dtype, name):
    x = sample(dtype, 64, seed=4)
    fn = getattr(torch, name)
    # XLA CPU's complex functions differ from PyTorch's by a few units in the last place.
    tol = dict(rtol=2e-5, atol=1e-6) if dtype == torch.complex64 else dict(rtol=1e-12, atol=1e-13)
    same(fn(x.to("pjrt")), fn(x), **tol)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_abs_angle_parts_and_polar(strict_or_fused_mode, dtype):
    x = sample(dtype, 6, seed=5)
    p = x.to("pjrt")
    same(p.abs(), x.abs())
    same(torch.angle(p), torch.angle(x))
    same(p.real, x.real)
    same(p.imag, x.imag)
    real, imag = x.real.contiguous(), x.imag.contiguous()
    same(torch.complex(real.to("pjrt"), imag.to("pjrt")), torch.complex(real, imag))
    mag, ang = x.abs(), torch.angle(x)
    same(torch.polar(mag.to("pjrt"), ang.to("pjrt")), torch.polar(mag, ang))
    same(torch.angle(torch.tensor([-1.0, 0.0, 2.0], device="pjrt")),
         torch.angle(torch.tensor([-1.0, 0.0, 2.0])))


@pytest.mark.parametrize("dtype", COMPLEX)
def test_views_share_storage(strict_or_fused_mode, dtype):
    x = sample(dtype, 2, 3, seed=6)
    p = x.to("pjrt")
    pairs = torch.view_as_real(p)
    assert pairs.dtype == x.real.dtype and pairs.shape == (2, 3, 2)
    assert pairs.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
    same(pairs, torch.view_as_real(x))
    # Writes through the real views change the complex tensor, and back.
    expected = x.clone()
    p.real[0] = 5.0
    expected.real[0] = 5.0
    p.imag[:, 1] *= -2
    expected.imag[:, 1] *= -2
    torch.view_as_real(p)[1, 2, 0] = 7.0
    torch.view_as_real(expected)[1, 2, 0] = 7.0
    same(p, expected)
    back = torch.view_as_complex(pairs)
    assert back.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
    same(back, expected)
    flat = torch.randn(4, 2, generator=seeded(8), dtype=x.real.dtype)
    pf = flat.to("pjrt")
    z = torch.view_as_complex(pf)
    z.mul_(1j)
    same(pf, torch.view_as_real(torch.view_as_complex(flat) * 1j))


@pytest.mark.parametrize("dtype", COMPLEX)
def test_conjugate_bit(strict_or_fused_mode, dtype):
    x = sample(dtype, 3, 3, seed=9)
    p = x.to("pjrt")
    c = p.conj()
    assert c.is_conj() and c.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
    same(c, x.conj())
    same(c.resolve_conj(), x.conj())
    assert not c.resolve_conj().is_conj()
    same(torch.conj_physical(p), torch.conj_physical(x))
    same(c * 2, x.conj() * 2)
    same(c @ p, x.conj() @ x)
    same(c.imag, x.conj().imag)
    # Writes into a conjugate view store the conjugate.
    value = torch.tensor(1 + 2j, dtype=dtype)
    c[0, 0] = value
    expected = x.clone()
    expected.conj()[0, 0] = value
    same(p, expected)
    q = p.clone()
    q.conj_physical_()
    same(q, expected.conj_physical())


@pytest.mark.parametrize("dtype", COMPLEX)
def test_comparisons_where_and_reductions(strict_or_fused_mode, dtype):
    x, y = sample(dtype, 4, 5, seed=10), sample(dtype, 4, 5, seed=11)
    y[0] = x[0]
    px, py = x.to("pjrt"), y.to("pjrt")
    same(px == py, x == y)
    same(px != py, x != y)
    mask = torch.rand(4, 5, generator=seeded(12)) > 0.5
    same(torch.where(mask.to("pjrt"), px, py), torch.where(mask, x, y))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.complex64 else {}
    same(px.sum(), x.sum(), **tol)
    same(px.sum(dim=1), x.sum(dim=1), **tol)
    same(px.mean(dim=0, keepdim=True), x.mean(dim=0, keepdim=True), **tol)
    same(px.prod(dim=1), x.prod(dim=1), **tol)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_products_and_data_movement(strict_or_fused_mode, dtype):
    a, b = sample(dtype, 3, 4, seed=13), sample(dtype, 4, 5, seed=14)
    pa, pb = a.to("pjrt"), b.to("pjrt")
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.complex64 else {}
    same(pa @ pb, a @ b, **tol)
    same(torch.mm(pa, pb), torch.mm(a, b), **tol)
    ba, bb = sample(dtype, 2, 3, 4, seed=15), sample(dtype, 2, 4, 2, seed=16)
    same(torch.bmm(ba.to("pjrt"), bb.to("pjrt")), torch.bmm(ba, bb), **tol)
    same(torch.cat([pa, pa * 2]), torch.cat([a, a * 2]))
    same(torch.stack([pa, pa], dim=1), torch.stack([a, a], dim=1))
    same(pa.reshape(2, 6), a.reshape(2, 6))
    same(pa.permute(1, 0).contiguous(), a.permute(1, 0).contiguous())
    same(pa[:, 1:3], a[:, 1:3])
    same(pa.flip(0), a.flip(0))
    same(torch.index_select(pa, 1, torch.tensor([3, 0], device="pjrt")),
         torch.index_select(a, 1, torch.tensor([3, 0])))


@pytest.mark.parametrize("dtype", COMPLEX)
@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.int64, torch.bool])
def test_out_of_a_real_result_into_a_complex_tensor(strict_or_fused_mode, dtype, source):
    # c10's canCast lets a real result be written into a complex out= tensor (imaginary part 0)
    # and refuses a complex result into a real one.
    x = torch.tensor([1, 0, 3], dtype=source)
    y = torch.tensor([0, 5, 1], dtype=source)
    out = torch.ones(6, dtype=dtype, device="pjrt")
    torch.cat([x.to("pjrt"), y.to("pjrt")], out=out)
    same(out, torch.cat([x, y]).to(dtype))
    real_out = torch.zeros(6, dtype=torch.float64, device="pjrt")
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Double"):
        torch.cat([x.to("pjrt").to(dtype)] * 2, out=real_out)


@pytest.mark.parametrize("dtype", COMPLEX)
@pytest.mark.parametrize("conj_self", [False, True])
@pytest.mark.parametrize("conj_other", [False, True])
def test_vdot_keeps_the_conjugate_bit_of_the_cpu(strict_or_fused_mode, dtype, conj_self,
                                                  conj_other):
    # PyTorch's kernel returns a conjugate view of `dot` when only `other` is conjugate; the
    # values alone would pass through the CPU fallback, the conjugate bit would not.
    a, b = sample(dtype, 6, seed=30), sample(dtype, 6, seed=31)

    def operands(x, y):
        return (x.conj() if conj_self else x), (y.conj() if conj_other else y)

    expected = torch.vdot(*operands(a, b))
    got = torch.vdot(*operands(a.to("pjrt"), b.to("pjrt")))
    assert got.is_conj() == expected.is_conj()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.complex64 else {}
    same(got, expected, **tol)
    real_a, real_b = torch.randn(6, generator=seeded(32)), torch.randn(6, generator=seeded(33))
    same(torch.vdot(real_a.to("pjrt"), real_b.to("pjrt")), torch.vdot(real_a, real_b),
         rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_linspace_and_eye(strict_or_fused_mode, dtype):
    # Real bounds: the real part is the real linspace of the parts' dtype, the imaginary part 0.
    for start, end, steps in [(-2.0, -3, 0), (1.5, 4, 1), (0, 1, 2), (-2.0, 3.25, 7), (10, -7.5, 100)]:
        same(torch.linspace(start, end, steps, dtype=dtype, device="pjrt"),
             torch.linspace(start, end, steps, dtype=dtype), rtol=0, atol=0)
    out = torch.empty(0, dtype=dtype, device="pjrt")
    torch.linspace(-1, 1, 5, out=out)
    same(out, torch.linspace(-1, 1, 5, dtype=dtype), rtol=0, atol=0)
    same(torch.eye(3, dtype=dtype, device="pjrt"), torch.eye(3, dtype=dtype), rtol=0, atol=0)
    same(torch.eye(2, 5, dtype=dtype, device="pjrt"), torch.eye(2, 5, dtype=dtype), rtol=0, atol=0)
    same(torch.eye(0, 3, dtype=dtype, device="pjrt"), torch.eye(0, 3, dtype=dtype))


# A grid of parts: finite, zero, infinite and NaN, each against each as real and imaginary parts.
SPECIAL_PARTS = [0.0, -0.0, 1.5, -2.0, 30.0, float("inf"), float("-inf"), float("nan")]


def special_values(dtype):
    parts = torch.tensor(SPECIAL_PARTS, dtype=torch.float64)
    grid = torch.complex(parts[:, None].expand(-1, len(parts)), parts[None, :].expand(len(parts), -1))
    return grid.reshape(-1).to(dtype)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_logaddexp(strict_or_fused_mode, dtype):
    x, y = sample(dtype, 4, 5, seed=24) * 4, sample(dtype, 5, seed=25) * 4
    px, py = x.to("pjrt"), y.to("pjrt")
    same(torch.logaddexp(px, py), torch.logaddexp(x, y))
    # Far apart (the smaller's exp is a small correction) and on equal real parts.
    far = torch.complex(torch.tensor([-40.0, 0.0, 25.0], dtype=torch.float64),
                        torch.tensor([1.0, -3.0, 0.5], dtype=torch.float64)).to(dtype)
    same(torch.logaddexp(far.to("pjrt"), py[:3]), torch.logaddexp(far, y[:3]))
    same(torch.logaddexp(py, py.conj()), torch.logaddexp(y, y.conj()))
    # A real operand promotes; out= takes the complex result.
    r = torch.randn(4, 5, generator=seeded(26), dtype=torch.float64)
    same(torch.logaddexp(r.to("pjrt"), py), torch.logaddexp(r, y))
    out = torch.empty(4, 5, dtype=dtype, device="pjrt")
    torch.logaddexp(px, py, out=out)
    same(out, torch.logaddexp(x, y))
    # Every pair of special values, against the CPU's results (NaN where the CPU's is NaN).
    grid = special_values(dtype)
    a, b = grid[:, None], grid[None, :]
    got = torch.logaddexp(a.to("pjrt"), b.to("pjrt")).cpu()
    expected = torch.logaddexp(a, b)
    assert got.dtype == dtype
    torch.testing.assert_close(got, expected, equal_nan=True, **TOL[dtype])


def test_gradients_through_complex_values():
    for mode in ["strict", "defer_and_fuse"]:
        with torch_pjrt.eager_mode(mode):
            x = torch.randn(3, generator=seeded(17))
            grads = []
            for device in ["cpu", "pjrt"]:
                xd = x.detach().clone().to(device).requires_grad_()
                z = torch.complex(xd, 2 * xd)
                loss = torch.view_as_real(z * z.conj() + z * 1j).sum()
                loss.backward()
                grads.append(xd.grad.cpu())
            torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("dtype", COMPLEX)
def test_random_draws(strict_or_fused_mode, dtype):
    # Each part is drawn on its own: uniform in [from, to), normal with half the variance.
    gen = torch.Generator(device="pjrt").manual_seed(3)
    z = torch.randn(20000, dtype=dtype, device="pjrt", generator=gen).cpu()
    assert z.dtype == dtype
    parts = torch.view_as_real(z).double()
    assert abs(parts.mean().item()) < 0.02
    torch.testing.assert_close(parts.std(0), torch.full((2,), 0.5**0.5, dtype=torch.float64), atol=0.02, rtol=0)
    torch.testing.assert_close(z.abs().pow(2).mean().item(), 1.0, atol=0.03, rtol=0)
    u = torch.empty(20000, dtype=dtype, device="pjrt").uniform_(-2, 3, generator=gen).cpu()
    parts = torch.view_as_real(u)
    assert parts.min() >= -2 and parts.max() < 3
    assert abs(parts[:, 0].mean().item() - 0.5) < 0.05 and abs(parts[:, 1].mean().item() - 0.5) < 0.05
    assert not torch.equal(parts[:, 0], parts[:, 1])
    # A draw into a strided view writes only the view.
    y = torch.zeros(4, 6, dtype=dtype, device="pjrt")
    y[:, ::2].normal_(generator=gen)
    assert torch.equal(y[:, 1::2].cpu(), torch.zeros(4, 3, dtype=dtype))
    assert (y[:, ::2].cpu() != 0).all()


@pytest.mark.parametrize("dtype", COMPLEX)
def test_indexing(strict_or_fused_mode, dtype):
    x = sample(dtype, 5, 4, seed=21)
    p = x.to("pjrt")
    rows = torch.tensor([3, 0, 3, -1])
    same(p[rows.to("pjrt")], x[rows])
    same(p[rows.to("pjrt"), 1:], x[rows, 1:])
    mask = x.real > 0
    same(p[mask.to("pjrt")], x[mask])
    same(p.nonzero(), x.nonzero())
    values = sample(dtype, 4, seed=22)
    for accumulate in (False, True):
        got = p.clone().index_put_((rows.to("pjrt"),), values.to("pjrt"), accumulate=accumulate)
        same(got, x.clone().index_put_((rows,), values, accumulate=accumulate))
    got = p.clone()
    got[mask.to("pjrt")] = 0
    expected = x.clone()
    expected[mask] = 0
    same(got, expected)
    source = sample(dtype, 20, seed=23)
    same(p.masked_scatter(mask.to("pjrt"), source.to("pjrt")), x.masked_scatter(mask, source))


@pytest.mark.parametrize("name", ["sinh", "cosh", "sinc", "asinh", "acosh", "atanh", "atan", "asin", "acos"])
@pytest.mark.parametrize("dtype", COMPLEX)
def test_real_compositions_run_complex_values_on_the_cpu_in_every_form(name, dtype):
    """Kernels composed for real numbers send complex values to the CPU in their functional,
    `out=` and in-place forms alike, on plain tensors and on conjugate and negative views."""
    x = sample(dtype, 6, seed=27)
    fn, in_place = getattr(torch, name), getattr(torch.Tensor, name + "_")
    views = {
        "plain": lambda t: t,
        "conj": lambda t: t.conj(),
        "neg_conj": lambda t: torch._neg_view(t.conj()),
    }
    with torch_pjrt.eager_mode("strict"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for view in views.values():
            cpu, dev = view(x.clone()), view(x.to("pjrt"))
            same(fn(dev), fn(cpu))
            out = torch.empty(6, dtype=dtype, device="pjrt")
            assert fn(dev, out=out) is out
            same(out, fn(cpu))
            cpu, dev = view(x.clone()), view(x.to("pjrt"))
            in_place(cpu)
            assert in_place(dev) is dev
            assert dev.is_conj() == cpu.is_conj() and dev.is_neg() == cpu.is_neg()
            same(dev.resolve_conj().resolve_neg(), cpu.resolve_conj().resolve_neg())
        # PyTorch's errors where it refuses: a complex result into a real out=, and `frac`.
        for call in [lambda t: fn(t, out=torch.empty(6, device=t.device)), torch.frac, torch.Tensor.frac_]:
            with pytest.raises(Exception) as on_cpu:
                call(x.clone())
            with pytest.raises(type(on_cpu.value)) as on_pjrt:
                call(x.to("pjrt"))
            assert str(on_pjrt.value) == str(on_cpu.value)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_vector_norms_and_masked_fill(strict_or_fused_mode, dtype):
    # A complex norm is its magnitudes' norm, in the parts' dtype (so complex gradients of
    # `norm`, whose backward masks the zeros with `masked_fill`, stay on the device too).
    x = sample(dtype, 3, 4, seed=21)
    real = {torch.complex64: torch.float32, torch.complex128: torch.float64}[dtype]
    for ord in [2, 1, 3, 0, float("inf"), -float("inf"), -1]:
        same(torch.linalg.vector_norm(x.to("pjrt"), ord, dim=1), torch.linalg.vector_norm(x, ord, dim=1),
             **TOL[dtype])
    same(torch.linalg.vector_norm(x.to("pjrt"), dtype=torch.complex128),
         torch.linalg.vector_norm(x, dtype=torch.complex128))
    assert torch.linalg.vector_norm(x.to("pjrt")).dtype == real
    with pytest.raises(RuntimeError, match="dtype should be complex for complex inputs"):
        torch.linalg.vector_norm(x.to("pjrt"), dtype=torch.float64)
    mask = torch.rand(3, 4, generator=seeded(22)) > 0.5
    for value in [0, -2.5, torch.tensor(1 + 2j, dtype=dtype)]:
        device_value = value.to("pjrt") if isinstance(value, torch.Tensor) else value
        same(x.to("pjrt").masked_fill(mask.to("pjrt"), device_value), x.masked_fill(mask, value))
    # A complex value tensor into a real tensor is refused, as on the CPU.
    with pytest.raises(RuntimeError, match="value cannot be converted to type int64_t without overflow"):
        torch.zeros(2, dtype=torch.long, device="pjrt").masked_fill(mask[0, :2].to("pjrt"),
                                                                    torch.tensor(1j, device="pjrt"))
    leaf = x.clone().requires_grad_()
    expected = torch.autograd.grad(torch.linalg.vector_norm(leaf), leaf)[0]
    on_device = x.to("pjrt").requires_grad_()
    same(torch.autograd.grad(torch.linalg.vector_norm(on_device), on_device)[0], expected)


def test_ops_not_lowered_for_complex_values_run_on_the_cpu():
    x = sample(torch.complex64, 5, seed=18)
    p = x.to("pjrt")
    with torch_pjrt.eager_mode("strict"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_pjrt.reset_metrics()
        # An engine op without a complex lowering, a kernel composed for real numbers, and a
        # complex Python scalar where the engine takes real ones.
        same(torch.sgn(p), torch.sgn(x))
        same(torch.sinh(p), torch.sinh(x), rtol=1e-5, atol=1e-6)
        same(torch.full((2,), 1 - 2j, device="pjrt"), torch.full((2,), 1 - 2j))
        same(p.mul(2j), x.mul(2j))
        fallbacks = torch_pjrt.metrics()["fallback_ops"]
    assert "aten::sgn" in fallbacks and "aten::sinh" in fallbacks, fallbacks
    # A composition for real numbers that the CPU does not offer for complex values refuses.
    with pytest.raises(NotImplementedError):
        torch.logit(p)


@pytest.mark.parametrize("dtype", COMPLEX)
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_products_write_through_a_conjugate_output_as_the_cpu_does(mode, dtype):
    """PyTorch's conjugation fallback passes the in-place and `out=` products (mm, addmm, bmm,
    baddbmm, dot, vdot) an output with the conjugate bit, on the device or through the CPU
    fallback's write-back (complex addmm): the result reads back unconjugated."""
    a, b, c = sample(dtype, 3, 4, seed=1), sample(dtype, 4, 2, seed=2), sample(dtype, 3, 2, seed=3)
    ba, bb, bc = (sample(dtype, 2, *s, seed=4 + i) for i, s in enumerate([(3, 4), (4, 2), (3, 2)]))
    u, v = sample(dtype, 5, seed=8), sample(dtype, 5, seed=9)
    cases = {
        "mm.out": (lambda out, d: torch.mm(d(a), d(b), out=out), c),
        "addmm.out": (lambda out, d: torch.addmm(d(c), d(a), d(b), alpha=2, out=out), c),
        "addmm_": (lambda out, d: out.addmm_(d(a), d(b), beta=0.5), c),
        "bmm.out": (lambda out, d: torch.bmm(d(ba), d(bb), out=out), bc),
        "baddbmm_": (lambda out, d: out.baddbmm_(d(ba), d(bb), alpha=3), bc),
        "baddbmm.out": (lambda out, d: torch.baddbmm(d(bc), d(ba), d(bb), out=out), bc),
        "dot.out": (lambda out, d: torch.dot(d(u), d(v), out=out), torch.zeros((), dtype=dtype)),
        "vdot.out": (lambda out, d: torch.vdot(d(u), d(v), out=out), torch.zeros((), dtype=dtype)),
    }
    for name, (call, init) in cases.items():
        expected = init.clone().conj()
        call(expected, lambda t: t)
        with torch_pjrt.eager_mode(mode), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # complex addmm runs through the CPU fallback
            got = init.to("pjrt").conj()
            call(got, lambda t: t.to("pjrt"))
            assert got.is_conj(), name
            same(got.resolve_conj(), expected.resolve_conj())


# ---- complex32 ------------------------------------------------------------------------------
# PyTorch's CUDA kernels compute complex32 in complex64 and round each part to float16; the
# expected values are the CPU's where it computes complex32, else its complex64 result rounded.

CHALF_WARNING = "ComplexHalf support is experimental"


def chalf_sample(*shape, seed=0):
    return sample(torch.complex64, *shape, seed=seed).to(torch.chalf)


def equal32(a, b):
    """`torch.equal` for complex32 tensors (the CPU's has no complex32 kernel)."""
    return torch.equal(torch.view_as_real(a.cpu()), torch.view_as_real(b))


def rounded(f, *xs):
    """`f` on the complex64 values of complex32 `xs`, its complex result rounded to complex32."""
    r = f(*(x.to(torch.complex64) for x in xs))
    return r.to(torch.chalf) if r.is_complex() else r


@pytest.mark.filterwarnings(f"ignore:{CHALF_WARNING}")
def test_complex32_creation_round_trips_and_casts(strict_or_fused_mode):
    c = torch.chalf
    same(torch.zeros(2, 3, dtype=c, device="pjrt"), torch.zeros(2, 3, dtype=c), rtol=0, atol=0)
    same(torch.ones(2, dtype=c, device="pjrt"), torch.ones(2, dtype=c), rtol=0, atol=0)
    same(torch.full((3,), 2.5, dtype=c, device="pjrt"), torch.full((3,), 2.5, dtype=c))
    assert torch.empty(4, dtype=c, device="pjrt").dtype == c
    x = chalf_sample(3, 4)
    p = x.to("pjrt")
    assert p.element_size() == 4 and p.untyped_storage().nbytes() == 48
    assert equal32(p, x)
    assert equal32(p.clone(), x)
    # Casts both ways round each part as the CPU's casts do.
    wide = sample(torch.complex64, 3, 4, seed=5)
    same(wide.to("pjrt").to(c), wide.to(c), rtol=0, atol=0)
    same(p.to(torch.complex64), x.to(torch.complex64), rtol=0, atol=0)
    same(p.to(torch.complex128), x.to(torch.complex128), rtol=0, atol=0)
    real = torch.tensor([1.5, -2.0, 1e-3], dtype=torch.float32)
    same(real.to("pjrt").to(c), real.to(c), rtol=0, atol=0)
    # copy_ between dtypes, into a view, and across the host boundary.
    dst = torch.zeros(3, 4, dtype=c, device="pjrt")
    dst.copy_(wide.to("pjrt"))
    same(dst, wide.to(c), rtol=0, atol=0)
    dst[1].copy_(p[0])
    expected = wide.to(c).clone()
    expected[1] = x[0]
    same(dst, expected, rtol=0, atol=0)
    host = torch.zeros(3, 4, dtype=c)
    host.copy_(p)
    assert equal32(host, x)


@pytest.mark.filterwarnings(f"ignore:{CHALF_WARNING}")
def test_complex32_views_and_joins(strict_or_fused_mode):
    x = chalf_sample(3, 4)
    p = x.to("pjrt")
    same(p.view(4, 3), x.view(4, 3), rtol=0, atol=0)
    same(p.reshape(2, 6), x.reshape(2, 6), rtol=0, atol=0)
    same(p[1:, ::2], x[1:, ::2], rtol=0, atol=0)
    same(p.t().contiguous(), x.t().contiguous(), rtol=0, atol=0)
    same(torch.cat([p, p[:1]]), torch.cat([x, x[:1]]), rtol=0, atol=0)
    same(torch.stack([p, p]), torch.stack([x, x]), rtol=0, atol=0)
    assert p[1, 2].item() == x[1, 2].item()
    # The float16 views of the parts share the storage, both ways.
    parts = torch.view_as_real(p)
    assert parts.dtype == torch.float16
    assert torch.equal(parts.cpu(), torch.view_as_real(x))
    assert torch.equal(p.real.cpu(), x.real) and torch.equal(p.imag.cpu(), x.imag)
    parts.mul_(2)
    assert torch.equal(torch.view_as_real(p.cpu()), torch.view_as_real(x) * 2)
    h = torch.randn(3, 2, generator=seeded(6)).half()
    c = torch.view_as_complex(h.to("pjrt"))
    assert c.dtype == torch.chalf and equal32(c, torch.view_as_complex(h))
    same(c * 1, rounded(lambda a: a * 1, torch.view_as_complex(h)), rtol=0, atol=0)


@pytest.mark.filterwarnings(f"ignore:{CHALF_WARNING}")
def test_complex32_arithmetic_rounds_as_cuda_does(strict_or_fused_mode):
    x, y = chalf_sample(4, 5, seed=1), chalf_sample(4, 5, seed=2)
    p, q = x.to("pjrt"), y.to("pjrt")
    exact = dict(rtol=0, atol=0)
    # A product or quotient may differ in complex64's last bit, so in the rounding to float16.
    ulp = dict(rtol=1e-3, atol=1e-3)
    same(p + q, rounded(torch.add, x, y), **exact)
    same(p - q, rounded(torch.sub, x, y), **exact)
    same(p * q, rounded(torch.mul, x, y), **ulp)
    same(p / q, rounded(torch.div, x, y), **ulp)
    same(torch.add(p, q, alpha=2), rounded(lambda a, b: torch.add(a, b, alpha=2), x, y), **exact)
    same(p * 2.5, rounded(lambda a: a * 2.5, x), **exact)
    same(-p, -x, **exact)
    same(p.conj().resolve_conj(), x.conj().resolve_conj(), **exact)
    same(torch.conj_physical(p), rounded(torch.conj_physical, x), **exact)
    same(p.abs(), rounded(torch.abs, x).to(torch.float16), **ulp)
    assert torch.equal((p == q).cpu(), x == y)
    assert torch.equal((p == p).cpu(), x == x)
    assert torch.equal((p != q).cpu(), x != y)
    torch.testing.assert_close(p.cpu(), x)


@pytest.mark.filterwarnings(f"ignore:{CHALF_WARNING}")
def test_complex32_type_promotion_matches_the_cpu(strict_or_fused_mode):
    h = torch.tensor([1.5, -2.25, 3.0], dtype=torch.float16)
    x = chalf_sample(3, seed=3)
    ph, px = h.to("pjrt"), x.to("pjrt")
    same(ph + px, rounded(torch.add, h, x), rtol=0, atol=0)
    assert (ph + 1j).dtype == (h + 1j).dtype == torch.chalf
    zero_d = torch.tensor(1.5, dtype=torch.float16)
    same(zero_d.to("pjrt") + (0.1 + 0.3j), zero_d + (0.1 + 0.3j), rtol=0, atol=0)
    same(ph + 1j, rounded(lambda a: a + 1j, h), rtol=0, atol=0)
    c64 = sample(torch.complex64, 3, seed=4)
    same(px * c64.to("pjrt"), x * c64)
    f32 = torch.tensor([0.5, 2.0, -1.0])
    same(px + f32.to("pjrt"), x + f32, rtol=0, atol=0)
    assert torch.result_type(px, ph) == torch.chalf
    assert torch.promote_types(torch.float16, torch.complex64) == torch.complex64


@pytest.mark.filterwarnings(f"ignore:{CHALF_WARNING}")
def test_complex32_advanced_indexing_moves_elements_on_the_device(strict_or_fused_mode):
    x, v = chalf_sample(5, 3, seed=4), chalf_sample(4, 3, seed=5)
    i = torch.tensor([4, 0, 2, 2])
    px, pv, pi = x.to("pjrt"), v.to("pjrt"), i.to("pjrt")
    assert equal32(px[pi], x[i])
    assert equal32(px[px.real > 0], x[x.real > 0])
    assert equal32(px.index_select(0, pi), x.index_select(0, i))
    assert equal32(px.roll(2, 0), x.roll(2, 0))
    assert equal32(px.index_put((pi[:2],), pv[:2]), x.index_put((i[:2],), v[:2]))
    y = px.clone()
    y[pi[:2]] = pv[:2]
    assert equal32(y, x.index_put((i[:2],), v[:2]))
    # Duplicate indices accumulate in complex64, rounded once (the CPU rounds after each add,
    # so it may differ in the last float16 bit).
    acc = px.index_put((pi,), pv, accumulate=True)
    assert equal32(acc, rounded(lambda a, b: a.index_put((i,), b, accumulate=True), x, v))
    torch.testing.assert_close(
        torch.view_as_real(acc.cpu()),
        torch.view_as_real(x.index_put((i,), v, accumulate=True)),
        atol=2e-3,
        rtol=1e-3,
    )


@pytest.mark.filterwarnings(f"ignore:{CHALF_WARNING}")
def test_complex32_ops_cuda_does_not_compute_raise_pytorchs_error():
    p = chalf_sample(3).to("pjrt")
    with pytest.raises(NotImplementedError, match="ComplexHalf"):
        torch.exp(p)
