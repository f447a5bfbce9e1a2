"""Which tensor-parallel rank this process is, out of how many.

Mirrors upstream ``minisgl.distributed.info``. Layers read it when they are built, to know
which slice of each weight they own; with one rank every slice is the whole.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DistributedInfo:
    rank: int
    size: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is outside a group of {self.size}")

    def is_primary(self) -> bool:
        return self.rank == 0


_TP_INFO = DistributedInfo(0, 1)


def set_tp_info(rank: int, size: int) -> None:
    """Set this process's rank (called once by the engine, before building the model)."""
    global _TP_INFO
    _TP_INFO = DistributedInfo(rank, size)


def get_tp_info() -> DistributedInfo:
    return _TP_INFO
