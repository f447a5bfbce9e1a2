"""Known wrong answers: what `check` proves an exercise's tests catch.

A wrong answer is ``broken/<name>.toml`` beside problem.md: only what differs from the
engine module, as text replacements applied to the module as it is today, so it follows
the engine as the engine changes::

    about = "counts only this step's prompt tokens, so it admits requests whose output does not fit"
    expect = "test_refuses_a_request_past_the_kv_limit"   # the first case that must fail
    verdict = "Wrong answer"                              # the default; or "Runtime error", ...

    [[replace]]
    old = "needed = (req.input_len - handle.cached_len) + req.output_len"
    new = "needed = req.input_len - handle.cached_len"

Multi-line snippets are TOML's ``'''`` strings (the newline right after the opening quotes
is dropped). Each ``old`` must occur exactly once in the engine module: a replacement
that no longer applies is a ``WrongAnswerError`` naming the file and the snippet.

An exercise graded on speed keeps right but slow answers the same way, in ``slow/<name>.toml``
(``about`` and ``[[replace]]`` only): `check` proves each passes every case and is judged Too
slow on a CUDA GPU (``load_slow``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

from .problems import tomllib
from .verdict import ACCEPTED, COMPILE, RUNTIME, TLE, TOO_SLOW, WRONG

VERDICTS = (WRONG, RUNTIME, TLE, COMPILE)


class WrongAnswerError(ValueError):
    """A wrong answer that is malformed, or no longer applies to the engine module."""


@dataclass
class WrongAnswer:
    name: str  # the file's name, e.g. past_kv_limit.toml
    about: str  # the mistake, in a sentence
    expect: str  # the test (or node id fragment) that must fail first
    verdict: str  # the verdict it must get
    replace: List[Tuple[str, str]]  # (old, new) snippets of the engine module
    folder: str = "broken"  # or "slow": a right but slow answer

    def apply(self, engine_source: str, module: str) -> str:
        """``engine_source`` (the text of ``module``) with the replacements made."""
        source = engine_source
        for i, (old, new) in enumerate(self.replace, 1):
            count = source.count(old)
            if count != 1:
                first = old.strip().splitlines()[0] if old.strip() else repr(old)
                raise WrongAnswerError(
                    f"{self.folder}/{self.name}: replacement {i} no longer applies: its old text "
                    f"(starting {first!r}) occurs {count} times in {module}, not once"
                )
            source = source.replace(old, new)
        return source


def load_slow(path: Path) -> WrongAnswer:
    """Read ``slow/<name>.toml``: a right answer the speed part must judge Too slow."""
    return load(path, slow=True)


def load(path: Path, slow: bool = False) -> WrongAnswer:
    """Read ``broken/<name>.toml`` (``slow``: ``slow/<name>.toml``); WrongAnswerError names
    the file when it is malformed."""
    folder = "slow" if slow else "broken"
    where = f"{folder}/{path.name}"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise WrongAnswerError(f"{where}: not TOML: {e}") from None
    unknown = set(data) - (
        {"about", "replace"} if slow else {"about", "expect", "verdict", "replace"}
    )
    if unknown:
        raise WrongAnswerError(f"{where}: unknown keys {', '.join(sorted(unknown))}")
    about, expect = data.get("about"), data.get("expect", "" if slow else None)
    verdict = TOO_SLOW if slow else data.get("verdict", WRONG)
    if not isinstance(about, str) or not isinstance(expect, str):
        need = 'about = "..."' if slow else 'about = "..." and expect = "test"'
        raise WrongAnswerError(f"{where}: needs {need}")
    if verdict not in VERDICTS and not slow:
        raise WrongAnswerError(
            f"{where}: verdict {verdict!r} is none of {', '.join(VERDICTS)}"
            + (" (a wrong answer must fail)" if verdict == ACCEPTED else "")
        )
    pairs = data.get("replace")
    if (
        not isinstance(pairs, list)
        or not pairs
        or not all(
            isinstance(p, dict)
            and set(p) == {"old", "new"}
            and all(isinstance(v, str) for v in p.values())
            for p in pairs
        )
    ):
        raise WrongAnswerError(f"{where}: needs one or more [[replace]] tables with old and new")
    pairs = [(p["old"], p["new"]) for p in pairs]
    return WrongAnswer(path.name, about, expect, verdict, pairs, folder)
