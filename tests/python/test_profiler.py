"""torch.profiler on pjrt: with ProfilerActivity.PrivateUse1 the exported Chrome trace holds the
engine's regions (key, op count, first ops), compiles (time, cache tier), executions on a device
track of their own, host transfers and CPU fallbacks, beside the host's ATen ops. Without a
profiler asking, the engine records nothing."""

import itertools
import json
import re
import warnings

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import torch_pjrt

# A size no other test uses, new at each call: the first region of each run compiles.
_sizes = itertools.count(41)


def _workload(n):
    x = torch.randn(n, n).to("pjrt")  # a host-to-device copy
    for _ in range(2):  # the second step finds its program in tier 1
        y = (x @ x).relu() * 0.5 + 1
        total = y.sum().item()  # materializes, and copies a scalar back
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.special.bessel_j0(x)  # no pjrt kernel: runs on the CPU
    return total


def _trace(tmp_path, mode, activities=(ProfilerActivity.CPU, ProfilerActivity.PrivateUse1)):
    n = next(_sizes)
    with torch_pjrt.eager_mode(mode):
        torch_pjrt.sync()
        with profile(activities=list(activities)) as prof:
            _workload(n)
    path = tmp_path / f"trace-{mode}.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text()), n


def _complete(trace):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def _host_pid(trace):
    return next(e["pid"] for e in _complete(trace) if e.get("cat") == "cpu_op")


def _named(trace, kind, pid):
    return {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == kind and e.get("pid") == pid
    }


def _check_common(trace, n):
    events = _complete(trace)
    host = _host_pid(trace)
    regions = [e for e in events if e.get("cat") == "privateuse1_runtime" and e["name"].startswith("pjrt ")]
    compiles = [e for e in events if e.get("cat") == "privateuse1_runtime" and e["name"].startswith("compile ")]
    executions = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    assert regions and compiles and executions and copies, sorted({e.get("cat") for e in events})

    # Regions: on the host's rows, beside the ATen ops, each with its key and what it runs.
    for r in regions:
        assert r["pid"] == host
        assert re.fullmatch(r"[0-9a-f]{48}", r["args"]["key"]), r
        assert r["args"]["ops"] >= 1 and r["args"]["first_ops"], r
        assert r["args"]["program"] in ("tier1", "requested", "tier1 (graph replay)"), r
    assert any(r["args"]["program"] == "tier1" for r in regions), "the second step hits tier 1"

    # Compiles: on the compile threads' rows of the host, with their time and where the program
    # came from; the first region of a new size compiles.
    compile_rows = _named(trace, "thread_name", host)
    for c in compiles:
        assert c["pid"] == host and compile_rows.get(c["tid"]) == "pjrt compile", (c, compile_rows)
        assert c["args"]["tier"] in ("compiled", "tier2", "tier3"), c
        assert c["args"]["seconds"] > 0 and c["dur"] > 0, c
    assert any(c["args"]["tier"] == "compiled" for c in compiles)
    compiled_keys = {c["args"]["key"] for c in compiles}
    assert compiled_keys <= {r["args"]["key"] for r in regions}, "each compile is a region's"

    # Executions: on the device's own process and row, each matched to the region that launched
    # it by its number and key, from launch to completion.
    device = {e["pid"] for e in executions}
    assert len(device) == 1 and host not in device
    (device,) = device
    assert _named(trace, "process_name", device).get(0) == "pjrt:0"
    assert _named(trace, "thread_name", device) == {0: "pjrt executions", 1: "pjrt host transfers"}
    by_region = {r["args"]["region"]: r for r in regions}
    for e in executions:
        assert e["tid"] == 0 and e["dur"] >= 0
        launched = by_region[e["args"]["region"]]
        assert launched["args"]["key"] == e["args"]["key"]
        assert e["ts"] >= launched["ts"], "an execution starts after its launch began"
    assert len(executions) == len(regions)

    # Transfers: on the device's transfer row, with their direction and size.
    assert {c["pid"] for c in copies} == {device} and {c["tid"] for c in copies} == {1}
    uploads = [c for c in copies if c["args"]["direction"] == "host to device"]
    reads = [c for c in copies if c["args"]["direction"] == "device to host"]
    assert any(c["args"]["bytes"] == n * n * 4 for c in uploads), uploads
    assert any(c["args"]["bytes"] == 4 for c in reads), reads  # `.item()` of a float32

    # The CPU fallback: a named range on the host thread, around the op's CPU run.
    fallbacks = [e for e in events if e["name"].startswith("pjrt cpu fallback: aten::special_bessel_j0")]
    assert fallbacks and all(e["pid"] == host for e in fallbacks), fallbacks
    return regions, executions


def test_defer_and_fuse_regions_compiles_executions_transfers_and_fallbacks(tmp_path):
    trace, n = _trace(tmp_path, "defer_and_fuse")
    regions, _ = _check_common(trace, n)
    fused = [r for r in regions if r["name"].startswith("pjrt region of ")]
    assert fused, [r["name"] for r in regions]
    step = max(fused, key=lambda r: r["args"]["ops"])
    assert step["args"]["ops"] >= 4, step
    assert step["args"]["first_ops"].startswith("mm, relu"), step
    assert step["args"]["mode"] == "defer_and_fuse"


def test_strict_mode_shows_each_op_as_a_region_of_one(tmp_path):
    trace, n = _trace(tmp_path, "strict")
    regions, executions = _check_common(trace, n)
    names = {r["name"] for r in regions}
    assert {"pjrt mm", "pjrt relu"} <= names, names
    assert all(r["args"]["ops"] == 1 and r["args"]["mode"] == "strict" for r in regions)
    assert {e["name"] for e in executions} >= {"mm", "relu"}


def test_device_time_reaches_the_profiler_s_tables(tmp_path):
    with torch_pjrt.eager_mode("defer_and_fuse"):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            _workload(next(_sizes))
    device = torch.autograd.DeviceType.PrivateUse1
    device_events = [e for e in prof.events() if e.device_type == device]
    assert device_events, "device activities are the pjrt device's"
    regions = [e for e in device_events if e.name.startswith("region of ")]
    assert regions and all(e.self_device_time_total >= 0 for e in regions)
    assert sum(e.self_device_time_total for e in device_events) > 0


def test_the_engine_records_nothing_unless_a_profiler_asks(tmp_path):
    before = torch_pjrt.metrics()["profiler_events"]
    with torch_pjrt.eager_mode("defer_and_fuse"):
        _workload(next(_sizes))
    with torch_pjrt.eager_mode("strict"):
        _workload(next(_sizes))
    assert torch_pjrt.metrics()["profiler_events"] == before, "recorded with no profiler"
    # A CPU-only profile does not turn the engine's trace on either.
    trace, _ = _trace(tmp_path, "strict", activities=(ProfilerActivity.CPU,))
    assert torch_pjrt.metrics()["profiler_events"] == before
    assert not [e for e in _complete(trace) if e.get("cat") in ("kernel", "gpu_memcpy")]
    # And a session leaves nothing for the next one.
    trace, n = _trace(tmp_path, "strict")
    assert torch_pjrt.metrics()["profiler_events"] > before
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        pass
    empty = tmp_path / "empty.json"
    prof.export_chrome_trace(str(empty))
    leftover = [e for e in _complete(json.loads(empty.read_text())) if e.get("cat") == "kernel"]
    assert leftover == []
