"""The verdict record: ``judge.py ID --report FILE`` writes it, ``judge.py verify FILE``
re-runs the judge on the same file and compares.

A record is JSON: the exercise, the verdict, the SHA-256 of the submitted file, of the
engine module it replaces, of every test file that judged it and of the judge's own code,
each case's outcome and seconds (the judge's clock), the device and the versions of Python,
pytest, torch and CUDA, and for an exercise graded on speed the speed part (speed.py): the
method, every workload's medians and raw times in ms, yours and the reference's, by CUDA
events and by the wall clock, and the ratio. A course collects records; ``verify`` proves one is what this
checkout's judge says of that file (the case times are shown, never compared: they are the
machine's, not the submission's).
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from pathlib import Path
from typing import List

from . import chapter
from .integrity import sha256_file
from .problems import Problem
from .sandbox import own_test_name
from .verdict import Verdict

FORMAT = 1


def _test_files(root: Path, problem: Problem, targets: List[str]) -> dict:
    out = {}
    for test in problem.own_tests:
        out[str(test.relative_to(root))] = sha256_file(test)
    own = {own_test_name(problem, t) for t in problem.own_tests}
    for t in targets:
        path = t.split("::")[0]
        if path not in own and (root / path).is_file():
            out[path] = sha256_file(root / path)
    for extra in ("tests/conftest.py", "conftest.py"):
        if (root / extra).is_file():
            out[extra] = sha256_file(root / extra)
    return dict(sorted(out.items()))


def _judge_code(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted((root / "practice" / "judgelib").glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def make(root: Path, problem: Problem, file: Path, v: Verdict, quick: bool) -> dict:
    """The record of verdict ``v`` of ``file`` for ``problem``."""
    rec = v.record or {}
    return {
        "format": FORMAT,
        "exercise": problem.id,
        "title": problem.title,
        "verdict": v.name,
        "passed": v.passed,
        "total": v.total,
        "skipped": v.skipped,
        "first_failure": v.case,
        "quick": quick,
        "submission": {"path": str(file), "sha256": sha256_file(file)},
        "engine_module": {
            "path": problem.module,
            "chapter": problem.chapter,
            "sha256": hashlib.sha256(chapter.engine_source(root, problem).encode()).hexdigest(),
        },
        "tests": _test_files(root, problem, rec.get("targets", [])),
        "judge_sha256": _judge_code(root),
        "cases": rec.get("cases", []),
        # the comparison the verdict rests on: the inputs' seed, both records' hashes and
        # where they first differ (compare.py)
        "seed": rec.get("seed"),
        "reference": rec.get("reference"),
        "record_sha256": rec.get("record_sha256"),
        "speed": rec.get("speed"),
        "device": rec.get("device", "?"),
        "device_name": rec.get("device_name", ""),
        "versions": rec.get("versions", {}),
        "host": platform.node(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def compare(old: dict, new: dict) -> List[str]:
    """What differs between a record and a fresh one of the same file (empty: verified;
    lines starting with ``note:`` do not count)."""
    out = []
    for key in ("exercise", "verdict", "passed", "total", "skipped", "first_failure"):
        if old.get(key) != new.get(key):
            out.append(f"{key}: recorded {old.get(key)!r}, now {new.get(key)!r}")
    if old.get("record_sha256") != new.get("record_sha256"):
        out.append("the record of what the code did differs from the recorded one")
    if old["submission"]["sha256"] != new["submission"]["sha256"]:
        out.append("the submitted file is not the one recorded (SHA-256 differs)")
    for path, digest in old.get("tests", {}).items():
        now = new.get("tests", {}).get(path)
        if now != digest:
            out.append(f"test file {path}: {'absent now' if now is None else 'changed since'}")
    was_speed, now_speed = old.get("speed") or {}, new.get("speed") or {}
    if was_speed.get("ratio") is not None and now_speed.get("ratio") is not None:
        out.append(  # the machine's figure, like the case times: shown, never compared
            f"note: speed {was_speed['ratio']:.2f}x the reference recorded, "
            f"{now_speed['ratio']:.2f}x now"
        )
    if old.get("judge_sha256") != new.get("judge_sha256"):
        out.append("note: the judge's code differs from the recorded one")
    was = {c["case"]: c["outcome"] for c in old.get("cases", [])}
    now = {c["case"]: c["outcome"] for c in new.get("cases", [])}
    for case in sorted(set(was) | set(now)):
        if was.get(case) != now.get(case):
            out.append(f"{case}: recorded {was.get(case)}, now {now.get(case)}")
    return out
