"""Mixed precision and activation checkpointing on pjrt, as scripts moved from "cuda" use them:
`torch.autocast("pjrt", dtype=...)` casts the ops CUDA's autocast casts (products to the autocast
dtype, sensitive ops to float32), trains, and fuses without falling back; and
`torch.utils.checkpoint` restores pjrt's random state for its recomputation, so a checkpointed
dropout gets the forward pass's mask and the gradients are those of the plain run."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import torch_pjrt
from conftest import in_mode_without_fallbacks, seeded


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_casts_products_down_and_sensitive_ops_up(mode, dtype):
    x = torch.randn(4, 8, generator=seeded(0)).to("pjrt")
    w = torch.randn(8, 8, generator=seeded(1)).to("pjrt")
    with torch.autocast("pjrt", dtype=dtype):
        assert torch.is_autocast_enabled("pjrt")
        product = x @ w
        linear = F.linear(x, w)
        soft = torch.softmax(product, dim=-1)
        normed = F.layer_norm(product, (8,))
        logged = torch.log(product.abs() + 1)
        total = product.sum()
    assert product.dtype == dtype and linear.dtype == dtype
    assert soft.dtype == torch.float32
    assert normed.dtype == torch.float32
    assert logged.dtype == torch.float32
    assert total.dtype == torch.float32
    # Outside the region nothing is cast.
    assert (x @ w).dtype == torch.float32
    # The product is the float32 one, rounded to the autocast dtype.
    expected = (x.cpu().to(dtype) @ w.cpu().to(dtype)).float()
    torch.testing.assert_close(product.float().cpu(), expected, rtol=1e-2, atol=1e-2)


def test_autocast_promotes_mixed_inputs(mode):
    a = torch.randn(5, generator=seeded(2)).to("pjrt")
    with torch.autocast("pjrt", dtype=torch.bfloat16):
        out = torch.addcmul(a, a.bfloat16(), a)
    assert out.dtype == torch.float32


def test_binary_cross_entropy_is_refused_under_autocast(mode):
    p = torch.rand(4, generator=seeded(3)).to("pjrt")
    with torch.autocast("pjrt", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(p, p)
        loss = F.binary_cross_entropy_with_logits(p, p)
    assert loss.dtype == torch.float32


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 32),
                                  nn.ReLU(), nn.Linear(32, 5))

    def forward(self, x):
        return self.body(x)


def _train_autocast(device, steps=6):
    torch.manual_seed(0)
    model = Net().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(16, 12, generator=seeded(4)).to(device)
    y = torch.randint(0, 5, (16,), generator=seeded(5)).to(device)
    losses = []
    for _ in range(steps):
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def test_a_model_trains_under_bfloat16_autocast(mode):
    losses, model = _train_autocast("pjrt")
    reference, _ = _train_autocast("cpu")
    # Parameters and their gradients stay float32; the loss follows the CPU's within bfloat16's
    # precision (CPU autocast casts the same products).
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert losses[-1] < losses[0]
    assert losses == pytest.approx(reference, rel=3e-2)


def test_an_autocast_step_is_one_region_in_defer_and_fuse():
    with in_mode_without_fallbacks("defer_and_fuse"):
        _train_autocast("pjrt", steps=3)  # compiles the step
        torch_pjrt.sync()
        torch_pjrt.reset_metrics()
        _train_autocast("pjrt", steps=6)
        torch_pjrt.sync()
        metrics = torch_pjrt.metrics()
    # Each step, casts included, is one region that ends at `loss.item()`; nothing recompiles.
    assert metrics["regions"] == 6, metrics
    assert metrics["compilations"] == 0, metrics
    assert metrics["largest_region"] > 50, metrics


# ---- activation checkpointing ------------------------------------------------------------------

def _checkpointed_grads(block, x0, how):
    x = x0.to("pjrt").requires_grad_()
    torch.manual_seed(123)
    if how == "plain":
        y = block(x)
    else:
        y = checkpoint(block, x, use_reentrant=(how == "reentrant"))
    y.sum().backward()
    params = [p.grad.detach().cpu().clone() for p in block.parameters()]
    block.zero_grad(set_to_none=True)
    return y.detach().cpu(), x.grad.cpu(), params


@pytest.mark.parametrize("how", ["non_reentrant", "reentrant"])
def test_checkpointed_dropout_recomputes_the_forward_mask(mode, how):
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.GELU(), nn.Linear(16, 8)).to("pjrt")
    x0 = torch.randn(6, 8, generator=seeded(6))
    plain = _checkpointed_grads(block, x0, "plain")
    checkpointed = _checkpointed_grads(block, x0, how)
    assert torch.equal(checkpointed[0], plain[0])
    torch.testing.assert_close(checkpointed[1], plain[1], rtol=1e-5, atol=1e-6)
    for a, e in zip(checkpointed[2], plain[2]):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_the_device_module_reports_itself_initialized(pjrt):
    torch.ones(1).to(pjrt)
    assert torch.pjrt._initialized is True
    with pytest.raises(AttributeError):
        torch.pjrt.no_such_attribute


def test_float16_autocast_trains_with_a_grad_scaler(mode):
    torch.manual_seed(0)
    model = Net().to("pjrt")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("pjrt")
    x = torch.randn(16, 12, generator=seeded(7)).to("pjrt")
    y = torch.randint(0, 5, (16,), generator=seeded(8)).to("pjrt")
    losses = []
    for _ in range(5):
        with torch.autocast("pjrt", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert scaler.get_scale() == 65536.0  # no overflow, so no back-off
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    assert losses[-1] < losses[0]
