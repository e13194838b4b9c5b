"""The fast path of nn.TransformerEncoder, nn.TransformerEncoderLayer and nn.MultiheadAttention on
pjrt (eval mode, no gradients): `_transformer_encoder_layer_fwd`, `_native_multi_head_attention`
and, with a padding mask, the encoder's nested-tensor route, against the CPU's own fast path, in
Strict and DeferAndFuse, with no CPU fallback (the `strict_or_fused_mode` fixture checks it)."""

import contextlib
import re
import warnings

import pytest
import torch
import torch.nn as nn

from conftest import in_mode_without_fallbacks, seeded

TOL = {"rtol": 1e-5, "atol": 1e-5}

# [B, L] padding masks (True: padding): left-aligned ones, which the encoder's nested route
# takes, and one with gaps, which the encoder's mask check sends to the dense route.
PADDING = {
    "ragged": [[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 0, 0, 0, 1]],
    "one_empty": [[0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]],
    "none_padded": [[0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]],
    "gaps": [[0, 1, 0, 0, 0], [1, 0, 0, 1, 0], [0, 0, 0, 0, 1]],
}


@contextlib.contextmanager
def quiet():
    """No gradients, and no prototype warning of nested tensors (the CPU's route makes them)."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def called_ops(fn):
    """fn()'s result and the ATen ops it called."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    return out, {e.name for e in prof.events()}


def encoder(norm_first=False, activation="relu", nested=True, layers=2, final_norm=False, d=16, heads=4):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        d, heads, 32, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )
    norm = nn.LayerNorm(d) if final_norm else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # enable_nested_tensor with norm_first
        return nn.TransformerEncoder(layer, layers, norm=norm, enable_nested_tensor=nested).eval()


def on_both(module, *args, **kwargs):
    """module(*args, **kwargs) on the CPU, then on pjrt: (expected, got on the CPU, ops called on
    pjrt). Tensors in the arguments are moved."""
    move = lambda v: v.to("pjrt") if isinstance(v, torch.Tensor) else v  # noqa: E731
    with quiet():
        expected = module(*args, **kwargs)
        pjrt_module = module.to("pjrt")
        got, ops = called_ops(lambda: pjrt_module(*map(move, args), **{k: move(v) for k, v in kwargs.items()}))
        got = tuple(g.cpu() if isinstance(g, torch.Tensor) else g for g in got) if isinstance(got, tuple) else got.cpu()
        module.to("cpu")
    return expected, got, ops


@pytest.mark.parametrize("padding", [None, "ragged"])
@pytest.mark.parametrize("nested", [True, False], ids=["nested", "dense"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_encoder_fast_path_matches_the_cpu(strict_or_fused_mode, norm_first, activation, nested, padding):
    model = encoder(norm_first, activation, nested)
    src = torch.randn(3, 5, 16, generator=seeded(1))
    mask = None if padding is None else torch.tensor(PADDING[padding], dtype=torch.bool)
    expected, got, ops = on_both(model, src, src_key_padding_mask=mask)
    torch.testing.assert_close(got, expected, **TOL)
    assert "aten::_transformer_encoder_layer_fwd" in ops
    # The encoder's nested route: post-norm layers, a padding mask and enable_nested_tensor.
    nested_route = nested and not norm_first and mask is not None
    assert ("aten::_nested_tensor_from_mask" in ops) == nested_route
    assert ("aten::to_padded_tensor" in ops) == nested_route
    if nested_route:
        # The CPU's result is 0 past each sequence's length (to_padded_tensor's padding).
        assert (expected[mask] == 0).all()


@pytest.mark.parametrize("padding", sorted(PADDING))
@pytest.mark.parametrize("nested", [True, False], ids=["nested", "dense"])
def test_encoder_padding_masks_match_the_cpu(strict_or_fused_mode, nested, padding):
    # A sequence padded in full: the nested route gives zeros for it; the dense one NaN (its
    # query rows are masked in full), on the CPU as on pjrt.
    model = encoder(nested=nested, final_norm=True)
    src = torch.randn(3, 5, 16, generator=seeded(2))
    mask = torch.tensor(PADDING[padding], dtype=torch.bool)
    expected, got, ops = on_both(model, src, src_key_padding_mask=mask)
    torch.testing.assert_close(got, expected, equal_nan=True, **TOL)
    assert ("aten::_nested_tensor_from_mask" in ops) == (nested and padding != "gaps")


def test_nested_route_ignores_the_padded_input(strict_or_fused_mode):
    # The nested route never reads the input past each length: NaN there changes nothing.
    model = encoder()
    src = torch.randn(3, 5, 16, generator=seeded(3))
    mask = torch.tensor(PADDING["ragged"], dtype=torch.bool)
    src[mask] = float("nan")
    expected, got, _ = on_both(model, src, src_key_padding_mask=mask)
    assert not expected.isnan().any()
    torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_padding", [False, True])
def test_layer_with_an_attention_mask_matches_the_cpu(strict_or_fused_mode, causal, with_padding):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, batch_first=True).eval()
    src = torch.randn(3, 5, 16, generator=seeded(4))
    attn_mask = nn.Transformer.generate_square_subsequent_mask(5) if causal else torch.rand(5, 5, generator=seeded(5)) > 0.7
    attn_mask = attn_mask.fill_diagonal_(0) if attn_mask.dtype == torch.bool else attn_mask
    padding = torch.tensor(PADDING["ragged"], dtype=torch.bool) if with_padding else None
    expected, got, ops = on_both(layer, src, src_mask=attn_mask, src_key_padding_mask=padding, is_causal=causal)
    torch.testing.assert_close(got, expected, **TOL)
    assert "aten::_transformer_encoder_layer_fwd" in ops


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("masks", ["none", "padding", "attn_2d", "attn_3d", "both"])
def test_multihead_attention_fast_path_matches_the_cpu(strict_or_fused_mode, need_weights, average, masks):
    torch.manual_seed(0)
    heads, length = 4, 6
    mha = nn.MultiheadAttention(16, heads, batch_first=True).eval()
    x = torch.randn(2, length, 16, generator=seeded(6))
    padding = torch.tensor([[0] * length, [0] * 4 + [1] * 2], dtype=torch.bool)
    attn_2d = torch.ones(length, length, dtype=torch.bool).triu(1)
    attn_3d = torch.rand(2 * heads, length, length, generator=seeded(7)) > 0.6
    attn_3d[:, torch.arange(length), torch.arange(length)] = False
    kwargs = {
        "none": {},
        "padding": {"key_padding_mask": padding},
        "attn_2d": {"attn_mask": attn_2d},
        "attn_3d": {"attn_mask": attn_3d},
        "both": {"key_padding_mask": padding, "attn_mask": attn_2d},
    }[masks]

    def self_attention(module):
        return lambda q, **kw: module(q, q, q, need_weights=need_weights, average_attn_weights=average, **kw)

    with quiet():
        expected = self_attention(mha)(x, **kwargs)
        mha.to("pjrt")
        moved = {k: v.to("pjrt") for k, v in kwargs.items()}
        got, ops = called_ops(lambda: self_attention(mha)(x.to("pjrt"), **moved))
    assert "aten::_native_multi_head_attention" in ops
    torch.testing.assert_close(got[0].cpu(), expected[0], **TOL)
    if need_weights:
        torch.testing.assert_close(got[1].cpu(), expected[1], **TOL)
    else:
        assert got[1] is None and expected[1] is None


@pytest.mark.parametrize("inputs", ["self", "shared_key_value", "distinct"])
def test_native_multi_head_attention_on_distinct_inputs(strict_or_fused_mode, inputs):
    d, heads = 8, 2
    g = seeded(8)
    q = torch.randn(2, 3, d, generator=g)
    k = q if inputs == "self" else torch.randn(2, 3, d, generator=g)
    v = k if inputs in ("self", "shared_key_value") else torch.randn(2, 3, d, generator=g)
    params = [torch.randn(3 * d, d, generator=g), torch.randn(3 * d, generator=g)]
    params += [torch.randn(d, d, generator=g), torch.randn(d, generator=g)]

    def run(device):
        ins = {t: t.to(device) for t in (q, k, v)}  # keeps which inputs are one tensor
        return torch._native_multi_head_attention(
            ins[q], ins[k], ins[v], d, heads, *(p.to(device) for p in params), None, True, True, None
        )

    with torch.no_grad():
        expected = run("cpu")
        got = run("pjrt")
    for e, r in zip(expected, got):
        torch.testing.assert_close(r.cpu(), e, **TOL)


def test_empty_inputs_match_the_cpu(strict_or_fused_mode):
    model = encoder(layers=1)
    src = torch.randn(2, 0, 16)
    expected, got, _ = on_both(model.layers[0], src)
    assert got.shape == expected.shape == (2, 0, 16)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    expected, got, _ = on_both(mha, src, src, src, need_weights=False)
    assert got[0].shape == expected[0].shape and got[1] is None


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_nested_checks_raise_the_cpus_errors(mode):
    t = torch.randn(2, 3, 4)
    cases = [
        (t, torch.tensor([[1, 0, 1], [1, 1, 0]], dtype=torch.bool), True),  # not left-aligned
        (t, torch.ones(2, 3), True),  # not bool
        (t, torch.ones(2, 4, dtype=torch.bool), False),  # wrong shape
        (t[0], torch.ones(2, 3, dtype=torch.bool), False),  # not 3-d
    ]
    with in_mode_without_fallbacks(mode):
        for src, mask, check in cases:
            with pytest.raises(RuntimeError) as expected:
                torch._nested_tensor_from_mask(src, mask, mask_check=check)
            with pytest.raises(RuntimeError, match=re.escape(str(expected.value).splitlines()[0])):
                torch._nested_tensor_from_mask(src.to("pjrt"), mask.to("pjrt"), mask_check=check)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_nested_tensors_pad_as_on_the_cpu(mode):
    parts = [torch.randn(2, 3, generator=seeded(9)), torch.randn(4, 3, generator=seeded(10))]
    with quiet(), in_mode_without_fallbacks(mode):
        cpu = torch.nested.nested_tensor(parts)
        nt = torch.nested.nested_tensor(parts, device="pjrt")
        for args in [(0.0,), (-1.5,), (2.0, (2, 6, 5))]:
            torch.testing.assert_close(nt.to_padded_tensor(*args).cpu(), cpu.to_padded_tensor(*args))
        mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
        t = torch.randn(2, 4, 3, generator=seeded(11))
        got = torch._nested_tensor_from_mask(t.to("pjrt"), mask.to("pjrt")).to_padded_tensor(0.0)
        torch.testing.assert_close(got.cpu(), torch._nested_tensor_from_mask(t, mask).to_padded_tensor(0.0))


def test_other_nested_ops_stay_unsupported(pjrt):
    with quiet():
        nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], device=pjrt)
        with pytest.raises(NotImplementedError, match="NestedTensorpjrt"):
            nt + 1
        with pytest.raises(NotImplementedError, match="NestedTensorpjrt"):
            nt.cpu()


def test_layer_on_a_nested_tensor_of_any_layout(strict_or_fused_mode):
    # A nested tensor made by torch.nested (packed components, one of them empty) through the
    # layer's nested kernel, read back padded.
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    parts = [torch.randn(2, 16, generator=seeded(12)), torch.randn(5, 16, generator=seeded(13)), torch.randn(0, 16)]
    with quiet():
        expected = layer(torch.nested.nested_tensor(parts)).to_padded_tensor(0.0)
        got = layer.to("pjrt")(torch.nested.nested_tensor(parts, device="pjrt")).to_padded_tensor(0.0)
    torch.testing.assert_close(got.cpu(), expected, **TOL)
