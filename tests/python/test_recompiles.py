"""Recompiles stay under control in a training loop: over 200 steps with learning-rate schedules,
compilations stop growing after warm-up in DeferAndFuse (the learning rate, momentum and weight
decay are lifted scalars, never constants)."""

import pytest
import torch

import torch_pjrt


def schedules():
    return {
        "step": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.7),
        "cosine": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=200),
    }


@pytest.mark.parametrize("schedule", ["step", "cosine"])
@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adamw"])
def test_compilations_stop_growing_after_warm_up(pjrt, schedule, optimizer):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
    ).to(pjrt)
    if optimizer == "sgd_momentum":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = schedules()[schedule](opt)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(8)]
    data = [(x.to(pjrt), y.to(pjrt)) for x, y in data]
    counts = []
    with torch_pjrt.eager_mode("defer_and_fuse"):
        for step in range(200):
            x, y = data[step % len(data)]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            loss.item()
            m = torch_pjrt.metrics()
            counts.append(m["compilations"])
            if step == 10:
                warm = m
    assert counts[-1] == counts[10], f"compilations grew after warm-up: {counts[10]} -> {counts[-1]}"
    # No step after warm-up compiles a known structure anew. (During warm-up one may: a memory
    # cut's region, such as the optimizer update alone, can have the structure of another
    # model's, with other dimensions; RFC 0023.)
    assert m["recompiles"] == warm["recompiles"], m.get("last_recompile_reason")
    assert m["fallback_ops"] == {}
    # The learning rate really changed: the schedule moved it by more than a factor of two.
    assert sched.get_last_lr()[0] < 0.5 * opt.defaults["lr"]
