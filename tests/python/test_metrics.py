"""Metrics: the contract keys, the compile cache, lifted scalars, the report."""

import torch

import torch_pjrt

CONTRACT_KEYS = (
    "compilations",
    "cache_hits",
    "executions",
    "deferred_ops",
    "materializations",
    "fallback_ops",
    "host_to_device",
    "device_to_host",
)


def test_contract_keys_present(pjrt):
    m = torch_pjrt.metrics()
    for key in CONTRACT_KEYS:
        assert key in m, key
    assert isinstance(m["fallback_ops"], dict)
    assert all(isinstance(m[k], int) for k in CONTRACT_KEYS if k != "fallback_ops")


def test_reset_zeroes_counters(pjrt):
    x = torch.ones(3).to(pjrt)
    (x + 1).sum().item()
    assert torch_pjrt.metrics()["executions"] > 0
    torch_pjrt.reset_metrics()
    m = torch_pjrt.metrics()
    assert m["executions"] == 0 and m["device_to_host"] == 0 and m["fallback_ops"] == {}


def test_repeated_loop_hits_the_cache(pjrt):
    x = torch.randn(5, 7).to(pjrt)
    w = torch.randn(7, 3).to(pjrt)

    def step():
        return ((x @ w).relu() * 0.5).sum().item()

    first = step()
    after_first = torch_pjrt.metrics()
    assert after_first["compilations"] >= 1
    for _ in range(3):
        assert step() == first
    m = torch_pjrt.metrics()
    assert m["compilations"] == after_first["compilations"], "a repeated loop recompiled"
    assert m["cache_hits"] - after_first["cache_hits"] >= 3 * 4  # mm, relu, mul, sum per step


def test_changed_python_scalar_does_not_recompile(pjrt):
    x_cpu = torch.randn(6)
    x = x_cpu.to(pjrt)
    torch.testing.assert_close((x * 1.5 + 0.25).cpu(), x_cpu * 1.5 + 0.25)
    compiled = torch_pjrt.metrics()["compilations"]
    for lr in (0.1, 2.0, -3.5, 1e-3):
        torch.testing.assert_close((x * lr + 0.25).cpu(), x_cpu * lr + 0.25)
    assert torch_pjrt.metrics()["compilations"] == compiled


def test_changed_scalar_in_defer_and_fuse_reuses_the_region(pjrt):
    p_cpu = torch.randn(10)
    g_cpu = torch.randn(10)
    p, g = p_cpu.clone().to(pjrt), g_cpu.to(pjrt)
    with torch_pjrt.eager_mode("defer_and_fuse"):
        compiled = None
        for step, lr in enumerate((0.1, 0.05, 0.025, 0.0125)):
            p.add_(g, alpha=-lr)
            p_cpu.add_(g_cpu, alpha=-lr)
            loss = (p * p).sum().item()
            # Wait for the device, so whether p's old buffer can be donated (part of the key)
            # does not depend on timing.
            torch_pjrt.sync()
            if step == 1:
                compiled = torch_pjrt.metrics()["compilations"]
        assert torch_pjrt.metrics()["compilations"] == compiled
    torch.testing.assert_close(p.cpu(), p_cpu)
    assert abs(loss - (p_cpu * p_cpu).sum().item()) < 1e-4


def test_defer_and_fuse_loop_reaches_one_cached_region_per_step(pjrt):
    x = torch.randn(16, 8).to(pjrt)
    w = torch.randn(8, 8).to(pjrt)
    with torch_pjrt.eager_mode("defer_and_fuse"):
        for _ in range(2):
            (x @ w).tanh().mean().item()
        before = torch_pjrt.metrics()
        for _ in range(3):
            (x @ w).tanh().mean().item()
        after = torch_pjrt.metrics()
    assert after["compilations"] == before["compilations"]
    assert after["executions"] - before["executions"] == 3
    assert after["cache_hits"] - before["cache_hits"] == 3
    assert after["deferred_ops"] - before["deferred_ops"] == 9


def test_transfers_are_counted(pjrt):
    x = torch.arange(12, dtype=torch.float32).to(pjrt)
    m = torch_pjrt.metrics()
    assert m["host_to_device"] >= 1
    x.cpu()
    assert torch_pjrt.metrics()["device_to_host"] == m["device_to_host"] + 1


def test_metrics_report_is_text(pjrt):
    (torch.ones(2).to(pjrt) + 1).cpu()
    report = torch_pjrt.metrics_report()
    assert report.startswith("torch-pjrt metrics")
    for key in ("compilations", "cache_hits", "executions", "fallback_ops"):
        assert key in report
