"""Tests of the machinery the model sweeps share (`sweep_common.py`), run without any model:
the results file, skipping and sharding, the child-process protocol (with a stand-in child
script), comparing values and grading a mode, and the tables and summaries of both sweeps.

    .venv/bin/python -m pytest -q -p no:logging tests/sweeps/test_sweep_common.py
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import textwrap
import types
import weakref

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_sweep  # noqa: E402 - the sweeps import sweep_common from their own folder
import sweep_common as sc  # noqa: E402
import tv_sweep  # noqa: E402

# --------------------------------------------------------------------------------------------
# The results file, skipping and sharding


def test_load_results_of_a_missing_file_is_empty(tmp_path):
    assert sc.load_results(str(tmp_path / "none.jsonl")) == []


def test_appended_rows_load_back_in_order_and_blank_lines_are_skipped(tmp_path):
    path = str(tmp_path / "r.jsonl")
    sc.append_result(path, {"model": "a", "seconds": 1.0})
    with open(path, "a") as f:
        f.write("\n   \n")
    sc.append_result(path, {"model": "b", "cpu": {"ok": False, "reason": "x"}})
    assert sc.load_results(path) == [{"model": "a", "seconds": 1.0}, {"model": "b", "cpu": {"ok": False, "reason": "x"}}]
    with open(path) as f:
        assert f.readline() == '{"model": "a", "seconds": 1.0}\n'  # one row, one line
    assert sc.names_done(sc.load_results(path), "model") == {"a", "b"}


def test_only_names_keeps_the_sweeps_order_and_drops_unknown_names():
    names = ["c", "a", "b"]
    assert sc.only_names(names, "b,c,zzz") == ["c", "b"]
    assert sc.only_names(names, None) == names
    assert sc.only_names(names, "") == names


def test_take_shard_takes_every_nth_from_the_ith():
    items = list(range(10))
    assert sc.take_shard(items, "0/4") == [0, 4, 8]
    assert sc.take_shard(items, "3/4") == [3, 7]
    shards = [sc.take_shard(items, f"{i}/3") for i in range(3)]
    assert sorted(x for shard in shards for x in shard) == items


def _fake_row(name):
    return {"model": name, "cpu": {"ok": True}, "strict": {"result": "pass"}, "seconds": 0.5}


def test_run_sweep_skips_names_in_the_results_and_appends_the_rest(tmp_path, capsys):
    out = str(tmp_path / "sub" / "r.jsonl")  # the folder is made on the way
    os.makedirs(os.path.dirname(out))
    sc.append_result(out, _fake_row("b"))
    ran = []

    def run_one(name):
        ran.append(name)
        return _fake_row(name)

    sc.run_sweep(["a", "b", "c", "d"], run_one, out_path=out, name_key="model", name_width=6, unit="model", limit=2)
    assert ran == ["a", "c"]
    assert [r["model"] for r in sc.load_results(out)] == ["b", "a", "c"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"2 models to run (1 already in {out})"
    assert printed[1] == "a         0.5s cpu=ok strict=pass defer_and_fuse=-"
    # a second run goes on where the first stopped
    sc.run_sweep(["a", "b", "c", "d"], run_one, out_path=out, name_key="model", name_width=6, unit="model")
    assert ran == ["a", "c", "d"]


def test_run_sweep_starts_nothing_once_the_budget_is_spent(tmp_path, capsys):
    out = str(tmp_path / "r.jsonl")
    sc.run_sweep(["a"], _fake_row, out_path=out, name_key="model", name_width=4, unit="model", budget_min=-1)
    assert "time budget spent" in capsys.readouterr().out
    assert sc.load_results(out) == []


def test_run_sweep_with_jobs_runs_every_name_once(tmp_path, capsys):
    out = str(tmp_path / "r.jsonl")
    sc.run_sweep(list("abcde"), _fake_row, out_path=out, name_key="model", name_width=4, unit="model", jobs=3)
    assert sorted(r["model"] for r in sc.load_results(out)) == list("abcde")
    assert capsys.readouterr().out.startswith("5 models to run (0 already in ")


def test_progress_line_shows_why_the_cpu_failed():
    row = {"model_type": "x", "cpu": {"ok": False, "reason": "build: " + "y" * 200}, "seconds": 12.25}
    line = sc.progress_line(row, "model_type", 8)
    assert line == "x          12.2s cpu=unsupported (build: " + "y" * 73 + ") strict=- defer_and_fuse=-"


# --------------------------------------------------------------------------------------------
# The child process and its parent

# A stand-in for a sweep script: what its child does depends on the model name.
FAKE_SWEEP = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {folder!r})
    from sweep_common import parse_child_call, stage_writer

    (name,), modes, stage_file = parse_child_call(sys.argv)
    emit = stage_writer(stage_file)
    if name == "no_cpu":
        print("ValueError: the model does not build", file=sys.stderr)
        sys.exit(3)
    emit({{"stage": "cpu", "ok": True, "modes": modes}})
    for mode in modes:
        emit({{"stage": mode, "started": True}})
        if name == "dies_in_strict" and mode == "strict":
            print("Fatal: device lost", file=sys.stderr)
            os._exit(7)
        if name == "hangs_in_defer" and mode == "defer_and_fuse":
            time.sleep(60)
        if name == "stops_early":
            sys.exit(0)
        emit({{"stage": mode, "result": "pass", "out_err": float("inf")}})
    """
)


@pytest.fixture
def fake_sweep(tmp_path):
    script = tmp_path / "fake_sweep.py"
    script.write_text(FAKE_SWEEP.format(folder=os.path.dirname(os.path.abspath(sc.__file__))))
    return str(script)


def test_parse_child_call():
    assert sc.parse_child_call(["s.py", "--child", "t", "C", "strict,", "/f"]) == (["t", "C"], ["strict"], "/f")
    assert sc.parse_child_call(["s.py", "--child", "t", "", "/f"]) == (["t"], [], "/f")
    assert sc.parse_child_call(["s.py", "--only", "t"]) is None
    assert sc.parse_child_call(["s.py"]) is None


def test_run_in_child_collects_every_mode(fake_sweep):
    row = sc.run_in_child(fake_sweep, ["fine"], {"model": "fine"}, timeout=60)
    assert list(row) == ["model", "cpu", "strict", "defer_and_fuse", "seconds"]
    assert row["cpu"] == {"ok": True, "modes": ["strict", "defer_and_fuse"]}
    # infinities come back as strings, which JSON can hold
    assert row["strict"] == {"result": "pass", "out_err": "inf"}
    assert row["defer_and_fuse"] == {"result": "pass", "out_err": "inf"}


def test_run_in_child_records_a_crash_and_runs_the_other_modes_in_a_new_child(fake_sweep):
    row = sc.run_in_child(fake_sweep, ["dies_in_strict"], {"model": "dies_in_strict"}, timeout=60)
    assert row["strict"] == {"result": "crash", "reason": "crash: exit 7: Fatal: device lost"}
    assert row["defer_and_fuse"] == {"result": "pass", "out_err": "inf"}
    assert row["cpu"]["modes"] == ["defer_and_fuse"]  # the CPU record of the second child


def test_run_in_child_records_a_timeout(fake_sweep):
    row = sc.run_in_child(fake_sweep, ["hangs_in_defer"], {"model": "hangs_in_defer"}, timeout=5)
    assert row["strict"]["result"] == "pass"
    assert row["defer_and_fuse"] == {"result": "timeout", "reason": "timeout after 5 s"}


def test_run_in_child_without_a_cpu_record_is_unsupported_on_cpu(fake_sweep):
    row = sc.run_in_child(fake_sweep, ["no_cpu"], {"model": "no_cpu"}, timeout=60)
    assert row["cpu"] == {"ok": False, "reason": "crash: exit 3 (ValueError: the model does not build)"}
    assert "strict" not in row and "defer_and_fuse" not in row


def test_run_in_child_gives_up_on_modes_a_clean_exit_never_started(fake_sweep):
    row = sc.run_in_child(fake_sweep, ["stops_early"], {"model": "stops_early"}, timeout=60)
    # the child exited cleanly in the middle of strict: a retry would do the same
    assert row["strict"] == {"result": "crash", "reason": "no result"}
    assert row["defer_and_fuse"] == {"result": "crash", "reason": "no result"}


def test_run_in_child_leaves_no_staging_file(fake_sweep, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    assert tempfile.gettempdir() == str(tmp_path)
    sc.run_in_child(fake_sweep, ["dies_in_strict"], {"model": "x"}, timeout=60)
    assert [p for p in os.listdir(tmp_path) if p.startswith("fake_sweep_")] == []


def test_stage_writer_appends_one_line_per_record(tmp_path):
    path = str(tmp_path / "stages.jsonl")
    emit = sc.stage_writer(path)
    emit({"stage": "cpu", "ok": True})
    emit({"stage": "strict", "started": True})
    with open(path) as f:
        assert [json.loads(line) for line in f] == [{"stage": "cpu", "ok": True}, {"stage": "strict", "started": True}]


class _FakeDevice(types.ModuleType):
    """Enough of torch_pjrt for `run_device_modes`: the modes entered and the fallbacks to report."""

    def __init__(self, fallback_ops):
        super().__init__("torch_pjrt")
        self.entered, self.fallback_ops = [], fallback_ops

    @contextlib.contextmanager
    def eager_mode(self, mode):
        self.entered.append(mode)
        yield

    def sync(self):
        pass

    def reset_metrics(self):
        pass

    def metrics(self):
        return {"fallback_ops": self.fallback_ops}


def test_run_device_modes_records_errors_then_seconds_then_findings(monkeypatch):
    device = _FakeDevice({"aten::foo": 2})
    monkeypatch.setitem(sys.modules, "torch_pjrt", device)
    records = []
    steps = iter([ValueError("bad shape\nmore detail"), "results"])

    def run_step():
        step = next(steps)
        if isinstance(step, Exception):
            raise step
        return step, "device objects"

    def judge(results, fallback_ops):
        assert results == "results" and fallback_ops == {"aten::foo": 2}
        return {"out_err": 0.0, "grad_err": 0.0}, {"result": "fallback"}

    sc.run_device_modes(["strict", "defer_and_fuse"], records.append, run_step, judge)
    assert device.entered == ["strict", "defer_and_fuse"]
    assert records[0] == {"stage": "strict", "started": True}
    assert records[1]["result"] == "error" and records[1]["reason"] == "ValueError: bad shape"
    assert records[2] == {"stage": "defer_and_fuse", "started": True}
    assert list(records[3]) == ["stage", "fallback_ops", "out_err", "grad_err", "seconds", "result"]


def test_run_device_modes_keeps_the_device_objects_until_the_last_sync(monkeypatch):
    device = _FakeDevice({})
    monkeypatch.setitem(sys.modules, "torch_pjrt", device)
    made = []  # weak references to the device models the step made
    alive_at_sync = []
    device.sync = lambda: alive_at_sync.append(bool(made) and made[-1]() is not None)

    class DeviceModel:
        pass

    def run_step():
        model = DeviceModel()
        made.append(weakref.ref(model))
        return "results", model

    def judge(results, fallback_ops):
        assert made[-1]() is None  # freed once the values are in
        return {}, {"result": "pass"}

    sc.run_device_modes(["strict"], lambda record: None, run_step, judge)
    assert alive_at_sync == [False, True]  # the sync before the step, then the one after it


# --------------------------------------------------------------------------------------------
# Comparing values and classifying failures


def test_json_safe_turns_infinities_and_nans_into_strings_at_any_depth():
    value = {"a": float("inf"), "b": [1.5, float("nan"), {"c": float("-inf")}], "d": "text", "e": 3}
    assert sc.json_safe(value) == {"a": "inf", "b": [1.5, "nan", {"c": "-inf"}], "d": "text", "e": 3}
    json.dumps(sc.json_safe(value), allow_nan=False)


def test_exception_reason_is_the_type_and_the_first_line():
    assert sc.exception_reason(RuntimeError("\n\n  first line\nsecond")) == "RuntimeError: first line"
    assert sc.exception_reason(KeyError()) == "KeyError: "
    assert sc.exception_reason(ValueError("x" * 500)) == "ValueError: " + "x" * 240


def test_tensor_error():
    import torch

    a = torch.tensor([1.0, 2.0, 3.0])
    assert sc.tensor_error(a, a.clone()) == 0.0
    assert sc.tensor_error(a[:2], a) == math.inf
    # absolute below a magnitude of 1, relative above it
    assert sc.tensor_error(torch.tensor([0.5]), torch.tensor([0.25])) == pytest.approx(0.25)
    assert sc.tensor_error(torch.tensor([10.0, 0.0]), torch.tensor([20.0, 0.0])) == pytest.approx(0.5)
    nan, inf = float("nan"), float("inf")
    assert sc.tensor_error(torch.tensor([nan, inf, 1.0]), torch.tensor([nan, inf, 1.0])) == 0.0
    assert sc.tensor_error(torch.tensor([nan, 1.0]), torch.tensor([1.0, 1.0])) == math.inf
    assert sc.tensor_error(torch.tensor([-inf]), torch.tensor([inf])) == math.inf
    assert sc.tensor_error(torch.tensor([1, 2]), torch.tensor([1, 2])) == 0.0
    assert sc.tensor_error(torch.tensor([1, 2]), torch.tensor([1, 3])) == math.inf
    assert sc.tensor_error(torch.zeros(0), torch.zeros(0)) == 0.0


def test_errors_by_name_is_infinite_for_what_is_missing():
    import torch

    expected = {"x": torch.ones(2), "y": torch.ones(1)}
    assert sc.errors_by_name({"x": torch.ones(2)}, expected) == {"x": 0.0, "y": math.inf}


def test_grade():
    ok_out, ok_grad = {"out": sc.OUT_TOL}, {"w": sc.GRAD_TOL}
    assert sc.grade(ok_out, ok_grad, [], {}) == {"result": "pass"}
    assert sc.grade(ok_out, ok_grad, [], {"aten::foo": 1}) == {"result": "fallback"}
    grads = {f"w{i}": 1.0 + i for i in range(10)}
    grads["fine"] = 0.0
    grads["nan"] = float("nan")  # not a number counts as off
    wrong = sc.grade({"out": 0.5, "ok": 0.0}, grads, ["e1", "e2", "e3", "e4", "e5", "e6"], {})
    assert wrong["result"] == "wrong"
    assert wrong["bad_outputs"] == [["out", 0.5]]
    assert [k for k, _ in wrong["bad_grads"]][:3] == ["w9", "w8", "w7"]
    assert len(wrong["bad_grads"]) == 8
    assert wrong["n_bad_grads"] == 11
    assert wrong["extra_grads"] == ["e1", "e2", "e3", "e4", "e5"]
    # gradients the CPU did not have are enough to be wrong
    assert sc.grade(ok_out, ok_grad, ["extra"], {}) == {
        "result": "wrong", "bad_outputs": [], "bad_grads": [], "n_bad_grads": 0, "extra_grads": ["extra"],
    }  # fmt: skip


def test_failure_cause_groups_failures_that_differ_only_in_specifics():
    a = {"result": "error", "reason": "RuntimeError: shape [2, 3] (of x) at 12"}
    b = {"result": "error", "reason": "RuntimeError: shape [4, 5] (of y) at 7"}
    assert sc.failure_cause(a) == "error: RuntimeError: shape [2, 3] (of x) at 12"
    assert sc.failure_cause(a, generalize=True) == sc.failure_cause(b, generalize=True)
    assert sc.failure_cause(a, generalize=True) == "error: RuntimeError: shape … … at …"
    assert sc.failure_cause({"result": "timeout", "reason": "x" * 300}) == "timeout: " + "x" * 160


def test_failure_note_says_why_the_first_mode_that_did_not_pass_did_not():
    assert sc.failure_note({"strict": {"result": "pass"}, "defer_and_fuse": {"result": "pass"}}) == ""
    crash = {"strict": {"result": "pass"}, "defer_and_fuse": {"result": "crash", "reason": "crash: exit -11"}}
    assert sc.failure_note(crash) == "defer_and_fuse: crash: exit -11"
    unchecked = {"strict": {"result": "unchecked", "reason": "random in eval mode: y"}}
    assert sc.failure_note(unchecked) == "strict: random in eval mode: y"
    assert sc.failure_note({"strict": {"result": "fallback"}}) == ""
    wrong = {"bad_grads": [["w", 0.5], ["v", "inf"]], "bad_outputs": [["out", 0.1]], "n_bad_grads": 3}
    assert sc.failure_note({"strict": {"result": "wrong", **wrong}}) == (
        "strict: wrong values: w 5.0e-01, v inf (3 gradients off)"
    )
    wrong["n_bad_grads"] = 1
    assert sc.failure_note({"strict": {"result": "wrong", **wrong}}) == "strict: wrong values: w 5.0e-01, v inf"


# --------------------------------------------------------------------------------------------
# Tables and summaries


def test_cells():
    assert sc.format_error(None) == ""
    assert sc.format_error("nan") == "nan"
    assert sc.format_error(0.000123456) == "1.2e-04"
    assert sc.escape_cell("a | b") == "a \\| b"
    records = [{"out_err": 0.5, "fallback_ops": {"b": 1, "a": 2}}, {"out_err": 0.25, "fallback_ops": {"a": 1}}, {}]
    assert sc.largest_error(records, "out_err") == 0.5
    assert sc.largest_error(records, "grad_err") is None
    assert sc.largest_error([*records, {"out_err": "nan"}], "out_err") == "inf"
    assert sc.largest_error([*records, {"out_err": "nan"}], "out_err", strings_are_infinite=False) == 0.5
    assert sc.fallback_ops_cell(records) == "`a`, `b`"
    assert sc.mode_records({"strict": {"result": "pass"}, "defer_and_fuse": None}) == [{"result": "pass"}, {}]


def test_mode_summary():
    built = [
        {"m": "a", "strict": {"result": "pass"}, "defer_and_fuse": {"result": "pass"}},
        {"m": "b", "strict": {"result": "fallback", "fallback_ops": {"op1": 1}}, "defer_and_fuse": {
            "result": "wrong", "bad_grads": [["w", 0.5]], "bad_outputs": [["o", 0.25]], "fallback_ops": {"op1": 1}}},
        {"m": "c", "strict": {"result": "error", "reason": "E: 1"}, "defer_and_fuse": {"result": "error", "reason": "E: 2"}},
    ]  # fmt: skip
    assert sc.mode_summary(built, "m", "thing", generalize_causes=True) == [
        "- pass in both modes (right values, no fallback): 1 (33%)",
        "- strict: pass 1, fallback 1, error 1",
        "- defer_and_fuse: pass 1, wrong 1, error 1",
        "",
        "Fallback ops (things):",
        "- `op1`: 1: b",
        "",
        "Wrong values (largest errors, relative to the magnitude where above 1):",
        "- b (defer_and_fuse): w 5.0e-01, o 2.5e-01",
        "",
        "Errors, crashes and timeouts:",
        "- 2x error: E: …: c (strict), c (defer_and_fuse)",
    ]
    # without generalizing, the two errors are two causes
    assert sc.mode_summary(built, "m", "thing")[-2:] == ["- 1x error: E: 1: c (strict)", "- 1x error: E: 2: c (defer_and_fuse)"]
    assert sc.mode_summary([], "m", "thing")[0] == "- pass in both modes (right values, no fallback): 0"


def test_hf_table_and_summary():
    rows = [
        {"model_type": "b", "class": "BModel", "cpu": {"ok": True},
         "strict": {"result": "pass", "out_err": 1e-7, "grad_err": 2e-7, "fallback_ops": {}},
         "defer_and_fuse": {"result": "error", "reason": "E: a | b"}},
        {"model_type": "a", "class": "AModel", "cpu": {"ok": False, "reason": "build: ImportError: needs the timm library but it was not found"}},
    ]  # fmt: skip
    assert hf_sweep.table(rows).splitlines() == [
        "| model type | class | strict | defer_and_fuse | max output err | max grad err | fallback ops | failure |",
        "| --- | --- | --- | --- | ---: | ---: | --- | --- |",
        "| b | BModel | pass | error | 1.0e-07 | 2.0e-07 |  | defer_and_fuse: E: a \\| b |",
        "",
        "Unsupported on CPU (not counted):",
        "",
        "| model type | class | reason |",
        "| --- | --- | --- |",
        "| a | AModel | library not installed: build: ImportError: needs the timm library but it was not found |",
    ]
    assert hf_sweep.summary(rows).splitlines()[:3] == [
        "- architectures tried: 2",
        "- unsupported on CPU (do not build or run forward+backward there): 1 (library not installed 1)",
        "- built on CPU: 1",
    ]


def test_tv_table_and_summary():
    rows = [
        {"model": "net", "cpu": {"ok": True, "size": 32, "params": 1_250_000},
         "strict": {"result": "pass", "out_err": 1e-7, "grad_err": "inf", "out_rel": "inf", "grad_rel": 3e-6,
                    "fallback_ops": {"aten::x": 1}},
         "seconds": 4.5},
        {"model": "big", "cpu": {"ok": False, "reason": "timeout after 300 s"}, "seconds": 300.1},
    ]  # fmt: skip
    assert tv_sweep.table(rows).splitlines()[2:] == [
        "| net | 1.2M | 32 | pass | - | 1.0e-07 | inf |  | 3.0e-06 | `aten::x` | 4.5 |  |",
        "",
        "Not run on CPU:",
        "",
        "| model | reason |",
        "| --- | --- |",
        "| big | timeout after 300 s |",
    ]
    assert tv_sweep.summary(rows).splitlines()[:4] == [
        "- models tried: 2",
        "- did not run forward and backward on the CPU within the limit: 1",
        "- ran on CPU: 1",
        "- pass in both modes (right values, no fallback): 0 (0%)",
    ]
