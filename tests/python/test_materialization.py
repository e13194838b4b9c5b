"""Materialization points hidden in PyTorch composites, and loops whose memory stays flat."""

import os
import warnings

import pytest
import torch

import torch_pjrt


def rss_mib():
    # The current resident size (not the peak: compiling a large region peaks high, briefly).
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_ten_thousand_iterations_keep_memory_flat(pjrt, mode):
    x = torch.zeros(256, device="pjrt")
    acc = torch.zeros((), device="pjrt")
    with torch_pjrt.eager_mode(mode):
        # Warm up with the loop itself: compile every region it makes, let allocators settle.
        for step in range(3000):
            x = x * 0.5 + 1.0
            acc = acc + x.sum()
            if step % 1000 == 999:
                acc.item()
        storages_before = torch_pjrt.metrics()["live_storages"]
        rss_before = rss_mib()
        for step in range(10_000):
            x = x * 0.5 + 1.0
            acc = acc + x.sum()  # a device-side accumulator, read only now and then
            if step % 1000 == 999:
                assert acc.item() > 0
        final = acc.item()
    m = torch_pjrt.metrics()
    assert abs(x[0].item() - 2.0) < 1e-6
    assert final > 0
    # The engine holds no more storages than before the loop, and nothing is left pending.
    assert m["live_storages"] <= storages_before + 2, (storages_before, m["live_storages"])
    assert m["pending_ops"] == 0
    # The process grew by at most a few MiB over 10,000 iterations.
    assert rss_mib() - rss_before < 64, (rss_before, rss_mib())


def test_allclose_and_equal_materialize(pjrt):
    a = torch.arange(6, dtype=torch.float32).to("pjrt")
    with torch_pjrt.eager_mode("defer_and_fuse"):
        b = a * 1.0 + 0.0
        before = torch_pjrt.metrics()["materializations"]
        assert torch.allclose(a, b)
        assert not torch.allclose(a, b + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert torch.equal(a, b)
        assert torch_pjrt.metrics()["materializations"] > before


def test_bool_int_float_and_tolist_materialize(pjrt):
    with torch_pjrt.eager_mode("defer_and_fuse"):
        t = torch.tensor([1.5, -2.0], device="pjrt") * 2
        assert bool(t[0] > 0)
        assert int(t[0]) == 3
        assert float(t[1]) == -4.0
        assert t.tolist() == [3.0, -4.0]
        if t.sum() < 0:
            flag = "negative"
        else:
            flag = "non-negative"
        assert flag == "negative"


def test_boolean_mask_indexing_and_clip_grad_norm(pjrt):
    with torch_pjrt.eager_mode("defer_and_fuse"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ops the engine lacks run on the CPU here
        x = torch.arange(8, dtype=torch.float32, device="pjrt") - 3
        picked = x[x > 0]
        assert picked.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
        w = torch.nn.Parameter(torch.ones(4, device="pjrt"))
        (w * 3).sum().backward()
        norm = torch.nn.utils.clip_grad_norm_([w], max_norm=1.0, error_if_nonfinite=True)
        assert abs(norm.item() - 6.0) < 1e-5
        assert abs(w.grad.norm().item() - 1.0) < 1e-4
