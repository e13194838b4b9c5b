"""Long-tail ops that pjrt runs as compositions of native ops (`torch_pjrt._decompositions`,
RFC 0045), through PyTorch's own decompositions or formulas of our own: each against the CPU
kernel, forward and backward, in every eager mode and under `torch.inference_mode`, with
nothing sent to the CPU (the `mode` fixture asserts that no op fell back); and each registered
kernel against the CPU kernel on the CPU, so a torch whose decomposition drifts from its kernel
fails here first."""

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt import _decompositions
from conftest import check_against_cpu as check, in_mode_without_fallbacks, seeded

X = torch.randn(6, 5, generator=seeded(0))
TARGET = torch.randint(0, 5, (6,), generator=seeded(1))
WEIGHT = torch.rand(5, generator=seeded(2)) + 0.5

# 3-d pooling inputs: windows that divide the input, windows that do not (and overlap), more
# outputs than inputs, an unbatched input; and one with many equal values (ties for max).
VOLUME = torch.randn(2, 3, 7, 9, 5, generator=seeded(3))
VOLUME_UNBATCHED = torch.randn(3, 5, 6, 4, generator=seeded(4))
VOLUME_TIES = torch.randint(0, 3, (2, 2, 6, 5, 7), generator=seeded(5)).float()
# NaN and infinities stay in their own windows (a NaN is the maximum; the last NaN's index).
VOLUME_NONFINITE = torch.randn(2, 2, 5, 6, 7, generator=seeded(10))
VOLUME_NONFINITE[0, 0, 1, 2, 3] = VOLUME_NONFINITE[0, 0, 3, 4, 5] = float("nan")
VOLUME_NONFINITE[0, 1, 2, 2, 2] = float("inf")
VOLUME_NONFINITE[1, 1] = -float("inf")
POOL3D = {
    "even": (VOLUME, (7, 3, 5)),
    "uneven": (VOLUME, (3, 4, 2)),
    "upsampled": (VOLUME[:, :, :3, :2, :4], (5, 4, 7)),
    "unbatched": (VOLUME_UNBATCHED, (2, 4, 3)),
    "ties": (VOLUME_TIES, (4, 3, 3)),
    "nonfinite": (VOLUME_NONFINITE, (2, 3, 4)),
}

# Multi-label targets: a row's targets are its entries before its first -1 (those after it
# are not targets), a row of -1 only, repeated targets.
ML_X = torch.randn(5, 6, generator=seeded(6))
ML_TARGET = torch.tensor(
    [[3, 0, -1, 1, 5, 2], [-1, 1, 1, 1, 1, 1], [4, 4, 2, 1, 0, 5], [1, 2, 3, -1, -1, 0], [5, -1, 0, 0, 0, 0]]
)

# CTC: 12 steps, 4 samples of 6 classes, lengths that vary; sample 2 repeats one label 3 times
# in 3 steps (it needs 5): an impossible alignment, whose loss is infinite.
CTC_LP = torch.randn(12, 4, 6, generator=seeded(7)).log_softmax(2)
CTC_IN = (12, 9, 3, 7)
CTC_TL = (4, 0, 3, 2)
CTC_TARGET = torch.randint(1, 6, (4, 5), generator=seeded(8))
CTC_TARGET[2, :3] = 2
CTC_TARGET_1D = torch.cat([CTC_TARGET[n, :length] for n, length in enumerate(CTC_TL)])
# Possible for every sample: sample 2 given 9 steps.
CTC_IN_OK = (12, 9, 9, 7)


# The ops moved from C++ composites (RFC 0045, "Placement measured"), with the edge values the
# placement checks use: both infinities, NaN, signed zeros, the ends of each op's pieces.
inf, nan = float("inf"), float("nan")
EDGE = torch.tensor(
    [-inf, -20.0, -3.5, -3.0, -2.5, -1.0, -0.5, -0.0, 0.0, 0.25, 0.5, 1.0, 2.9, 3.0, 3.5, 20.0, 25.0, inf, nan]
)
X_EDGE = torch.randn(4, 5, generator=seeded(11))
X_EDGE[0, :4] = torch.tensor([0.0, -inf, inf, nan])
X_EDGE[2, 1] = -0.0
# logit's domain: its ends 0 and 1, values outside it, NaN
PROB = torch.tensor([0.0, 1e-7, 0.1, 0.5, 0.9, 1.0 - 1e-7, 1.0, -0.5, 1.5, nan])
PAIR_A = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.0, inf, -inf, nan, 3.0, 0.0, -inf, inf])
PAIR_B = torch.tensor([0.0, 2.0, -0.0, 0.0, nan, inf, -inf, 1.0, inf, -inf, 5.0, -inf])
SIGNAL = torch.randn(2, 3, 7, generator=seeded(12))
SIGNAL_NONFINITE = SIGNAL.clone()
SIGNAL_NONFINITE[0, 1, :3] = torch.tensor([nan, inf, -0.0])
PRELU_WEIGHT = torch.tensor([0.25, -0.5])


def _flat(*tensors):
    """Several results as one tensor (the checks compare one output)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def _in_place(op, *args):
    # On a copy: the input is a leaf that requires grad.
    return lambda x, *more: op(x.clone(), *more, *args)


MOVED_CASES = {
    "threshold": (lambda x: F.threshold(x, 0.5, -2.0), (EDGE,)),
    "threshold_": (_in_place(torch.threshold_, 0.5, -2.0), (EDGE,)),
    "hardshrink": (lambda x: F.hardshrink(x, 0.5), (EDGE,)),
    "softshrink": (lambda x: F.softshrink(x, 0.5), (EDGE,)),
    "prelu": (lambda x, w: F.prelu(x, w), (X_EDGE.reshape(2, 2, 5), PRELU_WEIGHT)),
    "prelu_weight_grad": (lambda w, x: F.prelu(x, w), (PRELU_WEIGHT, X_EDGE.reshape(2, 2, 5))),
    "_prelu_kernel_backward": (
        lambda g, x, w: _flat(*torch.ops.aten._prelu_kernel_backward(g, x, w)),
        (torch.randn(2, 2, 5, generator=seeded(13)), X_EDGE.reshape(2, 2, 5), PRELU_WEIGHT.reshape(2, 1)),
    ),
    "logit": (lambda x: torch.logit(x), (PROB,)),
    "logit_eps": (lambda x: torch.logit(x, 1e-3), (PROB,)),
    "logit_": (_in_place(torch.logit_, 1e-3), (PROB,)),
    "norm_2": (lambda x: torch.norm(x, 2.0, [1]), (X_EDGE[1:],)),
    "norm_inf_keepdim": (lambda x: torch.norm(x, inf, [1], keepdim=True), (X_EDGE,)),
    "norm_1_nonfinite": (lambda x: torch.norm(x, 1.0, [0]), (X_EDGE,)),
    # Values only: on pjrt this gradient is None where the CPU's is defined (NaN for a NaN row),
    # with the C++ kernel as with the decomposition (autograd's formula is the same for both).
    "norm_0": (lambda x: torch.norm(x, 0.0, [1]), (X_EDGE,), ()),
    "norm_all": (lambda x: torch.norm(x, 3.0), (X_EDGE[1:],)),
    "norm_dtype": (lambda x: torch.norm(x, 2.0, [0], dtype=torch.float64), (X_EDGE[1:],)),
    "std_mean": (lambda x: _flat(*torch.std_mean(x, [0, 1], correction=0, keepdim=True)), (X_EDGE[1:],)),
    "std_mean_nonfinite": (lambda x: _flat(*torch.std_mean(x, [1], correction=1)), (X_EDGE,)),
    "frac": (lambda x: torch.frac(x), (EDGE * 1.3,)),
    "frac_": (_in_place(torch.frac_), (EDGE * 1.3,)),
    "logaddexp2": (lambda a, b: torch.logaddexp2(a, b), (PAIR_A, PAIR_B)),
    "sinc": (lambda x: torch.sinc(x), (EDGE,)),
    "sinc_": (_in_place(torch.sinc_), (EDGE,)),
    "trace": (lambda x: torch.trace(x), (X_EDGE[1:],)),
    "trace_nonfinite": (lambda x: torch.trace(x), (X_EDGE.T,)),
    "channel_shuffle": (
        lambda x: torch.channel_shuffle(x, 3),
        (torch.randn(2, 6, 2, 2, generator=seeded(14)),),
    ),
    "weight_norm": (lambda v, g: torch._weight_norm(v, g, 0), (X_EDGE[1:], torch.randn(3, 1, generator=seeded(15)))),
    "weight_norm_g_grad": (
        lambda g, v: torch._weight_norm(v, g, 1),
        (torch.randn(1, 5, generator=seeded(16)), X_EDGE[1:]),
    ),
    "unfold_backward": (
        lambda g: torch.ops.aten.unfold_backward(g, [10], 0, 3, 2),
        (torch.randn(4, 3, generator=seeded(17)),),
    ),
    "unfold_backward_2d": (
        lambda g: torch.ops.aten.unfold_backward(g, [3, 5], 1, 2, 3),
        (torch.randn(3, 2, 2, generator=seeded(18)),),
    ),
    "unfold_grad": (lambda x: x.unfold(1, 2, 3), (X_EDGE,)),
    "upsample_nearest1d": (lambda x: F.interpolate(x, size=11, mode="nearest"), (SIGNAL_NONFINITE,)),
    "upsample_nearest1d_scale": (
        lambda x: F.interpolate(x, scale_factor=1.7, mode="nearest", recompute_scale_factor=False),
        (SIGNAL,),
    ),
    "upsample_nearest_exact1d": (lambda x: F.interpolate(x, size=11, mode="nearest-exact"), (SIGNAL_NONFINITE,)),
    "upsample_nearest_exact1d_down": (lambda x: F.interpolate(x, size=4, mode="nearest-exact"), (SIGNAL,)),
    "replication_pad1d": (lambda x: F.pad(x, [3, 2], mode="replicate"), (SIGNAL_NONFINITE,)),
    "replication_pad1d_unbatched": (lambda x: F.pad(x, [0, 4], mode="replicate"), (SIGNAL[0],)),
}


def _ctc(targets, input_lengths, target_lengths, tensors=False, **kw):
    def fn(lp):
        il, tl = input_lengths, target_lengths
        if tensors:
            il, tl = torch.tensor(il, device=lp.device), torch.tensor(tl, device=lp.device)
        return F.ctc_loss(lp, targets.to(lp.device), il, tl, **kw)

    return fn


CASES = {
    "multi_margin_loss": (lambda x, t: F.multi_margin_loss(x, t), (X, TARGET)),
    "multi_margin_loss_p2_weight_sum": (
        lambda x, t, w: F.multi_margin_loss(x, t, p=2, margin=0.7, weight=w, reduction="sum"),
        (X, TARGET, WEIGHT),
    ),
    "multi_margin_loss_none_1d": (
        lambda x, t: F.multi_margin_loss(x, t, reduction="none"),
        (X[0], TARGET[:1].reshape(())),
    ),
    **{
        f"adaptive_avg_pool3d_{name}": (lambda x, size=size: F.adaptive_avg_pool3d(x, size), (x,))
        for name, (x, size) in POOL3D.items()
    },
    **{
        f"adaptive_max_pool3d_{name}": (lambda x, size=size: F.adaptive_max_pool3d(x, size), (x,))
        for name, (x, size) in POOL3D.items()
    },
    "multilabel_margin_loss": (lambda x, t: F.multilabel_margin_loss(x, t), (ML_X, ML_TARGET)),
    "multilabel_margin_loss_sum": (
        lambda x, t: F.multilabel_margin_loss(x, t, reduction="sum"),
        (ML_X, ML_TARGET),
    ),
    "multilabel_margin_loss_none": (
        lambda x, t: F.multilabel_margin_loss(x, t, reduction="none"),
        (ML_X, ML_TARGET),
    ),
    "multilabel_margin_loss_none_1d": (
        lambda x, t: F.multilabel_margin_loss(x, t, reduction="none"),
        (ML_X[3], ML_TARGET[3]),
    ),
    "ctc_loss": (_ctc(CTC_TARGET, CTC_IN_OK, CTC_TL), (CTC_LP,)),
    "ctc_loss_sum_1d_targets_tensor_lengths": (
        _ctc(CTC_TARGET_1D, CTC_IN_OK, CTC_TL, tensors=True, reduction="sum"),
        (CTC_LP,),
    ),
    "ctc_loss_none_blank_5": (
        _ctc(CTC_TARGET - 1, CTC_IN_OK, CTC_TL, blank=5, reduction="none"),
        (CTC_LP,),
    ),
    "ctc_loss_zero_infinity_mean": (_ctc(CTC_TARGET, CTC_IN, CTC_TL, zero_infinity=True), (CTC_LP,)),
    "ctc_loss_zero_infinity_none_1d_targets": (
        _ctc(CTC_TARGET_1D, CTC_IN, CTC_TL, zero_infinity=True, reduction="none"),
        (CTC_LP,),
    ),
    # Without zero_infinity the impossible sample's loss is inf and its gradient NaN, as on the CPU.
    "ctc_loss_impossible_none": (_ctc(CTC_TARGET, CTC_IN, CTC_TL, reduction="none"), (CTC_LP,)),
    # A log-probability input that is not a log_softmax output: the kernels' gradient convention
    # (the logits' gradient under a log_softmax) shows.
    "ctc_loss_unnormalized": (
        _ctc(CTC_TARGET, CTC_IN_OK, CTC_TL, reduction="sum"),
        (torch.randn(12, 4, 6, generator=seeded(9)),),
    ),
    **MOVED_CASES,
}


def test_every_decomposed_op_is_registered():
    from torch._decomp import decomposition_table

    moved = (*_decompositions.DECOMPOSED_KERNELS, *_decompositions.DECOMPOSED_OUT)
    for name in (*_decompositions.DECOMPOSED, *moved):
        op = _decompositions._overload(name)
        assert op in decomposition_table, name
        assert _decompositions.kernel(name) is not None, name
        keys = ("PrivateUse1",) if name in moved else ("AutogradPrivateUse1", "PrivateUse1")
        for key in keys:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key), (name, key)
    for name in _decompositions.OWN:
        op = _decompositions._overload(name)
        for key in ("AutogradPrivateUse1", "PrivateUse1"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key), (name, key)
        assert _decompositions.kernel(name) is _decompositions.OWN[name]
    for name, functional in _decompositions.OUT_OVERLOADS.items():
        assert functional in _decompositions.OWN, name
        op = _decompositions._overload(name)
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1"), name


@pytest.mark.parametrize("name", list(CASES))
def test_decomposed_ops_match_the_cpu(mode, name):
    fn, inputs, *grads_of = CASES[name]
    if grads_of == [()]:
        # Not differentiable (integer or boolean results, or a step): the values only.
        expected = fn(*inputs)
        got = fn(*[t.to("pjrt") for t in inputs])
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5, equal_nan=True)
    else:
        check(fn, inputs, equal_nan=True)


@pytest.mark.parametrize("name", list(CASES))
def test_decomposed_ops_run_under_inference_mode(name):
    fn, inputs, *_ = CASES[name]
    expected = fn(*inputs)
    with in_mode_without_fallbacks("strict"), torch.inference_mode():
        got = fn(*[t.to("pjrt") for t in inputs])
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("name", list(CASES))
def test_decompositions_agree_with_the_cpu_kernels(name):
    fn, inputs, *_ = CASES[name]
    # The same call with every decomposed op replaced by the kernel pjrt registers, on the CPU.
    with torch.library._scoped_library("aten", "IMPL") as lib:
        for op in (
            *_decompositions.DECOMPOSED,
            *_decompositions.DECOMPOSED_KERNELS,
            *_decompositions.DECOMPOSED_OUT,
            *_decompositions.OWN,
        ):
            lib.impl(op, _decompositions.kernel(op), "CPU")
        decomposed = fn(*inputs)
    torch.testing.assert_close(decomposed, fn(*inputs), rtol=1e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("name", list(POOL3D))
def test_adaptive_max_pool3d_indices_match_the_cpu(mode, name):
    # The index of each window's first maximum, flat over (D, H, W), as the CPU picks it.
    x, size = POOL3D[name]
    _, expected = F.adaptive_max_pool3d(x, size, return_indices=True)
    _, got = F.adaptive_max_pool3d(x.to("pjrt"), size, return_indices=True)
    assert got.dtype == expected.dtype
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_op_matches_the_cpu(mode, zero_infinity):
    # `_ctc_loss` itself, both overloads: the loss, log_alpha over each sample's steps and
    # states, and the gradient of the loss (whose backward applies zero_infinity itself).
    for lengths in (list, torch.tensor):
        for targets in (CTC_TARGET, CTC_TARGET_1D):
            args = (targets, lengths(CTC_IN), lengths(CTC_TL), 0, zero_infinity)
            lp = CTC_LP.clone().requires_grad_()
            nll, log_alpha = torch.ops.aten._ctc_loss(lp, *args)
            (grad,) = torch.autograd.grad(nll, lp, torch.ones(4))
            lp_pjrt = CTC_LP.to("pjrt").requires_grad_()
            pjrt_args = tuple(a.to("pjrt") if isinstance(a, torch.Tensor) else a for a in args)
            nll_pjrt, log_alpha_pjrt = torch.ops.aten._ctc_loss(lp_pjrt, *pjrt_args)
            (grad_pjrt,) = torch.autograd.grad(nll_pjrt, lp_pjrt, torch.ones(4, device="pjrt"))
            torch.testing.assert_close(nll_pjrt.cpu(), nll)
            torch.testing.assert_close(grad_pjrt.cpu(), grad, equal_nan=True)
            for n, (steps, length) in enumerate(zip(CTC_IN, CTC_TL)):
                torch.testing.assert_close(
                    log_alpha_pjrt[n, :steps, : 2 * length + 1].cpu(), log_alpha[n, :steps, : 2 * length + 1]
                )


def test_multilabel_margin_loss_is_target_matches_the_cpu(mode):
    _, expected = torch.ops.aten.multilabel_margin_loss_forward(ML_X, ML_TARGET, 1)
    _, got = torch.ops.aten.multilabel_margin_loss_forward(ML_X.to("pjrt"), ML_TARGET.to("pjrt"), 1)
    assert torch.equal(got.cpu(), expected)


MASKS = {
    "left_aligned": [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]],
    "token_after_padding": [[1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 0]],
    "padding_first": [[0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]],
}


@pytest.mark.parametrize("name", list(MASKS))
def test_nested_tensor_mask_check_matches_the_cpu(mode, name):
    mask = torch.tensor(MASKS[name], dtype=torch.bool)
    src = torch.randn(3, 4, 2)
    expected = torch._nested_tensor_from_mask_left_aligned(src, mask)
    got = torch._nested_tensor_from_mask_left_aligned(src.to("pjrt"), mask.to("pjrt"))
    assert got is expected


def test_transformer_encoder_checks_its_padding_mask_on_the_device(mode):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    # In eval mode the encoder checks that the padding mask is left-aligned before its fast path
    # (which grad-enabled parameters then rule out).
    encoder = torch.nn.TransformerEncoder(layer, 2).eval()
    src = torch.randn(3, 4, 8)
    padding = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0], [0, 0, 0, 1]], dtype=torch.bool)
    expected = encoder(src, src_key_padding_mask=padding)
    got = encoder.to("pjrt")(src.to("pjrt"), src_key_padding_mask=padding.to("pjrt"))
    torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=1e-4, atol=1e-5)


OUT_CALLS = {
    "adaptive_max_pool3d.out": (
        lambda x, **out: torch.ops.aten.adaptive_max_pool3d.out(x, [3, 4, 2], **out),
        (VOLUME,),
        ("out", "indices"),
    ),
    "_adaptive_avg_pool3d.out": (
        lambda x, **out: torch.ops.aten._adaptive_avg_pool3d.out(x, [3, 4, 2], **out),
        (VOLUME,),
        ("out",),
    ),
    "adaptive_avg_pool3d.out": (
        lambda x, **out: torch.ops.aten.adaptive_avg_pool3d.out(x, [3, 4, 2], **out),
        (VOLUME,),
        ("out",),
    ),
    "multilabel_margin_loss_forward.output": (
        lambda x, t, **out: torch.ops.aten.multilabel_margin_loss_forward.output(x, t, 0, **out),
        (ML_X, ML_TARGET),
        ("output", "is_target"),
    ),
    "_ctc_loss.out": (
        lambda lp, t, **out: torch.ops.aten._ctc_loss.out(lp, t, CTC_IN_OK, CTC_TL, **out),
        (CTC_LP, CTC_TARGET),
        ("out0",),  # out1 is log_alpha, which the CPU leaves unwritten past each sample's states
    ),
    "threshold.out": (lambda x, **out: torch.ops.aten.threshold.out(x, 0.5, -2.0, **out), (EDGE,), ("out",)),
    "hardshrink.out": (lambda x, **out: torch.ops.aten.hardshrink.out(x, 0.5, **out), (EDGE,), ("out",)),
    "softshrink.out": (lambda x, **out: torch.ops.aten.softshrink.out(x, 0.5, **out), (EDGE,), ("out",)),
    "logit.out": (lambda x, **out: torch.ops.aten.logit.out(x, 1e-3, **out), (PROB,), ("out",)),
    "norm.out": (lambda x, **out: torch.ops.aten.norm.out(x, 2.0, [1], True, **out), (X_EDGE,), ("out",)),
    "norm.dtype_out": (
        lambda x, **out: torch.ops.aten.norm.dtype_out(x, 1.0, [0], False, dtype=torch.float32, **out),
        (X_EDGE,),
        ("out",),
    ),
    "frac.out": (lambda x, **out: torch.ops.aten.frac.out(x, **out), (EDGE * 1.3,), ("out",)),
    "logaddexp2.out": (lambda a, b, **out: torch.ops.aten.logaddexp2.out(a, b, **out), (PAIR_A, PAIR_B), ("out",)),
    "sinc.out": (lambda x, **out: torch.ops.aten.sinc.out(x, **out), (EDGE,), ("out",)),
    "upsample_nearest1d.out": (
        lambda x, **out: torch.ops.aten.upsample_nearest1d.out(x, [11], **out),
        (SIGNAL_NONFINITE,),
        ("out",),
    ),
    "replication_pad1d.out": (
        lambda x, **out: torch.ops.aten.replication_pad1d.out(x, [3, 2], **out),
        (SIGNAL_NONFINITE,),
        ("out",),
    ),
}


@pytest.mark.parametrize("name", list(OUT_CALLS))
def test_out_overloads_match_the_cpu(mode, name):
    fn, inputs, compared = OUT_CALLS[name]
    outs = [a.name for a in _decompositions._overload(name)._schema.arguments if a.is_out]
    expected = {n: torch.empty(0) for n in outs}
    got = {n: torch.empty(0, device="pjrt") for n in outs}
    if "indices" in outs:
        expected["indices"], got["indices"] = expected["indices"].long(), got["indices"].long()
    fn(*inputs, **expected)
    fn(*[t.to("pjrt") for t in inputs], **got)
    for n in compared:
        torch.testing.assert_close(got[n].cpu(), expected[n], rtol=1e-5, atol=1e-5, equal_nan=True)
