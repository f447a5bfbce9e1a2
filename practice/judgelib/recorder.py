"""What the exercise's code did, case by case: runs inside the judged process.

The judge copies this file into the sandbox as ``_judge_recorder.py``; the plugin installs
it once the tests have imported the exercise's module. Every function the exercise asks for
(problem.md's ``symbols``) gets its code object swapped for a trampoline that calls the
original and records a summary of what it returned (and, for a method, of ``self``
afterwards). Swapping ``__code__`` rather than the module attribute reaches every caller,
including those that imported the function by name before the swap.

The record is plain JSON the parent reads after this process has exited (compare.py). It is
*evidence to compare*, never a claim that anything passed: the same tests run with the
engine's own module in another process write the reference record, and a verdict needs the
two to agree. A submission that rewrites its own record has to write the reference's
outputs for inputs drawn at judge time, which is solving the exercise.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import json
import math
import threading
import types

MAX_CALLS = 400  # calls kept per symbol per case (the count is always kept)
SAMPLE = 64  # elements of a float tensor kept, evenly spaced
MAX_ITEMS = 64  # items of a list, tuple or dict summarised
SMALL_TENSOR = 1 << 16  # an attribute's tensor larger than this keeps only dtype and shape
MAX_DEPTH = 3
ADDRESS = 1 << 32  # an int key this large is an id(), not a value

_ORIGINALS: dict = {}  # symbol -> the original function (a copy of it, code intact)
_METHODS: set = set()  # symbols that are methods: ``self`` is summarised after the call
_CASE: dict = {}  # symbol -> {"n": calls, "calls": [...]} for the running case
_STATE = threading.local()  # .depth: symbol calls on this thread's stack


def _tensor(t, attribute: bool) -> dict:
    import torch

    out = {"t": str(t.dtype).removeprefix("torch."), "s": list(t.shape)}
    if attribute and t.numel() > SMALL_TENSOR:
        return out
    flat = t.detach().reshape(-1)
    if t.is_floating_point() or t.is_complex():
        x = flat.to(torch.float64).cpu()
        finite = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
        out["sum"] = float(finite.sum())
        out["abs"] = float(finite.abs().sum())
        out["nonfinite"] = int((~torch.isfinite(x)).sum())
        if x.numel():
            n = min(SAMPLE, x.numel())
            idx = torch.arange(n) * (x.numel() - 1) // max(n - 1, 1)  # exact, at any size
            out["x"] = [_float(v) for v in x[idx].tolist()]
    else:
        data = flat.cpu().contiguous()
        out["h"] = hashlib.sha256(data.numpy().tobytes()).hexdigest()[:32]
        out["head"] = data[:16].tolist()
    return out


def _is_tensor(value) -> bool:
    return (type(value).__module__ or "").startswith("torch") and hasattr(value, "shape")


def _float(v: float):
    return v if math.isfinite(v) else repr(v)


def summarise(value, depth: int = 0, attribute: bool = False):
    """A JSON-able summary of ``value``: exact for integers, strings and integer tensors,
    sums and a sample for floats (compare.py applies the tolerance)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value if not isinstance(value, str) else value[:4000]
    if isinstance(value, enum.Enum):
        return {"e": f"{type(value).__name__}.{value.name}"}
    if isinstance(value, float):
        return {"f": _float(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return {"b": hashlib.sha256(data).hexdigest()[:32], "n": len(data)}
    mod = type(value).__module__ or ""
    if mod.startswith("torch") and type(value).__name__ in ("Tensor", "Parameter"):
        return _tensor(value, attribute)
    if mod.startswith("numpy") and hasattr(value, "dtype") and hasattr(value, "shape"):
        import torch

        return _tensor(torch.as_tensor(value), attribute)
    if depth >= MAX_DEPTH:
        return {"o": type(value).__name__}
    if isinstance(value, (list, tuple, range)) or type(value).__name__ == "deque":
        items = list(value)
        if items and all(type(i) is int for i in items):
            digest = hashlib.sha256(repr(items).encode()).hexdigest()[:32]
            return {"ints": digest, "n": len(items), "head": items[:16]}
        return {
            "l": [summarise(i, depth + 1, attribute) for i in items[:MAX_ITEMS]],
            "n": len(items),
        }
    if isinstance(value, (set, frozenset)):
        try:
            items = sorted(value)
        except TypeError:
            return {"set": len(value)}
        return summarise(items, depth, attribute)
    if isinstance(value, dict):
        if any(type(k) is int and k >= ADDRESS for k in value):
            return {"dict": len(value)}  # keyed by id(): the addresses differ between runs
        keys = sorted(value, key=str)[:MAX_ITEMS]
        return {"d": {str(k): summarise(value[k], depth + 1, attribute) for k in keys}}
    if (
        isinstance(value, (types.FunctionType, types.MethodType, types.ModuleType, type))
        or inspect.isgenerator(value)
        or inspect.iscoroutine(value)
    ):
        return {"o": type(value).__name__}
    return _object(value, depth)


def _object(value, depth: int) -> dict:
    """An object by its public fields: integers, strings, flags, enums, small tensors and
    lists, and (one level down) the objects it holds. Private fields (``_free_slots``) are
    the learner's own design, and floats are clocks and rates more often than answers:
    both are left out."""
    try:
        fields = dict(vars(value))
    except TypeError:
        fields = {}
        for klass in type(value).__mro__:
            for name in getattr(klass, "__slots__", ()):
                if hasattr(value, name):
                    fields[name] = getattr(value, name)
    attrs = {}
    for name in sorted(fields)[: 4 * MAX_ITEMS]:
        v = fields[name]
        if name.startswith("_") or isinstance(v, float) or callable(v) and not hasattr(v, "shape"):
            continue
        attrs[name] = summarise(v, depth + 1, attribute=True)
    return {"o": type(value).__name__, "a": attrs}


def _record(symbol: str, args: tuple, result=None, raised: BaseException | None = None) -> None:
    thread = threading.current_thread()
    if thread is not threading.main_thread():  # threads interleave: each keeps its own order
        symbol = f"{symbol} [{thread.name}]"
    entry = _CASE.setdefault(symbol, {"n": 0, "calls": []})
    entry["n"] += 1
    if len(entry["calls"]) >= MAX_CALLS:
        return
    try:
        if raised is not None:
            call = {"raised": type(raised).__name__}
        else:
            call = {"r": summarise(result)}
            if result is None:  # a kernel's launcher writes its outputs into its arguments
                tensors = [summarise(a) if _is_tensor(a) else None for a in args]
                if any(t is not None for t in tensors):
                    call["args"] = tensors
        if symbol in _METHODS and args:  # its own fields, and only the flat ones of what it holds
            call["self"] = summarise(args[0], depth=1)
    except Exception as e:  # noqa: BLE001 - the record fails, never the code it watches
        call = {"unrecorded": f"{type(e).__name__}: {e}"[:200]}
    entry["calls"].append(call)


def _call(symbol: str, args: tuple, kwargs: dict):
    fn = _ORIGINALS[symbol]
    depth = getattr(_STATE, "depth", 0)
    if depth:  # a symbol called by a symbol: the outer call's result is what counts
        return fn(*args, **kwargs)
    _STATE.depth = 1
    try:
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            _record(symbol, args, raised=e)
            raise
        _record(symbol, args, result)
        return result
    finally:
        _STATE.depth = 0


async def _acall(symbol: str, args: tuple, kwargs: dict):
    try:
        result = await _ORIGINALS[symbol](*args, **kwargs)
    except BaseException as e:
        _record(symbol, args, raised=e)
        raise
    _record(symbol, args, result)
    return result


def _gen(symbol: str, args: tuple, kwargs: dict):
    items = []
    result = yield from _tee(_ORIGINALS[symbol](*args, **kwargs), items)
    _record(symbol, args, {"yielded": items, "returned": result})
    return result


def _tee(gen, items: list):
    for item in gen:
        items.append(item)
        yield item
    return None


async def _agen(symbol: str, args: tuple, kwargs: dict):
    items = []
    async for item in _ORIGINALS[symbol](*args, **kwargs):
        items.append(item)
        yield item
    _record(symbol, args, {"yielded": items})


_TEMPLATES = {
    "sync": "def {name}(*args, **kwargs):\n{refs}    return __judge_call__({key!r}, args, kwargs)\n",
    "async": "async def {name}(*args, **kwargs):\n{refs}"
    "    return await __judge_acall__({key!r}, args, kwargs)\n",
    "gen": "def {name}(*args, **kwargs):\n{refs}"
    "    return (yield from __judge_gen__({key!r}, args, kwargs))\n",
    "agen": "async def {name}(*args, **kwargs):\n{refs}"
    "    async for item in __judge_agen__({key!r}, args, kwargs):\n        yield item\n",
}


def _kind(code: types.CodeType) -> str:
    if code.co_flags & inspect.CO_ASYNC_GENERATOR:
        return "agen"
    if code.co_flags & inspect.CO_COROUTINE:
        return "async"
    if code.co_flags & inspect.CO_GENERATOR:
        return "gen"
    return "sync"


def _trampoline(fn: types.FunctionType, key: str) -> types.CodeType:
    """A code object that forwards to ``__judge_call__`` (a global of ``fn``, put there by
    ``install``) with as many free variables as ``fn`` has (CPython only accepts a new
    ``__code__`` with the same number)."""
    free = [f"_judge_free{i}" for i in range(len(fn.__code__.co_freevars))]
    refs = f"    ({', '.join(free)},)\n" if free else ""
    body = _TEMPLATES[_kind(fn.__code__)].format(name="_judge_trampoline", key=key, refs=refs)
    body = "".join("    " + line + "\n" for line in body.splitlines())
    src = "def _outer():\n" + "".join(f"    {v} = None\n" for v in free) + body
    src += "    return _judge_trampoline\n"
    ns: dict = {}
    exec(compile(src, "<judge recorder>", "exec"), ns)  # noqa: S102 - our own template
    return ns["_outer"]().__code__


def _resolve(module: types.ModuleType, symbol: str):
    """(function to swap, is a method) for ``name`` or ``Class.name`` in ``module``."""
    owner, *rest = symbol.split(".")
    obj = vars(module).get(owner)
    is_method = False
    if rest:
        obj = vars(obj).get(rest[0]) if isinstance(obj, type) else None
        is_method = not isinstance(obj, staticmethod)
    if isinstance(obj, property):
        obj = obj.fget
    elif isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    try:
        obj = inspect.unwrap(obj) if obj is not None else None
    except ValueError:
        return None, False
    return (obj if isinstance(obj, types.FunctionType) else None), is_method


def install(module: types.ModuleType, symbols: list) -> list:
    """Swap in the trampolines; return the symbols that could not be found."""
    entries = dict(
        __judge_call__=_call, __judge_acall__=_acall, __judge_gen__=_gen, __judge_agen__=_agen
    )
    missing = []
    for symbol in symbols:
        if symbol in _ORIGINALS:
            continue
        try:
            fn, is_method = _resolve(module, symbol)
            if fn is None:
                missing.append(symbol)
                continue
            copy = types.FunctionType(
                fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
            )
            copy.__kwdefaults__ = fn.__kwdefaults__
            copy.__qualname__ = fn.__qualname__
            code = _trampoline(fn, symbol)
            fn.__globals__.update(entries)  # where the trampoline looks its helpers up
            _ORIGINALS[symbol] = copy
            if is_method:
                _METHODS.add(symbol)
            fn.__code__ = code
        except Exception:  # noqa: BLE001 - unrecorded, its calls count as missing
            missing.append(symbol)
    return missing


def begin_case() -> None:
    _CASE.clear()
    _STATE.depth = 0


def end_case(case: str, path: str) -> None:
    """Append the running case's record to ``path`` (one JSON line)."""
    line = json.dumps({"case": case, "calls": _CASE}, default=str, allow_nan=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    _CASE.clear()
