"""`torch.pjrt`'s memory functions, CUDA's names over the engine's own accounting:
allocated/reserved bytes and their peaks, `memory_stats`, `reset_peak_memory_stats`,
`empty_cache` and `mem_get_info`."""

import torch

import torch_pjrt


def test_allocated_and_reserved_bytes_follow_live_tensors_and_their_peak():
    torch_pjrt.sync()
    base = torch.pjrt.memory_allocated()
    t = torch.ones(1 << 20, device="pjrt")  # 4 MiB
    torch_pjrt.sync()
    held = torch.pjrt.memory_allocated()
    assert held - base >= 4 << 20
    assert torch.pjrt.memory_reserved() == held
    stats = torch.pjrt.memory_stats()
    assert stats["allocated_bytes.all.current"] == held
    assert stats["reserved_bytes.all.peak"] >= held
    assert stats["active.all.current"] >= 1 and stats["num_ooms"] == 0
    del t
    torch_pjrt.sync()
    assert torch.pjrt.memory_allocated() <= held - (4 << 20)
    assert torch.pjrt.max_memory_allocated() >= held
    torch.pjrt.reset_peak_memory_stats()
    assert torch.pjrt.max_memory_allocated() == torch.pjrt.memory_allocated()
    assert torch.pjrt.max_memory_reserved() == torch.pjrt.max_memory_allocated()


def test_empty_cache_drops_executables_and_the_next_use_builds_them_again():
    x = torch.randn(33, 7)
    p = x.to("pjrt")
    with torch_pjrt.eager_mode("strict"):
        torch.testing.assert_close((p.sin() * 3).cpu(), x.sin() * 3)
        torch_pjrt.sync()
        before = torch_pjrt.metrics()["compilations"]
        torch.pjrt.empty_cache()
        torch.testing.assert_close((p.sin() * 3).cpu(), x.sin() * 3)
        torch_pjrt.sync()
        after = torch_pjrt.metrics()["compilations"]
    assert after > before, "the programs were built again"


def test_mem_get_info_reports_the_host_memory_the_cpu_plugin_uses():
    free, total = torch.pjrt.mem_get_info()
    assert 0 < free <= total
