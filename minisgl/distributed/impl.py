"""Collective operations between tensor-parallel ranks.

With one rank every collective is the identity, so single-device runs need no process
group. With several, ``torch.distributed`` does the work (gloo on the CPU, NCCL on CUDA).
Mirrors upstream ``minisgl.distributed.impl.DistributedCommunicator``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .info import get_tp_info


class DistributedCommunicator:
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over ranks, in place; returns ``x``."""
        if get_tp_info().size > 1:
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` ``[N, ...]`` along dim 0 -> ``[size * N, ...]``."""
        size = get_tp_info().size
        if size == 1:
            return x
        out = torch.empty((size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x.contiguous())
        return out
