"""The GPT demo (`make demo`) runs: a few steps on the CPU and on pjrt, losses matching."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_gpt_demo_runs_a_few_steps():
    env = dict(os.environ, DEMO_STEPS="3", DEMO_MODES="cpu,defer_and_fuse", DEMO_PLOT="0")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "gpt_demo.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.strip().startswith("defer_and_fuse") and "loss vs CPU" in l)
    worst = float(line.split("max ")[1].split()[0].rstrip(","))
    assert worst < 1e-4, line
