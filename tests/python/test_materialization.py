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


def test_a_training_loop_without_syncs_runs_one_step_while_capturing_the_next(pjrt):
    # No .item() and no sync in the loop: DeferAndFuse finds the step's repetition and cuts
    # each repetition as soon as it is captured, so each step's region runs while the next
    # step is captured, every cut alike (one program), with CPU's results.
    def train(device, steps=30):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        ).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g))
                for _ in range(4)]
        data = [(x.to(device), y.to(device)) for x, y in data]
        losses = []
        for i in range(steps):
            x, y = data[i % len(data)]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return [float(l) for l in losses]

    want = train("cpu")
    with torch_pjrt.eager_mode("defer_and_fuse"):
        train("pjrt", steps=4)  # warm-up: the first steps create the momentum buffers
        torch_pjrt.sync()
        torch_pjrt.reset_metrics()
        got = train("pjrt")
        # Reading the losses leaves the last step's tail pending (nothing reads it); a sync
        # runs it.
        torch_pjrt.sync()
        m = torch_pjrt.metrics()
    assert m["repeat_cuts"] >= 5, m
    assert m["pending_ops"] == 0
    # The first cut holds the first step's optimizer set-up; every later one is alike.
    assert m["compilations"] <= 4, m
    assert m["fallback_ops"] == {}
    assert max(abs(a - b) / abs(b) for a, b in zip(got, want)) < 1e-3, (got, want)


def test_a_loop_run_again_after_a_sync_is_cut_at_every_step_with_one_program(pjrt):
    # The first run finds the step's repetition (wherever in the step it begins); after the
    # sync, the next run's cuts are re-aligned to where its steps start: every step is one
    # region, cut as soon as it is captured, and nothing is left for the sync.
    torch.manual_seed(0)
    with torch_pjrt.eager_mode("defer_and_fuse"):
        model = torch.nn.Sequential(
            torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
            torch.nn.ReLU(), torch.nn.Linear(256, 10)).to("pjrt")
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(64, 784).to("pjrt")
        y = torch.randint(0, 10, (64,)).to("pjrt")

        def run(steps):
            pending = []
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                pending.append(torch_pjrt.metrics()["pending_ops"])
            return pending

        run(12)
        torch_pjrt.sync()
        run(12)
        torch_pjrt.sync()
        torch_pjrt.reset_metrics()
        pending = run(12)
        after_loop = torch_pjrt.metrics()
        torch_pjrt.sync()
        m = torch_pjrt.metrics()
    assert pending == [0] * 12, pending
    assert after_loop["regions"] == 12 and after_loop["repeat_cuts"] == 12, after_loop
    assert m["regions"] == 12, "the sync found nothing left to run"
    assert m["compilations"] == 0, m
    assert m["region_ops"] == 12 * m["largest_region"], m


@pytest.mark.xfail(strict=False, reason=(
    "open defect: XLA's CPU compiler copies an elementwise producer into each fusion that reads it "
    "and contracts `a * b - c` into a fused multiply-add in some copies only, so a value that is a "
    "region's output and also read inside the region (here by max) can differ by an ulp between "
    "the two (not strict: a processor without FMA does not show it)"))
def test_a_value_read_inside_its_region_equals_its_output(pjrt):
    with torch_pjrt.eager_mode("defer_and_fuse"):
        torch.manual_seed(0)
        misses = 0
        for _ in range(20):
            x = torch.rand(25, device=pjrt) * 18 - 9
            largest = x.max().item()
            misses += not bool((x == largest).any().item())
    assert misses == 0
