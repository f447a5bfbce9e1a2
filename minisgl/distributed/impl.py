"""Collective operations between tensor-parallel ranks, and the process group behind them.

With one rank every collective is the identity, so single-device runs need no process
group. With several, ``torch.distributed`` does the work: ``init_distributed`` joins the
group with the backend the device calls for (gloo on the CPU, NCCL on CUDA) and also
returns a gloo group for small CPU-side agreements (how many KV pages every rank can
afford). Mirrors upstream ``minisgl.distributed.impl`` (``DistributedCommunicator``,
``destroy_distributed``) and ``Engine._init_communication``; upstream can also swap in
its own PyNCCL communicator, which this book leaves out.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from .info import DistributedInfo, get_tp_info

# torch >= 2.12 renames all_gather_into_tensor (and warns on the old name)
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class DistributedCommunicator:
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over ranks, in place; returns ``x``."""
        if get_tp_info().size > 1:
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` ``[N, ...]`` along dim 0 -> ``[size * N, ...]``.

        Every rank must pass the same shape (the collective moves fixed-size blocks).
        """
        size = get_tp_info().size
        if size == 1:
            return x
        out = torch.empty((size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        _all_gather_single(out, x.contiguous())
        return out


def init_distributed(
    tp_info: DistributedInfo, device: torch.device, init_method: str, timeout_s: float
) -> dist.ProcessGroup | None:
    """Join the ``tp_info.size`` ranks' process group; returns a gloo (CPU) group over the
    same ranks, or None with one rank (nothing to join).

    ``init_method`` is where the ranks meet (``file:///dir/store`` or ``tcp://host:port``),
    the same for all of them. Blocks until every rank has joined; a collective that waits
    longer than ``timeout_s`` for a peer raises.

    Raises:
        ValueError: with several ranks and no ``init_method``.
    """
    if tp_info.size == 1:
        return None
    if not init_method:
        raise ValueError(f"{tp_info.size} tensor-parallel ranks need an init_method to meet at")
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=tp_info.rank,
        world_size=tp_info.size,
        timeout=timedelta(seconds=timeout_s),
        **kwargs,
    )
    if backend == "gloo":
        return dist.group.WORLD  # type: ignore[return-value]
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


def destroy_distributed() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()
