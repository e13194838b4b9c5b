"""DeferAndFuse falls back to one-op programs while its regions never repeat (RFC 0042): code
that compiles a new fused region every time (a sweep over shapes or dtypes, a test suite) runs
its ops one by one, as Strict does, for a stretch, then fuses again; a loop never switches."""

import torch

import torch_pjrt
from conftest import assert_ok, run_python


def _counters():
    m = torch_pjrt.metrics()
    return m["adaptive_switches"], m["adaptive_one_op_ops"], m["executions"]


def test_regions_that_never_repeat_switch_to_one_op_programs_and_a_new_mode_fuses_again():
    with torch_pjrt.eager_mode("defer_and_fuse"):
        switches, one_op, _ = _counters()
        # Sizes no other test uses: every region is compiled anew.
        for n in range(40):
            x = torch.ones(n + 301, 3, device="pjrt") * (n + 1)
            assert (x + 1).sum().item() == (n + 301) * 3 * (n + 2)
        after, one_op_after, _ = _counters()
        assert after == switches + 1, "32 new regions in a row switch once"
        assert one_op_after > one_op, "the regions after the switch ran op by op"
        # While switched, a chain of four ops runs as four programs.
        y = torch.full((377, 3), 2.0, device="pjrt")
        _, _, before = _counters()
        z = ((y * 3 + 1) / 7 - 1).cpu()
        _, _, executed = _counters()
        assert executed - before >= 4
        torch.testing.assert_close(z, torch.full((377, 3), 0.0))
    # A new mode starts afresh: the same chain fuses into one region.
    with torch_pjrt.eager_mode("defer_and_fuse"):
        _, _, before = _counters()
        z = ((y * 3 + 1) / 7 - 1).cpu()
        _, _, executed = _counters()
        assert executed - before == 1
        torch.testing.assert_close(z, torch.full((377, 3), 0.0))


def test_a_loop_that_repeats_never_switches():
    with torch_pjrt.eager_mode("defer_and_fuse"):
        switches, _, _ = _counters()
        w = torch.randn(64, 64, device="pjrt")
        x = torch.randn(8, 64, device="pjrt")
        for _ in range(100):
            x = torch.tanh(x @ w) * 0.5
            x.sum().item()
        assert _counters()[0] == switches


def test_the_fallback_can_be_turned_off():
    code = """
        import torch, torch_pjrt
        with torch_pjrt.eager_mode("defer_and_fuse"):
            for n in range(40):
                (torch.ones(n + 301, 3, device="pjrt") + 1).sum().item()
        m = torch_pjrt.metrics()
        print(int(m["adaptive_switches"]), int(m["adaptive_one_op_ops"]))
    """
    assert assert_ok(run_python(code, env={"TORCH_PJRT_ADAPTIVE": "0"})).strip() == "0 0"
    assert assert_ok(run_python(code)).strip().startswith("1 ")
