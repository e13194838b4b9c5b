"""Ops pjrt composes from its own ops instead of falling back to the CPU: the activations
leaky_relu, elu (selu, celu), softplus, hardswish, hardsigmoid, mish, hardtanh (relu6) and prelu
with their gradients; max/min along a dim with indices; addmv (mv, matrix-vector matmul); xlogy
(kl_div). Values and gradients against the CPU in every eager mode, the in-place and `out=`
variants PyTorch calls directly, and CPU-like errors. Nothing may fall back to the CPU."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt
from conftest import assert_close, check_against_cpu as check, in_mode_without_fallbacks, seeded

TOL = {"rtol": 1e-5, "atol": 1e-5}


# Values around every branch point: the activations' kinks at 0 and ±3, softplus's threshold.
X = torch.cat([torch.randn(30, generator=seeded(0)) * 4, torch.tensor([0.0, 3.0, -3.0, 25.0, -25.0])])

ACTIVATIONS = {
    "leaky_relu": F.leaky_relu,
    "leaky_relu_slope": lambda x: F.leaky_relu(x, 0.2),
    "elu": F.elu,
    "elu_alpha": lambda x: F.elu(x, alpha=0.7),
    "selu": F.selu,
    "celu": lambda x: F.celu(x, alpha=1.5),
    "softplus": F.softplus,
    "softplus_beta": lambda x: F.softplus(x, beta=2.0, threshold=5.0),
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "mish": F.mish,
    "hardtanh": F.hardtanh,
    "relu6": F.relu6,
    "threshold": lambda x: F.threshold(x, 0.5, -2.0),
    "hardshrink": F.hardshrink,
    "softshrink": lambda x: F.softshrink(x, 1.0),
    "glu": lambda x: F.glu(x.view(5, 7)[:, :6], 1),
    "glu_first_dim": lambda x: F.glu(x[:34].view(2, 17), 0),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_and_its_gradient(mode, name):
    check(ACTIVATIONS[name], (X,))


@pytest.mark.parametrize("name", ["leaky_relu", "elu", "selu", "celu", "hardswish", "hardsigmoid",
                                  "mish", "hardtanh", "relu6", "threshold"])
def test_in_place_activation(mode, name):
    args = (0.5, -2.0) if name == "threshold" else ()
    expected = X.clone()
    getattr(F, name)(expected, *args, inplace=True)
    actual = X.to("pjrt")
    getattr(F, name)(actual, *args, inplace=True)
    torch.testing.assert_close(actual.cpu(), expected, **TOL)
    torch.testing.assert_close(actual.cpu(), getattr(F, name)(X, *args), **TOL)


def test_in_place_activations_inside_modules_train(mode):
    # `inplace=True` activations in a model: forward writes in place, backward reads the result.
    def train(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.1, inplace=True), nn.Linear(8, 8),
                              nn.ELU(inplace=True), nn.Linear(8, 8), nn.Hardswish(inplace=True),
                              nn.Linear(8, 8), nn.ReLU6(inplace=True), nn.Linear(8, 2)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(5, 6, generator=seeded(1)).to(device)
        losses = []
        for _ in range(4):
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    assert train("pjrt") == pytest.approx(train("cpu"), rel=1e-5)


def test_out_variants(mode):
    x = X.to("pjrt")
    out = torch.empty(0).to("pjrt")
    torch.ops.aten.leaky_relu.out(x, 0.3, out=out)
    torch.testing.assert_close(out.cpu(), F.leaky_relu(X, 0.3), **TOL)
    torch.ops.aten.softplus.out(x, 1.0, 20.0, out=out)
    torch.testing.assert_close(out.cpu(), F.softplus(X), **TOL)
    torch.ops.aten.mish.out(x, out=out)
    torch.testing.assert_close(out.cpu(), F.mish(X), **TOL)


def test_prelu_module_and_weight_gradient(mode):
    def run(device):
        torch.manual_seed(0)
        layer = nn.Sequential(nn.Conv2d(2, 3, 1), nn.PReLU(3)).to(device)
        x = torch.randn(2, 2, 4, 4, generator=seeded(2)).to(device).requires_grad_()
        y = layer(x)
        y.backward(torch.randn(y.shape, generator=seeded(3)).to(device))
        return y.detach().cpu(), x.grad.cpu(), layer[1].weight.grad.cpu()

    for a, e in zip(run("pjrt"), run("cpu")):
        torch.testing.assert_close(a, e, **TOL)


def test_integer_inputs_are_refused_as_on_the_cpu(pjrt):
    x = torch.tensor([1, -2]).to(pjrt)
    for fn in (F.leaky_relu, F.elu, F.softplus, F.hardswish, F.mish):
        with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
            fn(x)
    with pytest.raises(RuntimeError, match="Bool inputs not supported for hardtanh"):
        F.hardtanh(x > 0)
    # Integers through hardtanh keep their dtype, as on the CPU.
    assert F.hardtanh(x).dtype == torch.int64
    assert F.hardtanh(x).cpu().tolist() == [1, -1]


def test_glu_of_an_odd_dim_is_refused(pjrt):
    with pytest.raises(RuntimeError, match="Halving dimension must be even, but dimension 1 is size 7"):
        F.glu(X.view(5, 7).to(pjrt), 1)


# ---- norms and moments -----------------------------------------------------------------------

N3 = torch.randn(4, 5, 6, generator=seeded(11))

NORMS = {
    "p2_dim": lambda x: torch.norm(x, 2, dim=1),
    "p1_dims_keepdim": lambda x: torch.norm(x, 1, dim=(0, 2), keepdim=True),
    "pinf": lambda x: torch.norm(x, float("inf"), dim=-1),
    "p3_all": lambda x: torch.norm(x, 3),
    "pairwise_distance": lambda x: F.pairwise_distance(x[0], x[1]),
    "triplet_margin": lambda x: F.triplet_margin_loss(x[0], x[1], x[2]),
    "std_mean": lambda x: torch.stack(torch.std_mean(x, dim=1)),
    "var_mean_unbiased_false": lambda x: torch.stack(torch.var_mean(x, dim=(0, 2), unbiased=False)),
    "std_mean_all": lambda x: torch.stack(torch.std_mean(x)),
}


@pytest.mark.parametrize("name", list(NORMS))
def test_norms_and_moments_with_gradients(mode, name):
    check(NORMS[name], (N3,), rtol=1e-4, atol=1e-5)


# ---- max/min along a dim ---------------------------------------------------------------------

M = torch.randn(4, 6, 5, generator=seeded(4))
M[1, 2, :] = 7.0  # ties along dim 1: the first index wins on both devices


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, True), (-1, False)])
def test_max_and_min_along_a_dim_with_indices_and_gradient(mode, reduce, dim, keepdim):
    def values(x):
        return getattr(torch, reduce)(x, dim, keepdim=keepdim).values

    check(values, (M,))
    expected = getattr(torch, reduce)(M, dim, keepdim=keepdim)
    actual = getattr(torch, reduce)(M.to("pjrt"), dim, keepdim=keepdim)
    assert actual.indices.dtype == torch.int64
    assert torch.equal(actual.indices.cpu(), expected.indices)


def test_max_along_a_dim_of_bools_and_nans(mode):
    b = torch.tensor([[False, True, True], [False, False, False]])
    got = b.to("pjrt").max(1)
    assert got.values.cpu().tolist() == [True, False]
    assert got.indices.cpu().tolist() == [1, 0]
    n = torch.tensor([[1.0, float("nan"), 3.0], [2.0, 5.0, 4.0]])
    got, expected = n.to("pjrt").max(1), n.max(1)
    torch.testing.assert_close(got.values.cpu(), expected.values, equal_nan=True)
    assert got.indices.cpu().tolist() == expected.indices.tolist()


@pytest.mark.parametrize(
    "name", ["softmax", "log_softmax", "logsumexp", "safe_softmax", "cross_entropy"]
)
def test_row_functions_of_rows_with_nans_and_infinities(mode, name):
    # The maximum these shift by drops NaN on XLA CPU; a NaN must still reach its whole row,
    # and rows of infinities give what the CPU gives.
    nan, inf = float("nan"), float("inf")
    x = torch.tensor(
        [
            [nan, 1.0, 2.0, 3.0],
            [1.0, 2.0, nan, -inf],
            [nan, -inf, -inf, -inf],
            [-inf, -inf, -inf, -inf],
            [inf, 1.0, 2.0, 3.0],
            [inf, -inf, 0.0, 1.0],
            [nan, nan, nan, nan],
            [0.5, -1.0, 2.0, 3.0],
        ]
    )
    fns = {
        "softmax": lambda t: t.softmax(-1),
        "log_softmax": lambda t: t.log_softmax(-1),
        "logsumexp": lambda t: t.logsumexp(-1),
        "safe_softmax": lambda t: torch.ops.aten._safe_softmax(t, -1),
        "cross_entropy": lambda t: F.cross_entropy(t, torch.arange(8, device=t.device) % 4, reduction="none"),
    }
    # Long rows too, where XLA vectorizes the maximum: the specials mid-row.
    wide = torch.randn(8, 67, generator=seeded(3))
    wide[:, 30:34] = x
    f = fns[name]
    for t in (x, x.t().contiguous().t(), wide):
        torch.testing.assert_close(f(t.to("pjrt")).cpu(), f(t), equal_nan=True)


def test_max_along_a_dim_writes_out_tensors(mode):
    values, indices = torch.empty(0).to("pjrt"), torch.empty(0, dtype=torch.long).to("pjrt")
    torch.max(M.to("pjrt"), 2, out=(values, indices))
    expected = torch.max(M, 2)
    torch.testing.assert_close(values.cpu(), expected.values)
    assert torch.equal(indices.cpu(), expected.indices)


# ---- matrix-vector products ------------------------------------------------------------------

A = torch.randn(7, 5, generator=seeded(5))
V = torch.randn(5, generator=seeded(6))
BIAS = torch.randn(7, generator=seeded(7))


def test_matrix_vector_products_and_gradients(mode):
    check(torch.mv, (A, V), grads_of=(0, 1))
    check(lambda a, v: a @ v, (A, V), grads_of=(0, 1))
    check(lambda b, a, v: torch.addmv(b, a, v, beta=0.5, alpha=2.0), (BIAS, A, V), grads_of=(0, 1, 2))
    check(lambda x, v: x @ v, (torch.randn(3, 7, 5, generator=seeded(8)), V), grads_of=(0, 1))


def test_addmv_with_zero_beta_ignores_nans_in_the_input(mode):
    nan_bias = torch.full((7,), float("nan"))
    got = torch.addmv(nan_bias.to("pjrt"), A.to("pjrt"), V.to("pjrt"), beta=0)
    torch.testing.assert_close(got.cpu(), A @ V, **TOL)


def test_a_linear_layer_on_a_vector_is_native(mode):
    check(lambda w, v: F.linear(v, w), (A, V), grads_of=(0, 1))


# ---- xlogy -----------------------------------------------------------------------------------

XL = torch.tensor([0.0, 0.0, 1.0, 2.5, -1.0, 3.0, 0.0])
YL = torch.tensor([0.0, float("nan"), 2.0, 0.5, 4.0, 0.0, 3.0])


def test_xlogy_follows_pytorchs_zero_and_nan_rules(mode):
    torch.testing.assert_close(torch.xlogy(XL.to("pjrt"), YL.to("pjrt")).cpu(), torch.xlogy(XL, YL),
                               equal_nan=True)
    torch.testing.assert_close(torch.xlogy(XL.to("pjrt"), 2.0).cpu(), torch.xlogy(XL, 2.0))
    torch.testing.assert_close(torch.xlogy(3.0, YL.to("pjrt")).cpu(), torch.xlogy(3.0, YL),
                               equal_nan=True)
    ints = torch.tensor([0, 1, 2])
    assert torch.xlogy(ints.to("pjrt"), ints.to("pjrt")).dtype == torch.xlogy(ints, ints).dtype


def test_kl_div_and_its_gradient(mode):
    logits = torch.randn(4, 6, generator=seeded(9))
    target = torch.softmax(torch.randn(4, 6, generator=seeded(10)), 1)
    check(lambda p, t: F.kl_div(p.log_softmax(1), t, reduction="batchmean"), (logits, target),
          grads_of=(0, 1))


def test_a_composed_activation_fuses_into_its_region():
    x = X.to("pjrt")
    with in_mode_without_fallbacks("defer_and_fuse"):
        y = F.mish(F.leaky_relu(x * 2.0) + F.softplus(x)).sum()
        assert torch_pjrt.metrics()["materializations"] == 0
        y.item()
        metrics = torch_pjrt.metrics()
    assert metrics["regions"] == 1, metrics


# ---- elementwise functions without a native lowering ------------------------------------------

UNIT = torch.cat([torch.rand(20, generator=seeded(12)) * 1.98 - 0.99, torch.tensor([0.0, 0.5, -0.999])])
WIDE = torch.cat([torch.randn(20, generator=seeded(13)) * 5, torch.tensor([0.0, 1e-4, -30.0, 85.0])])
ABOVE_ONE = 1.0 + torch.rand(20, generator=seeded(14)) * 50

ELEMENTWISE = {
    "atan": (torch.atan, WIDE),
    "asin": (torch.asin, UNIT),
    "acos": (torch.acos, UNIT),
    "atanh": (torch.atanh, UNIT),
    "sinh": (torch.sinh, WIDE),
    "cosh": (torch.cosh, WIDE),
    "asinh": (torch.asinh, WIDE),
    "acosh": (torch.acosh, ABOVE_ONE),
    "frac": (torch.frac, WIDE),
}


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_function_and_its_gradient(mode, name):
    fn, x = ELEMENTWISE[name]
    check(fn, (x,), rtol=2e-5, atol=1e-5)


def test_elementwise_functions_outside_their_domain_and_on_integers(mode):
    edge = torch.tensor([1.0, -1.0, 1.5, -2.0, float("inf"), float("nan")])
    for fn in (torch.asin, torch.acos, torch.atanh, torch.acosh, torch.asinh, torch.atan):
        torch.testing.assert_close(fn(edge.to("pjrt")).cpu(), fn(edge), equal_nan=True)
    ints = torch.tensor([0, 1, 2])
    for fn in (torch.atan, torch.sinh, torch.asinh):
        got = fn(ints.to("pjrt"))
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.cpu(), fn(ints))
    y = WIDE.to("pjrt")
    y.sinh_()
    torch.testing.assert_close(y.cpu(), WIDE.sinh(), rtol=2e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        ints.to("pjrt").atan_()


A2 = torch.randn(3, 5, generator=seeded(15)) * 3
B2 = torch.randn(3, 5, generator=seeded(16)) * 3


@pytest.mark.parametrize("fn", [torch.logaddexp, torch.logaddexp2, torch.hypot],
                         ids=["logaddexp", "logaddexp2", "hypot"])
def test_binary_functions_and_their_gradients(mode, fn):
    check(fn, (A2, B2), grads_of=(0, 1))


def test_binary_functions_with_infinities_and_nans(mode):
    inf, nan = float("inf"), float("nan")
    a = torch.tensor([inf, -inf, inf, -inf, nan, 0.0, 1e30, 3.0])
    b = torch.tensor([inf, -inf, -inf, 2.0, 1.0, 0.0, 1e30, 4.0])
    for fn in (torch.logaddexp, torch.logaddexp2, torch.hypot):
        torch.testing.assert_close(fn(a.to("pjrt"), b.to("pjrt")).cpu(), fn(a, b), equal_nan=True)
    assert torch.hypot(torch.tensor([inf]).to("pjrt"), torch.tensor([nan]).to("pjrt")).item() == inf
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        torch.logaddexp(torch.tensor([1]).to("pjrt"), torch.tensor([2]).to("pjrt"))


# ---- index_copy, index_fill, channel_shuffle --------------------------------------------------

def test_index_copy_and_fill_with_gradients(mode):
    target = torch.randn(4, 5, 3, generator=seeded(17))
    index = torch.tensor([3, 0])
    source = torch.randn(4, 2, 3, generator=seeded(18))
    check(lambda t, s: t.index_copy(1, index.to(t.device), s), (target, source), grads_of=(0, 1))
    check(lambda t: t.index_fill(2, index[1:].to(t.device), -1.5), (target,))
    check(lambda t: t.index_fill(0, index.to(t.device), 2.0), (target,))
    row = torch.randn(1, 5, 3, generator=seeded(20))
    in_place = target.to("pjrt")
    in_place.index_copy_(0, torch.tensor([1]).to("pjrt"), row.to("pjrt"))
    expected = target.clone()
    expected.index_copy_(0, torch.tensor([1]), row)
    torch.testing.assert_close(in_place.cpu(), expected)


def test_channel_shuffle_matches_the_cpu(mode):
    x = torch.randn(2, 6, 3, 3, generator=seeded(19))
    check(lambda t: F.channel_shuffle(t, 3), (x,))
    assert torch.equal(nn.ChannelShuffle(2)(x.to("pjrt")).cpu(), nn.ChannelShuffle(2)(x))


# ---- order statistics, counting, creation ------------------------------------------------------

S = torch.randn(5, 7, generator=seeded(21))


@pytest.mark.parametrize("dim,keepdim", [(1, False), (0, True)])
def test_median_and_kthvalue_with_indices_and_gradients(mode, dim, keepdim):
    for fn in (lambda x: torch.median(x, dim, keepdim=keepdim),
               lambda x: torch.kthvalue(x, 3, dim, keepdim=keepdim)):
        check(lambda x: fn(x).values, (S,))
        got, expected = fn(S.to("pjrt")), fn(S)
        assert torch.equal(got.indices.cpu(), expected.indices)
    check(torch.median, (S,))


def test_median_of_a_row_with_nan_is_nan_at_its_first_nan(mode):
    x = torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [4.0, 2.0, 3.0, 1.0]])
    got, expected = x.to("pjrt").median(1), x.median(1)
    torch.testing.assert_close(got.values.cpu(), expected.values, equal_nan=True)
    assert got.indices.cpu().tolist() == expected.indices.tolist()
    assert torch.isnan(x.to("pjrt").median()).item()


def test_bincount_and_histc_match_the_cpu(mode):
    counts = torch.tensor([0, 3, 3, 1, 7])
    weights = torch.tensor([0.5, 1.0, 2.0, 0.25, 1.5])
    assert torch.equal(torch.bincount(counts.to("pjrt")).cpu(), torch.bincount(counts))
    assert torch.equal(torch.bincount(counts.to("pjrt"), minlength=10).cpu(), torch.bincount(counts, minlength=10))
    torch.testing.assert_close(torch.bincount(counts.to("pjrt"), weights.to("pjrt")).cpu(),
                               torch.bincount(counts, weights))
    values = torch.cat([torch.randn(50, generator=seeded(22)), torch.tensor([2.0, -2.0, 5.0, float("nan")])])
    torch.testing.assert_close(torch.histc(values.to("pjrt"), bins=8, min=-2, max=2).cpu(),
                               torch.histc(values, bins=8, min=-2, max=2))
    finite = values[:-1]
    torch.testing.assert_close(torch.histc(finite.to("pjrt"), bins=5).cpu(), torch.histc(finite, bins=5))
    with pytest.raises(RuntimeError, match="non-negative integral"):
        torch.bincount(torch.tensor([1, -1]).to("pjrt"))


def test_histc_counts_integers_as_cuda_does(mode):
    # Mixture-of-experts routing counts expert ids of an integer tensor; the CPU refuses them.
    ids = torch.randint(0, 8, (300,), generator=seeded(23), dtype=torch.int32)
    got = torch.histc(ids.to("pjrt"), bins=8, min=0, max=7).cpu()
    assert got.dtype == torch.int32
    assert torch.equal(got, torch.bincount(ids, minlength=8).int())
    # Integer bins are computed in integer arithmetic: (x - min) * bins // (max - min).
    x = torch.tensor([0, 1, 2, 3, 4, 5, 6, 9, -1], dtype=torch.int64)
    got = torch.histc(x.to("pjrt"), bins=4, min=0, max=6).cpu()
    assert got.tolist() == [2, 1, 2, 2]
    with pytest.raises(NotImplementedError, match="histogram"):
        torch.histc(torch.tensor([True, False]).to("pjrt"), bins=2)


@pytest.mark.parametrize("dim", [0, 1])
def test_weight_norm_and_its_gradients(mode, dim):
    v = torch.randn(5, 4, generator=seeded(24))
    g = torch.randn(5, 1, generator=seeded(25)) if dim == 0 else torch.randn(1, 4, generator=seeded(25))
    check(lambda v, g: torch._weight_norm(v, g, dim), (v, g), grads_of=(0, 1))
    linear = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3))
    on_pjrt = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3)).to("pjrt")
    on_pjrt.load_state_dict(linear.state_dict())
    x = torch.randn(2, 4, generator=seeded(26))
    linear(x).sum().backward()
    on_pjrt(x.to("pjrt")).sum().backward()
    for a, b in zip(linear.parameters(), on_pjrt.parameters()):
        assert_close(b.grad, a.grad, **TOL)


def test_embedding_max_norm_renormalizes_in_place(mode):
    torch.manual_seed(27)
    cpu = nn.Embedding(10, 4, max_norm=1.0)
    cpu.weight.data.mul_(3)
    dev = nn.Embedding(10, 4, max_norm=1.0).to("pjrt")
    dev.load_state_dict(cpu.state_dict())
    ids = torch.tensor([1, 2, 1, 7])
    cpu(ids).sum().backward()
    dev(ids.to("pjrt")).sum().backward()
    assert_close(dev.weight.detach(), cpu.weight.detach(), **TOL)
    assert_close(dev.weight.grad, cpu.weight.grad, **TOL)
    # Rows not looked up keep their norm.
    assert dev.weight.detach().cpu()[0].norm() > 1.5


def test_trace_and_triangle_indices(mode):
    check(torch.trace, (S[:, :5],))
    assert torch.trace(torch.arange(9).view(3, 3).to("pjrt")).item() == 12
    for offset in (-1, 0, 2):
        assert torch.equal(torch.tril_indices(4, 5, offset, device="pjrt").cpu(), torch.tril_indices(4, 5, offset))
        assert torch.equal(torch.triu_indices(4, 5, offset, device="pjrt").cpu(), torch.triu_indices(4, 5, offset))


def test_randperm_is_a_seeded_permutation(mode):
    torch.manual_seed(5)
    a = torch.randperm(1000, device="pjrt")
    torch.manual_seed(5)
    b = torch.randperm(1000, device="pjrt")
    assert a.dtype == torch.int64
    assert torch.equal(a.cpu(), b.cpu())
    assert torch.equal(a.sort().values.cpu(), torch.arange(1000))
    assert not torch.equal(a.cpu(), torch.arange(1000))
    g = torch.Generator(device="pjrt").manual_seed(9)
    assert torch.equal(torch.randperm(6, generator=g, device="pjrt").sort().values.cpu(), torch.arange(6))


def test_unique_with_inverse_and_counts(mode):
    for x in (torch.tensor([[3, 1, 3], [2, 3, 1]]),
              torch.tensor([float("nan"), 1.0, float("nan"), -2.0, 1.0]),
              torch.tensor([True, False, True]),
              torch.tensor([], dtype=torch.int64)):
        expected = torch.unique(x, return_inverse=True, return_counts=True)
        got = torch.unique(x.to("pjrt"), return_inverse=True, return_counts=True)
        for a, e in zip(got, expected):
            assert a.dtype == e.dtype and a.shape == e.shape
            torch.testing.assert_close(a.cpu(), e, equal_nan=True)


def test_unsorted_unique_is_a_counted_fallback(pjrt):
    # The unsorted order comes from the CPU's hash set, which only the CPU reproduces.
    got = torch.unique(torch.tensor([3, 1, 3]).to(pjrt), sorted=False)
    assert sorted(got.cpu().tolist()) == [1, 3]
    assert torch_pjrt.metrics()["fallback_ops"] == {"aten::_unique2 with sorted=False": 1}


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_sum_and_mean_with_gradients(mode, reduce, include_self):
    target = torch.randn(4, 6, generator=seeded(23))
    source = torch.randn(4, 3, generator=seeded(24))
    index = torch.tensor([[0, 2, 2], [5, 5, 5], [1, 0, 3], [4, 4, 0]])
    check(lambda t, s: t.scatter_reduce(1, index.to(t.device), s, reduce, include_self=include_self),
          (target, source), grads_of=(0, 1))
    ints = torch.tensor([10, 20, 30])
    got = ints.to("pjrt").scatter_reduce(0, torch.tensor([0, 0]).to("pjrt"), torch.tensor([1, 4]).to("pjrt"),
                                         reduce, include_self=include_self)
    expected = ints.scatter_reduce(0, torch.tensor([0, 0]), torch.tensor([1, 4]), reduce, include_self=include_self)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("reduce", ["prod", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_prod_amax_amin_with_gradients(mode, reduce, include_self):
    # The engine's scatter with that combiner; where `self` is left out, the receiving positions
    # start from the combiner's identity.
    target = torch.randn(4, 6, generator=seeded(25), dtype=torch.float64)
    source = torch.randn(4, 3, generator=seeded(26), dtype=torch.float64)
    index = torch.tensor([[0, 2, 2], [5, 5, 5], [1, 0, 3], [4, 4, 0]])
    check(lambda t, s: t.scatter_reduce(1, index.to(t.device), s, reduce, include_self=include_self),
          (target, source), grads_of=(0, 1))
    # A NaN wins amax and amin; integer and bool extremes.
    with_nan = source.clone()
    with_nan[1, 1] = float("nan")
    for dtype in [torch.float32, torch.bfloat16, torch.int32, torch.int64, torch.uint8, torch.bool]:
        t = (target * 4).to(dtype) if dtype != torch.uint8 else (target.abs() * 4).to(dtype)
        s = (with_nan * 4).to(dtype) if dtype.is_floating_point else (source.abs() * 4).to(dtype)
        if dtype == torch.bool and reduce == "prod":
            continue  # the CPU refuses a bool product
        expected = t.scatter_reduce(1, index, s, reduce, include_self=include_self)
        got = t.to("pjrt").scatter_reduce(1, index.to("pjrt"), s.to("pjrt"), reduce, include_self=include_self)
        assert torch.equal(got.cpu().isnan() if dtype.is_floating_point else got.cpu(),
                           expected.isnan() if dtype.is_floating_point else expected), (dtype, got, expected)
        assert_close(got, expected, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=1e-6)


@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_legacy_scatter_with_a_reduction(mode, reduce):
    # `scatter(..., reduce=)` is `scatter_reduce` with the self included, in every form.
    x = torch.randn(3, 4, generator=seeded(27))
    index = torch.tensor([[0, 1, 2, 0], [2, 2, 0, 1]])
    src = torch.randn(2, 5, generator=seeded(28))
    assert_close(torch.scatter(x.to("pjrt"), 0, index.to("pjrt"), src.to("pjrt"), reduce=reduce),
                 torch.scatter(x, 0, index, src, reduce=reduce))
    assert_close(torch.scatter(x.to("pjrt"), 1, index.to("pjrt"), 2.5, reduce=reduce),
                 torch.scatter(x, 1, index, 2.5, reduce=reduce))
    out = torch.empty(0, device="pjrt")
    torch.scatter(x.to("pjrt"), 0, index.to("pjrt"), src.to("pjrt"), reduce=reduce, out=out)
    assert_close(out, torch.scatter(x, 0, index, src, reduce=reduce))
    in_place = x.to("pjrt")
    in_place.scatter_(0, index.to("pjrt"), src.to("pjrt"), reduce=reduce)
    assert_close(in_place, x.clone().scatter_(0, index, src, reduce=reduce))
    ints = torch.arange(12).view(3, 4)
    assert_close(torch.scatter(ints.to("pjrt"), 0, index.to("pjrt"), 3, reduce=reduce),
                 torch.scatter(ints, 0, index, 3, reduce=reduce))
    with pytest.raises(RuntimeError, match="reduce argument must be either add or multiply"):
        torch.scatter(x.to("pjrt"), 0, index.to("pjrt"), 2.0, reduce="max")


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce_matches_the_cpu(mode, reduce):
    target = torch.randn(3, 6, generator=seeded(27))
    source = torch.randn(3, 5, generator=seeded(28))
    index = torch.tensor([0, 2, 2, 5, 0])
    for include_self in (True, False):
        check(lambda t, s: t.index_reduce(1, index.to(t.device), s, reduce, include_self=include_self),
              (target, source), grads_of=(0, 1))
        y = target.to("pjrt")
        y.index_reduce_(1, index.to("pjrt"), source.to("pjrt"), reduce, include_self=include_self)
        assert_close(y, target.index_reduce(1, index, source, reduce, include_self=include_self))


def test_graph_max_pooling_by_scatter_reduce(mode):
    # Message passing as graph networks write it: node features gathered along edges, then the
    # largest message per destination node.
    features = torch.randn(6, 4, generator=seeded(29))
    edges = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2], [1, 1, 3, 3, 3, 0, 5, 5]])

    def pool(x):
        messages = x[edges[0].to(x.device)]
        destination = edges[1].to(x.device).unsqueeze(1).expand_as(messages)
        return torch.zeros_like(x).scatter_reduce(0, destination, messages, "amax", include_self=False)

    check(pool, [features])
