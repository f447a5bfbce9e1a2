"""Running a test script under Triton's interpreter, on the CPU.

``TRITON_INTERPRET=1`` is read when ``triton`` is imported, so a test that wants the
interpreter runs its script in a fresh process. The script may import ``minisgl`` and the
test modules (``from test_ch19_kernels import ...``): both the root and ``tests/`` are on
its path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from .models import ROOT


def interpret(script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``script`` (dedented) with ``args`` in a fresh process with Triton's interpreter on;
    its output captured as text. Raises ``subprocess.TimeoutExpired`` after ``timeout`` s."""
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        OMP_NUM_THREADS="1",
        # what was on the path stays after (packages installed with --target, say)
        PYTHONPATH=os.pathsep.join(
            [
                str(ROOT),
                str(ROOT / "tests"),
                *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
            ]
        ),
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
