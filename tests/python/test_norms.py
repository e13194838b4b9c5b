"""Normalization layers and the ops a training step needs beside them (cumsum, masked_fill,
embedding's gradient) on pjrt against the CPU: outputs, saved statistics, running statistics
and gradients, in strict and defer_and_fuse mode (and once in debug), with no CPU fallback."""

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import assert_close

A = torch.ops.aten
TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(params=["strict", "defer_and_fuse"])
def mode(request, pjrt):
    """The pjrt device under each eager mode; the test fails if any op fell back to the CPU."""
    with torch_pjrt.eager_mode(request.param):
        yield pjrt
        torch_pjrt.sync()
    assert torch_pjrt.metrics()["fallback_ops"] == {}


def _leaves(device, *tensors):
    """Copies of `tensors` on `device` that require grad (None stays None)."""
    return [None if t is None else t.detach().to(device).requires_grad_() for t in tensors]


def _check_fwd_bwd(device, fn, *tensors, tol=TOL):
    """`fn` on pjrt against the CPU: its outputs, then the gradients of every input under a
    random upstream gradient (a plain sum would give normalized outputs zero gradient)."""
    cpu = _leaves("cpu", *tensors)
    dev = _leaves(device, *tensors)
    expected, actual = fn(*cpu), fn(*dev)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    grads = [torch.randn(e.shape) for e in expected]
    for a, e in zip(actual, expected):
        assert_close(a, e.detach(), **tol)
    differentiable = [(a, e, g) for a, e, g in zip(actual, expected, grads) if e.requires_grad]
    torch.autograd.backward([e for _, e, _ in differentiable], [g for *_, g in differentiable])
    torch.autograd.backward([a for a, _, _ in differentiable], [g.to(device) for *_, g in differentiable])
    for d, c in zip(dev, cpu):
        if c is not None:
            assert_close(d.grad, c.grad, **tol)


# ---- batch norm -----------------------------------------------------------------------------------


def test_batch_norm_training_updates_running_stats(mode):
    x = torch.randn(4, 3, 5, 5) * 2 + 0.5
    cpu = torch.nn.BatchNorm2d(3, momentum=0.3)
    with torch.no_grad():
        cpu.weight.copy_(torch.randn(3))
        cpu.bias.copy_(torch.randn(3))
    dev = torch.nn.BatchNorm2d(3, momentum=0.3).to(mode)
    dev.load_state_dict(cpu.state_dict())
    _check_fwd_bwd(mode, lambda x: (cpu if x.device.type == "cpu" else dev)(x), x)
    assert_close(dev.weight.grad, cpu.weight.grad, **TOL)
    assert_close(dev.bias.grad, cpu.bias.grad, **TOL)
    assert_close(dev.running_mean, cpu.running_mean)
    assert_close(dev.running_var, cpu.running_var)
    assert int(dev.num_batches_tracked.cpu()) == 1


def test_batch_norm_saved_statistics(mode):
    x, w, b = torch.randn(6, 4, 3), torch.randn(4), torch.randn(4)
    rm, rv = torch.randn(4), torch.rand(4) + 0.5
    for training in (True, False):
        rm_d, rv_d = rm.to(mode), rv.to(mode)
        expected = A.native_batch_norm(x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5)
        actual = A.native_batch_norm(x.to(mode), w.to(mode), b.to(mode), rm_d, rv_d, training, 0.1, 1e-5)
        for a, e in zip(actual, expected):
            assert_close(a, e, **TOL)
        if not training:
            # Evaluation leaves the running statistics alone.
            assert_close(rm_d, rm)
            assert_close(rv_d, rv)


def test_batch_norm_eval_and_without_affine_or_stats(mode):
    x = torch.randn(6, 4)
    rm, rv = torch.randn(4), torch.rand(4) + 0.5
    w, b = torch.randn(4), torch.randn(4)
    _check_fwd_bwd(
        mode, lambda x, w, b: F.batch_norm(x, rm.to(x.device), rv.to(x.device), w, b, training=False), x, w, b
    )
    _check_fwd_bwd(mode, lambda x: F.batch_norm(x, None, None, training=True), x)


def test_batch_norm_with_and_without_update(mode):
    # The forms functionalized and exported graphs call, with their backward (batch_norm_backward).
    x, w, b = torch.randn(4, 3, 5, 5) * 2 + 0.5, torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    rm_d, rv_d = rm.to(mode), rv.to(mode)
    expected_rm, expected_rv = rm.clone(), rv.clone()

    def with_update(x, w, b):
        stats = (expected_rm, expected_rv) if x.device.type == "cpu" else (rm_d, rv_d)
        return A._batch_norm_with_update(x, w, b, *stats, 0.3, 1e-5)[:3]

    _check_fwd_bwd(mode, with_update, x, w, b)
    assert_close(rm_d, expected_rm, **TOL)
    assert_close(rv_d, expected_rv, **TOL)
    reserve = A._batch_norm_with_update(x.to(mode), w.to(mode), b.to(mode), rm_d, rv_d, 0.3, 1e-5)[3]
    assert reserve.shape == (0,) and reserve.dtype == torch.uint8
    _check_fwd_bwd(mode, lambda x, w, b: A._batch_norm_no_update(x, w, b, rm.to(x.device), rv.to(x.device), 0.3,
                                                                 1e-5)[0], x, w, b)


# ---- layer, group and RMS norm ----------------------------------------------------------------------


@pytest.mark.parametrize("shape, normalized", [((4, 3, 5), (5,)), ((4, 3, 5), (3, 5))])
def test_layer_norm(mode, shape, normalized):
    x, w, b = torch.randn(shape) * 3 + 1, torch.randn(normalized), torch.randn(normalized)
    _check_fwd_bwd(mode, lambda x, w, b: F.layer_norm(x, normalized, w, b), x, w, b)
    _check_fwd_bwd(mode, lambda x, w: A.native_layer_norm(x, normalized, w, None, 1e-5), x, w)


def test_layer_norm_module_in_debug_mode(pjrt):
    x = torch.randn(4, 3, 5)
    with torch_pjrt.eager_mode("debug"):
        _check_fwd_bwd(pjrt, lambda x: F.layer_norm(x, (5,)), x)
    assert torch_pjrt.metrics()["fallback_ops"] == {}


def test_group_norm(mode):
    x, w, b = torch.randn(2, 6, 4) * 2, torch.randn(6), torch.randn(6)
    _check_fwd_bwd(mode, lambda x, w, b: F.group_norm(x, 3, w, b), x, w, b)
    _check_fwd_bwd(mode, lambda x: A.native_group_norm(x, None, None, 2, 6, 4, 2, 1e-5), x)


def test_rms_norm(mode):
    x, w = torch.randn(4, 3, 5), torch.randn(5)
    _check_fwd_bwd(mode, lambda x, w: F.rms_norm(x, (5,), w, eps=1e-6), x, w)


# ---- embedding gradient, cumsum, masked_fill -------------------------------------------------------------


@pytest.mark.parametrize("padding_idx, scale", [(None, False), (0, True)])
def test_embedding_gradient(mode, padding_idx, scale):
    weight = torch.randn(6, 4)
    idx = torch.tensor([[1, 2, 0, 1], [5, 1, 0, 3]])
    _check_fwd_bwd(
        mode,
        lambda w: F.embedding(idx.to(w.device), w, padding_idx=padding_idx, scale_grad_by_freq=scale),
        weight,
    )


def test_cumsum(mode):
    x = torch.randn(3, 4)
    _check_fwd_bwd(mode, lambda x: x.cumsum(1), x)
    assert_close(x.to(mode).cumsum(0, dtype=torch.float64), x.cumsum(0, dtype=torch.float64))
    i = torch.tensor([[1, 0, 3], [2, 2, -1]], dtype=torch.int32)
    assert_close(i.to(mode).cumsum(1), i.cumsum(1))
    assert_close((x > 0).to(mode).cumsum(-1), (x > 0).cumsum(-1))
    y = x.to(mode)
    y.cumsum_(1)
    assert_close(y, x.cumsum(1), **TOL)


def test_masked_fill(mode):
    x = torch.randn(3, 4)
    m = x > 0
    _check_fwd_bwd(mode, lambda x: x.masked_fill(m.to(x.device), 0.5), x)
    xd, md = x.to(mode), m.to(mode)
    assert_close(xd.masked_fill(md, torch.tensor(2.5)), x.masked_fill(m, torch.tensor(2.5)))
    assert_close(xd.masked_fill(md, torch.tensor(-1.0).to(mode)), x.masked_fill(m, -1.0))
    assert_close(xd[0].masked_fill(md, 3.0), x[0].masked_fill(m, 3.0))
    ints = torch.arange(12).reshape(3, 4)
    assert_close(ints.to(mode).masked_fill(md, 2.7), ints.masked_fill(m, 2.7))
    xd.masked_fill_(md, float("-inf"))
    assert_close(xd, x.masked_fill(m, float("-inf")))
    with pytest.raises(RuntimeError, match="only supports boolean masks"):
        xd.masked_fill(md.int(), 1.0)


# ---- a small model ----------------------------------------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 4),
            torch.nn.LayerNorm(4),
        )

    def forward(self, x):
        return self.body(x)


def _train(model, device, batches):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = ((model(x.to(device)) - y.to(device)) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_model_trains_like_cpu(mode):
    torch.manual_seed(1)
    cpu = _Net()
    dev = _Net().to(mode)
    dev.load_state_dict(cpu.state_dict())
    batches = [(torch.randn(12, 8), torch.randn(12, 4)) for _ in range(3)]
    expected = _train(cpu, "cpu", batches)
    actual = _train(dev, mode, batches)
    for a, e in zip(actual, expected):
        assert abs(a - e) <= 1e-5 * abs(e), (actual, expected)
    bn_cpu, bn_dev = cpu.body[1], dev.body[1]
    assert_close(bn_dev.running_mean, bn_cpu.running_mean)
    assert_close(bn_dev.running_var, bn_cpu.running_var)
    assert int(bn_dev.num_batches_tracked.cpu()) == 3
    for p_dev, p_cpu in zip(dev.parameters(), cpu.parameters()):
        assert_close(p_dev, p_cpu.detach(), **TOL)
