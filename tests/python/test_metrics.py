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


TIME_KEYS = (
    "host_op_seconds",
    "host_flush_seconds",
    "host_wait_seconds",
    "host_transfer_seconds",
    "exec_launch_seconds",
    "exec_compile_wait_seconds",
    "exec_queue_seconds",
    "device_seconds",
)


def test_time_breakdown_adds_up_each_stage_and_resets(pjrt):
    x = torch.randn(64, 64).to(pjrt)
    with torch_pjrt.eager_mode("defer_and_fuse"):
        (x @ x).relu().sum().item()  # compiled here; the loop below reuses it
        torch_pjrt.reset_metrics()
        assert all(torch_pjrt.metrics()[k] == 0 for k in TIME_KEYS)
        for _ in range(20):
            (x @ x).relu().sum().item()
    m = torch_pjrt.metrics()
    for key in TIME_KEYS:
        assert isinstance(m[key], float) and m[key] >= 0, key
    # Every stage a read goes through was timed; nothing compiled, so nothing waited for it.
    for key in ("host_op_seconds", "host_flush_seconds", "host_wait_seconds",
                "host_transfer_seconds", "exec_launch_seconds", "device_seconds"):
        assert m[key] > 0, key
    assert m["compilations"] == 0
    assert m["exec_compile_wait_seconds"] < m["device_seconds"] + 0.05
    # The device's time runs from each launch, so it covers the launches.
    assert m["device_seconds"] >= m["exec_launch_seconds"] * 0.5
    assert "host_wait_seconds" in torch_pjrt.metrics_report()


def test_a_read_launches_its_region_from_the_reading_thread(pjrt):
    x = torch.randn(16).to(pjrt)
    with torch_pjrt.eager_mode("defer_and_fuse"):
        (x * 2).sum().item()
        torch_pjrt.reset_metrics()
        values = [((x * 2 + i).sum()).item() for i in range(30)]
    m = torch_pjrt.metrics()
    assert m["executions"] == 30
    # The execution thread was asleep at each read: the reader ran the region itself.
    assert m["reader_launches"] >= 25, m["reader_launches"]
    expected = [float((x.cpu() * 2 + i).sum()) for i in range(30)]
    assert values == torch.tensor(expected).tolist() or all(
        abs(a - b) < 1e-4 for a, b in zip(values, expected))


def test_reads_from_several_threads_stay_correct(pjrt):
    import threading

    x = torch.arange(8, dtype=torch.float32).to(pjrt)
    errors, results = [], {}

    def reader(k):
        try:
            with torch_pjrt.eager_mode("defer_and_fuse"):
                results[k] = [((x + k) * j).sum().item() for j in range(40)]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for k in range(4):
        assert results[k] == [float(((torch.arange(8.0) + k) * j).sum()) for j in range(40)]
