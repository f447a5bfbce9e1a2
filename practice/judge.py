#!/usr/bin/env python3
"""The practice judge: `python practice/judge.py 191` judges your exercise 191.

Commands: list, start ID, [test] ID [--file PATH] [--device cpu|cuda], doctor,
solution ID, check [IDS]. See practice/README.md; the code is in practice/judgelib/.
"""

import sys
from pathlib import Path

# Run by its path, Python puts practice/ on sys.path; the judge's packages (practice.judgelib,
# and tools for `check --jobs`) are imported from the checkout this file belongs to.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from practice.judgelib.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
