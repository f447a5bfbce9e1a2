"""The experts of a mixture-of-experts MLP, stacked, and the call into the MoE backend.

A sparse MLP owns ``E`` SwiGLU experts. Stored one tensor per projection and expert, a
forward would loop over ``E`` small matmuls; stacked (``gate_up_proj: [E, 2I, H]``,
``down_proj: [E, H, I]``, the layout of ``transformers`` 5 in memory) one kernel can
index any expert. The loader stacks the checkpoint's per-expert tensors into these
(``models/moe_weight.py``). Which kernel runs is the MoE backend's business
(``minisgl.moe``), reached through the global context like the attention backend.

Tensor parallelism splits every expert like a dense MLP: each rank keeps ``I / tp`` of
the intermediate features of every expert (gate/up rows, down columns), computes a
partial output for all its tokens, and the ranks sum them with one all-reduce. Mirrors
upstream ``minisgl.layers.moe.MoELayer``.
"""

from __future__ import annotations

import torch

from minisgl.core import get_global_ctx
from minisgl.distributed import DistributedCommunicator, get_tp_info
from minisgl.utils import div_even

from .base import BaseOP


class MoELayer(BaseOP):
    """``E`` experts; ``forward(x: [T, H], router_logits: [T, E]) -> [T, H]``.

    Weights: ``gate_up_proj: [E, 2 * I/tp, H]`` (each expert's gate rows, then its up
    rows) and ``down_proj: [E, H, I/tp]``.

    Raises:
        ValueError: when ``intermediate_size`` does not divide by the TP size.
    """

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool = True,
        activation: str = "silu",
    ) -> None:
        tp = get_tp_info()
        self.num_experts = num_experts
        self.top_k = top_k
        self.renormalize = renormalize
        self.activation = activation
        self._tp_size = tp.size
        self._comm = DistributedCommunicator()
        local = div_even(intermediate_size, tp.size)
        self.gate_up_proj = torch.empty(num_experts, 2 * local, hidden_size)
        self.down_proj = torch.empty(num_experts, hidden_size, local)

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        out = get_global_ctx().moe_backend.forward(
            hidden_states,
            self.gate_up_proj,
            self.down_proj,
            router_logits,
            self.top_k,
            self.renormalize,
            self.activation,
        )
        return self._comm.all_reduce(out) if self._tp_size > 1 else out
