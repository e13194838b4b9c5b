"""`TORCH_PJRT_TRACEBACKS=1`: a check that fails at a later materialization (an index out of
range) names the user's line that queued it, in every mode. The probe's indices are computed on
the device, so the host does not know them and their check is the deferred one (RFC 0012)."""

import os
import subprocess
import sys

import pytest

from conftest import ENGINE_ENV

PROBE = """\
import torch, torch_pjrt, sys
emb = torch.nn.Embedding(10, 4).to("pjrt")
with torch_pjrt.eager_mode(sys.argv[1]):
    ids = (torch.tensor([0.5, 6.0], device="pjrt") * 2).long()
    y = emb(ids) * 2
    total = y.sum() + 1
    try:
        total.item()
    except IndexError as e:
        print("ERROR", e)
    print("after", float((torch.ones(2, device="pjrt") * 3).sum()))
"""


def _run(tmp_path, mode, tracebacks):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_ENV}
    if tracebacks:
        env["TORCH_PJRT_TRACEBACKS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(script), mode], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, str(script)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_an_index_error_names_the_line_that_queued_it(tmp_path, mode):
    out, script = _run(tmp_path, mode, tracebacks=True)
    assert "index out of range in self" in out
    assert f"queued at {script}:5" in out, out
    assert "after 6.0" in out, "the engine stays usable"


def test_without_tracebacks_the_message_is_pytorch_s_alone(tmp_path):
    out, _ = _run(tmp_path, "defer_and_fuse", tracebacks=False)
    assert "ERROR index out of range in self\n" in out, out
