"""What an MoE backend does: route each token to its experts and sum their outputs.

Every backend routes the same way (``routing.fused_topk``); they differ only in how they
run the chosen experts, so ``forward`` routes and a backend implements ``experts``.
Mirrors upstream ``minisgl.moe.base.BaseMoeBackend`` (where each backend's ``forward``
routes by itself; without its ``apply_router_weight_on_input`` switch, which no model of
this book uses).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from .routing import fused_topk


class BaseMoeBackend(ABC):
    """One call computes a whole sparse MLP, given the router's logits.

    Shapes: ``T`` tokens, ``H`` hidden size, ``E`` experts, ``I`` this rank's slice of the
    expert intermediate size (``moe_intermediate_size / tp``). ``supports_cuda_graph``: whether
    a forward can be captured (no host sync, static shapes); the engine checks it.
    """

    supports_cuda_graph: bool = True

    def forward(
        self,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        gating_output: torch.Tensor,
        topk: int,
        renormalize: bool,
        activation: str = "silu",
    ) -> torch.Tensor:
        """``sum_j w_j * down_e(act(gate_e(x)) * up_e(x))`` over each token's top-k experts.

        Args:
            hidden_states: ``[T, H]``.
            w1: ``[E, 2I, H]``, every expert's gate rows then its up rows (``gate_up_proj``).
            w2: ``[E, H, I]``, every expert's ``down_proj``.
            gating_output: the router logits, ``[T, E]``.
            topk: experts per token (``num_experts_per_tok``).
            renormalize: rescale the top-k probabilities to sum to 1 (``norm_topk_prob``).
            activation: only ``"silu"`` (SwiGLU experts).

        Returns:
            ``[T, H]`` in ``hidden_states``' dtype: this rank's partial sum under tensor
            parallelism (the layer all-reduces it).

        Raises:
            ValueError: for an activation other than ``"silu"``.
        """
        if activation != "silu":
            raise ValueError(f"unsupported expert activation {activation!r} (only silu)")
        topk_weights, topk_ids = fused_topk(gating_output, topk, renormalize)
        return self.experts(hidden_states, w1, w2, topk_weights, topk_ids)

    @abstractmethod
    def experts(
        self,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Each token's chosen experts, weighted and summed: ``[T, H]``, as ``forward``.

        ``topk_weights``: ``[T, k]`` float32 router weights; ``topk_ids``: ``[T, k]`` expert ids.
        """
