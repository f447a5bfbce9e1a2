"""The verdict's evidence: the learner's record against the engine's, compared in the judge.

Both records are JSON files written by recorder.py in two judged processes: one ran the
tests with the learner's module, one with the engine's own, on the same inputs (the same
seed). This module only parses JSON and compares values; it never imports or runs anything
either process wrote. Integers, strings, flags and integer tensors must be equal; floats and
float tensors agree within a tolerance that depends on their dtype.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

MAX_RECORD_BYTES = 256 * 1024 * 1024
# (rtol, atol) by dtype; a Python float is compared like float64
TOLERANCE = {
    "float64": (1e-6, 1e-9),
    "float32": (1e-3, 1e-4),
    "float16": (3e-2, 3e-2),
    "bfloat16": (3e-2, 3e-2),
}
DEFAULT_TOLERANCE = (1e-3, 1e-4)


@dataclass
class Record:
    """case -> symbol -> {"n": calls, "calls": [summaries]}; ``repeated``: cases written
    more than once (a record written twice is not trusted)."""

    cases: Dict[str, dict]
    repeated: List[str]
    unreadable: str = ""


def load(path: Path) -> Record:
    cases: Dict[str, dict] = {}
    repeated: List[str] = []
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            return Record({}, [], f"the record is larger than {MAX_RECORD_BYTES >> 20} MiB")
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return Record({}, [], "no record was written")
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            case, calls = str(entry["case"]), dict(entry["calls"])
        except (ValueError, KeyError, TypeError):
            return Record(cases, repeated, f"line {n} of the record is not a case record")
        if case in cases:
            repeated.append(case)
        cases[case] = calls
    return Record(cases, repeated)


def _close(a, b, rtol: float, atol: float) -> bool:
    if isinstance(a, str) or isinstance(b, str):  # 'nan', 'inf'
        return a == b
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return False
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= atol + rtol * abs(b)


def _tensor_diff(got: dict, ref: dict, where: str) -> Optional[str]:
    for key in ("t", "s"):
        if got.get(key) != ref.get(key):
            name = "dtype" if key == "t" else "shape"
            return f"{where}: {name} {got.get(key)} where the engine's is {ref.get(key)}"
    if "h" in ref:
        if got.get("h") != ref["h"]:
            return f"{where}: values {got.get('head')} ... where the engine's are {ref.get('head')} ..."
        return None
    if "sum" not in ref:
        return None  # a large attribute: dtype and shape only
    rtol, atol = TOLERANCE.get(ref["t"], DEFAULT_TOLERANCE)
    numel = math.prod(ref["s"]) if ref["s"] else 1
    if got.get("nonfinite") != ref.get("nonfinite"):
        return f"{where}: {got.get('nonfinite')} NaN/inf values where the engine has {ref.get('nonfinite')}"
    sample_got, sample_ref = got.get("x", []), ref.get("x", [])
    if len(sample_got) != len(sample_ref):
        return f"{where}: a different number of values"
    for i, (a, b) in enumerate(zip(sample_got, sample_ref)):
        if not _close(a, b, rtol, atol):
            return f"{where}: value {a!r} where the engine has {b!r} (sampled element {i})"
    bound = rtol * float(ref.get("abs", 0.0)) + atol * numel
    if not isinstance(got.get("sum"), (int, float)) or abs(got["sum"] - ref["sum"]) > bound:
        return f"{where}: values sum to {got.get('sum')!r} where the engine's sum to {ref['sum']!r}"
    return None


def show(value, limit: int = 160) -> str:
    """A summary as the learner should read it."""
    if isinstance(value, dict):
        if "f" in value:
            return repr(value["f"])
        if "t" in value:
            head = f", {value['head']}" if "head" in value else ""
            return f"tensor({value['t']}, shape {value['s']}{head})"
        if "ints" in value:
            return f"{value['head']}{' ...' if value['n'] > 16 else ''} ({value['n']} ints)"
        if "raised" in value:
            return f"raised {value['raised']}"
        if "o" in value:
            return f"a {value['o']}"
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + " ..."


def diff(got, ref, where: str = "") -> Optional[str]:
    """None when ``got`` agrees with ``ref``, else where and how they first differ."""
    if not isinstance(ref, dict):
        same = type(got) is type(ref) and got == ref
        return (
            None
            if same
            else f"{where or 'the value'}: {show(got)} where the engine's is {show(ref)}"
        )
    if not isinstance(got, dict):
        return f"{where or 'the value'}: {show(got)} where the engine's is {show(ref)}"
    if "t" in ref and "s" in ref:
        return _tensor_diff(got, ref, where or "the tensor")
    if "f" in ref:
        rtol, atol = TOLERANCE["float64"]
        ok = "f" in got and _close(got["f"], ref["f"], rtol, atol)
        return (
            None if ok else f"{where or 'the value'}: {show(got)} where the engine's is {show(ref)}"
        )
    if "l" in ref:
        if got.get("n") != ref["n"] or "l" not in got:
            return f"{where or 'the list'}: {got.get('n')} items where the engine's has {ref['n']}"
        for i, (a, b) in enumerate(zip(got["l"], ref["l"])):
            d = diff(a, b, f"{where}[{i}]")
            if d:
                return d
        return None
    if "d" in ref:
        if "d" not in got or set(got["d"]) != set(ref["d"]):
            return f"{where or 'the dict'}: keys {sorted(got.get('d', {}))[:8]} where the engine's are {sorted(ref['d'])[:8]}"
        for k in ref["d"]:
            d = diff(got["d"][k], ref["d"][k], f"{where}[{k!r}]")
            if d:
                return d
        return None
    if "a" in ref:  # an object: the engine's fields must be there and agree; more are fine
        if got.get("o") != ref.get("o"):
            return f"{where or 'the value'}: {show(got)} where the engine's is {show(ref)}"
        for k in ref["a"]:
            if k not in got.get("a", {}):
                return f"{where}.{k}: missing where the engine has {show(ref['a'][k])}"
            d = diff(got["a"][k], ref["a"][k], f"{where}.{k}")
            if d:
                return d
        return None
    if "yielded" in ref or "returned" in ref:
        for k in ("yielded", "returned"):
            d = diff(got.get(k), ref.get(k), f"{where} ({k})") if k in ref else None
            if d:
                return d
        return None
    if got != ref:
        return f"{where or 'the value'}: {show(got)} where the engine's is {show(ref)}"
    return None


def _call_diff(got: dict, ref: dict) -> Optional[str]:
    if "raised" in ref or "raised" in got:
        if got.get("raised") == ref.get("raised"):
            return None
        mine = f"raised {got['raised']}" if "raised" in got else f"returned {show(got.get('r'))}"
        theirs = f"raised {ref['raised']}" if "raised" in ref else f"returned {show(ref.get('r'))}"
        return f"{mine} where the engine's {theirs}"
    d = diff(got.get("r"), ref.get("r"), "returned")
    for i, (a, b) in enumerate(zip(got.get("args") or [], ref.get("args") or [])):
        if d is None and b is not None:
            d = diff(a, b, f"argument {i + 1} afterwards")
    if d is None and "self" in ref:
        d = diff(got.get("self"), ref["self"], "self afterwards")
    return d


def case_diff(got: dict, ref: dict) -> Optional[str]:
    """How one case's calls differ: the first symbol and call that disagree, or None."""
    for symbol in sorted(set(ref) | set(got)):
        r = ref.get(symbol, {"n": 0, "calls": []})
        g = got.get(symbol, {"n": 0, "calls": []})
        for i, (a, b) in enumerate(zip(g.get("calls", []), r["calls"]), 1):
            d = _call_diff(a, b)
            if d:
                return f"{symbol}, call {i} of {r['n']}: {d}"
        if g.get("n") != r["n"]:
            return f"{symbol}: {g.get('n')} calls where the engine's made {r['n']}"
    return None


def compare(got: Record, ref: Record, cases: List[str]) -> Tuple[List[str], Dict[str, str]]:
    """(cases that agree, case -> how it differs) for the reference's ``cases``."""
    agree: List[str] = []
    differ: Dict[str, str] = {}
    for case in cases:
        if got.unreadable:
            differ[case] = got.unreadable
        elif case in got.repeated:
            differ[case] = "its record was written more than once"
        elif case not in got.cases:
            differ[case] = "no record of it was written"
        else:
            d = case_diff(got.cases[case], ref.cases.get(case, {}))
            if d:
                differ[case] = d
            else:
                agree.append(case)
    return agree, differ
