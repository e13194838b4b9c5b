"""Streams and events on pjrt: PyTorch's semantics over the engine's one ordered queue.
Events complete when the device has finished the work launched before them (PJRT completion
events) and time it; streams are ids, current per thread; ordering across streams holds."""

import threading

import pytest
import torch

import torch_pjrt


def _busy(n=1 << 22, rounds=20):
    x = torch.ones(n, device="pjrt")
    for _ in range(rounds):
        x = (x * 1.0001).sin() + 0.5
    return x


def test_events_time_device_work_and_order_their_completions():
    start, end = torch.pjrt.Event(enable_timing=True), torch.pjrt.Event(enable_timing=True)
    with torch_pjrt.eager_mode("defer_and_fuse"):
        start.record()
        y = _busy()
        end.record()  # launches the pending region: the event follows it
    end.synchronize()
    assert start.query() and end.query()
    elapsed = start.elapsed_time(end)
    assert elapsed > 0, elapsed
    y.sum().item()
    assert start.elapsed_time(end) == elapsed
    assert end.elapsed_time(start) == pytest.approx(-elapsed)
    # A third event after more work completes later.
    later = torch.pjrt.Event(enable_timing=True)
    _busy(rounds=5)
    later.record()
    later.synchronize()  # PyTorch times completed events only
    assert start.elapsed_time(later) > elapsed


def test_synchronize_waits_for_the_events_work():
    with torch_pjrt.eager_mode("defer_and_fuse"):
        _busy(n=1 << 24, rounds=30)
        event = torch.Event(device="pjrt")
        event.record()
    # (The CPU plugin may finish a program inside its launch, so the event can be done as
    # soon as it is recorded; a device with its own queue would answer False here.)
    event.synchronize()
    assert event.query()
    assert torch.Event(device="pjrt").query(), "an event never recorded has nothing to wait for"


def test_streams_are_current_per_thread_and_order_their_work():
    default = torch.pjrt.current_stream()
    assert default.stream_id == 0 and default.device.type == "pjrt"
    assert torch.pjrt.default_stream() == default
    side = torch.pjrt.Stream()
    assert side.stream_id != 0 and side != default
    x = torch.ones(1024, device="pjrt")
    with torch.pjrt.stream(side):
        assert torch.pjrt.current_stream() == side
        seen = []
        other = threading.Thread(target=lambda: seen.append(torch.pjrt.current_stream()))
        other.start()
        other.join()
        assert seen == [default], "another thread keeps its own current stream"
        y = x * 2  # produced on the side stream
        done = side.record_event()
    default.wait_event(done)
    default.wait_stream(side)
    assert torch.pjrt.current_stream() == default
    # The default stream's reads see the side stream's writes.
    assert float((y + 1).sum()) == 3.0 * 1024
    side.synchronize()
    assert side.query() and default.query()
    with side:  # torch.Stream's own context manager
        assert torch.pjrt.current_stream() == side
    torch.accelerator.synchronize()
