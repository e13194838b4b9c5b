"""PyTorch's own device-generic test files, run on the pjrt device and judged against a manifest.

    python tests/upstream/run.py [FOLDER] [--files test_x.py ...] [--modes strict debug defer_and_fuse]
                                 [--timeout 180] [--workers 2] [--ci] [--sample N] [--select GLOB]

Only the pjrt variants run (PYTORCH_TESTING_DEVICE_ONLY_FOR=privateuse1). Each file's test ids are
collected once, split into batches, and every batch runs in a pytest worker process (at most
`--workers` at a time) that loads tests/upstream/upstream_plugin.py. The plugin reports each test's
start and outcome as it happens; this supervisor enforces the per-test wall clock from outside:
a test that runs past the limit has its worker killed (a test blocked in native code cannot be
interrupted from inside) and is recorded as a hang, a worker that dies mid-test records that
test as a crash, and a new worker goes on with the batch's remaining ids.

Outcomes are compared with tests/upstream/expected_failures.toml: a failure, error, hang or crash
that no entry covers fails the run (exit status 1); a pass that an entry covers is reported as an
unexpected pass (and fails the run with --fail-on-unexpected-pass), so the manifest only shrinks.
A table per file and mode goes to stdout and, with every outcome, to report.md and report.json
in the results folder (tests/upstream/results by default, git-ignored). Failures outside the
manifest are also written as draft entries (new_failures.toml); --check-cpu reruns them on the CPU
first, so a failure the CPU shares is drafted as version skew.
"""

import argparse
import fnmatch
import importlib.metadata
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_FOLDER = REPO.parent / "shared" / "pytorch-tests" / "v2.4.0"
DEFAULT_MANIFEST = HERE / "expected_failures.toml"
DEFAULT_RESULTS = HERE / "results"

MODES = {
    "strict": {},
    "debug": {"TORCH_PJRT_LAUNCH_BLOCKING": "1"},
    # Fusion always on: the column tests fused regions, which the fallback to one-op programs
    # for code whose regions never repeat (RFC 0042) would mostly replace by Strict's.
    "defer_and_fuse": {"TORCH_PJRT_DEFER_AND_FUSE": "1", "TORCH_PJRT_ADAPTIVE": "0"},
}
# Variables that change the engine's behaviour: a worker starts from a clean slate plus its mode.
ENGINE_ENV = (
    "TORCH_PJRT_DEFER_AND_FUSE",
    "TORCH_PJRT_LAUNCH_BLOCKING",
    "TORCH_PJRT_FALLBACK",
    "TORCH_PJRT_MAX_REGION_OPS",
    "TORCH_PJRT_RECOMPILE_LIMIT",
    "TORCH_PJRT_LOG_RECOMPILES",
    "TORCH_PJRT_ADAPTIVE",
)
CLASSES = ("unsupported dtype", "pytorch limitation", "version skew", "open defect")
BAD = ("failed", "error", "hang", "crash")

# The CI subset, sized to about ten minutes with two workers on a 2-core machine: Strict and
# DeferAndFuse, every CI_SAMPLE[file]-th test id of these files (a fixed stride, so the subset is
# the same on every run and inside any run with a stride that divides it), leaving out the tests
# the manifest marks `hang = true` (each would cost the whole per-test limit).
CI_SAMPLE = {"test_shape_ops.py": 2, "test_indexing.py": 2, "test_type_promotion.py": 2,
             "test_view_ops.py": 2, "test_ops.py": 1000}
CI_MODES = ("strict", "defer_and_fuse")


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# Manifest


@dataclass
class Entry:
    pattern: str
    modes: tuple
    cls: str
    reason: str
    hang: bool = False
    matched: int = 0

    def covers(self, test_id, mode):
        return mode in self.modes and fnmatch.fnmatchcase(test_id, self.pattern)


def load_manifest(path):
    if not path.exists():
        return []
    with open(path, "rb") as f:
        data = tomllib.load(f)
    entries = []
    for i, raw in enumerate(data.get("failure", [])):
        modes = raw.get("modes", ["all"])
        if "all" in modes:
            modes = list(MODES)
        unknown = [m for m in modes if m not in MODES]
        if unknown or raw.get("class") not in CLASSES or not raw.get("test") or not raw.get("reason"):
            sys.exit(f"{path}: entry {i + 1} ({raw.get('test')!r}) needs test, reason, class in "
                     f"{CLASSES} and modes in {list(MODES) + ['all']}")
        entries.append(Entry(raw["test"], tuple(modes), raw["class"], raw["reason"],
                             bool(raw.get("hang", False))))
    return entries


def find_entry(entries, test_id, mode):
    for entry in entries:
        if entry.covers(test_id, mode):
            return entry
    return None


# ---------------------------------------------------------------------------------------------
# Collection


def worker_env(mode, device_only="privateuse1"):
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_ENV}
    env.update(MODES[mode])
    env["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = device_only
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    # Workers run side by side, one per core: the CPU reference computations of the tests would
    # otherwise each start a thread pool the size of the machine.
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the test folder may be shared or read-only
    return env


def pytest_cmd(folder, test_file):
    return [sys.executable, "-m", "pytest", "-p", "upstream_plugin", "-p", "no:cacheprovider",
            "-q", "--rootdir", str(folder), test_file]


def collect(folder, test_file, results, device_only="privateuse1"):
    """Test ids of one file, cached by the file's size and time and the installed torch."""
    src = folder / test_file
    st = src.stat()
    torch_version = importlib.metadata.version("torch")
    cache = (results / "collected" /
             f"{test_file}.{device_only}.{st.st_size}.{int(st.st_mtime)}.{torch_version}.txt")
    if cache.exists():
        return cache.read_text().split()
    proc = subprocess.run(pytest_cmd(folder, test_file) + ["--collect-only"], cwd=folder,
                          env=worker_env("strict", device_only), capture_output=True, text=True,
                          timeout=1800)
    ids = [line.strip() for line in proc.stdout.splitlines()
           if line.startswith(test_file + "::")]
    if not ids:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        log(f"collection of {test_file} found no tests (rc {proc.returncode}):\n{tail}")
        return []
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("\n".join(ids) + "\n")
    return ids


# ---------------------------------------------------------------------------------------------
# Workers


@dataclass
class Outcome:
    test_id: str
    mode: str
    outcome: str  # passed failed error skipped xfailed xpassed hang crash
    message: str = ""
    seconds: float = 0.0


def outcome_of(reports):
    """One test's outcome from its setup/call/teardown reports, as pytest would summarize it."""
    if any(r["xfail"] and r["outcome"] == "skipped" for r in reports):
        return "xfailed"
    if any(r["outcome"] == "skipped" for r in reports):
        return "skipped"
    by_phase = {r["when"]: r for r in reports}
    if by_phase.get("setup", {}).get("outcome") == "failed":
        return "error"
    call = by_phase.get("call")
    if call and call["outcome"] == "failed":
        return "failed"
    if by_phase.get("teardown", {}).get("outcome") == "failed":
        return "error"
    if call and call["outcome"] == "passed":
        return "xpassed" if call["xfail"] else "passed"
    return "error"


def message_of(reports):
    for r in reports:
        if r["outcome"] != "passed" and r["message"]:
            return r["message"]
    return ""


@dataclass
class Job:
    folder: Path
    test_file: str
    mode: str
    ids: list
    index: int
    device_only: str = "privateuse1"
    outcomes: list = field(default_factory=list)


class Supervisor:
    def __init__(self, timeout, workdir, startup_limit=900, on_outcome=None):
        self.timeout = timeout
        self.workdir = workdir
        self.startup_limit = startup_limit
        self.on_outcome = on_outcome or (lambda o: None)
        self.stop = threading.Event()

    def run_job(self, job):
        remaining = list(job.ids)
        attempts_without_progress = 0
        round_no = 0
        while remaining and not self.stop.is_set():
            round_no += 1
            stem = f"{Path(job.test_file).stem}.{job.mode}.{job.device_only}.{job.index}.{round_no}"
            ids_path = self.workdir / f"{stem}.ids"
            events_path = self.workdir / f"{stem}.events"
            log_path = self.workdir / f"{stem}.log"
            ids_path.write_text("\n".join(remaining) + "\n")
            events_path.write_text("")
            env = worker_env(job.mode, job.device_only)
            env["UPSTREAM_IDS"] = str(ids_path)
            env["UPSTREAM_EVENTS"] = str(events_path)
            done = self._run_process(job, env, events_path, log_path)
            remaining = [i for i in remaining if i not in done]
            if done:
                attempts_without_progress = 0
                continue
            # No test started: the worker could not import or collect (the package may be being
            # rebuilt). Wait and retry a couple of times before recording the batch as errors.
            attempts_without_progress += 1
            tail = _tail(log_path)
            if attempts_without_progress < 3:
                log(f"  worker for {job.test_file} [{job.mode}] ran no test, retrying in 60 s: "
                    f"{tail[-1] if tail else ''}")
                self.stop.wait(60)
                continue
            message = "worker ran no test: " + (tail[-1] if tail else "no output")
            for test_id in remaining:
                self._record(job, Outcome(test_id, job.mode, "error", message), done)
            remaining = []

    def _record(self, job, outcome, done):
        done.add(outcome.test_id)
        job.outcomes.append(outcome)
        self.on_outcome(outcome)

    def _run_process(self, job, env, events_path, log_path):
        """One worker process over the remaining ids; returns the ids it settled."""
        done = set()
        reports = {}
        current, started_at, begun = None, None, time.monotonic()
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(pytest_cmd(job.folder, job.test_file), cwd=job.folder, env=env,
                                    stdout=log_file, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        killed_for = None
        with open(events_path, encoding="utf-8") as events:
            pending = ""
            while True:
                exited = proc.poll() is not None
                chunk = events.read()
                pending += chunk
                *lines, pending = pending.split("\n")
                for line in lines:
                    ev = json.loads(line)
                    kind, test_id = ev["ev"], ev.get("id")
                    if kind == "start":
                        current, started_at = test_id, time.monotonic()
                        reports[test_id] = []
                    elif kind == "report":
                        reports.setdefault(test_id, []).append(ev)
                    elif kind == "finish":
                        rs = reports.pop(test_id, [])
                        secs = sum(r["duration"] for r in rs)
                        self._record(job, Outcome(test_id, job.mode, outcome_of(rs),
                                                  message_of(rs), round(secs, 2)), done)
                        current = None
                    elif kind == "missing":
                        self._record(job, Outcome(test_id, job.mode, "error",
                                                  "not collected: the file defines no such test"),
                                     done)
                if exited:
                    break
                now = time.monotonic()
                if current is not None and now - started_at > self.timeout:
                    killed_for = "hang"
                elif current is None and not done and now - begun > self.startup_limit:
                    killed_for = "startup"
                elif self.stop.is_set():
                    killed_for = "stop"
                if killed_for:
                    _kill(proc)
                    break
                time.sleep(0.25)
        proc.wait()
        if current is not None and self.stop.is_set() and killed_for == "stop":
            return done
        if current is not None:
            if killed_for == "hang":
                outcome = Outcome(current, job.mode, "hang",
                                  f"still running after {self.timeout:g} s; worker killed",
                                  float(self.timeout))
                log(f"  HANG {current} [{job.mode}] (killed after {self.timeout:g} s)")
            else:
                tail = _tail(log_path, 60)
                why = _signal_name(proc.returncode)
                # The interpreter's fault handler names the fatal error above its module list.
                fatal = [line for line in tail if line.startswith("Fatal Python error")]
                detail = fatal[-1] if fatal else (tail[-1] if tail else "")
                outcome = Outcome(current, job.mode, "crash",
                                  f"worker died ({why}): {detail}"[:300],
                                  round(time.monotonic() - started_at, 2))
                log(f"  CRASH {current} [{job.mode}] ({why})")
            self._record(job, outcome, done)
        return done


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _signal_name(rc):
    if rc is not None and rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            pass
    return f"exit status {rc}"


def _tail(path, n=20):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines[-n:] if line.strip()]


def run_jobs(jobs, supervisor, workers):
    q = queue.Queue()
    for job in jobs:
        q.put(job)
    total = len(jobs)
    finished = [0]
    lock = threading.Lock()

    def loop():
        while True:
            try:
                job = q.get_nowait()
            except queue.Empty:
                return
            t0 = time.monotonic()
            supervisor.run_job(job)
            counts = {}
            for o in job.outcomes:
                counts[o.outcome] = counts.get(o.outcome, 0) + 1
            with lock:
                finished[0] += 1
                summary = " ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                log(f"[{finished[0]}/{total}] {job.test_file} [{job.mode}] batch {job.index}: "
                    f"{summary} ({time.monotonic() - t0:.0f} s)")

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(max(1, workers))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.5)
    except KeyboardInterrupt:
        # Stop here and report what ran: the workers are killed, the test each was running
        # counts as not run.
        log("interrupted: stopping the workers")
        supervisor.stop.set()
        for t in threads:
            t.join()


def make_jobs(folder, test_file, mode, ids, batch_size, device_only="privateuse1"):
    if not ids:
        return []
    n = max(1, -(-len(ids) // batch_size))
    size = -(-len(ids) // n)
    return [Job(folder, test_file, mode, ids[i:i + size], k, device_only)
            for k, i in enumerate(range(0, len(ids), size))]


# ---------------------------------------------------------------------------------------------
# Judging and reporting


def to_cpu_id(test_id):
    """The CPU variant of a pjrt test id (same class template and test, device cpu)."""
    path, cls, name = test_id.split("::", 2)
    cls = re.sub(r"(PRIVATEUSE1|PJRT)$", "CPU", cls)
    name = name.replace("_pjrt", "_cpu")
    return f"{path}::{cls}::{name}"


def suggest_class(message, fails_on_cpu):
    if fails_on_cpu:
        return "version skew"
    if re.search(r"Complex(Float|Double|Half)|complex(64|128|32)|UInt(16|32|64)|quantized|"
                 r"nested|Quint|Qint|dtype code \d+ is not supported|operand type\(s\) for .*'complex'|"
                 r"Quantized|Sparse", message):
        return "unsupported dtype"
    return "open defect"


def judge(outcomes, entries):
    """Per outcome: the covering manifest entry (if any); new failures, unexpected passes."""
    new, fixed, known = [], [], []
    for o in outcomes:
        entry = find_entry(entries, o.test_id, o.mode)
        if entry is not None:
            entry.matched += 1
        if o.outcome in BAD:
            (known if entry else new).append((o, entry))
        elif o.outcome == "passed" and entry is not None:
            fixed.append((o, entry))
    return new, fixed, known


COLUMNS = ("passed", "failed", "error", "hang", "skipped", "xfail", "known", "new", "fixed")


def table_rows(outcomes, new, fixed, known):
    rows = {}

    def row(o):
        return rows.setdefault((o.test_id.split("::")[0], o.mode), dict.fromkeys(COLUMNS, 0))

    for o in outcomes:
        r = row(o)
        if o.outcome in ("hang", "crash"):
            r["hang"] += 1
        elif o.outcome in ("xfailed",):
            r["xfail"] += 1
        elif o.outcome == "xpassed":
            r["passed"] += 1
        else:
            r[o.outcome] += 1
    for items, col in ((new, "new"), (fixed, "fixed"), (known, "known")):
        for o, _ in items:
            row(o)[col] += 1
    return rows


def format_table(rows, mode_order):
    head = ("file", "mode", "tests", "passed", "failed", "errored", "hang/crash", "skipped",
            "upstream xfail", "in manifest", "new", "unexpected pass", "pass rate")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = sorted(rows, key=lambda k: (k[0], mode_order.index(k[1])))
    for f, m in keys:
        r = rows[(f, m)]
        total = sum(r[c] for c in ("passed", "failed", "error", "hang", "skipped", "xfail"))
        ran = total - r["skipped"]
        rate = f"{100 * r['passed'] / ran:.1f}%" if ran else "-"
        cells = (f, m, total, r["passed"], r["failed"], r["error"], r["hang"], r["skipped"],
                 r["xfail"], r["known"], r["new"], r["fixed"], rate)
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def draft_entries(new, cpu_failures):
    """Draft manifest entries (exact ids) for failures the manifest does not cover."""
    by_id = {}
    for o, _ in new:
        by_id.setdefault(o.test_id, []).append(o)
    out = []
    for test_id, os_ in sorted(by_id.items()):
        modes = sorted({o.mode for o in os_}, key=list(MODES).index)
        message = os_[0].message or os_[0].outcome
        cls = suggest_class(message, test_id in cpu_failures)
        reason = message if cls != "version skew" else f"fails on the CPU too: {message}"
        if os_[0].outcome in ("hang", "crash"):
            reason = f"{os_[0].outcome}: {message}"
        modes_toml = "[" + ", ".join(f'"{m}"' for m in modes) + "]"
        out.append(f"[[failure]]\ntest = {json.dumps(test_id)}\nmodes = {modes_toml}\n"
                   f"class = {json.dumps(cls)}\nreason = {json.dumps(reason[:200])}\n")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Main


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", nargs="?", type=Path, default=DEFAULT_FOLDER,
                   help="folder of PyTorch test files (default: %(default)s)")
    p.add_argument("--files", nargs="+", metavar="FILE",
                   help="test files in the folder (default: every test_*.py, test_ops.py last)")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    p.add_argument("--timeout", type=float, default=180,
                   help="per-test wall-clock limit in seconds, enforced from outside (default 180)")
    p.add_argument("--workers", type=int, default=2, help="worker processes at a time (default 2)")
    p.add_argument("--batch-size", type=int, default=150,
                   help="test ids per worker process (default 150)")
    p.add_argument("--ci", action="store_true",
                   help="the CI subset (about ten minutes on 2 cores): "
                        + ", ".join(f"every {n}th test of {f}" for f, n in CI_SAMPLE.items())
                        + f", in {' and '.join(CI_MODES)}, without the manifest's hangs")
    p.add_argument("--sample", type=int, default=1, metavar="N",
                   help="run every N-th test id of each file (default 1: all)")
    p.add_argument("--select", nargs="+", metavar="GLOB",
                   help="run only test ids matching one of these globs")
    p.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST)
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                   help="results folder (default: %(default)s)")
    p.add_argument("--fail-on-unexpected-pass", action="store_true",
                   help="an unexpected pass (a manifest entry that no longer fails) fails the run")
    p.add_argument("--deadline", type=float, metavar="MINUTES",
                   help="stop after this many minutes and report what ran (the rest counts as "
                        "not run)")
    p.add_argument("--rejudge", type=Path, metavar="REPORT_JSON",
                   help="run nothing: judge the outcomes of an earlier report.json against the "
                        "manifest (after editing it)")
    p.add_argument("--check-cpu", action="store_true",
                   help="rerun new failures' CPU variants; those failing there are drafted as "
                        "version skew")
    args = p.parse_args(argv)
    if args.ci:
        args.files = args.files or list(CI_SAMPLE)
        if args.modes == list(MODES):
            args.modes = list(CI_MODES)
    return args


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None):
    args = parse_args(argv)
    # SIGTERM (and SIGINT, which a shell ignores in background jobs) stops the run the way
    # Ctrl-C does: workers killed, what ran reported.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    folder = args.folder.resolve()
    if not folder.is_dir():
        sys.exit(f"no such folder: {folder}")
    files = args.files or sorted((p.name for p in folder.glob("test_*.py")),
                                 key=lambda n: (n == "test_ops.py", n))
    entries = load_manifest(args.manifest)
    results = args.results.resolve()
    results.mkdir(parents=True, exist_ok=True)
    workdir = results / "work"
    if not args.rejudge:
        # Worker logs of the previous run go; a rejudged run keeps them.
        shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)

    t_start = time.monotonic()
    jobs = []
    for test_file in files if not args.rejudge else []:
        t0 = time.monotonic()
        ids = collect(folder, test_file, results)
        if args.select:
            ids = [i for i in ids if any(fnmatch.fnmatchcase(i, g) for g in args.select)]
        sample = max(args.sample, CI_SAMPLE.get(test_file, 1)) if args.ci else args.sample
        ids = ids[::sample]
        if args.ci:
            ids = [i for i in ids if not any(e.hang and fnmatch.fnmatchcase(i, e.pattern)
                                             and set(e.modes) & set(args.modes) for e in entries)]
        log(f"{test_file}: {len(ids)} pjrt tests selected ({time.monotonic() - t0:.0f} s to collect)")
        for mode in args.modes:
            jobs += make_jobs(folder, test_file, mode, ids, args.batch_size)
    # Interleave files and modes so that the two workers rarely hold the same expensive batch.
    jobs.sort(key=lambda j: (j.index, files.index(j.test_file), args.modes.index(j.mode)))

    supervisor = Supervisor(args.timeout, workdir)
    if args.deadline:
        timer = threading.Timer(max(0.0, args.deadline * 60 - (time.monotonic() - t_start)),
                                supervisor.stop.set)
        timer.daemon = True
        timer.start()
    run_jobs(jobs, supervisor, args.workers)
    not_run = sum(len(j.ids) for j in jobs) - sum(len(j.outcomes) for j in jobs)
    outcomes = [o for j in jobs for o in j.outcomes]
    elapsed = time.monotonic() - t_start
    if args.rejudge:
        earlier = json.loads(args.rejudge.read_text())
        outcomes = [Outcome(**o) for o in earlier["outcomes"]]
        files, args.modes, elapsed = earlier["files"], earlier["modes"], earlier["seconds"]
        not_run = earlier.get("not_run", 0)

    new, fixed, known = judge(outcomes, entries)
    cpu_failures = set()
    if args.check_cpu and new:
        cpu_failures = check_cpu(folder, new, args, workdir)
    rows = table_rows(outcomes, new, fixed, known)
    table = format_table(rows, list(MODES))

    report = [f"# Upstream PyTorch tests on pjrt\n",
              f"Folder `{folder}`, files {', '.join(files)}, modes {', '.join(args.modes)}, "
              f"per-test limit {args.timeout:g} s, {args.workers} workers"
              + (" (the CI subset)" if args.ci else "")
              + (f", every {args.sample}th test" if args.sample > 1 else "")
              + (f", ids matching {' '.join(args.select)}" if args.select else "")
              + f"; {len(outcomes)} test runs in {elapsed / 60:.1f} min"
              + (f" ({not_run} not run: stopped early)" if not_run else "") + ".\n",
              table, ""]
    if new:
        report.append(f"## Failures not in the manifest ({len(new)})\n")
        report += [f"- `{o.test_id}` [{o.mode}] {o.outcome}: {o.message}"
                   + (" (fails on the CPU too)" if o.test_id in cpu_failures else "")
                   for o, _ in new]
        report.append("")
    if fixed:
        report.append(f"## Unexpected passes: manifest entries to remove ({len(fixed)})\n")
        report += [f"- `{o.test_id}` [{o.mode}] (entry `{e.pattern}`)" for o, e in fixed]
        report.append("")
    hangs = [o for o in outcomes if o.outcome in ("hang", "crash")]
    if hangs:
        report.append(f"## Hangs and crashes ({len(hangs)})\n")
        report += [f"- `{o.test_id}` [{o.mode}] {o.outcome}: {o.message}" for o in hangs]
        report.append("")
    slow = sorted((o for o in outcomes if o.outcome not in ("hang", "crash")),
                  key=lambda o: -o.seconds)[:10]
    report.append("## Slowest tests\n")
    report += [f"- `{o.test_id}` [{o.mode}] {o.seconds:.1f} s ({o.outcome})" for o in slow]
    report.append("")
    (results / "report.md").write_text("\n".join(report))
    (results / "report.json").write_text(json.dumps({
        "folder": str(folder), "files": files, "modes": args.modes, "timeout": args.timeout,
        "sample": args.sample, "ci": args.ci, "not_run": not_run, "select": args.select, "seconds": round(elapsed, 1),
        "table": [{"file": f, "mode": m, **r} for (f, m), r in sorted(rows.items())],
        "outcomes": [o.__dict__ for o in outcomes],
        "new": [{"test": o.test_id, "mode": o.mode, "outcome": o.outcome, "message": o.message,
                 "fails_on_cpu": o.test_id in cpu_failures} for o, _ in new],
        "unexpected_passes": [{"test": o.test_id, "mode": o.mode, "entry": e.pattern}
                              for o, e in fixed],
    }, indent=1))
    draft = results / "new_failures.toml"
    if new:
        draft.write_text("# Draft manifest entries for the failures of the last run that the\n"
                         "# manifest does not cover; check each class and reason before copying.\n\n"
                         + draft_entries(new, cpu_failures))
    elif draft.exists():
        draft.unlink()

    log("")
    log(table)
    log("")
    log(f"{len(outcomes)} test runs in {elapsed / 60:.1f} min; report: {results / 'report.md'}")
    status = 0
    if not_run:
        log(f"STOPPED EARLY: {not_run} selected test runs did not run")
        status = 1
    if new:
        log(f"FAIL: {len(new)} failures, errors or hangs not in the manifest "
            f"(draft entries: {draft})")
        for o, _ in new[:30]:
            log(f"  {o.test_id} [{o.mode}] {o.outcome}: {o.message[:160]}")
        status = 1
    if fixed:
        log(f"{len(fixed)} unexpected passes: manifest entries to remove (see report.md)")
        for o, e in fixed[:30]:
            log(f"  {o.test_id} [{o.mode}] (entry {e.pattern})")
        if args.fail_on_unexpected_pass:
            status = 1
    return status


def check_cpu(folder, new, args, workdir):
    """The new failures' test ids run on the CPU; returns the pjrt ids whose CPU variant fails."""
    by_file = {}
    for o, _ in new:
        cpu = to_cpu_id(o.test_id)
        by_file.setdefault(o.test_id.split("::")[0], {})[cpu] = o.test_id
    jobs = []
    for test_file, mapping in by_file.items():
        jobs += make_jobs(folder, test_file, "strict", sorted(mapping), args.batch_size, "cpu")
    log(f"checking {sum(len(m) for m in by_file.values())} failing tests on the CPU")
    run_jobs(jobs, Supervisor(args.timeout, workdir), args.workers)
    failing = set()
    for job in jobs:
        for o in job.outcomes:
            if o.outcome in BAD and not o.message.startswith("not collected"):
                failing.add(by_file[job.test_file][o.test_id])
    return failing


if __name__ == "__main__":
    sys.exit(main())
