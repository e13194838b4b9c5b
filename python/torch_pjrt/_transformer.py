"""pjrt kernels for the fast path of PyTorch's transformer modules (RFC 0045's placement rule).

In eval mode without gradients, `nn.TransformerEncoderLayer` and `nn.MultiheadAttention` call
`torch._transformer_encoder_layer_fwd` and `torch._native_multi_head_attention` on any device that
is `cpu`, `cuda`, `xpu` or the PrivateUse1 backend. PyTorch has kernels for them on CPU and CUDA
only, and no decomposition: the kernels here compose them from ops that pjrt runs natively,
following the CPU kernels step by step (the projection without bias, then bias and the query's
scale 1/sqrt(head dim) as a product, a masked softmax over the keys, the output projection; layer
norms and a ReLU or exact GELU feed-forward around it).

With a padding mask, `nn.TransformerEncoder` packs its input into a nested tensor
(`torch._nested_tensor_from_mask`), runs its layers on it and pads the result with zeros
(`to_padded_tensor`). Nested tensors are otherwise unsupported on pjrt; these three ops are
registered for them so that this path gives the CPU's result: the nested tensor made here keeps
its rows in a padded buffer ([N, L, D], zeros past each sequence's length), the encoder layer runs
densely on that buffer with the lengths as a key padding mask and zeroes the rows past each
length (they do not exist in the CPU's nested computation), and `to_padded_tensor` reads a nested
tensor of any layout back. The nested tensor's sizes and offsets are read with the nested-tensor
kernels that PyTorch registers for the CPU: they only read metadata held on the host.
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten

_lib = None

_NESTED_META = torch._C.DispatchKeySet(torch._C.DispatchKey.NestedTensorCPU)
_DENSE_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _scalar_type(t) -> str:
    """The c10 name of `t`'s dtype (`Float` for float32), as PyTorch's messages write it."""
    return torch.empty(0, dtype=t.dtype).type()[len("torch.") : -len("Tensor")]


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise RuntimeError(message)


def _masked_softmax_last(scores, mask, mask_type):
    """Softmax of `scores` ([B, H, L, S]) over its last dim where `mask` (bool, True: masked) is
    False, as `torch._masked_softmax`: masked entries are 0, and a row masked in full is NaN.
    mask_type 0 is an [L, L] attention mask, 1 a [B, S] padding mask, 2 a mask of the scores'
    shape (the only form for a mask that is not 2-d or scores that are not 4-d)."""
    if mask.dim() != 2 or scores.dim() != 4:
        mask_type = 2
    if mask_type == 2:
        _check(tuple(scores.shape) == tuple(mask.shape), "For mask_type == 2 mask shape should match input shape")
    elif mask_type == 1:
        _check(
            scores.shape[0] == mask.shape[0] and scores.shape[2] == mask.shape[1],
            "For mask_type == 1 mask shape should be (B, L)",
        )
        mask = mask.reshape(mask.shape[0], 1, 1, mask.shape[1])
    elif mask_type == 0:
        _check(
            scores.shape[2] == mask.shape[0] and scores.shape[2] == mask.shape[1],
            "For mask_type == 0 mask shape should be (L, L)",
        )
        mask = mask.reshape(1, 1, *mask.shape)
    else:
        raise RuntimeError(f"_masked_softmax: mask_type must be 0, 1 or 2, got {mask_type}")
    return scores.masked_fill(mask, -math.inf).softmax(-1)


def _native_multi_head_attention(
    query,
    key,
    value,
    embed_dim,
    num_head,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    mask=None,
    need_weights=True,
    average_attn_weights=True,
    mask_type=None,
):
    _check(mask is None or not query.is_nested, "NestedTensor with mask is not supported yet")
    if query.is_nested or key.is_nested or value.is_nested:
        raise NotImplementedError("_native_multi_head_attention: nested tensors are not implemented for 'pjrt'")
    d = embed_dim
    _check(query.dim() == 3, f"expected 3-D `query`, got {query.dim()}-D tensor")
    _check(query.shape[2] == d, f"passed-in embed_dim {d} didn't match last dim of query {query.shape[2]}")
    _check(key.dim() == 3, f"expected 3-D `key`, got {key.dim()}-D tensor")
    _check(value.dim() == 3, f"expected 3-D `value`, got {value.dim()}-D tensor")
    _check(query.shape == key.shape and key.shape == value.shape, "expected `query`/`key`/`value` shapes to match")
    _check(qkv_weight.dim() == 2, f"expected 2-D `qkv_weight`, got {qkv_weight.dim()}-D tensor")
    _check(d * 3 == qkv_weight.shape[0], "expected `qkv_weight` first dim to be 3x embed_dim")
    _check(d == qkv_weight.shape[1], "expected `qkv_weight` second dim to be embed_Dim")
    _check(qkv_bias.dim() == 1, f"expected 1-D `qkv_bias`, got {qkv_bias.dim()}-D tensor")
    _check(qkv_bias.shape[0] == 3 * d, "expected `qkv_bias` first dim and first dim of query to be equal")
    _check(d % num_head == 0, "`embed_dim` must divide evenly by `num_heads`")

    if query.numel() == 0:
        return torch.empty_like(query), None
    # The projections without bias, one product where the inputs are one tensor (as the CPU).
    if query is key and key is value:
        q, k, v = torch.matmul(query, qkv_weight.t()).chunk(3, -1)
    elif key is value:
        q = torch.matmul(query, qkv_weight[:d].t())
        k, v = torch.matmul(key, qkv_weight[d:].t()).chunk(2, -1)
    else:
        wq, wk, wv = qkv_weight.chunk(3, 0)
        q, k, v = torch.matmul(query, wq.t()), torch.matmul(key, wk.t()), torch.matmul(value, wv.t())

    batch, steps = query.shape[:2]
    per_head = d // num_head
    bq, bk, bv = qkv_bias.chunk(3)

    def heads(x):  # [B, T, D] -> [B, H, T, D / H]
        return x.reshape(batch, steps, num_head, per_head).transpose(1, 2)

    # The CPU scales the query by 1/sqrt(head dim) rounded to the input's dtype.
    scale = torch.tensor(1.0 / math.sqrt(per_head), dtype=query.dtype).item()
    q = heads((q + bq) * scale)
    k = heads(k + bk)
    v = heads(v + bv)
    scores = torch.matmul(q, k.transpose(2, 3))
    if mask is None:
        weights = scores.softmax(-1)
    else:
        # The CPU reads any mask as a boolean one (True: masked), a float mask included.
        weights = _masked_softmax_last(scores, mask if mask.dtype == torch.bool else mask.to(torch.bool), mask_type)
    context = torch.matmul(weights, v).transpose(1, 2).reshape(batch, steps, d)
    out = torch.nn.functional.linear(context, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    if average_attn_weights:
        weights = weights.sum(1) / num_head
    return out, weights


def _transformer_encoder_layer_fwd(
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    eps,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
):
    if src.numel() == 0:
        return src.clone()
    layer_norm = torch.nn.functional.layer_norm
    linear = torch.nn.functional.linear
    x = src
    if norm_first:
        x = layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)
    x = _native_multi_head_attention(
        x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, False, True, mask_type
    )[0]
    x = x + src
    if not norm_first:
        x = layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)
    residual = x
    if norm_first:
        x = layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)
    _check(x.dim() == 3, "batched input size should be 3")
    _check(ffn_weight_1.dim() == 2 and ffn_weight_2.dim() == 2, "2d weights expected")
    x = linear(x, ffn_weight_1, ffn_bias_1)
    x = torch.nn.functional.gelu(x) if use_gelu else torch.relu(x)
    x = linear(x, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)
    return x


# --- The nested path of nn.TransformerEncoder ----------------------------------------------


def _nested_meta(nt):
    """The sizes, strides and storage offsets of nested tensor `nt` (CPU tensors), and its buffer."""
    return (
        aten._nested_tensor_size.default.redispatch(_NESTED_META, nt),
        aten._nested_tensor_strides.default.redispatch(_NESTED_META, nt),
        aten._nested_tensor_storage_offsets.default.redispatch(_NESTED_META, nt),
        aten.values.default.redispatch(_NESTED_META, nt),
    )


def _nested_from_buffer(buffer, sizes, strides, offsets):
    """A nested tensor on pjrt viewing `buffer` (1-d), its components given by the CPU tensors
    `sizes`, `strides` ([N, dims]) and `offsets` ([N])."""
    return aten._nested_view_from_buffer.default.redispatch(_DENSE_CPU, buffer, sizes, strides, offsets)


def _packed(padded, lengths):
    """The nested tensor of the sequences `padded[b, :lengths[b]]` ([N, L, D]) with the padded
    rows as its buffer: component b starts at b * L * D. The rows past each length must be 0."""
    n, steps, d = padded.shape
    sizes = torch.tensor([[length, d] for length in lengths], dtype=torch.long).reshape(n, 2)
    strides = torch.tensor([[d, 1]] * n, dtype=torch.long).reshape(n, 2)
    offsets = torch.arange(n, dtype=torch.long) * (steps * d)
    return _nested_from_buffer(padded.contiguous().reshape(-1), sizes, strides, offsets)


def _lengths_mask(lengths, steps, device):
    """[N, steps] bool: True at each sequence's first `lengths[b]` positions."""
    lengths = torch.tensor(lengths, dtype=torch.long).to(device)
    return torch.arange(steps, device=device).unsqueeze(0) < lengths.unsqueeze(1)


def _as_padded(nt):
    """Nested tensor `nt` of 2-d components [l_b, D] as (padded [N, L, D], lengths), with L the
    padded length of its buffer when it has the layout `_packed` makes (its rows past a length
    are 0), else the longest length (rows past a length are then 0 too)."""
    sizes, strides, offsets, buffer = _nested_meta(nt)
    if sizes.dim() != 2 or sizes.shape[1] != 2:
        raise NotImplementedError(
            f"nested tensors of {sizes.shape[1] if sizes.dim() == 2 else 0}-d components are not implemented "
            "for 'pjrt' in the transformer fast path"
        )
    n = sizes.shape[0]
    lengths = sizes[:, 0].tolist()
    widths = set(sizes[:, 1].tolist())
    if len(widths) > 1:
        raise RuntimeError("the transformer fast path needs nested components of one width")
    d = widths.pop() if widths else 0
    if n and buffer.numel() % n == 0 and d:
        steps = buffer.numel() // n // d
        if (
            buffer.numel() == n * steps * d
            and strides.tolist() == [[d, 1]] * n
            and offsets.tolist() == [b * steps * d for b in range(n)]
            and steps >= max(lengths)
        ):
            return buffer.reshape(n, steps, d), lengths
    steps = max(lengths, default=0)
    return _read_components(buffer, sizes, strides, offsets, 0.0, [n, steps, d]), lengths


def _read_components(buffer, sizes, strides, offsets, padding, shape):
    """The components of a nested tensor, each padded with `padding` to `shape[1:]` and stacked."""
    rows = []
    for size, stride, offset in zip(sizes.tolist(), strides.tolist(), offsets.tolist()):
        component = buffer.as_strided(size, stride, offset)
        pad = []
        for have, want in zip(reversed(size), reversed(shape[1:])):
            pad += [0, want - have]
        rows.append(torch.nn.functional.pad(component, pad, value=padding))
    if not rows:
        return buffer.new_empty(shape)
    return torch.stack(rows)


def _nested_tensor_from_mask(t, mask, mask_check=True):
    _check(mask.dtype == torch.bool, f"Expected mask to be of ScalarType Bool, but got {_scalar_type(mask)} instead.")
    _check(mask.dim() == 2, "Padding mask should be 2D")
    _check(t.dim() == 3, "Input should be a 3D tensor, N * L * D")
    _check(tuple(t.shape[:2]) == tuple(mask.shape), "Mask size should match input size")
    n, steps, _ = t.shape
    # Each sequence is as long as its mask has True entries, and takes the input's first rows (as
    # the CPU's `_nested_from_padded`); the mask check asks that those be the True entries.
    counts = mask.sum(1)
    if mask_check:
        first_false = torch.cat([mask, mask.new_zeros(n, 1)], 1).to(torch.int).argmin(1)
        _check(bool((counts == first_false).all()), "Mask must be left-aligned without gaps")
    lengths = counts.tolist()
    valid = _lengths_mask(lengths, steps, t.device)
    return _packed(torch.where(valid.unsqueeze(2), t, 0), lengths)


def _nested_transformer_encoder_layer_fwd(src, *args):
    # The rows of a nested sequence are its padded rows before its length: the layer runs on the
    # padded rows with the rest masked as keys, and the rows past each length are zeroed (the CPU
    # has none to compute: a query row masked in full is NaN in the masked softmax).
    mask, mask_type = args[17:19] if len(args) > 17 else (None, None)
    _check(mask is None, "NestedTensor with mask is not supported yet")
    padded, lengths = _as_padded(src)
    if padded.numel() == 0:
        return _packed(padded, lengths)
    valid = _lengths_mask(lengths, padded.shape[1], padded.device)
    out = _transformer_encoder_layer_fwd(padded, *args[:17], ~valid, 1)
    return _packed(torch.where(valid.unsqueeze(2), out, 0), lengths)


def _to_padded_tensor(self, padding, output_size=None):
    sizes, strides, offsets, buffer = _nested_meta(self)
    n = sizes.shape[0]
    dims = sizes.shape[1] if sizes.dim() == 2 else 0
    longest = sizes.amax(0).tolist() if n else [0] * dims
    padded = _read_components(buffer, sizes, strides, offsets, padding, [n, *longest])
    if output_size is not None:
        output_size = list(output_size)
        _check(
            len(output_size) == padded.dim(),
            "Length of output_size does not match NestedTensor dims. Broadcasting is not supported.",
        )
        pad = []
        for have, want in zip(reversed(padded.shape), reversed(output_size)):
            pad += [0, want - have]
        padded = torch.nn.functional.pad(padded, pad, value=padding)
    return padded


def register() -> None:
    """Registers the kernels (once): the dense ones at `PrivateUse1` (no gradient, as the CPU's:
    autograd has no formula for these ops), the nested ones at `NestedTensorPrivateUse1`."""
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_native_multi_head_attention", _native_multi_head_attention, "PrivateUse1")
    lib.impl("_transformer_encoder_layer_fwd", _transformer_encoder_layer_fwd, "PrivateUse1")
    lib.impl("_nested_tensor_from_mask", _nested_tensor_from_mask, "PrivateUse1")
    lib.impl("_transformer_encoder_layer_fwd", _nested_transformer_encoder_layer_fwd, "NestedTensorPrivateUse1")
    lib.impl("to_padded_tensor", _to_padded_tensor, "NestedTensorPrivateUse1")
    _lib = lib
