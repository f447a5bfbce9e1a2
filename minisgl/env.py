"""Switches read from the environment, settable from code for experiments and tests.

``ENV.DISABLE_OVERLAP_SCHEDULING.value = True`` turns overlap scheduling off, and the
scheduler runs its plain loop (``MINISGL_DISABLE_OVERLAP_SCHEDULING=1`` does the same for a
whole process). Mirrors upstream ``minisgl.env``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _as_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


@dataclass
class EnvBool:
    """A boolean read once from environment variable ``name`` (default ``default``)."""

    name: str
    default: bool = False
    value: bool = field(init=False)

    def __post_init__(self) -> None:
        raw = os.environ.get(self.name)
        self.value = self.default if raw is None else _as_bool(raw)

    def __bool__(self) -> bool:
        return self.value


class _Env:
    def __init__(self) -> None:
        self.DISABLE_OVERLAP_SCHEDULING = EnvBool("MINISGL_DISABLE_OVERLAP_SCHEDULING")
        # >>> ch17: the torch reference kernels on CUDA too, instead of the faster libraries'
        # (the switch to reach for when a fast kernel is suspected of a wrong answer)
        self.TORCH_KERNELS = EnvBool("MINISGL_TORCH_KERNELS")
        # <<< ch17


ENV = _Env()
