"""The fused MoE backend: align the routing slots by expert, then two grouped GEMMs in Triton.

A token's ``k`` experts are different matrices, so the MLP is no longer one matmul. The
fused path makes it two kernel launches whatever ``E`` is:

1. ``fused_topk`` picks ``[T, k]`` experts and weights; ``moe_align_block_size`` lists the
   ``T*k`` slots grouped by expert, each group padded to ``BLOCK_SIZE_M`` rows;
2. the grouped GEMM (``kernel.moe_grouped_gemm``) with ``w1``: each program takes ``BLOCK_SIZE_M`` sorted slots
   (one expert, by construction), gathers their tokens' rows of ``x`` and multiplies by that
   expert's ``gate_up_proj``: ``[T*k, 2I]``;
3. SwiGLU: ``[T*k, I]``;
4. the same kernel with ``w2``, reading rows by slot and multiplying each output row by its
   routing weight: ``[T*k, H]``;
5. a sum over each token's ``k`` rows: ``[T, H]``.

Everything has static shapes, so the whole forward can be captured in a CUDA graph. The
block sizes come from :func:`get_default_config` (upstream also reads tuned per-GPU JSON
tables; the defaults are its fallback). Mirrors upstream ``minisgl.moe.fused``
(``fused_experts_impl``, ``FusedMoe``).
"""

from __future__ import annotations

from typing import Dict

import torch

from minisgl.kernel import silu_and_mul
from minisgl.kernel.moe_ops import moe_grouped_gemm

from .base import BaseMoeBackend
from .routing import moe_align_block_size


def get_default_config(num_tokens: int, num_experts: int) -> Dict[str, int]:
    """Tile sizes of the grouped GEMM for ``num_tokens`` tokens (upstream's defaults).

    With few tokens (decode: at most one per expert on average) most blocks of 64 sorted
    rows would be padding, so blocks shrink to 16 rows; otherwise 64 x 64 tiles.
    """
    if num_tokens <= num_experts:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32}


def fused_experts(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: Dict[str, int] | None = None,
) -> torch.Tensor:
    """``[T, H]`` -> ``[T, H]``: the same sum as ``torch_backend.torch_experts``, in two
    grouped GEMMs. ``w1: [E, 2I, H]``, ``w2: [E, H, I]`` contiguous; ``topk_*: [T, k]``.

    Raises:
        ValueError: on mismatched shapes or non-contiguous inputs.
    """
    num_tokens, hidden = hidden_states.shape
    num_experts, two_i, _ = w1.shape
    if w1.shape[2] != hidden or w2.shape != (num_experts, hidden, two_i // 2):
        raise ValueError(
            f"expert weights do not fit: x {tuple(hidden_states.shape)}, "
            f"w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}"
        )
    if topk_weights.shape != topk_ids.shape or topk_ids.shape[0] != num_tokens:
        raise ValueError(
            f"topk_weights {tuple(topk_weights.shape)} / topk_ids {tuple(topk_ids.shape)} "
            f"must both be [T={num_tokens}, k]"
        )
    if not (hidden_states.is_contiguous() and w1.is_contiguous() and w2.is_contiguous()):
        raise ValueError("hidden_states, w1 and w2 must be contiguous")
    top_k = topk_ids.shape[1]
    config = config or get_default_config(num_tokens, num_experts)
    sorted_token_ids, expert_ids, num_post_padded = moe_align_block_size(
        topk_ids, config["BLOCK_SIZE_M"], num_experts
    )
    topk_weights = topk_weights.contiguous()
    dtype, device = hidden_states.dtype, hidden_states.device

    gate_up = torch.empty(num_tokens * top_k, two_i, dtype=dtype, device=device)
    moe_grouped_gemm(
        hidden_states,
        w1,
        gate_up,
        topk_weights,
        sorted_token_ids,
        expert_ids,
        num_post_padded,
        mul_routed_weight=False,
        top_k=top_k,
        config=config,
    )
    act = silu_and_mul(gate_up)  # [T*k, I]
    down = torch.empty(num_tokens * top_k, hidden, dtype=dtype, device=device)
    moe_grouped_gemm(
        act,
        w2,
        down,
        topk_weights,
        sorted_token_ids,
        expert_ids,
        num_post_padded,
        mul_routed_weight=True,
        top_k=1,
        config=config,
    )
    return down.view(num_tokens, top_k, hidden).sum(dim=1)


class FusedMoe(BaseMoeBackend):
    """Router top-k, then :func:`fused_experts` (Triton: CUDA, or the CPU interpreter)."""

    def experts(
        self,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        return fused_experts(hidden_states.contiguous(), w1, w2, topk_weights, topk_ids)
