"""The fast decode path's speed-ups, in one frozen record read from the environment once.

Each speed-up is on unless ``MINISGL_DISABLE_<NAME>=1`` turns it off for the process, to
measure what it saves (``python -m minisgl.benchmark.batch1`` turns them off one after
another). Every part of the path asks ``current()``: the kernel table's Triton entries,
the launches (PDL), the split-KV attention backend and the fused model wrapper, so they
always agree. ``using(**changes)`` puts another record in force for a ``with`` block (a
benchmark that builds and times one engine per setting; a test).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any, Iterator

from minisgl.env import EnvBool

FUSED_DECODE_MAX_BS = 4  # the fused kernels keep the broadcast sums of up to 4 rows in registers


@dataclass(frozen=True)
class SpeedUps:
    gemv: bool = True  # small-batch linear layers on the Triton GEMV (off: cuBLAS)
    fused_decode: bool = True  # the fused decode path (models/fused_decode.py)
    split_kv: bool = True  # the split-KV attention backend for a few requests
    pdl: bool = True  # programmatic dependent launch of the Triton kernels
    lm_head_kernel: bool = True  # the fused path's final norm and LM head in one kernel
    # >>> ch20
    sample_kernel: bool = True  # temperature sampling in one pass (off: FlashInfer's)
    decode_batch_kernel: bool = True  # decodes of many requests on the batch kernel
    longest_first: bool = True  # the batch kernel starts the longest contexts first
    # <<< ch20

    @classmethod
    def from_env(cls) -> SpeedUps:
        """Each field off where ``MINISGL_DISABLE_<FIELD>`` is set."""
        return cls(
            **{f.name: not EnvBool(f"MINISGL_DISABLE_{f.name.upper()}") for f in fields(cls)}
        )


_current = SpeedUps.from_env()


def current() -> SpeedUps:
    """The speed-ups in force."""
    return _current


@contextmanager
def using(**changes: Any) -> Iterator[SpeedUps]:
    """Put ``current()`` with ``changes`` in force inside the ``with`` block."""
    global _current
    saved = _current
    _current = replace(saved, **changes)
    try:
        yield _current
    finally:
        _current = saved
