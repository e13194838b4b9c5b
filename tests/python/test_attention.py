"""`scaled_dot_product_attention` on pjrt runs as the engine's one attention op (PyTorch's
`overrideable` kernel slot) where no gradient is needed, against the CPU in every eager mode: plain, causal (square and not), bool and float masks that broadcast, fully masked
rows, an explicit scale, grouped-query heads, and reduced floats. What it does not take (gradients, dropout, inputs other
than 4-d, `sdpa_kernel` without `OVERRIDEABLE`) runs PyTorch's math composition. The op's own
backward, which a direct call of the op reaches, is checked against the CPU's gradients too."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_pjrt
from conftest import assert_close, seeded


def rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=seeded(seed)).to(dtype)


Q = rand(2, 4, 3, 8, seed=1)
K = rand(2, 4, 5, 8, seed=2)
V = rand(2, 4, 5, 6, seed=3)
K_GROUPED = rand(2, 2, 5, 8, seed=4)
V_GROUPED = rand(2, 2, 5, 6, seed=5)
BOOL_MASK = torch.rand(3, 5, generator=seeded(6)) > 0.4
BOOL_MASK[:, 0] = True
ROW_MASKED = BOOL_MASK.clone()
ROW_MASKED[1] = False
FLOAT_MASK = rand(2, 1, 3, 5, seed=7)

CASES = {
    "plain": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v), (Q, K, V, None)),
    "causal_rectangular": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (Q, K, V, None),
    ),
    "causal_square": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (Q, K[:, :, :3], V[:, :, :3], None),
    ),
    "bool_mask": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        (Q, K, V, BOOL_MASK),
    ),
    "fully_masked_row": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        (Q, K, V, ROW_MASKED),
    ),
    "float_mask_broadcast": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        (Q, K, V, FLOAT_MASK),
    ),
    "scale": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, scale=0.3), (Q, K, V, None)),
    "grouped_heads": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        (Q, K_GROUPED, V_GROUPED, None),
    ),
    # Inputs as HF models lay them out: heads transposed out of `[batch, length, heads, dim]`.
    "transposed_heads": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (Q.transpose(1, 2).contiguous().transpose(1, 2), K.transpose(1, 2).contiguous().transpose(1, 2),
         V.transpose(1, 2).contiguous().transpose(1, 2), None),
    ),
}


def run(fn, args, device):
    moved = [None if a is None else a.to(device) for a in args]
    with torch.no_grad():
        return fn(*moved)


def ops_of(fn, args):
    """Engine ops captured or run by one call (the inputs already on the device)."""
    moved = [None if a is None else a.to("pjrt") for a in args]
    torch_pjrt.sync()
    before = torch_pjrt.metrics()["ops"]
    with torch.no_grad():
        out = fn(*moved)
    count = torch_pjrt.metrics()["ops"] - before
    out.cpu()
    return count


@pytest.mark.parametrize("name", list(CASES))
def test_attention_matches_the_cpu_as_one_op(mode, name):
    fn, args = CASES[name]
    expected = run(fn, args, "cpu")
    assert_close(run(fn, args, "pjrt"), expected, rtol=1e-5, atol=1e-5)
    # One engine op; PyTorch turns a bool mask into an additive one first (`zeros_like`,
    # `logical_not`, `masked_fill_`), before it asks for a kernel.
    mask = args[3]
    # A query laid out otherwise than contiguous gets its output in its layout: one copy.
    relaid = 0 if args[0].is_contiguous() else 1
    assert ops_of(fn, args) == (3 if mask is not None and mask.dtype == torch.bool else 0) + 1 + relaid


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_attention_in_other_float_dtypes(strict_or_fused_mode, dtype):
    fn, args = CASES["bool_mask"]
    args = [a.to(dtype) if a is not None and a.is_floating_point() else a for a in args]
    expected = run(fn, args, "cpu")
    tol = {torch.float64: 1e-10}.get(dtype, 1e-2)
    assert_close(run(fn, args, "pjrt"), expected, rtol=tol, atol=tol)


def overrideable(q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False):
    """The engine's attention op called directly (its gradients are its backward op's)."""
    if enable_gqa and q.device.type == "cpu":
        return F.scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal, scale=scale, enable_gqa=True)
    if q.device.type == "cpu":
        return F.scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal, scale=scale)
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
    return torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        q, k, v, mask, is_causal=is_causal, scale=scale
    )[0]


DIRECT = {
    "plain": (lambda q, k, v, m: overrideable(q, k, v), (Q, K, V, None)),
    "causal_rectangular": (lambda q, k, v, m: overrideable(q, k, v, is_causal=True), (Q, K, V, None)),
    "fully_masked_row": (lambda q, k, v, m: overrideable(q, k, v, m), (Q, K, V, ROW_MASKED)),
    "float_mask_broadcast": (lambda q, k, v, m: overrideable(q, k, v, m), (Q, K, V, FLOAT_MASK)),
    "scale": (lambda q, k, v, m: overrideable(q, k, v, scale=0.3), (Q, K, V, None)),
    "grouped_heads": (
        lambda q, k, v, m: overrideable(q, k, v, is_causal=True, enable_gqa=True),
        (Q, K_GROUPED, V_GROUPED, None),
    ),
    "transposed_heads": (lambda q, k, v, m: overrideable(q, k, v, is_causal=True), CASES["transposed_heads"][1]),
}


def grads(fn, args, device, with_mask_grad=False):
    """`fn`'s output and the gradients of query, key, value (and a float mask) for a fixed
    cotangent."""
    leaves = [None if a is None else a.detach().clone().to(device) for a in args]
    for i, t in enumerate(leaves):
        if t is not None and (i < 3 or with_mask_grad):
            t.requires_grad_()
    out = fn(*leaves)
    cotangent = torch.randn(out.shape, generator=seeded(11)).to(device)
    out.backward(cotangent)
    wanted = leaves[:4] if with_mask_grad else leaves[:3]
    return [out] + [t.grad for t in wanted]


def grads_match_the_cpu(fn, args):
    """Checks `grads` on pjrt against the CPU; returns how many ops pjrt ran for them."""
    expected = grads(fn, args, "cpu")
    torch_pjrt.sync()
    before = torch_pjrt.metrics()["ops"]
    got = grads(fn, args, "pjrt")
    for g, w in zip(got, expected):
        assert_close(g, w, rtol=1e-5, atol=1e-5)
    return torch_pjrt.metrics()["ops"] - before


@pytest.mark.parametrize("name", list(CASES))
def test_attention_with_gradients_takes_the_composition(strict_or_fused_mode, name):
    ops = grads_match_the_cpu(*CASES[name])
    # The composition saves its softmax for the backward, which the op would compute again.
    assert ops > 6


@pytest.mark.parametrize("name", list(DIRECT))
def test_the_ops_own_backward_matches_the_cpu(strict_or_fused_mode, name):
    fn, args = DIRECT[name]
    ops = grads_match_the_cpu(fn, args)
    # Forward and backward: one op each (grouped key heads are summed inside the backward op),
    # and the bool mask's conversion. (A transposed query's output is laid out by a copy whose
    # gradient adds its own ops.)
    if args[0].is_contiguous():
        mask = args[3]
        conversion = 3 if mask is not None and mask.dtype == torch.bool else 0
        assert ops == 2 + conversion


def test_a_float_masks_gradient(strict_or_fused_mode):
    fn, args = DIRECT["float_mask_broadcast"]
    expected = grads(fn, args, "cpu", with_mask_grad=True)
    got = grads(fn, args, "pjrt", with_mask_grad=True)
    for g, w in zip(got, expected):
        assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_what_the_op_does_not_take_runs_the_math_composition(strict_or_fused_mode):
    fn, args = CASES["bool_mask"]
    # Left out of `sdpa_kernel`'s backends: PyTorch's math composition, many ops, and with it
    # a gradient of the gradient.
    with sdpa_kernel([SDPBackend.MATH]):
        assert ops_of(fn, args) > 3
        assert_close(run(fn, args, "pjrt"), run(fn, args, "cpu"), rtol=1e-5, atol=1e-5)
        q = Q.to("pjrt").requires_grad_()
        out = F.scaled_dot_product_attention(q, K.to("pjrt"), V.to("pjrt"))
        (g,) = torch.autograd.grad(out.sum(), q, create_graph=True)
        g.sum().backward()
        assert q.grad is not None
    # With dropout: the composition's own random draws, so only the shape is compared.
    q, k, v = (t.to("pjrt") for t in (Q, K, V))
    assert F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).shape == (*Q.shape[:-1], V.shape[-1])


def test_a_gradient_of_the_gradient_names_the_backward_op(strict_or_fused_mode):
    q = Q.to("pjrt").requires_grad_()
    out = overrideable(q, K.to("pjrt"), V.to("pjrt"))
    (g,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="_scaled_dot_product_fused_attention_overrideable_backward"):
        g.sum().backward()


def test_heads_that_differ_without_gqa_raise_pytorchs_error(strict_or_fused_mode):
    q, k, v = (t.to("pjrt") for t in (Q, K_GROUPED, V_GROUPED))
    with pytest.raises(RuntimeError) as on_pjrt:
        F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(RuntimeError) as on_cpu:
        F.scaled_dot_product_attention(Q, K_GROUPED, V_GROUPED)
    assert str(on_pjrt.value).splitlines()[0] == str(on_cpu.value).splitlines()[0]
    # The engine stays usable.
    assert_close(run(*CASES["plain"], "pjrt"), run(*CASES["plain"], "cpu"), rtol=1e-5, atol=1e-5)


def test_a_direct_call_with_dropout_says_what_to_do(pjrt):
    q, k, v = (t.to("pjrt") for t in (Q, K, V))
    with pytest.raises(RuntimeError, match="takes no dropout.*math composition"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, k, v, None, 0.5)


def test_a_growing_cache_reads_padded_keys_without_a_program_per_length():
    """Decoding against a key/value cache that grows by one position per step: the attention
    reads the cache at its bucket's size, so 40 lengths make a few programs, not 40."""
    torch.manual_seed(0)
    q_steps = torch.randn(40, 1, 2, 1, 8)
    k_new = torch.randn(40, 1, 2, 1, 8)
    v_new = torch.randn(40, 1, 2, 1, 8)

    def decode(device):
        k = torch.randn(1, 2, 4, 8, generator=seeded(9)).to(device)
        v = torch.randn(1, 2, 4, 8, generator=seeded(10)).to(device)
        outs = []
        with torch.no_grad():
            for i in range(40):
                k = torch.cat([k, k_new[i].to(device)], dim=2)
                v = torch.cat([v, v_new[i].to(device)], dim=2)
                outs.append(F.scaled_dot_product_attention(q_steps[i].to(device), k, v).cpu())
        return torch.stack(outs)

    expected = decode("cpu")
    with torch_pjrt.eager_mode("defer_and_fuse"):
        before = torch_pjrt.metrics()
        got = decode("pjrt")
        after = torch_pjrt.metrics()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert after["padded_ops"] > before["padded_ops"]
    assert after["compilations"] - before["compilations"] <= 12, after["compilations"] - before["compilations"]
