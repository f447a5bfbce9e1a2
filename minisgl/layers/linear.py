"""Linear layers, including the merged projections an inference engine prefers.

Attention's q, k and v projections read the same input, and so do the MLP's gate and up
projections; one matmul with the weights stacked along the output dim does the work of
three (or two) and launches one kernel; the model's loader stacks the checkpoint's separate
weights in that order. The names say how the weights split over several GPUs:
column-parallel layers own a slice of the output dim, row-parallel ones a slice of the
input dim; one process owns every slice (``get_tp_info().size`` is 1). The product itself
is the kernel op ``linear``: ``F.linear``, unless the table in ``minisgl.kernel`` has a
faster kernel for the call.

Mirrors upstream ``minisgl.layers.linear``.
"""

from __future__ import annotations

from typing import List

import torch

from minisgl.distributed import (
    DistributedCommunicator,  # +ch16
    get_tp_info,
)
from minisgl.kernel import linear
from minisgl.utils import div_even

from .base import BaseOP


class _Linear(BaseOP):
    """``y = x @ weight.T + bias`` with ``weight: [out_local, in_local]``."""

    def __init__(self, local_in: int, local_out: int, has_bias: bool) -> None:
        self.weight = torch.empty(local_out, local_in)
        self.bias = torch.empty(local_out) if has_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class LinearReplicated(_Linear):
    """The full weight on every rank."""

    def __init__(self, input_size: int, output_size: int, has_bias: bool) -> None:
        super().__init__(input_size, output_size, has_bias)


class LinearColParallelMerged(_Linear):
    """Several projections of one input stacked along the output dim (gate | up).

    ``x: [T, input_size]`` -> ``[T, sum(output_sizes) / tp]``.
    """

    def __init__(self, input_size: int, output_sizes: List[int], has_bias: bool) -> None:
        tp = get_tp_info().size
        super().__init__(input_size, sum(div_even(n, tp) for n in output_sizes), has_bias)


class LinearQKVMerged(_Linear):
    """q, k and v stacked along the output dim: ``[T, hidden]`` -> ``[T, (H_q + 2 H_kv) D]``.

    Heads are divided between ranks; when there are fewer KV heads than ranks, each KV
    head is replicated (``div_even(..., allow_replicate=True)``).
    """

    def __init__(
        self, hidden_size: int, head_dim: int, num_qo_heads: int, num_kv_heads: int, has_bias: bool
    ) -> None:
        tp = get_tp_info().size
        local_qo = div_even(num_qo_heads, tp)
        local_kv = div_even(num_kv_heads, tp, allow_replicate=True)
        super().__init__(hidden_size, (local_qo + 2 * local_kv) * head_dim, has_bias)


class LinearRowParallel(_Linear):
    """The input dim is split between ranks (each one's partial outputs are then summed).

    Used for attention's output projection and the MLP's down projection, whose inputs
    arrive already split by the column-parallel layer before them.
    """

    def __init__(self, input_size: int, output_size: int, has_bias: bool) -> None:
        self._tp_size = get_tp_info().size
        self._comm = DistributedCommunicator()  # +ch16
        super().__init__(div_even(input_size, self._tp_size), output_size, has_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # >>> ch16: every rank holds a partial sum; an all-reduce adds them up
        if self._tp_size > 1:
            # the bias must be added once, not once per rank, so it joins after the sum
            y = self._comm.all_reduce(linear(x, self.weight))
            return y if self.bias is None else y + self.bias
        # <<< ch16
        return linear(x, self.weight, self.bias)


class LinearOProj(LinearRowParallel):
    """Attention's output projection: row-parallel over the heads."""
