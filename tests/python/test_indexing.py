"""Sorting and advanced indexing on pjrt against the CPU: sort, argsort and topk; `index` and
`index_put_` with integer index tensors and bool masks; nonzero and masked_select, whose result
sizes depend on the data; and the gradients of each, in every eager mode, with no CPU fallback."""

import warnings

import pytest
import torch

import torch_pjrt

MODES = ["strict", "defer_and_fuse"]

# A small pool of inputs, so the number of distinct programs (and compiles) stays small.
X = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(0))
M = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
TIES = torch.tensor([[2.0, 1.0, 2.0, 0.0, 1.0, 2.0], [1.0, 1.0, 0.0, 0.0, 1.0, 1.0],
                     [0.0, 2.0, 1.0, 2.0, 0.0, 2.0], [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]])
NANS = torch.tensor([[0.5, float("nan"), -1.0, 2.0, float("nan"), 0.0],
                     [float("nan"), 1.0, -0.0, 0.0, 3.0, -2.0]])
I0 = torch.tensor([2, 0, 2, 3])
I1 = torch.tensor([0, 3, 1])
I2 = torch.tensor([5, 0, 0])


@pytest.fixture
def dev(pjrt):
    yield pjrt
    assert torch_pjrt.metrics()["fallback_ops"] == {}


def _weights(out):
    # Distinct weights per element, so a gradient sent to the wrong place shows.
    w = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) / max(out.numel(), 1)
    return (w + 0.5).to(out.device)


def _run(fn, inputs, device, grad):
    xs = [t.detach().clone().to(device) for t in inputs]
    leaves = [x.requires_grad_() for x in xs if grad and x.is_floating_point()]
    out = fn(*xs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    grads = []
    if leaves:
        loss = sum((o * _weights(o)).sum() for o in outs if o.is_floating_point())
        grads = torch.autograd.grad(loss, leaves)
    return [o.detach().cpu() for o in outs], [g.cpu() for g in grads]


def check(fn, *inputs, grad=False, mode="strict"):
    """`fn` on pjrt copies of `inputs` gives CPU's results exactly (and CPU's gradients)."""
    want, want_grads = _run(fn, inputs, "cpu", grad)
    with torch_pjrt.eager_mode(mode):
        got, got_grads = _run(fn, inputs, "pjrt", grad)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)


# ----- sort, argsort, topk -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_sort_and_argsort(dev, mode):
    check(lambda x: x.sort(dim=1), M, grad=True, mode=mode)
    check(lambda x: torch.sort(x, dim=0, descending=True), M, grad=True, mode=mode)
    check(lambda x: x.argsort(dim=-1), M, mode=mode)


def test_stable_sort_keeps_ties_in_order(dev):
    check(lambda x: x.sort(dim=1, stable=True), TIES)
    check(lambda x: x.sort(dim=1, descending=True, stable=True), TIES)
    check(lambda x: x.argsort(dim=0, stable=True), TIES)
    # Short rows sort stably on the CPU without asking, too.
    check(lambda x: x.sort(dim=1, descending=True), TIES)


def test_sort_puts_nan_above_everything(dev):
    check(lambda x: x.sort(dim=1, stable=True), NANS)
    check(lambda x: x.sort(dim=1, descending=True, stable=True), NANS)


def test_sort_integers_and_bools(dev):
    ints = (TIES * 3 - 2).long()
    check(lambda x: x.sort(dim=1, stable=True), ints)
    check(lambda x: x.sort(dim=0, descending=True, stable=True), ints.int())
    check(lambda x: x.sort(dim=1, stable=True), TIES > 0)


@pytest.mark.parametrize("mode", MODES)
def test_topk(dev, mode):
    check(lambda x: x.topk(3, dim=1), M, grad=True, mode=mode)
    check(lambda x: x.topk(2, dim=1, largest=False), M, grad=True, mode=mode)
    check(lambda x: torch.topk(x, 1, dim=0), M, mode=mode)


# ----- index -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_integer_indices(dev, mode):
    check(lambda x, i: x[i], X, I0, grad=True, mode=mode)
    check(lambda x, i, j: x[i, :, j], X, I1, I2, grad=True, mode=mode)
    check(lambda x, i: x[:, i], X, I1, grad=True, mode=mode)


def test_integer_indices_broadcast_and_wrap(dev):
    check(lambda x, i, j: x[i, j], X, I1.view(3, 1), I2.clamp(max=4), grad=True)
    check(lambda x, i: x[i], X, torch.tensor([[0, 1], [3, 3]]))
    check(lambda x, i: x[:, :, i], X, torch.tensor([-1, 0, -6]))
    check(lambda x, i: x[i], X, I0.int())
    # Index tensors on the host are moved to the device.
    x = X.to("pjrt")
    torch.testing.assert_close(x[[0, 2]].cpu(), X[[0, 2]])
    torch.testing.assert_close(x[I0].cpu(), X[I0])


@pytest.mark.parametrize("mode", MODES)
def test_bool_masks(dev, mode):
    check(lambda x: x[x > 0], X, grad=True, mode=mode)
    check(lambda x: x[x[:, :, 0] > 0.5], X, grad=True, mode=mode)
    check(lambda x, m: x[:, m], X, torch.tensor([True, False, True, True, False]), grad=True,
          mode=mode)


def test_uint8_masks_warn_as_pytorch_does(dev):
    # PyTorch warns at every indexing call, once per uint8 mask in the index list.
    mask = torch.tensor([1, 0, 1, 1, 0], dtype=torch.uint8)
    for index in (mask, mask.to("pjrt")):
        x = X.to("pjrt")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = x[:, index]
            x[:, index] = 0.0
        deprecated = [w for w in caught if "indexing with dtype torch.uint8" in str(w.message)]
        assert len(deprecated) == 2, [str(w.message) for w in caught]
        torch.testing.assert_close(got.cpu(), X[:, mask.bool()])
        assert not x[:, index].cpu().any()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x[:, mask.bool().to("pjrt")]
    assert not [w for w in caught if "uint8" in str(w.message)]


def test_index_errors_say_what_pytorch_says(dev):
    x = torch.empty(10, 0, device="pjrt")
    with pytest.raises(IndexError, match="^index is out of bounds for dimension with size 0$"):
        x[:, [0, 1]]
    a = torch.arange(0, 4, device="pjrt")
    # The values' shape is checked before their dtype (an empty tensor is float32).
    for values in (torch.tensor([]), torch.tensor([1, 2, 3])):
        with pytest.raises(RuntimeError, match="shape mismatch"):
            a[a > -1] = values.to("pjrt")


def test_bool_mask_in_debug_mode(dev):
    check(lambda x: x[x > 0.5], X, grad=True, mode="debug")


def test_host_mask_and_index_errors(dev):
    x = X.to("pjrt")
    mask = X[:, 0, 0] > 0
    torch.testing.assert_close(x[mask].cpu(), X[mask])
    with pytest.raises(IndexError, match="too many indices"):
        x[I0, I0, I0, I0]
    with pytest.raises(IndexError, match="shape of the mask"):
        x[torch.ones(3, dtype=torch.bool, device="pjrt")]
    with pytest.raises(IndexError, match="could not be broadcast"):
        x[I0, I1]


# ----- index_put_ --------------------------------------------------------------------------------


def _put(key, accumulate=False):
    def fn(x, v, *idx):
        y = x.clone()
        # The ATen op takes None for a whole dim (Python's `index_put_` does not).
        torch.ops.aten.index_put_(y, key(*idx), v, accumulate)
        return y
    return fn


@pytest.mark.parametrize("mode", MODES)
def test_index_put(dev, mode):
    v = torch.randn(4, 5, 6)
    # Repeated indices accumulate (the backward of x[i] is this op).
    check(_put(lambda i: [i], accumulate=True), X, v, I0, grad=True, mode=mode)
    check(_put(lambda i, j: [i, None, j]), X, torch.randn(3, 5), I1, I2.clamp(max=4),
          grad=True, mode=mode)
    check(_put(lambda i, j: [i, None, j], accumulate=True), X, torch.randn(5), I1, I2,
          grad=True, mode=mode)


@pytest.mark.parametrize("mode", MODES)
def test_setitem_with_masks(dev, mode):
    def fill(x):
        y = x * 1.0
        y[y > 0] = 0.25
        return y

    def assign(x, v):
        y = x * 1.0
        y[x[:, :, 0] > 0.5] = v
        return y

    count = int((X[:, :, 0] > 0.5).sum())
    check(fill, X, grad=True, mode=mode)
    check(assign, X, torch.randn(count, 6), grad=True, mode=mode)


@pytest.mark.parametrize("mode", MODES)
def test_setitem_with_host_masks_compiles_once_per_shape(dev, mode):
    # `x[cpu_mask] = value`: each new mask selects a different count of elements, but the
    # assignment keeps the tensor's shape, so it runs one program whatever the mask.
    gen = torch.Generator().manual_seed(3)
    masks = [torch.rand(4, 5, 6, generator=gen) > 0.5 for _ in range(5)]
    with torch_pjrt.eager_mode(mode):
        x = X.to("pjrt")
        want = X.clone()
        for k, mask in enumerate(masks):
            x[mask] = float(k)
            want[mask] = float(k)
            assert torch.equal(x.cpu(), want)
            if k == 1:
                after_two = torch_pjrt.metrics()["compilations"]
        assert torch_pjrt.metrics()["compilations"] == after_two
        # Along the leading dims only: the mask broadcasts over the rest.
        lead = torch.rand(4, 5, generator=gen) > 0.5
        x[lead] = -1.0
        want[lead] = -1.0
        assert torch.equal(x.cpu(), want)


def test_out_tensors_are_checked_as_pytorch_checks_them(dev):
    x = (X > 0).to("pjrt")
    out = torch.empty(0, dtype=torch.long, device="pjrt")
    torch.nonzero(x, out=out)
    assert torch.equal(out.cpu(), torch.nonzero(X > 0))
    with pytest.raises(RuntimeError, match="scalar type Long"):
        torch.nonzero(x, out=torch.empty(0, dtype=torch.float, device="pjrt"))
    with pytest.raises(RuntimeError, match="on the same device"):
        torch.nonzero(x, out=torch.empty(0, dtype=torch.long))
    # Composites' out= variants too (xlogy with a scalar self is one).
    y = X.abs().to("pjrt")
    with pytest.raises(RuntimeError, match="on the same device"):
        torch.xlogy(2.0, y, out=torch.empty(X.shape))


def test_setitem_integer_dtypes_and_errors(dev):
    def bump(x, i):
        y = x.clone()
        y[i] += 1
        y.index_put_((i,), torch.ones((), dtype=y.dtype, device=y.device), accumulate=True)
        return y

    check(bump, (X * 4).long(), I0)
    check(_put(lambda i: [i], accumulate=True), X > 0, X[:1] < 0, I0)
    x = X.to("pjrt")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        x[x > 0] = torch.ones(3, device="pjrt")


@pytest.mark.parametrize("mode", MODES)
def test_index_add_and_the_backward_of_index_select(dev, mode):
    check(lambda x, i: x.index_select(1, i), X, I0.clamp(max=4), grad=True, mode=mode)
    check(lambda x, s, i: x.index_add(2, i, s, alpha=0.5), X, torch.randn(4, 5, 3), I2,
          grad=True, mode=mode)


def test_index_add_variants(dev):
    def inplace(x, s, i):
        y = x.clone()
        y.index_add_(0, i, s)
        return y

    check(inplace, (X * 3).int(), (X[:4] * 2).int(), I0.int())
    check(lambda x, s, i: x.index_add(0, i, s), torch.tensor(1.5), torch.tensor(2.0),
          torch.tensor(0))
    out = torch.empty(0, device="pjrt")
    torch.index_add(X.to("pjrt"), 1, I1.to("pjrt"), torch.ones(4, 3, 6, device="pjrt"), out=out)
    torch.testing.assert_close(out.cpu(), X.index_add(1, I1, torch.ones(4, 3, 6)))
    with pytest.raises(IndexError, match="Number of indices"):
        X.to("pjrt").index_add(0, I1.to("pjrt"), torch.ones(4, 5, 6, device="pjrt"))


# ----- nonzero, masked_select, masked_scatter ----------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_nonzero_and_masked_select(dev, mode):
    check(lambda x: (x > 0.5).nonzero(), X, mode=mode)
    check(lambda x: torch.nonzero((x * 2).long(), as_tuple=True), M, mode=mode)
    check(lambda x: torch.argwhere(x > 9), M, mode=mode)
    check(lambda x: torch.masked_select(x, x > 0), X, grad=True, mode=mode)
    check(lambda x, m: x.masked_select(m), X, M[0] > 0, grad=True, mode=mode)


def test_nonzero_edge_cases(dev):
    check(lambda x: x.nonzero(), torch.tensor(3.0))
    check(lambda x: x.nonzero(), torch.zeros(2, 0))
    check(lambda x: x.nonzero(), torch.tensor([0.0, -0.0, float("nan"), 1.0]))


def test_masked_scatter(dev):
    def scatter(x, s):
        return x.masked_scatter(x > 0, s)

    check(scatter, M, torch.randn(30), grad=True)


# ----- deferred programs -------------------------------------------------------------------------


def test_data_dependent_sizes_read_only_their_counts_when_deferred(dev):
    x_cpu = M.clone().requires_grad_()
    x = M.to("pjrt").requires_grad_()
    with torch_pjrt.eager_mode("defer_and_fuse"):
        torch_pjrt.sync()
        start = torch_pjrt.metrics()["materializations"]
        y = x * 2 - 0.5
        nz = (y > 0).nonzero()
        # The count is the one value read; the rest stays deferred.
        assert torch_pjrt.metrics()["materializations"] == start + 1
        picked = y[nz[:, 0], nz[:, 1]] * 3
        z = y[y > 1].sum() + picked.sum()
        assert torch_pjrt.metrics()["materializations"] == start + 2
        # The backward of x[mask] knows the count from the gradient's shape: no read.
        z.backward()
        assert torch_pjrt.metrics()["materializations"] == start + 2
        order = picked.topk(3).indices
        assert torch_pjrt.metrics()["materializations"] == start + 2
        got = (z.detach().cpu(), picked.detach().cpu(), order.cpu(), x.grad.cpu())
    y_cpu = x_cpu * 2 - 0.5
    nz_cpu = (y_cpu > 0).nonzero()
    picked_cpu = y_cpu[nz_cpu[:, 0], nz_cpu[:, 1]] * 3
    z_cpu = y_cpu[y_cpu > 1].sum() + picked_cpu.sum()
    z_cpu.backward()
    want = (z_cpu.detach(), picked_cpu.detach(), picked_cpu.topk(3).indices, x_cpu.grad)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
