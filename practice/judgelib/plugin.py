"""pytest plugin run inside the judge's sandbox: streams one sealed JSON line per event.

The judge copies this file into the sandbox as ``_judge_plugin.py`` and runs
``python -m pytest -p _judge_plugin``. Events go to the file named by ``JUDGE_EVENTS``
(never to stdout, which the learner's code may flood or close), one flushed line each:
``session``, ``collected``, ``start``, ``body`` and ``result`` per case, ``done``; and
``tamper`` when the judge's machinery was changed.

Verdict evidence the learner's module cannot forge by patching (integrity.py has the scheme):

* Every line is ``{"s": <event json>, "m": <HMAC-SHA256>}`` under a key the judge sends
  through an inherited pipe that this file reads and closes at import, before pytest
  imports any test or engine module; the key then lives only inside an ``hmac`` object in
  a closure. A line written by anyone else does not verify, and the judge rejects the run.
* Before that import this file snapshots pytest's, pluggy's, ``time``'s, ``builtins``'
  and torch's testing functions (each object and its ``__code__``); after collection the
  tests' own modules (``tests/``, conftest) are snapshotted too and their functions are
  compared with a fresh compile of the sandbox's source. After collection and after every
  case the snapshot is compared; a difference is a ``tamper`` event naming it.
* A case's pass needs a ``body`` event, written by ``pytest_pyfunc_call`` after the test
  function returned, i.e. after its last assertion: a pytest whose ``runtest`` never calls
  the test cannot produce one.
* A ``pytest.skip``/``xfail`` raised from inside the learner's module is a failure, not a
  skipped case (skipped cases are not counted).

The judge process reads the events while the tests run and enforces every limit with its
own clock; this file only reports.
"""

from __future__ import annotations

import ast
import hmac
import json
import os
import sys
import time
import types

import pytest

_LIMIT = 6000  # characters kept of a traceback or captured output
_EVENTS = open(os.environ["JUDGE_EVENTS"], "a", buffering=1, encoding="utf-8")  # noqa: SIM115


def _sealer():
    """The one function that writes events; the key stays in the hmac object in here."""
    fd = int(os.environ.pop("JUDGE_SEAL_FD", "-1"))
    key = b""
    if fd >= 0:
        while len(key) < 32:
            chunk = os.read(fd, 32 - len(key))
            if not chunk:
                break
            key += chunk
        os.close(fd)
    mac = hmac.new(key, digestmod="sha256")
    del key
    seq = [0]
    write, flush, dumps = _EVENTS.write, _EVENTS.flush, json.dumps

    def emit(**event) -> None:
        seq[0] += 1
        event["seq"] = seq[0]
        body = dumps(event, default=str)
        m = mac.copy()
        m.update(body.encode())
        write(dumps({"s": body, "m": m.hexdigest()}) + "\n")
        flush()

    return emit


_emit = _sealer()
del _sealer

if os.environ.get("JUDGE_HANG_FILE"):
    # the judge sends SIGUSR1 before it kills a case past its limit: every thread's stack
    # goes to this file (opened now, before pytest redirects the output)
    import faulthandler
    import signal

    _HANG = open(os.environ["JUDGE_HANG_FILE"], "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=_HANG, all_threads=True)

if not os.environ.get("MINISGL_DEVICE"):
    # Decide once here so the tests and the judge's report agree on the device.
    try:
        import torch

        os.environ["MINISGL_DEVICE"] = "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001 - a toy engine without torch
        os.environ["MINISGL_DEVICE"] = "cpu"

# -- the snapshot of the judge's machinery, taken before any test or engine import ---------

_SKIP_NAMES = {"__dict__", "__weakref__", "__doc__", "__module__", "__annotations__"}


def _watch_namespace(owner_name: str, ns: dict, into: dict, depth: int = 0) -> None:
    for name, obj in list(ns.items()):
        if name in _SKIP_NAMES:
            continue
        key = f"{owner_name}.{name}"
        if isinstance(obj, type):
            if depth == 0 and obj.__module__ == owner_name:
                into[key] = (ns, name, obj, None)
                _watch_namespace(key, obj.__dict__, into, depth + 1)  # a read-only view
        elif callable(obj) or isinstance(obj, (staticmethod, classmethod, property)):
            into[key] = (ns, name, obj, getattr(obj, "__code__", None))


def _watch_module(mod: types.ModuleType, into: dict, names=None) -> None:
    ns = vars(mod)
    if names is None:
        _watch_namespace(mod.__name__, ns, into)
        return
    for name in names:
        if name in ns:
            obj = ns[name]
            into[f"{mod.__name__}.{name}"] = (ns, name, obj, getattr(obj, "__code__", None))
            if isinstance(obj, type):
                _watch_namespace(f"{mod.__name__}.{name}", obj.__dict__, into, 1)


def _snapshot_machinery() -> None:
    """Called from ``pytest_load_initial_conftests``: after pytest's own early patches
    (legacypath's), before the conftests, the tests and the engine are imported."""
    if os.environ.get("JUDGE_HYPOTHESIS") == "1":
        import hypothesis  # noqa: F401 - watched from here on, and bounded in judge mode
    for name, mod in list(sys.modules.items()):
        if mod is None:
            continue
        if name.split(".")[0] in ("_pytest", "pytest", "pluggy", "hypothesis") or name == __name__:
            _watch_module(mod, _WATCH)
    _watch_module(
        time,
        _WATCH,
        [
            "time",
            "perf_counter",
            "monotonic",
            "process_time",
            "sleep",
            "perf_counter_ns",
            "monotonic_ns",
            "time_ns",
        ],
    )
    _watch_module(os, _WATCH, ["_exit", "kill", "fork", "write"])
    import builtins

    _watch_module(
        builtins,
        _WATCH,
        [n for n in vars(builtins) if not n.startswith("_")] + ["__import__", "__build_class__"],
    )
    try:
        import torch
        import torch.testing

        _watch_module(
            torch, _WATCH, ["equal", "allclose", "isclose", "eq", "all", "any", "tensor", "Tensor"]
        )
        _watch_module(torch.testing, _WATCH, ["assert_close", "assert_allclose"])
    except Exception:  # noqa: BLE001 - a toy engine without torch
        pass


_WATCH: dict = {}
_TEST_WATCH: dict = {}  # the tests' own modules, filled after collection
_BOX = os.path.realpath(os.getcwd())
_TEST_FILES_CHECKED: set = set()


def _changed(watch: dict) -> list:
    out = []
    for key, (ns, name, obj, code) in watch.items():
        now = ns.get(name, _changed)
        if now is not obj:
            out.append(f"{key} was {'removed' if now is _changed else 'replaced'}")
        elif code is not None and getattr(obj, "__code__", None) is not code:
            out.append(f"{key}.__code__ was replaced")
    return out


def _code_objects(code: types.CodeType, into: dict) -> None:
    into.setdefault((code.co_qualname, code.co_firstlineno), []).append(code)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code_objects(c, into)


def _pristine_codes(mod: types.ModuleType) -> dict:
    """(qualname, first line) -> the code objects a fresh compile of ``mod``'s file makes,
    with and without pytest's assertion rewriting (test modules and conftest get it)."""
    path = mod.__file__
    with open(path, "rb") as f:
        source = f.read()
    codes: dict = {}
    _code_objects(compile(source, path, "exec", dont_inherit=True), codes)
    try:
        from _pytest.assertion.rewrite import rewrite_asserts

        tree = ast.parse(source, filename=path)
        rewrite_asserts(tree, source, path, _CONFIG[0] if _CONFIG else None)
        _code_objects(compile(tree, path, "exec", dont_inherit=True), codes)
    except Exception:  # noqa: BLE001 - a pytest whose rewriter moved: the plain compile stays
        pass
    return codes


def _is_test_module(mod) -> bool:
    path = getattr(mod, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return False
    real = os.path.realpath(path)
    if not real.startswith(_BOX + os.sep):
        return False
    inner = real[len(_BOX) :]
    if inner.startswith(os.sep + "minisgl" + os.sep):  # the rest of the engine, not yours
        learner = _module_file()
        return not learner or os.path.realpath(learner) != real
    return inner.startswith(os.sep + "tests" + os.sep) or os.path.basename(real) == "conftest.py"


def _foreign_defs(mod) -> list:
    """Names the module's source binds with a top-level ``def`` that now hold a function
    defined somewhere else (a lambda of the learner's module put in its place, say)."""
    import inspect

    try:
        with open(mod.__file__, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return []
    own = os.path.realpath(mod.__file__)
    out = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        obj = vars(mod).get(node.name)
        try:
            fn = inspect.unwrap(obj) if callable(obj) else obj
        except ValueError:
            fn = obj
        code = getattr(getattr(fn, "_fixture_function", fn), "__code__", None)
        if code is not None and os.path.realpath(code.co_filename) != own:
            out.append(f"{mod.__name__}.{node.name} was replaced")
    return out


def _snapshot_tests() -> list:
    """Watch the tests' modules and the engine's other modules; return the functions that
    differ from their source."""
    found = []
    for name, mod in list(sys.modules.items()):
        if name in _TEST_FILES_CHECKED:
            continue
        _TEST_FILES_CHECKED.add(name)  # each module is looked at once (sys.modules is long)
        if mod is None or not _is_test_module(mod):
            continue
        before = len(_TEST_WATCH)
        _watch_module(mod, _TEST_WATCH)
        try:
            codes = _pristine_codes(mod)
        except (OSError, SyntaxError, ValueError):
            continue
        found += _foreign_defs(mod)
        for key, (_, _, obj, code) in list(_TEST_WATCH.items())[before:]:
            fn = getattr(obj, "_fixture_function", obj)  # pytest's fixture wrapper
            fn = getattr(getattr(fn, "hypothesis", None), "inner_test", fn)  # @given's
            fn = getattr(fn, "__func__", fn)
            code = getattr(fn, "__code__", None)
            if code is None or not os.path.realpath(code.co_filename) == os.path.realpath(
                mod.__file__
            ):
                continue  # imported from elsewhere (watched where it was defined, if a test file)
            same = codes.get((code.co_qualname, code.co_firstlineno), [])
            if not any(code == c for c in same):
                found.append(f"{key} is not the code of {os.path.relpath(mod.__file__, _BOX)}")
    return found


def _check(where: str) -> None:
    changed = _changed(_WATCH) + _changed(_TEST_WATCH) + _snapshot_tests()
    if changed:
        _emit(ev="tamper", where=where, what=changed[:200])


_CONFIG: list = []


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


def _versions() -> dict:
    out = {"python": sys.version.split()[0], "pytest": pytest.__version__}
    for name in ("torch", "hypothesis"):
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = getattr(mod, "__version__", "?")
    try:
        import torch

        out["cuda"] = torch.version.cuda or ""
    except Exception:  # noqa: BLE001
        pass
    return out


def pytest_load_initial_conftests(early_config, parser, args) -> None:
    _CONFIG.append(early_config)
    _snapshot_machinery()


def pytest_sessionstart(session) -> None:
    device = os.environ["MINISGL_DEVICE"]
    _emit(ev="session", device=device, device_name=_device_name(device), versions=_versions())


def pytest_collectreport(report) -> None:
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        _emit(
            ev="collect_error",
            nodeid=report.nodeid,
            message=_trim(getattr(crash, "message", "") or "", 1000),
            longrepr=_trim(report.longreprtext, tail=True),
        )


def _bound_properties(items) -> None:
    """Judge mode: property tests run their examples but never shrink a failure (shrinking
    a wrong answer's example can take longer than the case limit), and draw them from the
    judge's seed (``JUDGE_SEED``): new examples in every judged run, the same for the
    engine's run and the learner's."""
    if os.environ.get("JUDGE_PROPERTY_SHRINK") == "1" or "hypothesis" not in sys.modules:
        return
    seed = os.environ.get("JUDGE_SEED")
    from hypothesis import Phase, settings

    for item in items:
        fn = getattr(item, "obj", None)
        fn = getattr(fn, "__func__", fn)
        if fn is None or not hasattr(fn, "hypothesis"):
            continue
        base = getattr(fn, "_hypothesis_internal_use_settings", None) or settings()
        fn._hypothesis_internal_use_settings = settings(
            base,
            phases=[p for p in base.phases if p != Phase.shrink],
            database=None,
            print_blob=False,
        )
        if seed:
            fn._hypothesis_internal_use_seed = int(seed)  # over ``derandomize``'s fixed one


def pytest_collection_modifyitems(session, config, items) -> None:
    _bound_properties(items)


def pytest_collection_finish(session) -> None:
    _emit(ev="collected", cases=[item.nodeid for item in session.items], module_file=_module_file())
    _install_recorder()  # before the tests' snapshot, which then holds the recording code
    _check("after importing the tests and your module")


_state: dict = {}

# -- the record of what the exercise's code did (recorder.py) ------------------------------

_RECORD = os.environ.get("JUDGE_RECORD")
_SYMBOLS = json.loads(os.environ.get("JUDGE_SYMBOLS", "[]"))
_installed: list = []


def _install_recorder() -> None:
    """Once the tests have imported the exercise's module, swap in the recorder."""
    mod = sys.modules.get(os.environ.get("JUDGE_MODULE", ""))
    if _installed or not _RECORD or mod is None:
        return
    import _judge_recorder

    _installed.append(mod)
    try:
        missing = _judge_recorder.install(mod, _SYMBOLS)
    except Exception as e:  # noqa: BLE001 - a module the recorder cannot read: nothing recorded
        missing = [f"{type(e).__name__}: {e}"]
    if missing:
        _emit(ev="record_missing", symbols=missing)


def _seed_global_generators() -> None:
    """Each case starts with Python's and torch's global generators seeded from the judge's
    seed: a test drawing from them (``torch.randn`` without a generator) gets the same
    inputs in the engine's run and the learner's, and new ones in every judged run."""
    seed = os.environ.get("JUDGE_SEED")
    if not seed:
        return
    import random

    random.seed(int(seed))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(int(seed))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(int(seed) % 2**32)


def pytest_runtest_logstart(nodeid, location) -> None:
    _state.clear()
    _state.update(nodeid=nodeid, t0=time.perf_counter(), outcome="passed", failure=None, body=False)
    _seed_global_generators()
    _install_recorder()
    if _installed:
        import _judge_recorder

        _judge_recorder.begin_case()
    _emit(ev="start", case=nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    # fixtures (model loading, building a tiny model) are set up before this: the judge
    # holds only the test body to the per-case limit
    _emit(ev="phase", case=item.nodeid, when="call")
    yield
    _emit(ev="phase", case=item.nodeid, when="teardown")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    result = yield  # raises when the test function raised
    _state["body"] = True  # the test function returned: it is past its last assertion
    _emit(ev="body", case=pyfuncitem.nodeid)
    return result


def _raised_in_learner(excinfo) -> str | None:
    """Where in the learner's module a skip/xfail/exit was raised, or None."""
    target = _module_file()
    if not target:
        return None
    target = os.path.realpath(target)
    for entry in excinfo.traceback:
        if os.path.realpath(str(entry.path)) == target:
            return f"{os.path.relpath(target, _BOX)}:{entry.lineno + 1}"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and report.failed:
        report._judge_exc_type = call.excinfo.typename  # noqa: SLF001
    if call.excinfo is not None and report.skipped:
        where = _raised_in_learner(call.excinfo)
        if where:  # a skipped case is not counted: a skip from the learner's code is a failure
            report.outcome = "failed"
            report.longrepr = f"{where}: your code raised {call.excinfo.typename} (a skip)"
            report._judge_exc_type = "SkipFromYourCode"  # noqa: SLF001


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
            "message": _trim(getattr(crash, "message", "") or str(report.longrepr), 2000),
            "location": f"{crash.path}:{crash.lineno}" if crash is not None else None,
            "longrepr": _trim(report.longreprtext, tail=True),
            "stdout": _trim(report.capstdout, 2000),
            "stderr": _trim(report.capstderr, 2000),
        }


def pytest_runtest_logfinish(nodeid, location) -> None:
    _install_recorder()  # a module first imported in this case: recorded from the next one
    _check(f"after {nodeid}")
    if _RECORD:
        import _judge_recorder

        _judge_recorder.end_case(nodeid, _RECORD)
    _emit(
        ev="result",
        case=nodeid,
        outcome=_state.get("outcome", "passed"),
        body=_state.get("body", False),
        duration=time.perf_counter() - _state.get("t0", time.perf_counter()),
        failure=_state.get("failure"),
    )


def pytest_sessionfinish(session, exitstatus) -> None:
    _check("at the end of the run")
    _emit(ev="done", exitstatus=int(exitstatus), module_file=_module_file())
