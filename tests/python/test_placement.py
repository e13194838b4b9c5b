"""The placement rule measured (RFC 0045, "Placement measured"): each op that the plugin composed
in C++ (its family files: activation.cpp, elementwise.cpp, reduce.cpp, linalg.cpp, norm.cpp,
indexing.cpp, conv.cpp, creation.cpp, resample.cpp, padding.cpp, random.cpp) and
for which torch ships a decomposition (`torch._decomp.decomposition_table`) is run three ways
on the same inputs: the pjrt kernel registered today, PyTorch's decomposition called directly
on pjrt tensors (its ATen ops run on pjrt), and the CPU kernel. Both pjrt results must match
the CPU's, in Strict and in DeferAndFuse. Inputs hold the edge values of each op where they
mean something (0, -0.0, negatives, infinities, NaN, the ends of an activation's linear piece).

The ops the rule moved are registered as their decomposition
(`torch_pjrt._decompositions.DECOMPOSED_KERNELS`, tested against the CPU with their gradients
in test_decompositions.py): for them the two pjrt runs are one, so the kernel check runs only on
the ops that stay C++, and a check of the registrations holds each op to its side of the rule.

A disagreement found by these checks is an xfail naming it (strict, so a fix shows up), on the
side that disagrees. Ops whose decomposition is a prim-level reference (`atan`, `hypot`,
`fmax`, `signbit`, ...) are left out: the prim's eager kernel calls the same ATen op, so the
"decomposition" runs the C++ kernel again and there is nothing to compare.

This file holds no timings; RFC 0045 records them, measured with the same inputs (`CASES`).
"""

import math

import pytest
import torch
from torch._decomp import decomposition_table

import torch_pjrt
from conftest import seeded
from torch_pjrt import _decompositions

aten = torch.ops.aten
inf, nan = math.inf, math.nan

PJRT = "pjrt"


class Device:
    """Stands for the device in a case's arguments (factory ops: `tril_indices`)."""


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=seeded(seed))


# Edge values of the activations: both infinities, NaN, signed zeros, the kinks of hardswish,
# hardsigmoid and hardtanh (+-3, +-1), a value above softplus's threshold (20).
EDGE = torch.tensor(
    [-inf, -20.0, -3.5, -3.0, -2.5, -1.0, -0.5, -0.0, 0.0, 0.25, 0.5, 1.0, 2.9, 3.0, 3.5, 20.0, 25.0, inf, nan]
)
GRAD = _randn(EDGE.shape, seed=1)
X = _randn(4, 5, seed=2)
X_EDGE = X.clone()
X_EDGE[0, :4] = torch.tensor([0.0, -inf, inf, nan])
ELU_RESULT = torch.nn.functional.elu(EDGE)
# logit's domain: the ends 0 and 1, outside it, NaN
PROB = torch.tensor([0.0, 1e-7, 0.1, 0.5, 0.9, 1.0 - 1e-7, 1.0, -0.5, 1.5, nan])
PAIR_A = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.0, inf, -inf, nan, 3.0, 0.0, -inf, inf])
PAIR_B = torch.tensor([0.0, 2.0, -0.0, 0.0, nan, inf, -inf, 1.0, inf, -inf, 5.0, -inf])
IMAGE = _randn(2, 3, 5, 6, seed=3)
IMAGE_NONFINITE = IMAGE.clone()
IMAGE_NONFINITE[0, 0, 1, 2] = nan
IMAGE_NONFINITE[1, 2, 3, 3] = inf
SIGNAL = _randn(2, 3, 7, seed=4)
VOLUME = _randn(1, 2, 3, 4, 5, seed=5)
# grid points inside, on the border, outside, and one NaN
GRID = _randn(2, 4, 3, 2, seed=6) * 1.3
GRID[0, 0, 0] = torch.tensor([1.0, -1.0])
GRID[1, 3, 2] = torch.tensor([nan, 0.2])
COLUMNS = _randn(1, 2 * 2 * 3, 12, seed=7)  # im2col of [1, 2, 5, 6], kernel 2x3, padding (1, 0), stride (2, 1)


def _case(op, *args, tol=None, **kwargs):
    return op, args, kwargs, tol or {}


# name -> (op overload, positional args, keyword args, tolerances). Tensors are CPU tensors,
# moved to pjrt for the pjrt runs.
CASES = {
    # --- activations (activation.cpp) ---
    "leaky_relu": _case(aten.leaky_relu.default, EDGE, 0.1),
    "leaky_relu_backward": _case(aten.leaky_relu_backward.default, GRAD, EDGE, 0.1, False),
    "elu": _case(aten.elu.default, EDGE, 1.0, 1.0, 1.0),
    "elu_scaled": _case(aten.elu.default, EDGE, 0.5, 2.0, 1.5),
    "elu_backward": _case(aten.elu_backward.default, GRAD, 1.0, 1.0, 1.0, False, EDGE),
    "elu_backward_of_result": _case(aten.elu_backward.default, GRAD, 1.0, 1.0, 1.0, True, ELU_RESULT),
    "softplus": _case(aten.softplus.default, EDGE, 1.0, 20.0),
    "softplus_beta": _case(aten.softplus.default, EDGE, 2.0, 5.0),
    "softplus_backward": _case(aten.softplus_backward.default, GRAD, EDGE, 2.0, 5.0),
    "hardswish": _case(aten.hardswish.default, EDGE),
    "hardswish_backward": _case(aten.hardswish_backward.default, GRAD, EDGE),
    "hardsigmoid": _case(aten.hardsigmoid.default, EDGE),
    "hardsigmoid_backward": _case(aten.hardsigmoid_backward.default, GRAD, EDGE),
    "mish": _case(aten.mish.default, EDGE),
    "hardtanh": _case(aten.hardtanh.default, EDGE, -1.0, 1.0),
    "hardtanh_backward": _case(aten.hardtanh_backward.default, GRAD, EDGE, -1.0, 1.0),
    "threshold": _case(aten.threshold.default, EDGE, 0.5, -2.0),
    "hardshrink": _case(aten.hardshrink.default, EDGE, 0.5),
    "softshrink": _case(aten.softshrink.default, EDGE, 0.5),
    "glu": _case(aten.glu.default, _randn(4, 6, seed=8), -1),
    "glu_backward": _case(aten.glu_backward.default, _randn(4, 3, seed=9), _randn(4, 6, seed=8), -1),
    "_prelu_kernel": _case(aten._prelu_kernel.default, X_EDGE.reshape(2, 2, 5), torch.tensor([[0.25], [-0.5]])),
    "_prelu_kernel_backward": _case(
        aten._prelu_kernel_backward.default, _randn(2, 2, 5, seed=10), X.reshape(2, 2, 5), torch.tensor([[0.25], [-0.5]])
    ),
    "logit": _case(aten.logit.default, PROB),
    "logit_eps": _case(aten.logit.default, PROB, 1e-3),
    "logit_backward": _case(aten.logit_backward.default, _randn(10, seed=11), PROB, None),
    "logit_backward_eps": _case(aten.logit_backward.default, _randn(10, seed=11), PROB, 1e-3),
    # --- reductions and elementwise math (reduce.cpp, elementwise.cpp, linalg.cpp) ---
    "norm_2": _case(aten.norm.ScalarOpt_dim, X, 2.0, [1], False),
    "norm_inf": _case(aten.norm.ScalarOpt_dim, X_EDGE, inf, [1], True),
    "norm_1_nonfinite": _case(aten.norm.ScalarOpt_dim, X_EDGE, 1.0, [0], False),
    "norm_0": _case(aten.norm.ScalarOpt_dim, X_EDGE, 0.0, [1], False),
    "var_mean": _case(aten.var_mean.correction, X, [1], correction=1, keepdim=False),
    "std_mean": _case(aten.std_mean.correction, X, [0, 1], correction=0, keepdim=True),
    "frac": _case(aten.frac.default, EDGE * 1.3),
    "logaddexp": _case(aten.logaddexp.default, PAIR_A, PAIR_B),
    "logaddexp2": _case(aten.logaddexp2.default, PAIR_A, PAIR_B),
    "xlogy": _case(aten.xlogy.Tensor, PAIR_A, PAIR_B),
    "xlogy_scalar_other": _case(aten.xlogy.Scalar_Other, PAIR_A, 2.0),
    "xlogy_scalar_self": _case(aten.xlogy.Scalar_Self, 3.0, PAIR_B),
    "copysign": _case(aten.copysign.Tensor, PAIR_A, PAIR_B),
    "heaviside": _case(aten.heaviside.default, PAIR_A, PAIR_B),
    "sinc": _case(aten.sinc.default, EDGE),
    "aminmax": _case(aten.aminmax.default, X),
    "aminmax_dim_nan": _case(aten.aminmax.default, X_EDGE, dim=1, keepdim=True),
    "count_nonzero": _case(aten.count_nonzero.dim_IntList, X_EDGE.clamp(max=0.0), [1]),
    "trace": _case(aten.trace.default, X),
    "addmv": _case(aten.addmv.default, _randn(4, seed=12), X, _randn(5, seed=13), beta=0.5, alpha=2.0),
    "addmv_beta0_nan": _case(aten.addmv.default, torch.full((4,), nan), X, _randn(5, seed=13), beta=0.0),
    "linalg_cross": _case(aten.linalg_cross.default, _randn(4, 3, seed=14), _randn(4, 3, seed=15)),
    "bucketize": _case(aten.bucketize.Tensor, X_EDGE, torch.tensor([-1.0, 0.0, 0.5, 2.0])),
    "bucketize_right": _case(aten.bucketize.Tensor, X_EDGE, torch.tensor([-1.0, 0.0, 0.5, 2.0]), right=True),
    # --- indexing and shapes (indexing.cpp, norm.cpp, creation.cpp) ---
    "channel_shuffle": _case(aten.channel_shuffle.default, _randn(2, 6, 2, 2, seed=16), 3),
    "index_copy": _case(aten.index_copy.default, X, 0, torch.tensor([3, 0, 1]), _randn(3, 5, seed=17)),
    "index_fill_tensor": _case(aten.index_fill.int_Tensor, X, 1, torch.tensor([4, 0]), torch.tensor(-1.5)),
    "index_fill_scalar": _case(aten.index_fill.int_Scalar, X, 1, torch.tensor([2]), 2.0),
    "_weight_norm_interface": _case(aten._weight_norm_interface.default, X, _randn(4, 1, seed=18), 0),
    "tril_indices": _case(aten.tril_indices.default, 4, 5, 1, device=Device),
    "triu_indices": _case(aten.triu_indices.default, 5, 3, -1, device=Device),
    # --- windows (conv.cpp) ---
    "im2col": _case(aten.im2col.default, IMAGE[:1, :2], [2, 3], [1, 1], [1, 0], [2, 1]),
    "col2im": _case(aten.col2im.default, COLUMNS, [5, 6], [2, 3], [1, 1], [1, 0], [2, 1]),
    "unfold_backward": _case(aten.unfold_backward.default, _randn(4, 3, seed=19), [10], 0, 3, 2),
    "unfold_backward_2d": _case(aten.unfold_backward.default, _randn(3, 2, 2, seed=20), [3, 5], 1, 2, 3),
    # --- grid_sample (resample.cpp): interpolation 0 bilinear, 1 nearest, 2 bicubic; padding
    # 0 zeros, 1 border, 2 reflection ---
    **{
        f"grid_sampler_2d_{interp}_{pad}_{int(align)}": _case(
            aten.grid_sampler_2d.default, IMAGE[:, :2, :4], GRID, interp, pad, align, tol={"atol": 1e-5, "rtol": 1e-4}
        )
        for interp, pad, align in [(0, 0, False), (0, 1, True), (0, 2, False), (1, 0, True), (1, 2, False), (2, 0, False), (2, 1, True)]
    },
    # --- upsampling (resample.cpp) ---
    "upsample_nearest1d": _case(aten.upsample_nearest1d.default, SIGNAL, [11]),
    "upsample_nearest2d": _case(aten.upsample_nearest2d.default, IMAGE_NONFINITE, [7, 4]),
    "upsample_nearest2d_scales": _case(aten.upsample_nearest2d.default, IMAGE, [10, 9], 2.0, 1.5),
    "upsample_nearest3d": _case(aten.upsample_nearest3d.default, VOLUME, [5, 3, 8]),
    "_upsample_nearest_exact1d": _case(aten._upsample_nearest_exact1d.default, SIGNAL, [11]),
    "_upsample_nearest_exact2d": _case(aten._upsample_nearest_exact2d.default, IMAGE, [7, 4]),
    "_upsample_nearest_exact3d": _case(aten._upsample_nearest_exact3d.default, VOLUME, [5, 3, 8]),
    "upsample_linear1d": _case(aten.upsample_linear1d.default, SIGNAL, [11], False),
    "upsample_linear1d_align": _case(aten.upsample_linear1d.default, SIGNAL, [4], True),
    "upsample_bilinear2d": _case(aten.upsample_bilinear2d.default, IMAGE, [7, 4], False),
    "upsample_bilinear2d_align": _case(aten.upsample_bilinear2d.default, IMAGE, [9, 11], True),
    "upsample_bilinear2d_nonfinite": _case(aten.upsample_bilinear2d.default, IMAGE_NONFINITE, [9, 11], False),
    "upsample_trilinear3d": _case(aten.upsample_trilinear3d.default, VOLUME, [5, 3, 8], False),
    "upsample_bicubic2d": _case(aten.upsample_bicubic2d.default, IMAGE, [7, 9], False, tol={"atol": 1e-5, "rtol": 1e-4}),
    "upsample_bicubic2d_align": _case(aten.upsample_bicubic2d.default, IMAGE, [3, 11], True, tol={"atol": 1e-5, "rtol": 1e-4}),
    # --- padding (padding.cpp) ---
    "reflection_pad1d": _case(aten.reflection_pad1d.default, SIGNAL, [3, 2]),
    "reflection_pad2d": _case(aten.reflection_pad2d.default, IMAGE_NONFINITE, [2, 1, 0, 3]),
    "reflection_pad3d": _case(aten.reflection_pad3d.default, VOLUME, [1, 2, 2, 0, 1, 1]),
    "reflection_pad1d_backward": _case(aten.reflection_pad1d_backward.default, _randn(2, 3, 12, seed=21), SIGNAL, [3, 2]),
    "reflection_pad2d_backward": _case(
        aten.reflection_pad2d_backward.default, _randn(2, 3, 8, 9, seed=22), IMAGE, [2, 1, 0, 3]
    ),
    "reflection_pad3d_backward": _case(
        aten.reflection_pad3d_backward.default, _randn(1, 2, 5, 6, 8, seed=23), VOLUME, [1, 2, 2, 0, 1, 1]
    ),
    "replication_pad1d": _case(aten.replication_pad1d.default, SIGNAL, [3, 2]),
    "replication_pad2d": _case(aten.replication_pad2d.default, IMAGE_NONFINITE, [2, 1, 0, 3]),
    "replication_pad3d": _case(aten.replication_pad3d.default, VOLUME, [1, 2, 2, 0, 1, 1]),
}

# Disagreements with the CPU kernel found by these checks: case -> reason, per side.
KERNEL_DISAGREES: dict = {}
DECOMPOSITION_DISAGREES = {
    "logit_backward_eps": "the decomposition gives 0 for a NaN input; the CPU gives NaN (on the CPU too)",
    **{
        f"grid_sampler_2d_{case}": "the decomposition samples a NaN grid point as 0; the CPU gives NaN (zeros "
        "padding) or a clamped pixel (border, reflection) (on the CPU too)"
        for case in ("0_0_0", "0_1_1", "0_2_0", "1_2_0")
    },
    "upsample_bilinear2d_nonfinite": "the decomposition spreads inf times a 0 weight as NaN to neighbours where "
    "the CPU gives inf (on the CPU too)",
}


def _overload_name(op):
    """`op` as `_decompositions` names it: "threshold", "norm.ScalarOpt_dim"."""
    name = op._schema.name.split("::")[1]
    return f"{name}.{op._overloadname}" if op._overloadname != "default" else name


# Cases whose op the placement rule moved to its decomposition.
MOVED = {name for name, (op, *_rest) in CASES.items() if _overload_name(op) in _decompositions.DECOMPOSED_KERNELS}


def _on(device, value):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if value is Device:
        return torch.device(device)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_on(device, v) for v in value)
    return value


def arguments(name, device):
    """The positional and keyword arguments of case `name` on `device`."""
    _, args, kwargs, _ = CASES[name]
    return [_on(device, a) for a in args], {k: _on(device, v) for k, v in kwargs.items()}


def run(name, device, implementation):
    """Case `name` on `device` through the registered kernel ("kernel") or PyTorch's
    decomposition ("decomposition")."""
    op = CASES[name][0]
    fn = op if implementation == "kernel" else decomposition_table[op]
    args, kwargs = arguments(name, device)
    return fn(*args, **kwargs)


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check(name, implementation):
    tol = CASES[name][3]
    expected = _flat(run(name, "cpu", "kernel"))
    actual = _flat(run(name, PJRT, implementation))
    torch_pjrt.sync()
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.device.type == PJRT, a.device
        assert a.dtype == e.dtype, (a.dtype, e.dtype)
        torch.testing.assert_close(a.cpu(), e, equal_nan=True, **tol)


def _params(disagrees, names=CASES):
    return [
        pytest.param(name, marks=pytest.mark.xfail(reason=disagrees[name], strict=True)) if name in disagrees else name
        for name in names
    ]


@pytest.fixture(params=["strict", "defer_and_fuse"])
def placement_mode(request):
    with torch_pjrt.eager_mode(request.param):
        torch_pjrt.sync()
        torch_pjrt.reset_metrics()
        yield request.param
        torch_pjrt.sync()


def test_every_case_has_a_decomposition():
    for name, (op, *_rest) in CASES.items():
        assert op in decomposition_table, name


def _pjrt_kernel_source(op):
    """Where `op`'s PrivateUse1 kernel was registered, from the dispatcher's table."""
    lines = torch._C._dispatch_dump(f"aten::{_overload_name(op)}")
    (line,) = [line for line in lines.splitlines() if line.startswith("PrivateUse1:")]
    return line


@pytest.mark.parametrize("name", list(CASES))
def test_each_op_is_on_its_side_of_the_rule(name):
    # Moved ops: PyTorch's decomposition, registered from Python; the others: a C++ kernel.
    source = _pjrt_kernel_source(CASES[name][0])
    assert ("_decompositions.py" in source) == (name in MOVED), source


def test_some_ops_stay_cpp_and_some_moved():
    # The rule splits the cases; a registration change that moved everything (or nothing) shows.
    assert MOVED and set(CASES) - MOVED


@pytest.mark.parametrize("name", _params(KERNEL_DISAGREES, [n for n in CASES if n not in MOVED]))
def test_kernel_matches_cpu(name, placement_mode):
    check(name, "kernel")


@pytest.mark.parametrize("name", _params(DECOMPOSITION_DISAGREES))
def test_decomposition_matches_cpu(name, placement_mode):
    check(name, "decomposition")
