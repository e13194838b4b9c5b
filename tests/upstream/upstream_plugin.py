"""pytest plugin loaded into every worker of the upstream runner (tests/upstream/run.py).

It does four things, and nothing else:

- bridges the version skew of older PyTorch test files against the installed torch: `skip`,
  `skipOps` and `xfail` moved from `common_methods_invocations` to `common_device_type`, and
  `skipOps` lost its two leading arguments (the class and test names, now read from the
  decorated function's qualified name). The names are injected before any test file is imported,
  so the files run unedited;
- narrows the collected items to the test ids listed in the file named by `UPSTREAM_IDS`, in that
  order (ids a file does not define are reported as missing instead of stopping pytest, which a
  node id on the command line that is not found would do);
- writes one JSON line per event to `UPSTREAM_EVENTS` (test start, outcome with the error's first
  line, test finish), flushed at once, so the supervisor outside the process knows which test is
  running when it has to kill a hung or crashed worker;
- ends each test with the device's pending work materialized: in Strict and DeferAndFuse an error
  found on the device (an out-of-bounds index) is raised at the next materialization point (RFC
  0012), so an error a test's own ops left pending fails that test's teardown, not whichever later
  test reads a value first.
"""
import sys

import json
import os
import time

import pytest


def _bridge_version_skew():
    """Gives `common_methods_invocations` the names older test files import from it."""
    from torch.testing._internal import common_device_type as cdt
    from torch.testing._internal import common_methods_invocations as cmi

    for name in ("skip", "xfail"):
        if not hasattr(cmi, name) and hasattr(cdt, name):
            setattr(cmi, name, getattr(cdt, name))
    if not hasattr(cmi, "skipOps") and hasattr(cdt, "skipOps"):
        new_skip_ops = cdt.skipOps

        def skipOps(*args):
            # Old signature: skipOps(test_case_name, base_test_name, to_skip); the new one takes
            # only to_skip and reads both names from the function it decorates, which is the
            # same function the old call named.
            return new_skip_ops(args[-1])

        cmi.skipOps = skipOps


_events = None


def _emit(**record):
    if _events is None:
        return
    record["t"] = time.time()
    _events.write(json.dumps(record) + "\n")
    _events.flush()


def pytest_configure(config):
    global _events
    _bridge_version_skew()
    path = os.environ.get("UPSTREAM_EVENTS")
    if path:
        # Line-buffered append: the supervisor tails this file while the worker runs.
        _events = open(path, "a", buffering=1, encoding="utf-8")


def pytest_unconfigure(config):
    global _events
    if _events is not None:
        _events.close()
        _events = None


def pytest_collection_modifyitems(session, config, items):
    path = os.environ.get("UPSTREAM_IDS")
    if not path:
        return
    with open(path, encoding="utf-8") as f:
        wanted = [line.strip() for line in f if line.strip()]
    by_id = {item.nodeid: item for item in items}
    selected = [by_id[i] for i in wanted if i in by_id]
    for missing in (i for i in wanted if i not in by_id):
        _emit(ev="missing", id=missing)
    deselected = [item for item in items if item.nodeid not in set(wanted)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = selected


def pytest_collectreport(report):
    if report.failed:
        _emit(ev="collect_error", id=report.nodeid, message=_first_line(str(report.longrepr), tail=True))


def pytest_runtest_logstart(nodeid, location):
    _emit(ev="start", id=nodeid)


def pytest_runtest_logfinish(nodeid, location):
    _emit(ev="finish", id=nodeid)


@pytest.fixture(autouse=True)
def _pjrt_pending_errors():
    """Materializes what the test left pending; its error fails this test's teardown."""
    yield
    engine = sys.modules.get("torch_pjrt")
    if engine is not None:
        try:
            engine.sync()
        except Exception as e:  # noqa: BLE001 - re-raised with the test it belongs to
            raise RuntimeError(f"an error this test's pjrt ops left pending: {e}") from e


def _first_line(text, tail=False):
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    # A collection error's longrepr is a traceback whose last line names the exception.
    if tail:
        return lines[-1][:300]
    # Some messages say little on their first line ("Comparing", "Scalars are not equal!"):
    # the next lines carry what differed. PyTorch's repro hint ends the useful part.
    useful = []
    for line in lines[:3]:
        if line.startswith("To execute this test"):
            break
        useful.append(line)
    return " | ".join(useful)[:300]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    message = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        message = report.longrepr[2]
    elif call.excinfo is not None and not report.passed:
        exc = call.excinfo
        message = f"{exc.typename}: {_first_line(exc.value)}"
    elif report.failed:
        message = _first_line(report.longrepr, tail=True)
    _emit(
        ev="report",
        id=report.nodeid,
        when=report.when,
        outcome=report.outcome,
        xfail=hasattr(report, "wasxfail"),
        duration=round(report.duration, 3),
        message=str(message)[:300],
    )
