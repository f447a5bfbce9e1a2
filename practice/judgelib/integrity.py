"""The judge's first line of defence: a submission that changes the judge is named.

What an Accepted rests on is not here: it is the comparison of what the learner's code
returned with what the engine's returned on the same drawn inputs, made by the judge after
both processes have exited (recorder.py, compare.py, docs/judge.md). The learner's code runs
in the same interpreter as this file's checks, so anything below it can undo; they stay
because a Rejected that names what changed is a better message than a Wrong answer.

1. **Sealed evidence.** The judge sends the child a fresh 32-byte key through a pipe
   (``JUDGE_SEAL_FD``) that plugin.py reads and closes at import, before pytest imports a
   test or engine module. Every event is HMAC-sealed and numbered; the judge drops the run
   at the first line that does not verify or is out of sequence (runner.py).
2. **A snapshot of the machinery** (plugin.py): pytest's, pluggy's, ``time``'s,
   ``builtins``' and torch's comparison functions, taken before the learner's import; the
   tests' own modules after collection, their functions compared with a fresh compile of
   their source. Re-checked after collection and after every case: a difference is a
   ``tamper`` event naming it.
3. **A pass needs its test function to return** (a ``body`` event from
   ``pytest_pyfunc_call``, after the test's last assertion).
4. **The judge's clock.** Limits and the durations reported are measured here; a learner
   patching ``time`` in the child changes nothing but its own view.
5. **Exits.** A run without a sealed ``done`` is a Runtime error (``os._exit``, ``sys.exit``,
   ``pytest.exit``, a signal), never a pass.
6. **Processes.** The judge is a child subreaper (Linux): a process the submission forked or
   daemonised is reparented here and killed when the run ends, and named.
7. **Files.** :class:`FileGuard` hashes the sandbox (its engine copy and tests) and keeps
   the bytes of the repository's ``minisgl/``, ``tests/`` and ``practice/`` (but not the
   learner's workspace) before the run; after it (and after every survivor is dead) a file
   that changed is restored and named.

8. **The speed run** of an exercise graded on speed (speed.py, bench.py) is a second child,
   ``python -I``, sealed the same way; it keeps its own references to the timing functions,
   compares them and Triton's, ``time``'s and ``builtins``' with a snapshot taken before
   the learner's import, and checks the CUDA events against its own wall clock.

A tampering attempt gets the verdict ``Rejected``. What this does not stop: code that reads
the plugin's own memory (``gc``, frames) to borrow its sealing function, registers a pytest
plugin, or traces pluggy's frames; the record comparison makes those a Wrong answer
(tests/test_practice_attacks.py). Running the child in its own user and mount namespace
(read-only binds) would close the file part without restoring; not done here.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set

PR_SET_CHILD_SUBREAPER = 36
_SUBREAPER = [False]


def become_subreaper() -> None:
    """Make orphaned descendants of this process its children (Linux; no-op elsewhere)."""
    if _SUBREAPER[0] or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        _SUBREAPER[0] = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        pass


def _in_group(pid: int, group: int) -> bool:
    """Whether ``pid`` is (or was, as it exits) in the process group ``group``."""
    try:
        return os.getpgid(pid) == group
    except (ProcessLookupError, PermissionError):
        return True  # gone already: it did not outlive the run


def children() -> Set[int]:
    """The pids whose parent is this process (from /proc; empty where there is none)."""
    me = os.getpid()
    out: Set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(me):
            out.add(int(name))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:100]
    except OSError:
        return "?"


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode("ascii", "replace").rsplit(")", 1)[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def reap_descendants(group: int, before: Iterable[int]) -> List[str]:
    """Kill the run's process group and every descendant reparented to this process (not in
    ``before``); return those that were still alive, as ``pid (command)``."""
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    before = set(before) | {group}
    alive: List[str] = []
    deadline = time.monotonic() + 5.0
    quiet = 0
    while time.monotonic() < deadline and quiet < 3:
        found = children() - before
        if not found:
            quiet += 1
            time.sleep(0.02)
            continue
        quiet = 0
        for pid in found:
            if not _is_zombie(pid):
                # a member of the run's own group is dying of the killpg above (reparented
                # here mid-exit, its cmdline already empty): killed, not one that escaped
                command = _cmdline(pid)
                if command and not _in_group(pid, group):
                    alive.append(f"{pid} ({command})")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return alive


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(top: Path, skip: Iterable[str] = ()) -> Iterable[Path]:
    skip = set(skip)
    for dirpath, dirnames, filenames in os.walk(top):
        rel = Path(dirpath).relative_to(top)
        dirnames[:] = [
            d
            for d in dirnames
            if d not in ("__pycache__", ".hypothesis", ".pytest_cache") and str(rel / d) not in skip
        ]
        for name in filenames:
            if name.endswith((".pyc", ".pyo")):
                continue
            if str(rel / name) not in skip:
                yield Path(dirpath) / name


class FileGuard:
    """The bytes of the files under ``dirs`` of ``top`` (except ``skip``), to name and undo
    what a run changed. ``keep=False``: hashes only (the sandbox, thrown away after)."""

    def __init__(self, top: Path, dirs: Iterable[str], skip: Iterable[str] = (), keep=True):
        self.top, self.keep, self.skip = top, keep, list(skip)
        self.dirs = [d for d in dirs if (top / d).exists()]
        self.before: Dict[str, object] = self._read()

    def _read(self) -> Dict[str, object]:
        out: Dict[str, object] = {}
        for d in self.dirs:
            path = self.top / d
            files = (
                [path]
                if path.is_file()
                else _files(path, [s[len(d) + 1 :] for s in self.skip if s.startswith(d + "/")])
            )
            for f in files:
                if f.is_symlink():
                    continue
                rel = str(f.relative_to(self.top))
                try:
                    data = f.read_bytes()
                except OSError:
                    continue
                out[rel] = data if self.keep else hashlib.sha256(data).digest()
        return out

    def changes(self, restore: bool = False) -> List[str]:
        """What differs from the snapshot, as ``changed: path`` lines; with ``restore``
        (needs ``keep``), put the old bytes back and remove new files."""
        after = self._read()
        out = []
        for rel, old in self.before.items():
            if rel not in after:
                out.append(f"deleted {rel}")
            elif after[rel] != old:
                out.append(f"changed {rel}")
            else:
                continue
            if restore and self.keep:
                path = self.top / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.chmod(path, 0o644)
                except OSError:
                    pass
                path.write_bytes(old)  # type: ignore[arg-type]
        for rel in sorted(set(after) - set(self.before)):
            if not rel.endswith(".py"):
                continue  # a test's output file is not the judge; a new module could be
            out.append(f"added {rel}")
            if restore:
                try:
                    (self.top / rel).unlink()
                except OSError:
                    pass
        return out


def protect(top: Path, dirs: Iterable[str], leave: Optional[Path] = None) -> None:
    """Make the files under ``dirs`` read-only (the first line of defence; FileGuard is the
    one that counts, since the owner of a file can make it writable again)."""
    for d in dirs:
        for f in _files(top / d) if (top / d).is_dir() else [top / d]:
            if f.exists() and not f.is_symlink() and f != leave:
                try:
                    os.chmod(f, 0o444)
                except OSError:
                    pass
