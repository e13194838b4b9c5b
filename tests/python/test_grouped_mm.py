"""Grouped matrix products (`torch.nn.functional.grouped_mm`), as a mixture of experts runs its
experts: every layout PyTorch has, values and gradients against the CPU, and a program that
depends on the shapes only, so a new routing of tokens to experts compiles nothing."""

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt

from conftest import seeded

GROUPS = 3
ENDS = torch.tensor([4, 8, 12], dtype=torch.int32)


def layouts():
    gen = seeded(0)
    return {
        # Rows of the first operand in groups, one matrix per group.
        "2d-3d": (torch.randn(16, 8, generator=gen), torch.randn(GROUPS, 8, 4, generator=gen)),
        # The contracted dimension in groups: one result per group (a weight's gradient).
        "2d-2d": (torch.randn(16, 8, generator=gen).t(), torch.randn(16, 4, generator=gen)),
        # Columns of the second operand in groups.
        "3d-2d": (torch.randn(GROUPS, 8, 4, generator=gen), torch.randn(16, 4, generator=gen).t()),
        "3d-3d": (torch.randn(GROUPS, 4, 8, generator=gen), torch.randn(GROUPS, 8, 4, generator=gen)),
    }


def true_part(name, t):
    """Rows (or columns) past the last group's end are left unwritten by the CPU's kernel."""
    if name == "2d-3d":
        return t[:12]
    if name == "3d-2d":
        return t[:, :12]
    return t


@pytest.mark.parametrize("name", ["2d-3d", "2d-2d", "3d-2d", "3d-3d"])
def test_each_layout_matches_the_cpu(mode, name):
    a, b = layouts()[name]
    ends = None if name == "3d-3d" else ENDS
    expected = torch._grouped_mm(a, b, ends)
    got = torch._grouped_mm(a.to("pjrt"), b.to("pjrt"), None if ends is None else ends.to("pjrt"))
    assert got.shape == expected.shape
    torch.testing.assert_close(true_part(name, got.cpu()), true_part(name, expected))
    if name == "2d-3d":
        assert torch.equal(got.cpu()[12:], torch.zeros(4, 4)), "rows in no group are zero"


def test_gradients_match_the_cpu(mode):
    a, b = layouts()["2d-3d"]
    ends = torch.tensor([5, 9, 16], dtype=torch.int32)
    weight = torch.randn(16, 4, generator=seeded(1))
    a_cpu, b_cpu = a.clone().requires_grad_(), b.clone().requires_grad_()
    (F.grouped_mm(a_cpu, b_cpu, offs=ends) * weight).sum().backward()
    a_dev, b_dev = a.to("pjrt").requires_grad_(), b.to("pjrt").requires_grad_()
    (F.grouped_mm(a_dev, b_dev, offs=ends.to("pjrt")) * weight.to("pjrt")).sum().backward()
    torch.testing.assert_close(a_dev.grad.cpu(), a_cpu.grad)
    torch.testing.assert_close(b_dev.grad.cpu(), b_cpu.grad)


def test_a_group_infinity_stays_in_its_rows(pjrt):
    a, b = layouts()["2d-3d"]
    b = b.clone()
    b[2, 0, 0] = float("inf")  # only the last group's rows may see it
    got = torch._grouped_mm(a.to(pjrt), b.to(pjrt), ENDS.to(pjrt)).cpu()
    expected = torch._grouped_mm(a, b, ENDS)
    torch.testing.assert_close(got[:12], expected[:12])
    assert got[:8].isfinite().all()


def test_a_new_routing_compiles_nothing(mode):
    a, b = layouts()["2d-3d"]
    on_pjrt = b.to("pjrt")
    compiled = []
    for step in range(6):
        cuts = sorted(torch.randint(0, 17, (2,), generator=seeded(step)).tolist())
        ends = torch.tensor(cuts + [16], dtype=torch.int32)
        got = F.grouped_mm(a.to("pjrt"), on_pjrt, offs=ends.to("pjrt")).cpu()
        torch.testing.assert_close(got, F.grouped_mm(a, b, offs=ends))
        compiled.append(torch_pjrt.metrics()["compilations"])
    assert compiled[-1] == compiled[1], compiled


def test_bias_and_a_wider_result_dtype(pjrt):
    a, b = layouts()["2d-3d"]
    bias = torch.randn(GROUPS, 4, generator=seeded(2))
    got = torch._grouped_mm(a.to(pjrt), b.to(pjrt), ENDS.to(pjrt), bias.to(pjrt)).cpu()
    rows = torch.arange(16)
    group = (ENDS[:, None] <= rows[None]).sum(0)
    for g in range(GROUPS):
        picked = rows[group == g]
        torch.testing.assert_close(got[picked], a[picked] @ b[g] + bias[g])
    half = torch._grouped_mm(
        a.bfloat16().to(pjrt), b.bfloat16().to(pjrt), ENDS.to(pjrt), out_dtype=torch.float32
    )
    assert half.dtype == torch.float32
    expected = torch._grouped_mm(a.bfloat16().float(), b.bfloat16().float(), ENDS)
    torch.testing.assert_close(half.cpu()[:12], expected[:12])
    with pytest.raises(RuntimeError, match="bias is supported on pjrt for 2-d by 3-d"):
        a2, b2 = layouts()["2d-2d"]
        torch._grouped_mm(a2.to(pjrt), b2.to(pjrt), ENDS.to(pjrt), torch.zeros(GROUPS, 4, device=pjrt))


def test_a_mixture_of_experts_model_compiles_once(mode):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(
        num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, num_local_experts=4, num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).eval()
    on_pjrt = transformers.MixtralForCausalLM(cfg).eval().to("pjrt")
    on_pjrt.load_state_dict(model.state_dict())
    compiled = []
    with torch.no_grad():
        for step in range(4):
            ids = torch.randint(0, 100, (2, 12), generator=seeded(step))
            got = on_pjrt(ids.to("pjrt")).logits.cpu()
            torch.testing.assert_close(got, model(ids).logits, rtol=1e-4, atol=1e-5)
            compiled.append(torch_pjrt.metrics()["compilations"])
    assert compiled[-1] == compiled[1], compiled
