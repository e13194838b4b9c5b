"""Convolutions and pooling on pjrt against the CPU: values, gradients, layouts and errors, in
every eager mode, with no CPU fallback; and a small CNN trained on both devices.

Shapes come from a small fixed pool: each distinct shape compiles an executable."""

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import assert_close

X2 = (2, 4, 9, 9)  # images
X1 = (2, 4, 11)  # sequences

# (name, input shape, weight shape or None, bias, function of (x, w, b))
CASES = [
    ("conv2d", X2, (6, 4, 3, 3), True, lambda x, w, b: F.conv2d(x, w, b)),
    ("conv2d_stride_pad", X2, (6, 4, 3, 3), True,
     lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1)),
    ("conv2d_groups_dilation", X2, (6, 2, 3, 2), False,
     lambda x, w, b: F.conv2d(x, w, stride=(1, 2), padding=(2, 1), dilation=(2, 1), groups=2)),
    ("conv2d_same", X2, (6, 4, 2, 3), True, lambda x, w, b: F.conv2d(x, w, b, padding="same")),
    ("conv1d", X1, (6, 4, 3), True, lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1)),
    ("conv_transpose2d", X2, (4, 3, 3, 3), True,
     lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1)),
    ("conv_transpose2d_groups", X2, (4, 2, 2, 3), False,
     lambda x, w, b: F.conv_transpose2d(x, w, stride=(3, 2), output_padding=(2, 0), groups=2,
                                        dilation=(1, 2))),
    ("conv_transpose1d", X1, (4, 3, 4), True,
     lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3, padding=1)),
    ("max_pool2d", X2, None, False, lambda x, w, b: F.max_pool2d(x, 3, stride=2, padding=1)),
    ("max_pool2d_ceil_dilation", X2, None, False,
     lambda x, w, b: F.max_pool2d(x, (2, 3), stride=(2, 1), dilation=(2, 1), ceil_mode=True)),
    ("max_pool1d", X1, None, False, lambda x, w, b: F.max_pool1d(x, 3, stride=2, ceil_mode=True)),
    ("avg_pool2d", X2, None, False, lambda x, w, b: F.avg_pool2d(x, 2)),
    ("avg_pool2d_pad_ceil", X2, None, False,
     lambda x, w, b: F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True,
                                  count_include_pad=False)),
    ("avg_pool2d_divisor", X2, None, False,
     lambda x, w, b: F.avg_pool2d(x, (3, 2), stride=(2, 1), padding=(1, 0), divisor_override=4)),
    ("avg_pool1d", X1, None, False, lambda x, w, b: F.avg_pool1d(x, 4, stride=3, padding=2)),
    ("adaptive_avg_pool2d", X2, None, False, lambda x, w, b: F.adaptive_avg_pool2d(x, (4, 2))),
    ("adaptive_avg_pool1d", X1, None, False, lambda x, w, b: F.adaptive_avg_pool1d(x, 4)),
]


def _check(fn, x, w, b, device):
    """`fn` forward and backward on the CPU and on `device`: values and every gradient agree, and
    nothing fell back to the CPU."""
    leaves = [t for t in (x, w, b) if t is not None]
    cpu = [t.clone().requires_grad_() for t in leaves]
    dev = [t.to(device).requires_grad_() for t in leaves]

    def call(ts):
        it = iter(ts)
        return fn(*(next(it) if t is not None else None for t in (x, w, b)))

    ref = call(cpu)
    out = call(dev)
    grad = torch.randn_like(ref)
    ref.backward(grad)
    out.backward(grad.to(device))
    assert_close(out, ref.detach(), rtol=1e-4, atol=1e-5)
    for d, c in zip(dev, cpu):
        assert_close(d.grad, c.grad, rtol=1e-4, atol=1e-4)
    assert torch_pjrt.metrics()["fallback_ops"] == {}


def _bias_channels(name, wshape):
    # transposed weights are [in, out / groups, ...]; the others [out, in / groups, ...]
    return wshape[1] if "transpose" in name else wshape[0]


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_and_backward_match_cpu(pjrt, mode, case):
    name, shape, wshape, bias, fn = case
    x = torch.randn(shape)
    w = torch.randn(wshape) if wshape else None
    b = torch.randn(_bias_channels(name, wshape)) if bias else None
    with torch_pjrt.eager_mode(mode):
        _check(fn, x, w, b, pjrt)


def test_debug_mode(pjrt):
    x, w, b = torch.randn(X2), torch.randn(6, 4, 3, 3), torch.randn(6)
    with torch_pjrt.eager_mode("debug"):
        _check(lambda x, w, b: F.max_pool2d(F.conv2d(x, w, b, padding=1), 2), x, w, b, pjrt)


def test_backward_in_defer_and_fuse_is_deferred(pjrt):
    x, w = torch.randn(X2), torch.randn(6, 4, 3, 3)
    xp, wp = x.to(pjrt).requires_grad_(), w.to(pjrt).requires_grad_()
    with torch_pjrt.eager_mode("defer_and_fuse"):
        torch_pjrt.sync()
        before = torch_pjrt.metrics()["executions"]
        y = F.avg_pool2d(F.conv2d(xp, wp), 2)
        y.sum().backward()
        assert torch_pjrt.metrics()["executions"] == before
        grad = wp.grad.cpu()
    xc, wc = x.requires_grad_(), w.requires_grad_()
    F.avg_pool2d(F.conv2d(xc, wc), 2).sum().backward()
    torch.testing.assert_close(grad, wc.grad, rtol=1e-4, atol=1e-4)


def test_max_pool_indices_follow_pytorch(pjrt):
    # Ties keep the first maximum in the window, NaN wins (the last one), padding never does.
    nan = float("nan")
    x = torch.tensor([[[[1.0, 1, 0, 2], [1, nan, 1, 2], [nan, 0, 1, 2], [-1, -1, -1, -1]]]])
    for kwargs in (dict(kernel_size=3, stride=1, padding=1), dict(kernel_size=2, ceil_mode=True,
                                                                   stride=3)):
        values, indices = F.max_pool2d(x.to(pjrt), return_indices=True, **kwargs)
        ref_values, ref_indices = F.max_pool2d(x, return_indices=True, **kwargs)
        assert_close(values, ref_values)
        assert_close(indices, ref_indices)
    x = torch.full((1, 1, 3, 3), float("-inf"))
    assert_close(F.max_pool2d(x.to(pjrt), 2, stride=1, padding=1, return_indices=True)[1],
                 F.max_pool2d(x, 2, stride=1, padding=1, return_indices=True)[1])


def test_integer_pooling(pjrt):
    x = torch.randint(-20, 20, (2, 3, 5, 5))
    assert_close(F.avg_pool2d(x.to(pjrt), 2, padding=1), F.avg_pool2d(x, 2, padding=1))
    values, indices = F.max_pool2d(x.to(pjrt), 2, return_indices=True)
    ref_values, ref_indices = F.max_pool2d(x, 2, return_indices=True)
    assert_close(values, ref_values)
    assert_close(indices, ref_indices)


def test_channels_last_results_keep_the_layout(pjrt):
    x = torch.randn(X2).to(memory_format=torch.channels_last)
    for fn in (lambda t: F.max_pool2d(t, 2), lambda t: F.avg_pool2d(t, 3, stride=2),
               lambda t: F.adaptive_avg_pool2d(t, 3)):
        out, ref = fn(x.to(pjrt)), fn(x)
        assert out.stride() == ref.stride()
        assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert torch_pjrt.metrics()["fallback_ops"] == {}


def test_errors_match_pytorch(pjrt):
    x = torch.randn(X2)
    for fn in (lambda t: F.max_pool2d(t, 2, padding=2), lambda t: F.avg_pool2d(t, 2, stride=0),
               lambda t: F.max_pool2d(t, 20), lambda t: F.adaptive_avg_pool2d(t[0, 0], 2)):
        with pytest.raises(RuntimeError) as expected:
            fn(x)
        with pytest.raises(RuntimeError) as got:
            fn(x.to(pjrt))
        assert str(got.value) == str(expected.value)
    assert_close(x.to(pjrt) + 1, x + 1)


X3 = (2, 3, 6, 7, 5)  # volumes

# 3-d pooling and adaptive max pooling: (name, input shape, function of x)
POOL_CASES = [
    ("max_pool3d", X3, lambda x: F.max_pool3d(x, 2)),
    ("max_pool3d_pad_ceil", X3, lambda x: F.max_pool3d(x, 3, stride=2, padding=1, ceil_mode=True)),
    ("max_pool3d_dilation", X3,
     lambda x: F.max_pool3d(x, (2, 2, 3), stride=(1, 2, 1), dilation=(2, 1, 1))),
    ("max_pool3d_unbatched", X3[1:], lambda x: F.max_pool3d(x, (3, 2, 2), stride=1)),
    ("avg_pool3d", X3, lambda x: F.avg_pool3d(x, 2)),
    ("avg_pool3d_pad_exclude", X3,
     lambda x: F.avg_pool3d(x, (2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0),
                            count_include_pad=False)),
    ("avg_pool3d_ceil_divisor", X3,
     lambda x: F.avg_pool3d(x, 2, ceil_mode=True, divisor_override=3)),
    ("adaptive_max_pool2d", X2, lambda x: F.adaptive_max_pool2d(x, (4, 2))),
    ("adaptive_max_pool2d_up", X2, lambda x: F.adaptive_max_pool2d(x, (11, 5))),
    ("adaptive_max_pool2d_unbatched", X2[1:], lambda x: F.adaptive_max_pool2d(x, 3)),
    ("adaptive_max_pool1d", X1, lambda x: F.adaptive_max_pool1d(x, 4)),
]


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
@pytest.mark.parametrize("case", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_3d_and_adaptive_max_pooling_match_cpu(pjrt, mode, case):
    _, shape, fn = case
    with torch_pjrt.eager_mode(mode):
        _check(lambda x, w, b: fn(x), torch.randn(shape), None, None, pjrt)


@pytest.mark.parametrize("fn", [
    lambda t: F.max_pool3d(t, 2, stride=1, padding=1, return_indices=True),
    lambda t: F.max_pool3d(t, (1, 2, 3), ceil_mode=True, stride=2, return_indices=True),
    lambda t: F.adaptive_max_pool2d(t[0], (3, 2), return_indices=True),
    lambda t: F.adaptive_max_pool2d(t[:, 0], 3, return_indices=True),
], ids=["max_pool3d", "max_pool3d_ceil", "adaptive_max_pool2d", "adaptive_max_pool2d_batched"])
def test_3d_and_adaptive_max_pool_indices_follow_pytorch(pjrt, fn):
    # Ties keep the first maximum in scan order, NaN wins (the last one), padding never does.
    nan = float("nan")
    x = torch.tensor([[1.0, 1, 0, 2], [1, nan, 1, 2], [nan, 0, 1, 2], [-1, -1, -1, -1]])
    x = torch.stack([x, x.flip(0), torch.ones(4, 4), torch.full((4, 4), float("-inf"))])
    x = x.view(1, 4, 4, 4)  # one channel of a 4x4x4 volume
    values, indices = fn(x.to(pjrt))
    ref_values, ref_indices = fn(x)
    assert_close(values, ref_values)
    assert_close(indices, ref_indices)
    assert torch_pjrt.metrics()["fallback_ops"] == {}


def test_3d_pooling_errors_match_pytorch(pjrt):
    x = torch.randn(X3)
    for fn in (lambda t: F.max_pool3d(t, 2, padding=2), lambda t: F.avg_pool3d(t, 2, stride=0),
               lambda t: F.max_pool3d(t, 9), lambda t: F.max_pool3d(t[0, 0], 2),
               lambda t: F.adaptive_max_pool2d(t[0, 0, 0], 2)):
        with pytest.raises(RuntimeError) as expected:
            fn(x)
        with pytest.raises(RuntimeError) as got:
            fn(x.to(pjrt))
        assert str(got.value) == str(expected.value)
    assert_close(x.to(pjrt) + 1, x + 1)


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.conv2 = torch.nn.Conv2d(8, 12, 3)
        self.head_pool = torch.nn.AdaptiveAvgPool2d((2, 2))
        self.fc = torch.nn.Linear(12 * 4, 5)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.head_pool(self.conv2(x))
        return self.fc(x.flatten(1))


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_small_cnn_trains_like_cpu(pjrt, mode):
    torch.manual_seed(3)
    ref = SmallCNN()
    model = SmallCNN()
    model.load_state_dict(ref.state_dict())
    model.to(pjrt)
    x, y = torch.randn(4, 3, 11, 11), torch.randint(0, 5, (4,))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    with torch_pjrt.eager_mode(mode):
        for _ in range(3):
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to(pjrt)), y.to(pjrt))
            loss.backward()
            opt.step()
            ref_opt.zero_grad()
            ref_loss = F.cross_entropy(ref(x), y)
            ref_loss.backward()
            ref_opt.step()
            assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-5)
    assert torch_pjrt.metrics()["fallback_ops"] == {}


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("size", [(3, 3), (4, 2), (1, 1), (11, 5)], ids=str)
def test_adaptive_avg_pool_keeps_a_non_finite_input_in_its_own_windows(pjrt, mode, size):
    # The CPU sums each window: an inf or NaN reaches only the windows holding it, forward and
    # backward; every other window stays finite.
    x = torch.randn(X2)
    x[0, 0, 1, 2] = float("inf")
    x[0, 1, 7, 0] = float("nan")
    x[1, 2, 4, 8] = float("-inf")
    g = torch.randn(2, 4, *size)
    g[1, 3, 0, 0] = float("nan")
    with torch_pjrt.eager_mode(mode):
        xd = x.to(pjrt).requires_grad_()
        out = F.adaptive_avg_pool2d(xd, size)
        out.backward(g.to(pjrt))
        got, got_grad = out.detach().cpu(), xd.grad.cpu()
    xc = x.clone().requires_grad_()
    ref = F.adaptive_avg_pool2d(xc, size)
    ref.backward(g)
    assert torch.equal(got.isfinite(), ref.detach().isfinite())
    assert torch.equal(got_grad.isfinite(), xc.grad.isfinite())
    torch.testing.assert_close(got, ref.detach(), rtol=1e-5, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(got_grad, xc.grad, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert torch_pjrt.metrics()["fallback_ops"] == {}
