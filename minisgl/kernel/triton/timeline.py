"""Per-program timestamps on the GPU's clock, compiled into a kernel only when asked for.

A profiler times whole kernels and, to do so, serialises the ones that programmatic
dependent launch (``pdl``) lets overlap, so it cannot say where a chain of overlapping
kernels spends its time. A kernel of chapter 19 that takes ``TIMELINE: tl.constexpr`` can
instead stamp, in every program, the global timer (``%globaltimer``, nanoseconds) when the
program starts, when its PDL wait returns and when it ends, with the SM it ran on. The
launcher sets ``TIMELINE`` when it is given a ``stamps`` buffer; without one the stamps are
compiled away and the kernel is the engine's own. ``minisgl.benchmark.layer_timeline``
reads the buffers of a whole layer.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

STAMP_FIELDS = ("start", "waited", "end", "sm")  # the columns of a stamps buffer


def stamps_buffer(programs: int, device: torch.device) -> torch.Tensor:
    """A zeroed ``[programs, 4]`` int64 buffer for one launch's stamps (``STAMP_FIELDS``)."""
    return torch.zeros(programs, len(STAMP_FIELDS), dtype=torch.int64, device=device)


def check_stamps(stamps: Optional[torch.Tensor], programs: int) -> None:
    """Raises ValueError unless ``stamps`` is None or a contiguous int64 ``[>= programs, 4]``."""
    if stamps is None:
        return
    if stamps.dtype != torch.int64 or stamps.dim() != 2 or stamps.shape[1] != 4:
        raise ValueError(
            f"stamps must be int64 [programs, 4], got {stamps.dtype} {tuple(stamps.shape)}"
        )
    if stamps.shape[0] < programs or not stamps.is_contiguous():
        raise ValueError(f"stamps must hold {programs} contiguous rows, got {tuple(stamps.shape)}")


@triton.jit
def now():
    """The GPU's global timer, in ns (CUDA only: the interpreter has no inline assembly)."""
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def record(stamps_ptr, started, waited):
    """This program's stamps and its SM, at the row of its linear program id."""
    ended = now()
    sm = tl.inline_asm_elementwise(
        "mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )
    pid = tl.program_id(0) + tl.num_programs(0) * (
        tl.program_id(1) + tl.num_programs(1) * tl.program_id(2)
    )
    row = stamps_ptr + pid.to(tl.int64) * 4
    tl.store(row, started)
    tl.store(row + 1, waited)
    tl.store(row + 2, ended)
    tl.store(row + 3, sm.to(tl.int64))
