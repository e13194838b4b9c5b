"""DDP step time on 2 and 4 processes (torchrun, one device each): pjrt in Strict and
DeferAndFuse against the same processes running gloo DDP on CPU eager, with the share of each
pjrt step spent in collectives (staging to host and back included). Writes
benches/results/ddp.md. `--steps N` sizes the timed loop (median per step is reported)."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
CASES = [("cpu", "eager", "CPU eager, gloo"), ("pjrt", "strict", "pjrt Strict"),
         ("pjrt", "defer_and_fuse", "pjrt DeferAndFuse")]


def run(nprocs, device, mode, steps):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [TORCHRUN, "--standalone", f"--nproc-per-node={nprocs}",
               os.path.join(HERE, "ddp_worker.py"), device, mode, str(steps), out]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 and not os.path.exists(out):
            sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
        # A rank that aborts in its teardown after rank 0 wrote the figures still leaves them.
        with open(out) as f:
            return json.load(f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", default=os.path.join(HERE, "..", "results", "ddp.md"))
    args = parser.parse_args()
    rows = ["| processes | case | step (median) | vs CPU | collectives' share | compiles after warm-up |",
            "| ---: | --- | ---: | ---: | ---: | ---: |"]
    for nprocs in (2, 4):
        base = None
        for device, mode, label in CASES:
            r = run(nprocs, device, mode, args.steps)
            med = statistics.median(r["times"])
            base = base or med
            share = (f"{100 * r['collective_seconds'] / sum(r['times']):.0f}%"
                     if device == "pjrt" else "")
            rows.append(f"| {nprocs} | {label} | {med * 1e3:.2f} ms | {base / med:.2f}x | {share} | "
                        f"{r['compilations'] if device == 'pjrt' else ''} |")
            print(rows[-1], flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    text = ("# DDP step, MLP 4x512 (batch 64 per rank), `loss.item()` each step\n\n"
            + "\n".join(rows) + "\n")
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
