"""The wheel (`make wheel`): built from the package as it is here, installed into a fresh venv,
it runs pjrt from outside the source tree with the autoload entry point alone.

The fresh venv borrows torch and the PJRT plugin package from the project's venv (a `.pth`
line: a second 4 GiB torch download would dominate the suite); the package itself, its engine
library and its extension come only from the wheel."""

import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SMOKE = """
import torch, torch._dynamo
x = torch.ones(2, device="pjrt")
print("sum", float((x * 3).sum()))
import torch_pjrt
print("package", torch_pjrt.__file__)
print("backend", "pjrt" in torch._dynamo.list_backends())
"""


def test_the_wheel_installs_into_a_fresh_venv_and_runs_from_outside_the_tree(tmp_path):
    dist = tmp_path / "dist"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_PJRT_")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
         "--no-build-isolation", "--no-deps", "-w", str(dist), os.path.join(ROOT, "python")],
        check=True, env=env, timeout=900,
    )
    (wheel,) = dist.glob("torch_pjrt-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "torch_pjrt/libtorch_glue.so" in names
    assert any(n.startswith("torch_pjrt/_C") and n.endswith(".so") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "torch.backends" in text and "torch_dynamo_backends" in text

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    project_site = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "torch")))
    (site / "borrowed_torch.pth").write_text(project_site + "\n")
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
         "--disable-pip-version-check", "--no-deps", str(wheel)],
        check=True, env=env, timeout=300,
    )
    clean = {k: v for k, v in env.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    proc = subprocess.run(
        [str(python), "-c", SMOKE], cwd=tmp_path, env=clean, capture_output=True, text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["sum"] == "6.0"
    assert lines["package"].startswith(str(site)), lines["package"]
    assert lines["backend"] == "True"
