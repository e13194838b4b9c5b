"""Compile cost is reported per program, and programs of a few ops compile with the plugin's
fast-compile options while fused regions get its full optimization (RFC 0025)."""

import torch

import torch_pjrt
from conftest import assert_ok, run_python


def test_each_compile_is_listed_with_its_time_and_effort(pjrt):
    x = torch.randn(64, 64).to(pjrt)
    torch.tanh(x).cpu()
    with torch_pjrt.eager_mode("defer_and_fuse"):
        y = x
        for _ in range(6):
            y = torch.tanh(y * 1.5 + 0.25)
        y.sum().cpu()
    m = torch_pjrt.metrics()
    programs = m["compiled_programs"]
    assert [p["region"] for p in programs][0] == "tanh"
    by_region = {p["region"]: p for p in programs}
    assert by_region["tanh"]["fast"] is True
    fused = [p for p in programs if p["region"].startswith("region of")]
    assert len(fused) == 1 and fused[0]["fast"] is False, programs
    assert all(p["seconds"] > 0 for p in programs)
    assert m["compile_seconds"] >= sum(p["seconds"] for p in programs) * 0.999
    assert m["compile_seconds_max"] == max(p["seconds"] for p in programs)
    assert "latest compiles" in torch_pjrt.metrics_report()
    torch_pjrt.reset_metrics()
    assert torch_pjrt.metrics()["compiled_programs"] == []


def test_fast_compiles_give_the_same_values_and_can_be_turned_off():
    code = """
        import torch, torch_pjrt
        torch.manual_seed(0)
        x = torch.randn(1000)
        outs = [f(x.to("pjrt")).cpu() for f in (torch.tanh, torch.exp, torch.log1p, torch.sigmoid)]
        print([p["fast"] for p in torch_pjrt.metrics()["compiled_programs"]])
        torch.save(outs, OUT)
    """
    import os, tempfile

    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for setting in ("1", "0"):
            path = os.path.join(tmp, f"{setting}.pt")
            out = assert_ok(
                run_python(code.replace("OUT", repr(path)), env={"TORCH_PJRT_FAST_COMPILE": setting})
            )
            expected = "True" if setting == "1" else "False"
            assert out.strip() == "[" + ", ".join([expected] * 4) + "]", out
            results[setting] = torch.load(path)
        for fast, full in zip(results["1"], results["0"]):
            torch.testing.assert_close(fast, full, rtol=0, atol=0, equal_nan=True)


def test_fused_regions_of_little_work_compile_quick_and_large_ones_full(pjrt):
    # Shapes and ops no other test compiles, so both regions are compiled here.
    small = torch.randn(48, 40).to(pjrt)  # 1920 elements an op: a decoding step's scale
    large = torch.randn(1000, 1040).to(pjrt)  # a million: past the quick bound (2**18)
    torch_pjrt.reset_metrics()
    with torch_pjrt.eager_mode("defer_and_fuse"):
        for x in (small, large):
            y = x
            for _ in range(5):
                y = torch.sigmoid(y * 1.25 - 0.5).sqrt()
            y.amax().cpu()
    fused = [p for p in torch_pjrt.metrics()["compiled_programs"] if p["region"].startswith("region of")]
    assert [(p["quick"], p["fast"]) for p in fused] == [(True, False), (False, False)], fused
    assert "[quick]" in torch_pjrt.metrics_report()


def test_one_op_programs_of_large_work_compile_full(pjrt):
    # One op can be a whole row-wise computation: past 2**18 elements its run time, not its
    # compile, counts. Shapes no other test compiles.
    small = torch.randn(24, 52).to(pjrt)
    large = torch.randn(520, 1032).to(pjrt)  # 536,640 elements
    torch_pjrt.reset_metrics()
    for x in (small, large):
        torch.testing.assert_close(torch.softmax(x, dim=-1).cpu(), torch.softmax(x.cpu(), dim=-1))
    programs = [p for p in torch_pjrt.metrics()["compiled_programs"] if p["region"] == "_softmax"]
    assert [(p["fast"], p["quick"]) for p in programs] == [(True, False), (False, False)], programs


def test_default_compile_options_give_close_values_and_can_be_turned_off():
    # On XLA CPU the defaults make reductions YNNPACK fusions: row sums, softmax, layer_norm,
    # and a whole-tensor sum, in Strict and fused, against the CPU with and without them.
    code = """
        import torch, torch_pjrt
        import torch.nn.functional as F
        torch.manual_seed(0)
        x = torch.randn(300, 257)
        w, b = torch.randn(257), torch.randn(257)
        fns = (
            lambda t: t.sum(-1), lambda t: t.softmax(-1), lambda t: t.log_softmax(0),
            lambda t: F.layer_norm(t, (257,), w.to(t.device), b.to(t.device)),
            lambda t: (t * 2 + 1).relu().sum(), lambda t: t.amax(-1), lambda t: t.mean(0),
        )
        outs = []
        for mode in ("strict", "defer_and_fuse"):
            with torch_pjrt.eager_mode(mode):
                outs += [f(x.to("pjrt")).cpu() for f in fns]
        for f, got in zip(fns + fns, outs):
            torch.testing.assert_close(got, f(x), rtol=1e-5, atol=1e-5)
        print(len(outs))
    """
    for setting in ("1", "0"):
        out = assert_ok(run_python(code, env={"TORCH_PJRT_DEFAULT_COMPILE_OPTIONS": setting}))
        assert out.strip() == "14", out


def test_quick_compiles_give_close_values_and_can_be_turned_off():
    code = """
        import torch, torch_pjrt
        torch.manual_seed(0)
        x = torch.randn(50, 40).to("pjrt")
        w = torch.randn(40, 30).to("pjrt")
        with torch_pjrt.eager_mode("defer_and_fuse"):
            y = torch.softmax(torch.tanh(x @ w) * 3.0, -1).log1p().cumsum(0)
            out = y.cpu()
        print([p["quick"] for p in torch_pjrt.metrics()["compiled_programs"]])
        torch.save(out, OUT)
    """
    import os, tempfile

    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for setting in ("1", "0"):
            path = os.path.join(tmp, f"{setting}.pt")
            out = assert_ok(
                run_python(code.replace("OUT", repr(path)), env={"TORCH_PJRT_QUICK_COMPILE": setting})
            )
            assert out.strip() == ("[True]" if setting == "1" else "[False]"), out
            results[setting] = torch.load(path)
        # LLVM's optimization level may fuse a multiply-add differently: the last bit may differ.
        torch.testing.assert_close(results["1"], results["0"], rtol=1e-6, atol=1e-6)


def test_a_quick_program_run_often_is_upgraded_to_a_full_compile_in_the_background():
    code = """
        import time, torch, torch_pjrt
        torch.manual_seed(0)
        x = torch.randn(36, 44).to("pjrt")
        def step(x):
            return torch.softmax(torch.tanh(x * 1.5 + 0.25), -1).cumsum(0).sum(0)
        with torch_pjrt.eager_mode("defer_and_fuse"):
            quick = step(x).cpu()
            compiled = torch_pjrt.metrics()["compilations"]
            runs = 0
            deadline = time.time() + 120
            while torch_pjrt.metrics()["compile_upgrades"] < 1 and time.time() < deadline:
                step(x).cpu()
                runs += 1
                time.sleep(0.01)
            m = torch_pjrt.metrics()
            full = step(x).cpu()
            after = torch_pjrt.metrics()
        sources = {p["source"] for p in torch_pjrt.cache_stats() if p["region"].startswith("region of")}
        torch.testing.assert_close(full, quick, rtol=1e-6, atol=1e-6)
        print(int(m["compile_upgrades"]), runs >= 7, m["compile_upgrade_seconds"] > 0,
              after["compilations"] == compiled, sorted(sources))
    """
    out = assert_ok(run_python(code))
    # Eight runs from tier 1 make the upgrade due; it is not a compilation anyone waited for.
    assert out.strip() == "1 True True True ['upgraded']", out
    off = assert_ok(run_python(code.replace("120", "3"), env={"TORCH_PJRT_TIERED_COMPILE": "0"}))
    assert off.strip() == "0 True False True ['compiled']", off
    bad = run_python("import torch, torch_pjrt; torch.ones(1).to('pjrt')", env={"TORCH_PJRT_TIERED_COMPILE": "soon"})
    assert bad.returncode != 0 and "TORCH_PJRT_TIERED_COMPILE must be 0 (off), 1 (on)" in bad.stderr, bad.stderr


def test_waiting_for_upgrades_returns_once_the_full_program_serves_the_loop():
    # Benchmarks wait for the upgrades that warm-up started before timing; the wait must end
    # with the full program in tier 1, and report an engine with nothing queued as settled.
    code = """
        import torch, torch_pjrt
        from torch_pjrt import _api
        torch.manual_seed(0)
        x = torch.randn(36, 44).to("pjrt")
        with torch_pjrt.eager_mode("defer_and_fuse"):
            for _ in range(10):
                y = torch.softmax(torch.tanh(x * 1.5 + 0.25), -1).cumsum(0).sum(0).cpu()
            settled = _api._wait_compile_upgrades(120.0)
            m = torch_pjrt.metrics()
        sources = {p["source"] for p in torch_pjrt.cache_stats() if p["region"].startswith("region of")}
        print(settled, int(m["compile_upgrades"]), sorted(sources), _api._wait_compile_upgrades(0.0))
    """
    out = assert_ok(run_python(code))
    assert out.strip() == "True 1 ['upgraded'] True", out


def test_quick_programs_upgrade_on_request_however_often_they_ran():
    # A program that runs once per request reaches the upgrade count only at its eighth run; a
    # benchmark asks for every upgrade after warm-up instead, and then waits for them.
    code = """
        import torch, torch_pjrt
        from torch_pjrt import _api
        torch.manual_seed(0)
        x = torch.randn(36, 44).to("pjrt")
        with torch_pjrt.eager_mode("defer_and_fuse"):
            y = torch.softmax(torch.tanh(x * 1.5 + 0.25), -1).cumsum(0).sum(0).cpu()
            before = {p["source"] for p in torch_pjrt.cache_stats() if p["region"].startswith("region of")}
            queued = _api._upgrade_quick_programs()
            settled = _api._wait_compile_upgrades(120.0)
            again = _api._upgrade_quick_programs()
            z = torch.softmax(torch.tanh(x * 1.5 + 0.25), -1).cumsum(0).sum(0).cpu()
            m = torch_pjrt.metrics()
        after = {p["source"] for p in torch_pjrt.cache_stats() if p["region"].startswith("region of")}
        torch.testing.assert_close(y, z, rtol=1e-6, atol=1e-6)
        print(sorted(before), queued, settled, again, int(m["compile_upgrades"]), int(m["compilations"]), sorted(after))
    """
    out = assert_ok(run_python(code))
    assert out.strip() == "['compiled'] 1 True 0 1 1 ['upgraded']", out
