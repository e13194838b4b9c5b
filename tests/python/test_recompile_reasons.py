"""Why a program compiled again: each recompile names the op, what changed (a dimension, a dtype,
a static parameter) from what to what, and the user's line; a recompile budget refuses (or warns
about) a recompile past its limit with that explanation and leaves the engine usable."""

import pytest
import torch

import torch_pjrt
from conftest import assert_ok, run_python


def line_of(marker: str) -> int:
    with open(__file__) as f:
        for number, line in enumerate(f, start=1):
            if marker in line and "line_of(" not in line:
                return number
    raise AssertionError(marker)


def test_a_new_batch_size_is_named_by_op_input_dim_and_line(pjrt):
    # Shapes no other test uses: the first is a compile (a recompile too, if another test ran
    # abs before), the second a recompile of it.
    torch.abs(torch.ones(4, 13).to(pjrt)).cpu()
    before = torch_pjrt.metrics()["recompiles"]
    torch.abs(torch.ones(6, 13).to(pjrt)).cpu()  # the new batch size
    m = torch_pjrt.metrics()
    assert m["recompiles"] == before + 1
    reason = m["recompile_reasons"][-1]
    assert (reason["op"], reason["op_index"], reason["what"]) == ("aten::abs", 0, "input 0 (self) dim 0")
    assert (reason["old"], reason["new"]) == ("4", "6")
    assert reason["mode"] == "strict"
    assert reason["region"] == "abs"
    assert reason["location"] == f"{__file__}:{line_of('# the new batch size')}"
    assert [c["what"] for c in reason["changes"]] == ["input 0 (self) dim 0", "output 0 dim 0"]
    assert "input 0 (self) dim 0 changed 4 -> 6" in reason["message"]
    assert reason["message"] == m["last_recompile_reason"]
    report = torch_pjrt.metrics_report()
    assert "recent recompiles" in report and reason["message"] in report
    # A structure seen before with the same dimensions is a cache hit, not a recompile.
    torch.abs(torch.ones(4, 13).to(pjrt)).cpu()
    assert torch_pjrt.metrics()["recompiles"] == before + 1


def test_a_new_static_parameter_and_dtype_are_named(pjrt):
    x = torch.arange(12.0).reshape(3, 4).to(pjrt)
    with torch_pjrt.eager_mode("defer_and_fuse"):
        (x.sum(dim=0) * 2).cpu()
        torch_pjrt.reset_metrics()
        (x.sum(dim=1) * 2).cpu()  # another dim: a static parameter
        reason = torch_pjrt.metrics()["recompile_reasons"][-1]
        assert reason["mode"] == "defer_and_fuse"
        assert (reason["op"], reason["what"]) == ("aten::sum", "param 2 (dims)"), reason
        assert (reason["old"], reason["new"]) == ("0", "1")
        assert reason["location"].endswith(f":{line_of('# another dim: a static parameter')}")
        half = torch.arange(12.0).reshape(3, 4).half().to(pjrt)
        (half.sum(dim=1) * 2).cpu()
    reason = torch_pjrt.metrics()["recompile_reasons"][-1]
    assert (reason["op"], reason["what"]) == ("aten::sum", "input 0 (self) dtype"), reason
    assert (reason["old"], reason["new"]) == ("float32", "float16")


def test_reset_metrics_keeps_the_known_structures(pjrt):
    torch.exp(torch.ones(5, 11).to(pjrt)).cpu()
    torch_pjrt.reset_metrics()
    assert torch_pjrt.metrics()["recompile_reasons"] == []
    torch.exp(torch.ones(7, 11).to(pjrt)).cpu()
    assert torch_pjrt.metrics()["recompiles"] == 1


def test_a_budget_refuses_with_the_explanation_and_the_engine_stays_usable(pjrt):
    x = torch.ones(8, 2).to(pjrt)
    with torch_pjrt.eager_mode("defer_and_fuse"):
        first = (x.sin() + 1).sum().item()
        assert first == pytest.approx(16 * (1 + torch.tensor(1.0).sin().item()))
        with torch_pjrt.recompile_limit(0):
            # The warm program runs under the limit.
            (x.sin() + 1).sum().item()
            y = torch.ones(9, 2).to(pjrt)
            with pytest.raises(RuntimeError) as info:
                (y.sin() + 1).sum().item()
        message = str(info.value)
        assert "recompile limit of 0 exceeded" in message, message
        assert "input 0 (self) dim 0 changed 8 -> 9" in message, message
        assert "mark_dynamic" in message and "recompile_limit" in message
        # Outside the limit the same program compiles and runs.
        second = (y.sin() + 1).sum().item()
        assert second == pytest.approx(18 * (1 + torch.tensor(1.0).sin().item()))
    assert torch_pjrt.metrics()["compile_failures"] == 0


def test_nested_budgets_count_their_own_recompiles(pjrt):
    with torch_pjrt.recompile_limit(2):
        torch.cos(torch.ones(2).to(pjrt)).cpu()
        torch.cos(torch.ones(3).to(pjrt)).cpu()  # recompile 1 of the outer budget
        with torch_pjrt.recompile_limit(0, action="warn"):
            torch.cos(torch.ones(4).to(pjrt)).cpu()  # warns, compiles
        torch.cos(torch.ones(4).to(pjrt)).cpu()  # cached: no recompile
        with pytest.raises(RuntimeError, match="recompile limit of 2 exceeded"):
            torch.cos(torch.ones(5).to(pjrt)).cpu()


def test_bad_limits_are_value_errors():
    with pytest.raises(ValueError, match="non-negative int"):
        torch_pjrt.recompile_limit(-1)
    with pytest.raises(ValueError, match="'raise' or 'warn'"):
        torch_pjrt.recompile_limit(1, action="ignore")


def test_environment_limit_and_log():
    out = run_python(
        """
        import torch, torch_pjrt
        for n in (2, 3):
            torch.neg(torch.ones(n).to("pjrt")).cpu()
        try:
            torch.neg(torch.ones(4).to("pjrt")).cpu()
        except RuntimeError as e:
            print("refused:", "recompile limit of 1 exceeded" in str(e))
        print("recompiles", torch_pjrt.metrics()["recompiles"])
        """,
        env={"TORCH_PJRT_RECOMPILE_LIMIT": "1", "TORCH_PJRT_LOG_RECOMPILES": "1"},
    )
    stdout = assert_ok(out)
    assert "refused: True" in stdout and "recompiles 2" in stdout, stdout
    assert "torch-pjrt: recompile 1 in strict mode of neg: op 0 (aten::neg): input 0 (self) dim 0 changed 2 -> 3" in out.stderr, out.stderr
    bad = run_python("import torch; torch.ones(1, device='pjrt')", env={"TORCH_PJRT_RECOMPILE_LIMIT": "lots"})
    assert bad.returncode != 0 and "TORCH_PJRT_RECOMPILE_LIMIT=lots: expected a number" in bad.stderr, bad.stderr


def test_with_the_log_a_fused_region_names_the_changed_ops_line():
    out = run_python(
        """
        import torch, torch_pjrt
        x = torch.ones(4, 4).to("pjrt")
        with torch_pjrt.eager_mode("defer_and_fuse"):
            for n in (3, 5):
                grown = torch.ones(n).to("pjrt")
                y = (x * 2).sum() + torch.cat([grown, grown]).sum()  # OP LINE
                y.item()  # MATERIALIZED LINE
        r = torch_pjrt.metrics()["recompile_reasons"][-1]
        print(r["location"].rsplit(":", 1)[1], r["materialized_at"].rsplit(":", 1)[1], r["op"])
        """,
        env={"TORCH_PJRT_LOG_RECOMPILES": "1"},
    )
    stdout = assert_ok(out).split()
    # The code's lines, counted from its first line (run_python dedents it; line 1 is blank).
    assert stdout == ["7", "8", "aten::cat"], (stdout, out.stderr)
    assert "op at <string>:7, materialized at <string>:8" in out.stderr, out.stderr
