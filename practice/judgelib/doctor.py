"""`judge.py doctor`: what this machine has, and which exercises it can judge."""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path

from . import problems as P
from .judging import cannot_judge

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct"


def _torch_lines() -> tuple[list[str], bool]:
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return [f"torch        not importable ({e})"], False
    lines = [f"torch        {torch.__version__}"]
    cuda = torch.cuda.is_available()
    if cuda:
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            lines.append(
                f"CUDA         cuda:{i} {torch.cuda.get_device_name(i)}, capability {major}.{minor}"
                f" (CUDA {torch.version.cuda})"
            )
    else:
        lines.append("CUDA         not available: exercises are judged on the CPU")
    return lines, cuda


def doctor(root: Path) -> int:
    print(f"Python       {sys.version.split()[0]} ({platform.machine()}, {platform.system()})")
    lines, cuda = _torch_lines()
    print("\n".join(lines))
    fi = importlib.util.find_spec("flashinfer") is not None
    print(f"flashinfer   {'present' if fi else 'absent (the torch attention backend is used)'}")
    print(
        f"pytest       {'present' if importlib.util.find_spec('pytest') else 'ABSENT: pip install pytest'}"
    )
    model = root / DEFAULT_MODEL
    ok = (model / "config.json").is_file()
    print(f"model        {DEFAULT_MODEL}: {'present' if ok else 'absent (make models)'}")
    print(
        f"engine       {root / 'minisgl'}: {'present' if (root / 'minisgl').is_dir() else 'absent'}"
    )
    device = "cuda" if cuda else "cpu"
    print(f"\nExercises this machine can judge (on {device}):")
    for p in P.load_all(root / "practice" / "exercises"):
        why = cannot_judge(root, p, device)
        if why is None and p.speed is not None and not cuda:
            why_speed = "  (its speed part is graded only on a CUDA GPU)"
        else:
            why_speed = ""
        print(
            f"  {'✓' if why is None else '✗'} {p.id} {p.title}"
            + (f"  ({why})" if why else why_speed)
        )
    return 0
