"""The speed run: the learner's module and the engine's own, timed in one process on one GPU.

The judge (speed.py) copies this file into the sandbox as ``_judge_bench.py`` and runs it
once every case has passed: ``python _judge_bench.py CONFIG_JSON``. It writes one result
line, HMAC-sealed like the plugin's events, with a key it reads from the pipe
``JUDGE_SEAL_FD`` before anything of the exercise is imported. In order:

1. Read the key; put the sandbox first on ``sys.path`` (the run is ``python -I``, so
   no ``PYTHONPATH`` and no file planted in the sandbox is read at start-up); import torch; load the reference (the engine's module, copied beside this
   file, imported as ``<its package>._judge_reference``) and the exercise's benchmark module (its
   workloads).
2. Keep the originals of the timing machinery (the CUDA event's C methods, the device
   synchronize, ``time.perf_counter``, the flush's ``zero_``, ``torch.equal``) and snapshot
   what a submission could patch to fake a timing: ``torch.cuda``'s events, streams and
   synchronize, ``time``, ``builtins``, torch's tensor methods used here, every loaded
   ``triton`` module, the reference's and the benchmark's namespaces and this file's own.
3. Import the learner's module. The snapshot is compared after the import and after each
   workload; a difference is a ``tamper`` result naming it (the verdict Rejected).
4. Per workload: each side gets its own inputs and KV pool (the same seed, so the same
   bytes), ``warmup`` untimed calls, then ``repeat`` rounds, interleaved (the side that
   goes first alternates), each call after an L2 flush (``zero_`` of a 256 MiB buffer,
   which also keeps the GPU busy while the call is launched) between two CUDA events
   recorded with the event's C method. Then the same rounds on the wall clock: flush,
   synchronize, ``perf_counter``, the call, synchronize, ``perf_counter``. Last, both pools
   are cleared and each side called once more: the outputs must be equal, so a function
   that skips work once it is being timed is caught.

A benchmark module (``[speed] bench`` in problem.md) defines ``workloads() -> list[str]``,
``make(name, device) -> case``, ``call(module, case)`` and ``output(case) -> tuple of
tensors``. What this does not stop: code that reaches into the reference's kernel objects
or this process's memory (``gc``, ctypes) to slow the reference down; it takes reverse
engineering of the judge, not a patch, and the verdict record names the file that did it.
"""

from __future__ import annotations

import hmac
import importlib
import importlib.util
import inspect
import json
import os
import sys
import time
import traceback
import types

FLUSH_BYTES = 256 * 1024 * 1024  # several times any GPU's L2 (50 MiB on an H100 or H200)
_MISSING = object()
_SKIP = {"__dict__", "__weakref__", "__doc__", "__module__", "__annotations__"}


def read_key() -> bytes:
    """The sealing key from the inherited pipe (``JUDGE_SEAL_FD``), which is then closed."""
    fd = int(os.environ.pop("JUDGE_SEAL_FD", "-1"))
    key = b""
    if fd >= 0:
        while len(key) < 32:
            chunk = os.read(fd, 32 - len(key))
            if not chunk:
                break
            key += chunk
        os.close(fd)
    return key


def sealer(key: bytes, path: str):
    """``emit(**result)``: one sealed line ``{"s": json, "m": HMAC-SHA256}`` to ``path``."""
    mac = hmac.new(key, digestmod="sha256")
    out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the process's life
    write, flush, dumps = out.write, out.flush, json.dumps

    def emit(**result) -> None:
        body = dumps(result, default=str)
        m = mac.copy()
        m.update(body.encode())
        write(dumps({"s": body, "m": m.hexdigest()}) + "\n")
        flush()

    return emit


class Watch:
    """Objects by where they are found (``owner.name``, looked up statically, so a class's
    descriptors keep their identity); ``changed()`` names those replaced since."""

    def __init__(self) -> None:
        self.items: dict = {}
        self.seen: set = set()  # (owner, name) once, under the first label it was found by

    def attr(self, owner, name: str, label: str) -> None:
        obj = inspect.getattr_static(owner, name, _MISSING)
        if obj is not _MISSING and (id(owner), name) not in self.seen:
            self.seen.add((id(owner), name))
            self.items[label] = (owner, name, obj, getattr(obj, "__code__", None))

    def names(self, owner, names, label: str) -> None:
        for name in names:
            self.attr(owner, name, f"{label}.{name}")

    def namespace(self, owner, label: str, depth: int = 0) -> None:
        """Every callable and class in ``owner`` (a module or class) defined there; a
        class's own members one level down."""
        home = owner.__name__ if isinstance(owner, types.ModuleType) else owner.__module__
        for name, obj in list(vars(owner).items()):
            if name in _SKIP:
                continue
            if isinstance(obj, type):
                if depth == 0 and obj.__module__ == home:
                    self.attr(owner, name, f"{label}.{name}")
                    self.namespace(obj, f"{label}.{name}", depth + 1)
            elif callable(obj) or isinstance(obj, (staticmethod, classmethod, property)):
                self.attr(owner, name, f"{label}.{name}")

    def module_values(self, mod: types.ModuleType, label: str) -> None:
        """Every public name of ``mod`` (the reference: its kernels are objects, not functions)."""
        for name in list(vars(mod)):
            if not name.startswith("__"):
                self.attr(mod, name, f"{label}.{name}")

    def changed(self) -> list:
        out = []
        for label, (owner, name, obj, code) in self.items.items():
            now = inspect.getattr_static(owner, name, _MISSING)
            if now is not obj:
                out.append(f"{label} was {'removed' if now is _MISSING else 'replaced'}")
            elif code is not None and getattr(obj, "__code__", None) is not code:
                out.append(f"{label}.__code__ was replaced")
        return out


def watch_timing(torch, extra_modules=()) -> Watch:
    """The snapshot of step 2 (module docstring): what a faked timing would have to patch."""
    import builtins

    w = Watch()
    cuda = torch.cuda
    w.names(
        cuda,
        [
            "Event",
            "Stream",
            "synchronize",
            "current_stream",
            "default_stream",
            "set_stream",
            "stream",
            "is_available",
            "current_device",
            "set_device",
            "device",
        ],
        "torch.cuda",
    )
    for name in ("record", "elapsed_time", "synchronize", "query", "wait", "__new__", "__init__"):
        w.attr(cuda.Event, name, f"torch.cuda.Event.{name}")
        for base in cuda.Event.__mro__[1:-1]:
            w.attr(base, name, f"{base.__module__}.{base.__name__}.{name}")
    for modname in ("torch.cuda", "torch.cuda.streams"):
        if modname in sys.modules:
            w.namespace(sys.modules[modname], modname)
    w.names(
        time,
        ["perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "sleep"],
        "time",
    )
    w.names(builtins, [n for n in vars(builtins) if not n.startswith("_")], "builtins")
    w.names(torch, ["equal", "empty", "zeros", "randn", "randperm", "Generator"], "torch")
    w.names(torch.Tensor, ["zero_", "copy_", "clone", "to", "contiguous", "view"], "torch.Tensor")
    if "torch._C" in sys.modules:
        w.names(torch._C, ["_cuda_synchronize"], "torch._C")
    for name, mod in list(sys.modules.items()):
        if mod is not None and (name == "triton" or name.startswith("triton.")):
            w.namespace(mod, name)
    for label, mod in extra_modules:
        w.module_values(mod, label)
    return w


def load_file(path: str, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def time_workload(bench, ref, mine, name: str, device, cfg: dict, tools: dict) -> dict:
    """Step 4 of the module docstring for one workload; times in milliseconds."""
    cases = [bench.make(name, device), bench.make(name, device)]
    calls = [lambda: bench.call(ref, cases[0]), lambda: bench.call(mine, cases[1])]
    Event, record, elapsed = tools["Event"], tools["record"], tools["elapsed"]
    sync, now, flush, stream = tools["sync"], tools["now"], tools["flush"], tools["stream"]
    for _ in range(cfg["warmup"]):
        calls[0]()
        calls[1]()
    sync()
    marks: list = [[], []]
    for i in range(cfg["repeat"]):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            start, end = Event(enable_timing=True), Event(enable_timing=True)
            flush()
            record(start, stream)
            calls[side]()
            record(end, stream)
            marks[side].append((start, end))
    sync()
    event_ms = [[elapsed(s, e) for s, e in marks[k]] for k in (0, 1)]
    wall_ms: list = [[], []]
    for i in range(cfg["repeat"]):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            flush()
            sync()
            t0 = now()
            calls[side]()
            sync()
            wall_ms[side].append((now() - t0) * 1e3)
    # last, both pools cleared and one more call each: a function that stops working once
    # it has been called a few times leaves its pool empty, and the outputs differ
    equal, zero = tools["equal"], tools["zero"]
    for case in cases:
        for t in bench.output(case):
            zero(t)
    calls[0]()
    calls[1]()
    sync()
    same = all(
        equal(a, b) for a, b in zip(bench.output(cases[0]), bench.output(cases[1]), strict=True)
    )
    return {
        "name": name,
        "ref_ms": event_ms[0],
        "mine_ms": event_ms[1],
        "ref_wall_ms": wall_ms[0],
        "mine_wall_ms": wall_ms[1],
        "same_output": bool(same),
    }


def main(argv: list) -> int:
    emit = sealer(read_key(), json.loads(argv[1])["out"])
    cfg = json.loads(argv[1])
    sys.path[:0] = cfg["path"]  # run with -I: the sandbox comes first, and nothing else it holds
    try:
        import torch

        parent = cfg["module"].rpartition(".")[0]
        if parent:  # the engine's packages around the learner's module are not the learner's
            importlib.import_module(parent)
        # the reference lives in its package, where its relative imports (``from .. import``)
        # resolve; the learner's module is imported by its own name below
        ref = load_file(
            cfg["reference"], f"{parent}._judge_reference" if parent else "_judge_reference"
        )
        bench = load_file(cfg["bench"], "_judge_workloads")
        cuda = torch.cuda.is_available()
        tools: dict = {}
        if cuda:
            device = torch.device("cuda")
            base = type.mro(torch.cuda.Event)[1]  # the C event type: its methods stay put
            buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
            zero = torch.Tensor.zero_
            tools = {
                "Event": torch.cuda.Event,
                "record": base.record,
                "elapsed": base.elapsed_time,
                "sync": getattr(torch._C, "_cuda_synchronize", torch.cuda.synchronize),
                "now": time.perf_counter,
                "equal": torch.equal,
                "stream": torch.cuda.current_stream(),
                "flush": lambda: zero(buf),
                "zero": zero,
            }
            # one call of the reference first: Triton's compiler and launcher are loaded
            # (and watched below) before the learner's code can touch them
            first = bench.workloads()[0]
            bench.call(ref, bench.make(first, device))
            tools["sync"]()
        watch = watch_timing(
            torch,
            [
                ("the reference", ref),
                ("the benchmark", bench),
                ("the judge's speed run", sys.modules[__name__]),
            ],
        )
    except Exception:  # noqa: BLE001 - the judge's own side failed: say so, not a verdict
        emit(error="the speed run could not start:\n" + traceback.format_exc()[-3000:])
        return 0
    try:
        mine = importlib.import_module(cfg["module"])
    except BaseException:  # noqa: BLE001 - the learner's import: its error is the verdict
        emit(error="importing your module failed:\n" + traceback.format_exc()[-3000:])
        return 0
    changed = watch.changed()
    if changed:
        emit(tamper=[f"{c} (when your module was imported)" for c in changed[:50]])
        return 0
    where = os.path.realpath(getattr(mine, "__file__", "") or "")
    if not where.startswith(os.path.realpath(cfg["path"][0]) + os.sep):
        emit(error=f"the speed run imported {cfg['module']} from {where}, not the sandbox")
        return 0
    if not cuda:
        emit(error="no CUDA device in the speed run")
        return 0
    results = []
    for name in bench.workloads():
        try:
            result = time_workload(bench, ref, mine, name, device, cfg, tools)
        except BaseException:  # noqa: BLE001
            emit(error=f"{name}: your module raised:\n" + traceback.format_exc()[-3000:])
            return 0
        changed = watch.changed()
        if torch.cuda.current_stream() != tools["stream"]:
            changed.append("the current CUDA stream was changed")
        if changed:
            emit(tamper=[f"{c} (while {name} was timed)" for c in changed[:50]])
            return 0
        results.append(result)
        torch.cuda.empty_cache()
    emit(
        workloads=results,
        device_name=torch.cuda.get_device_name(0),
        warmup=cfg["warmup"],
        repeat=cfg["repeat"],
        flush_bytes=FLUSH_BYTES,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
