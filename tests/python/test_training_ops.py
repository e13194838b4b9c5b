"""What a training step needs, on pjrt against the CPU, in every eager mode: losses and their
input gradients, scaled_dot_product_attention with its q/k/v gradients, activation gradients,
the optimizers (foreach, for-loop and fused), GradScaler, clip_grad_norm_, and a learning-rate
schedule that never recompiles. Nothing may fall back to the CPU."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt
from conftest import check_against_cpu as check, in_mode_without_fallbacks, seeded

TOL = {"rtol": 1e-5, "atol": 1e-5}


# ---- losses ----------------------------------------------------------------------------------

N, C = 6, 5
LOGITS = torch.randn(N, C, generator=seeded(0))
TARGET = torch.randint(0, C, (N,), generator=seeded(1))
IGNORED = TARGET.clone().index_fill_(0, torch.tensor([1, 4]), -100)
CLASS_WEIGHT = torch.rand(C, generator=seeded(2)) + 0.5
PROBS = torch.softmax(torch.randn(N, C, generator=seeded(3)), 1)
SPATIAL = torch.randn(2, C, 3, 4, generator=seeded(4))
SPATIAL_TARGET = torch.randint(0, C, (2, 3, 4), generator=seeded(5)).index_put_(
    (torch.tensor([0]), torch.tensor([1]), torch.tensor([2])), torch.tensor(-100)
)
REAL = torch.randn(N, C, generator=seeded(6))
UNIT = torch.rand(N, C, generator=seeded(8))

LOSSES = {
    "ce": (F.cross_entropy, (LOGITS, TARGET)),
    "ce_sum": (lambda x, t: F.cross_entropy(x, t, reduction="sum"), (LOGITS, TARGET)),
    "ce_none": (lambda x, t: F.cross_entropy(x, t, reduction="none"), (LOGITS, TARGET)),
    "ce_label_smoothing": (lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), (LOGITS, TARGET)),
    "ce_ignore_index": (F.cross_entropy, (LOGITS, IGNORED)),
    "ce_ignore_index_2": (lambda x, t: F.cross_entropy(x, t, ignore_index=2), (LOGITS, TARGET)),
    "ce_weight": (lambda x, t, w: F.cross_entropy(x, t, weight=w), (LOGITS, IGNORED, CLASS_WEIGHT)),
    "ce_weight_label_smoothing": (
        lambda x, t, w: F.cross_entropy(x, t, weight=w, label_smoothing=0.2),
        (LOGITS, IGNORED, CLASS_WEIGHT),
    ),
    "ce_ignore_label_smoothing_sum": (
        lambda x, t: F.cross_entropy(x, t, label_smoothing=0.3, reduction="sum"),
        (LOGITS, IGNORED),
    ),
    "ce_probabilities": (F.cross_entropy, (LOGITS, PROBS)),
    "ce_probabilities_label_smoothing": (
        lambda x, p, w: F.cross_entropy(x, p, weight=w, label_smoothing=0.1),
        (LOGITS, PROBS, CLASS_WEIGHT),
    ),
    "ce_spatial": (F.cross_entropy, (SPATIAL, SPATIAL_TARGET)),
    "ce_spatial_weight_none": (
        lambda x, t, w: F.cross_entropy(x, t, weight=w, reduction="none"),
        (SPATIAL, SPATIAL_TARGET, CLASS_WEIGHT),
    ),
    "nll": (lambda x, t: F.nll_loss(x.log_softmax(1), t), (LOGITS, IGNORED)),
    "nll_3d": (lambda x, t: F.nll_loss(x.log_softmax(1), t), (SPATIAL[:, :, 0], SPATIAL_TARGET[:, 0])),
    "nll_4d_weight_sum": (
        lambda x, t, w: F.nll_loss(x.log_softmax(1), t, weight=w, reduction="sum"),
        (SPATIAL, SPATIAL_TARGET, CLASS_WEIGHT),
    ),
    "mse": (F.mse_loss, (LOGITS, REAL)),
    "mse_sum": (lambda x, y: F.mse_loss(x, y, reduction="sum"), (LOGITS, REAL)),
    "mse_none": (lambda x, y: F.mse_loss(x, y, reduction="none"), (LOGITS, REAL)),
    "bce_logits": (F.binary_cross_entropy_with_logits, (LOGITS, UNIT)),
    "bce_logits_pos_weight": (
        lambda x, y, w: F.binary_cross_entropy_with_logits(x, y, pos_weight=w),
        (LOGITS, UNIT, CLASS_WEIGHT),
    ),
    "bce_logits_weights_sum": (
        lambda x, y, w: F.binary_cross_entropy_with_logits(x, y, weight=y, pos_weight=w, reduction="sum"),
        (LOGITS, UNIT, CLASS_WEIGHT),
    ),
    "bce": (lambda x, y: F.binary_cross_entropy(torch.sigmoid(x), y), (LOGITS, UNIT)),
    "bce_weight_none": (
        lambda x, y, w: F.binary_cross_entropy(torch.sigmoid(x), y, weight=w, reduction="none"),
        (LOGITS, UNIT, CLASS_WEIGHT),
    ),
    "smooth_l1": (lambda x, y: F.smooth_l1_loss(x, y, beta=0.5), (LOGITS, REAL)),
    "smooth_l1_beta0_sum": (lambda x, y: F.smooth_l1_loss(x, y, beta=0.0, reduction="sum"), (LOGITS, REAL)),
    "huber": (lambda x, y: F.huber_loss(x, y, delta=0.7), (LOGITS, REAL)),
    "huber_none": (lambda x, y: F.huber_loss(x, y, reduction="none"), (LOGITS, REAL)),
    "l1": (F.l1_loss, (LOGITS, REAL)),
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_loss(mode, name):
    fn, inputs = LOSSES[name]
    check(fn, inputs)


def test_nll_losses_with_every_target_ignored_have_zero_gradients(mode):
    # A mean over no target is 0 / 0 (NaN), as on the CPU; the gradient is zeros there, not the
    # NaN of 0 * (1 / 0).
    ignored = torch.full((N,), -100)
    spatial_ignored = torch.full((2, 3, 4), 3)
    cases = [
        (F.cross_entropy, (LOGITS, ignored)),
        (lambda x, t, w: F.cross_entropy(x, t, weight=w), (LOGITS, ignored, CLASS_WEIGHT)),
        (lambda x, t: F.nll_loss(x.log_softmax(1), t, ignore_index=3), (SPATIAL, spatial_ignored)),
        (lambda x, t: F.cross_entropy(x, t, reduction="sum"), (LOGITS, ignored)),
    ]
    for fn, inputs in cases:
        check(fn, inputs, equal_nan=True)


def test_loss_target_gradients(mode):
    # Soft targets and regression targets get gradients too.
    check(F.cross_entropy, (LOGITS, PROBS), grads_of=(0, 1))
    check(F.mse_loss, (LOGITS, REAL), grads_of=(0, 1))
    check(F.binary_cross_entropy_with_logits, (LOGITS, UNIT), grads_of=(0, 1))


# ---- activations -----------------------------------------------------------------------------

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "logsigmoid": F.logsigmoid,
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_gradient(mode, name):
    x = torch.randn(4, 7, generator=seeded(9)) * 3
    check(ACTIVATIONS[name], (x,))


# ---- attention -------------------------------------------------------------------------------

Q = torch.randn(2, 2, 4, 8, generator=seeded(10))
K = torch.randn(2, 2, 6, 8, generator=seeded(11))
V = torch.randn(2, 2, 6, 8, generator=seeded(12))
BOOL_MASK = torch.rand(4, 6, generator=seeded(13)) > 0.3
BOOL_MASK[:, 0] = True
FLOAT_MASK = torch.randn(2, 1, 4, 6, generator=seeded(14))
ROW_MASKED = BOOL_MASK.clone()
ROW_MASKED[2] = False

ATTENTION = {
    "plain": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    "causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "bool_mask": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=BOOL_MASK.to(q.device)),
    "float_mask": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=FLOAT_MASK.to(q.device)),
    "scale": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3),
    "masked_row": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=ROW_MASKED.to(q.device)),
}


@pytest.mark.parametrize("name", list(ATTENTION))
def test_scaled_dot_product_attention(mode, name):
    check(ATTENTION[name], (Q, K, V), grads_of=(0, 1, 2))


def test_attention_layer_trains(mode):
    # nn.MultiheadAttention reaches the same decomposition through its own projections.
    torch.manual_seed(0)
    layer = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8, generator=seeded(15))

    def loss(module, inp):
        out, _ = module(inp, inp, inp, need_weights=False)
        return out.pow(2).mean()

    ref = loss(layer, x)
    ref.backward()
    dev_layer = nn.MultiheadAttention(8, 2, batch_first=True)
    dev_layer.load_state_dict(layer.state_dict())
    dev_layer.to("pjrt")
    got = loss(dev_layer, x.to("pjrt"))
    got.backward()
    torch.testing.assert_close(got.detach().cpu(), ref.detach(), **TOL)
    for p, q in zip(dev_layer.parameters(), layer.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL)


# ---- optimizers ------------------------------------------------------------------------------

def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _train(device, make_opt, steps, schedule=None):
    model = _mlp().to(device)
    opt = make_opt(model.parameters())
    sched = schedule(opt) if schedule else None
    g = seeded(20)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=g).to(device)
        y = torch.randn(8, 3, generator=g).to(device)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        if sched:
            sched.step()
        if device != "cpu":
            # A step per region, as a loop reading its loss gets: from the third step on, every
            # region is the same one.
            torch_pjrt.sync()
    return [p.detach().cpu() for p in model.parameters()]


OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.1}),
    "sgd_nesterov_wd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    "sgd_dampening_maximize": (
        torch.optim.SGD,
        {"lr": 0.05, "momentum": 0.8, "dampening": 0.2, "weight_decay": 0.02, "maximize": True},
    ),
    "adam_wd": (torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.01}),
    "adam_amsgrad": (torch.optim.Adam, {"lr": 0.01, "amsgrad": True}),
    "adamw_wd": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    "adamw_amsgrad": (torch.optim.AdamW, {"lr": 0.01, "amsgrad": True, "betas": (0.8, 0.99)}),
}


@pytest.mark.parametrize("impl", ["foreach", "for_loop", "fused"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_matches_cpu(mode, name, impl):
    cls, kw = OPTIMIZERS[name]
    flags = {"foreach": {"foreach": True}, "for_loop": {"foreach": False}, "fused": {"fused": True}}[impl]
    expected = _train("cpu", lambda p: cls(p, **kw, **flags), 5)
    actual = _train("pjrt", lambda p: cls(p, **kw, **flags), 5)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_fused_adam_tensor_lr_and_found_inf(mode):
    params = [torch.randn(3, 4, generator=seeded(30)), torch.randn(5, generator=seeded(31))]
    grads = [torch.randn_like(p) for p in params]

    def run(device, found_inf):
        ps = [p.clone().to(device) for p in params]
        gs = [g.clone().to(device) for g in grads]
        m = [torch.full_like(p, 0.1) for p in ps]
        v = [torch.full_like(p, 0.2) for p in ps]
        vmax = [torch.full_like(p, 0.3) for p in ps]
        steps = [torch.tensor(3.0, device=device) for _ in ps]
        torch._fused_adamw_(
            ps, gs, m, v, vmax, steps, lr=torch.tensor(0.01, device=device), beta1=0.9, beta2=0.99,
            weight_decay=0.1, eps=1e-8, amsgrad=True, maximize=False,
            grad_scale=torch.tensor(4.0, device=device), found_inf=torch.tensor(found_inf, device=device),
        )
        return [t.cpu() for t in ps + gs + m + v + vmax]

    for found_inf in (0.0, 1.0):
        for a, e in zip(run("pjrt", found_inf), run("cpu", found_inf)):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "make_opt",
    [lambda p: torch.optim.AdamW(p, lr=0.01, fused=True), lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)],
    ids=["adamw_fused", "sgd_foreach"],
)
def test_grad_scaler(mode, make_opt):
    # GradScaler unscales, skips the step with an inf gradient, and grows and backs off its scale.
    def run(device):
        model = _mlp().to(device)
        opt = make_opt(model.parameters())
        scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
        g = seeded(60)
        for step in range(5):
            x = torch.randn(8, 6, generator=g)
            if step == 2:
                x[0, 0] = float("inf")
            opt.zero_grad()
            scaler.scale(model(x.to(device)).pow(2).mean()).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach().cpu() for p in model.parameters()], scaler.get_scale()

    params, scale = run("pjrt")
    ref_params, ref_scale = run("cpu")
    assert scale == ref_scale
    for a, e in zip(params, ref_params):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", [{}, {"foreach": False}, {"norm_type": float("inf")}, {"norm_type": 1.0}],
                         ids=["foreach", "for_loop", "inf", "l1"])
def test_clip_grad_norm(mode, kw):
    x = torch.randn(8, 6, generator=seeded(40))

    def grads(device):
        model = _mlp().to(device)
        model(x.to(device)).pow(2).sum().backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, **kw)
        return total.cpu(), [p.grad.cpu() for p in model.parameters()]

    total, clipped = grads("pjrt")
    ref_total, ref_clipped = grads("cpu")
    torch.testing.assert_close(total, ref_total, **TOL)
    for a, e in zip(clipped, ref_clipped):
        torch.testing.assert_close(a, e, **TOL)


SCHEDULES = {
    "step": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5),
    "cosine": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10),
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.Adam(p, lr=0.01),
        lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
    ],
    ids=["sgd", "adam", "adamw_fused"],
)
def test_learning_rate_schedule_never_recompiles(make_opt, schedule):
    sched = SCHEDULES[schedule]
    with torch_pjrt.eager_mode("defer_and_fuse"):
        torch_pjrt.sync()
        torch_pjrt.reset_metrics()
        model = _mlp().to("pjrt")
        opt = make_opt(model.parameters())
        lr_sched = sched(opt)
        g = seeded(50)
        lrs = set()
        for step in range(30):
            if step == 3:
                # The first steps create the optimizer state; from here on every step is alike.
                warm = torch_pjrt.metrics()["compilations"]
            x = torch.randn(8, 6, generator=g).to("pjrt")
            y = torch.randn(8, 3, generator=g).to("pjrt")
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            lr_sched.step()
            lrs.add(opt.param_groups[0]["lr"])
            torch_pjrt.sync()
        m = torch_pjrt.metrics()
    assert len(lrs) > 5
    assert m["compilations"] == warm, f"{m['compilations'] - warm} recompilations under the schedule"
    assert m["fallback_ops"] == {}
