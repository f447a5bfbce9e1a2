#!/usr/bin/env python3
"""The practice judge: `python practice/judge.py 191` judges your exercise 191.

Commands: list, start ID, [test] ID [--file PATH] [--device cpu|cuda], doctor,
solution ID, check [IDS]. See practice/README.md; the code is in practice/judgelib/.
"""

import os
import sys
import tempfile
from pathlib import Path

isolated = sys.flags.isolated and sys.flags.dont_write_bytecode and sys.pycache_prefix
if __name__ == "__main__" and not isolated:  # not in `check --jobs`' workers (__mp_main__)
    # The judge runs isolated (no PYTHON* variables, no user site-packages, no script folder
    # on the path) and neither writes bytecode nor reads any from beside its sources, where a
    # judged submission could have planted some: its caches would live under a folder that
    # is never created.
    never = os.path.join(tempfile.gettempdir(), f"minisgl-judge-no-bytecode-{os.getpid()}")
    here = os.path.abspath(__file__)
    argv = [sys.executable, "-I", "-B", "-X", f"pycache_prefix={never}", here, *sys.argv[1:]]
    sys.stdout.flush()
    os.execv(sys.executable, argv)

# The judge's packages (practice.judgelib, and tools for `check --jobs`) are imported from
# the checkout this file belongs to.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from practice.judgelib.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
