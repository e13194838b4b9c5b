"""A compile the plugin rejects raises at the materialization that needs it, naming the op or
region, and points at the StableHLO module that failed, written out even with dumping off."""

import re

from conftest import assert_ok, run_python

PROBE = """
import torch, torch_pjrt
x = torch.ones(3, device="pjrt")
with torch_pjrt.eager_mode("{mode}"):
    y = (x * 2).sin() + 1
    try:
        y.cpu()
    except RuntimeError as e:
        print("ERROR", e)
"""


def _failure(mode, env):
    # XLA refuses a compile option it does not know: every compile of this process fails.
    env = {"TORCH_PJRT_COMPILE_OPTIONS": "xla_no_such_option=1", **env}
    out = assert_ok(run_python(PROBE.format(mode=mode), env=env))
    assert out.startswith("ERROR "), out
    match = re.search(r"failed to compile is in (\S+\.mlir)", out)
    assert match, out
    return out, match.group(1)


def test_a_rejected_region_names_its_ops_and_its_module(tmp_path):
    out, path = _failure("defer_and_fuse", {"TMPDIR": str(tmp_path)})
    assert "region of 3 ops: mul, sin, add" in out, out
    assert "No such compile option" in out, "the plugin's diagnostic is kept"
    assert path.startswith(str(tmp_path)), "written under the temporary directory"
    module = open(path).read()
    assert "func.func public @main" in module and "stablehlo.sine" in module, module


def test_a_rejected_op_in_strict_mode_points_at_the_dump_directory(tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    out, path = _failure("strict", {"TORCH_PJRT_DUMP_DIR": str(dump)})
    # Every op failed to compile; the read raises the failure of the op that made its value.
    assert out.startswith("ERROR add: "), out
    assert path.startswith(str(dump)), path
    assert "stablehlo.add" in open(path).read()
