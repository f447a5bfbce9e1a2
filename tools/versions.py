"""Each chapter's version of a file: the source as that chapter leaves it.

Every file lives once, in its final form. Where a later chapter adds lines to an earlier
chapter's file, the lines are fenced by markers, one-line comments of one form that name
the chapter (``chNN``, as the chapter's directory starts):

    # >>> ch18: a decode batch is padded to a captured size
    self.engine.graph_runner.pad_batch(batch)
    # <<< ch18

    from .graph import GraphRunner  # +ch18

Chapter N's version of the file drops every block and every line marked with a chapter
after N (markers included) and keeps the rest byte for byte, so the last chapter's version
*is* the file. Where a later chapter replaces lines rather than adding to them, and no
extension point could avoid it, the earlier lines stay in the file as comments inside a
block that says when they live:

    # >>> ch07-ch08: before the radix cache every prompt is computed whole
    # cache_type: str = "naive"
    # <<< ch07-ch08

In chapters 7 and 8 those lines are live code (uncommented, without the markers); before
chapter 7 they are gone; from chapter 9 on they stay as the comment they are in the file.
Cutting merges the blank lines around a dropped block as a formatter would, and a
``from x import (...)`` whose names were all cut goes with them.

``version(text, n)`` cuts one version; ``parse(text)`` reads the markers and raises
``MarkerError`` naming the line of the first malformed, unclosed or misnamed one. The
checks that every version is honest (no later chapter named, valid Python, formatted)
live in ``tools/version_checks.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional

_CH = r"ch(\d{2})"
OPEN = re.compile(rf"^(?P<indent>[ \t]*)# >>> {_CH}(?:-{_CH})?(?::[ \t]*(?P<note>\S.*))?$")
CLOSE = re.compile(rf"^(?P<indent>[ \t]*)# <<< {_CH}(?:-{_CH})?$")
TRAILING = re.compile(rf"^[ \t]*\S.*?[ \t]+# \+{_CH}$")
# anything that looks like a marker; each must then match one of the three forms exactly
SUSPECT = re.compile(r"(>>>|<<<)[ \t]*ch[ \t]*\d|#[ \t]*\+[ \t]*ch[ \t]*\d")


class MarkerError(ValueError):
    """A malformed, unclosed, unopened or misnested marker; the message names the line."""


@dataclass(frozen=True)
class Block:
    """Lines ``first..last`` (1-based, the markers included) of one fenced block.

    ``start`` is the chapter that adds the lines; ``until`` is set for a replaced block,
    whose lines are live code in chapters ``start..until`` and a comment after.
    """

    start: int
    until: Optional[int]
    first: int
    last: int
    note: str = ""
    indent: str = ""


@dataclass(frozen=True)
class Marked:
    """What ``parse`` found: the blocks, and the lines with a trailing ``# +chNN``."""

    blocks: tuple[Block, ...]
    trailing: dict[int, int]  # line (1-based) -> chapter

    def chapters(self) -> set[int]:
        """Every chapter a marker of this file names."""
        found = set(self.trailing.values())
        for b in self.blocks:
            found.add(b.start)
            if b.until is not None:
                found.add(b.until)
        return found


def parse(text: str, where: str = "<text>") -> Marked:
    """Read the markers of ``text``.

    Raises:
        MarkerError: for a line that looks like a marker but has none of the three forms;
            a block closed by another chapter's marker, or at another indent, or never
            closed; a replaced block's ``until`` before its start, or a block nested in a
            replaced one; a block of an earlier chapter nested in a later one; a replaced
            block whose lines are not all comments; a trailing marker inside a later block.
    """
    blocks: List[Block] = []
    trailing: dict[int, int] = {}
    stack: List[tuple[int, Optional[int], int, str, str]] = []  # start, until, line, note, indent
    for i, line in enumerate(text.split("\n"), start=1):
        opened, closed, tail = OPEN.match(line), CLOSE.match(line), TRAILING.match(line)
        if opened:
            start = int(opened.group(2))
            until = int(opened.group(3)) if opened.group(3) else None
            if until is not None and until < start:
                raise MarkerError(
                    f"{where}:{i}: a block cannot end (ch{until:02d}) before it starts"
                )
            if stack and stack[-1][1] is not None:
                raise MarkerError(f"{where}:{i}: no block may open inside a replaced block")
            if stack and start < stack[-1][0]:
                raise MarkerError(
                    f"{where}:{i}: a ch{start:02d} block inside the ch{stack[-1][0]:02d} block "
                    f"opened at line {stack[-1][2]}: the outer one already hides it"
                )
            stack.append((start, until, i, opened.group("note") or "", opened.group("indent")))
        elif closed:
            start = int(closed.group(2))
            until = int(closed.group(3)) if closed.group(3) else None
            if not stack:
                raise MarkerError(f"{where}:{i}: closes a block that was never opened")
            o_start, o_until, o_line, note, indent = stack.pop()
            if (start, until) != (o_start, o_until):
                raise MarkerError(
                    f"{where}:{i}: closes {_name(start, until)} but the block opened at line "
                    f"{o_line} is {_name(o_start, o_until)}"
                )
            if closed.group("indent") != indent:
                raise MarkerError(f"{where}:{i}: closes at another indent than line {o_line} opens")
            blocks.append(Block(o_start, o_until, o_line, i, note, indent))
        elif tail:
            chapter = int(tail.group(1))
            if stack and chapter < stack[-1][0]:
                raise MarkerError(
                    f"{where}:{i}: a ch{chapter:02d} line inside the ch{stack[-1][0]:02d} "
                    f"block opened at line {stack[-1][2]}"
                )
            if stack and stack[-1][1] is not None:
                raise MarkerError(f"{where}:{i}: a marked line inside a replaced block")
            trailing[i] = chapter
        elif SUSPECT.search(line):
            raise MarkerError(
                f"{where}:{i}: looks like a marker but is none of '# >>> chNN[: note]', "
                f"'# <<< chNN' or a line ending in '  # +chNN': {line.strip()!r}"
            )
        elif stack and stack[-1][1] is not None:
            body = line[len(stack[-1][4]) :]
            if line.strip() and not (line.startswith(stack[-1][4]) and body.startswith("#")):
                raise MarkerError(
                    f"{where}:{i}: the lines of a replaced block are comments at its indent"
                )
    if stack:
        start, until, line_no, _, _ = stack[-1]
        raise MarkerError(f"{where}:{line_no}: {_name(start, until)} is never closed")
    return Marked(tuple(sorted(blocks, key=lambda b: b.first)), trailing)


def _name(start: int, until: Optional[int]) -> str:
    return f"ch{start:02d}" + ("" if until is None else f"-ch{until:02d}")


def version(text: str, n: int, where: str = "<text>", marked: Optional[Marked] = None) -> str:
    """Chapter ``n``'s version of ``text`` (see the module docstring).

    Raises:
        MarkerError: as ``parse`` does.
    """
    marked = marked if marked is not None else parse(text, where)
    if not marked.blocks and not marked.trailing:
        return text
    result = "\n".join(line for _, line in _cut(text, n, marked))
    if _ends_dropped(text, n, marked) and text.endswith("\n"):  # one final newline
        result = result.rstrip("\n") + "\n"
    return result


def source_lines(text: str, n: int, where: str = "<text>") -> List[int]:
    """For each line of chapter ``n``'s version of ``text``, its line (1-based) in ``text``."""
    marked = parse(text, where)
    return [i + 1 for i, _ in _cut(text, n, marked)]


def chapter_of_lines(text: str, where: str = "<text>") -> Dict[int, int]:
    """Each marked line (1-based) of ``text`` -> the chapter that adds it (its innermost block's,
    or its own trailing marker's); unmarked lines are left out."""
    marked = parse(text, where)
    chapters: Dict[int, int] = {}
    for b in marked.blocks:
        if b.until is None:
            for line in range(b.first, b.last + 1):
                chapters[line] = max(chapters.get(line, 0), b.start)
    chapters.update(marked.trailing)
    return chapters


def _kept(text: str, n: int, marked: Marked) -> tuple[List[bool], Dict[int, str]]:
    """Which lines (0-based) chapter ``n`` keeps, and the ones to uncomment at an indent."""
    lines = text.split("\n")
    keep = [True] * len(lines)
    uncomment: Dict[int, str] = {}
    for b in marked.blocks:
        lo, hi = b.first - 1, b.last - 1
        if n < b.start:
            for j in range(lo, hi + 1):
                keep[j] = False
        elif b.until is not None and n <= b.until:
            keep[lo] = keep[hi] = False
            for j in range(lo + 1, hi):
                uncomment[j] = b.indent
    for line_no, chapter in marked.trailing.items():
        if n < chapter:
            keep[line_no - 1] = False
    return keep, uncomment


def _ends_dropped(text: str, n: int, marked: Marked) -> bool:
    keep, _ = _kept(text, n, marked)
    lines = text.split("\n")
    for j in range(len(lines) - 1, -1, -1):
        if lines[j].strip():
            return not keep[j]
    return False


def _cut(text: str, n: int, marked: Marked) -> List[tuple[int, str]]:
    """Chapter ``n``'s lines of ``text``, each with its 0-based line in ``text``."""
    lines = text.split("\n")
    keep, uncomment = _kept(text, n, marked)
    out: List[tuple[int, str]] = []
    blank_before = 0  # blank lines kept just before the run of dropped lines being skipped
    dropping = False
    for j, line in enumerate(lines):
        if not keep[j]:
            if not dropping:
                blank_before = _trailing_blanks([x for _, x in out])
                dropping = True
            continue
        if dropping and not line.strip():
            # the blank lines around a dropped block merge into the larger run of the two, as
            # a formatter leaves them; none at the top of a file
            if blank_before > 0 or not out:
                blank_before -= 1
                continue
        elif dropping:
            dropping = False
        if j in uncomment:
            indent = uncomment[j]
            body = line[len(indent) :]
            if body == "#":
                line = ""
            elif body:
                line = indent + (body[2:] if body.startswith("# ") else body[1:])
        out.append((j, line))
    return _drop_emptied_imports(out)


_FROM_OPEN = re.compile(r"^[ \t]*from [\w.]+ import \($")
_CLOSE_PAREN = re.compile(r"^[ \t]*\)$")


def _drop_emptied_imports(lines: List[tuple[int, str]]) -> List[tuple[int, str]]:
    """``from x import (`` and ``)`` with every name between them cut (each marked with a later
    chapter, as a formatter lays out a long import): nothing is imported, so neither stays."""
    out: List[tuple[int, str]] = []
    dropped = False
    for j, line in lines:
        if _CLOSE_PAREN.match(line) and out and _FROM_OPEN.match(out[-1][1]):
            out.pop()
            dropped = True
            continue
        if (
            dropped
            and not line.strip()
            and (not out or not out[-1][1].strip() or out[-1][1].endswith(":"))
        ):
            continue  # no blank line doubled, none opening a block
        dropped = False
        out.append((j, line))
    return out


def _trailing_blanks(lines: List[str]) -> int:
    count = 0
    for line in reversed(lines):
        if line.strip():
            break
        count += 1
    return count


def changes_in(text: str, n: int, where: str = "<text>") -> bool:
    """Whether chapter ``n`` changes this file: a marker names ``n`` (a block it adds, or a
    replaced block that comes alive or goes at ``n``)."""
    marked = parse(text, where)
    return (
        any(b.start == n or (b.until is not None and b.until + 1 == n) for b in marked.blocks)
        or n in marked.trailing.values()
    )
