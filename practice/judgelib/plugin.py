"""pytest plugin run inside the judge's sandbox: streams one JSON line per event.

The judge copies this file into the sandbox as ``_judge_plugin.py`` and runs
``python -m pytest -p _judge_plugin``. Events go to the file named by ``JUDGE_EVENTS``
(never to stdout, which the learner's code may flood or close), one flushed line each:
``session``, ``collected``, ``start`` and ``result`` per case, ``done``. The judge
process reads them while the tests run and kills the process group on a time limit, so
this file only reports; it never enforces anything.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

_LIMIT = 6000  # characters kept of a traceback or captured output
_EVENTS = open(os.environ["JUDGE_EVENTS"], "a", buffering=1, encoding="utf-8")  # noqa: SIM115

if not os.environ.get("MINISGL_DEVICE"):
    # Decide once here so the tests and the judge's report agree on the device.
    try:
        import torch

        os.environ["MINISGL_DEVICE"] = "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001 - a toy engine without torch
        os.environ["MINISGL_DEVICE"] = "cpu"


def _emit(**event) -> None:
    _EVENTS.write(json.dumps(event, default=str) + "\n")
    _EVENTS.flush()


def _trim(text: str, limit: int = _LIMIT, tail: bool = False) -> str:
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    if tail:
        return f"[... {cut} characters cut ...]\n" + text[-limit:]
    return text[:limit] + f"\n[... {cut} characters cut ...]"


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        try:
            import torch

            return torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001
            return "unknown CUDA device"
    import platform

    return platform.machine() or "cpu"


def _module_file() -> str | None:
    mod = sys.modules.get(os.environ.get("JUDGE_MODULE", ""))
    return getattr(mod, "__file__", None)


def pytest_sessionstart(session) -> None:
    device = os.environ["MINISGL_DEVICE"]
    _emit(
        ev="session", device=device, device_name=_device_name(device), python=sys.version.split()[0]
    )


def pytest_collectreport(report) -> None:
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        _emit(
            ev="collect_error",
            nodeid=report.nodeid,
            message=_trim(getattr(crash, "message", "") or "", 1000),
            longrepr=_trim(report.longreprtext, tail=True),
        )


def pytest_collection_finish(session) -> None:
    _emit(ev="collected", cases=[item.nodeid for item in session.items], module_file=_module_file())


_state: dict = {}


def pytest_runtest_logstart(nodeid, location) -> None:
    _state.clear()
    _state.update(nodeid=nodeid, t0=time.perf_counter(), outcome="passed", failure=None)
    _emit(ev="start", case=nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    # fixtures (model loading, building a tiny model) are set up before this: the judge
    # holds only the test body to the per-case limit
    _emit(ev="phase", case=item.nodeid, when="call")
    yield
    _emit(ev="phase", case=item.nodeid, when="teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and report.failed:
        report._judge_exc_type = call.excinfo.typename  # noqa: SLF001


def pytest_runtest_logreport(report) -> None:
    if report.skipped and _state.get("outcome") == "passed":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _state.update(outcome="skipped", failure={"message": _trim(str(reason), 500)})
    if report.failed and _state.get("outcome") != "failed":  # keep the first failure
        crash = getattr(report.longrepr, "reprcrash", None)
        _state["outcome"] = "failed"
        _state["failure"] = {
            "when": report.when,
            "exc_type": getattr(report, "_judge_exc_type", None),
            "message": _trim(getattr(crash, "message", "") or "", 2000),
            "location": f"{crash.path}:{crash.lineno}" if crash is not None else None,
            "longrepr": _trim(report.longreprtext, tail=True),
            "stdout": _trim(report.capstdout, 2000),
            "stderr": _trim(report.capstderr, 2000),
        }


def pytest_runtest_logfinish(nodeid, location) -> None:
    _emit(
        ev="result",
        case=nodeid,
        outcome=_state.get("outcome", "passed"),
        duration=time.perf_counter() - _state.get("t0", time.perf_counter()),
        failure=_state.get("failure"),
    )


def pytest_sessionfinish(session, exitstatus) -> None:
    _emit(ev="done", exitstatus=int(exitstatus), module_file=_module_file())
