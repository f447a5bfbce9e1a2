"""A started worker process and the name logs use for it: what ``launch`` starts and the
API server watches. Its own module so that the frontend can name it without importing the
launcher (which imports the frontends). Mirrors the worker records of upstream
``minisgl.server.launch``."""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.process import BaseProcess


@dataclass
class Worker:
    """A started worker process (``process``) and the name logs use for it (``name``:
    ``minisgl-scheduler-0``, ``minisgl-tokenizer``)."""

    name: str
    process: BaseProcess

    def describe(self) -> str:
        return f"{self.name} (pid {self.process.pid})"

    def exit_text(self) -> str:
        """``exit code N`` (negative: killed by signal ``-N``) once the process has been
        reaped; before that (a GPU process can take seconds to release its device after
        its pipes have closed) ``exit code not known yet``."""
        code = self.process.exitcode
        return "exit code not known yet" if code is None else f"exit code {code}"
