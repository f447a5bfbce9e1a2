"""The reference MoE backend: a loop over the experts, in plain torch.

For each expert that at least one token chose: gather those tokens, run the expert's
SwiGLU MLP on them, scale each output by the token's routing weight, and add it into the
token's row of the output. This is what ``transformers``' ``Qwen3MoeExperts`` computes, in
the same order (experts by increasing id, ``index_add_``), so CPU float32 runs match it
token for token. It is slow on a GPU: one small matmul per expert, and a host sync to
learn which experts were hit, which also makes it impossible to capture in a CUDA graph
(the engine only picks it on CUDA when asked to: ``--moe-backend torch`` or
``MINISGL_TORCH_KERNELS=1``). No upstream counterpart: upstream is CUDA only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.kernel import torch_ops

from .base import BaseMoeBackend


def torch_experts(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """``[T, H]`` -> ``[T, H]``: every token through its experts ``topk_ids: [T, k]``, outputs
    weighted by ``topk_weights: [T, k]`` and summed. ``w1: [E, 2I, H]``, ``w2: [E, H, I]``."""
    out = torch.zeros_like(hidden_states)
    weights = topk_weights.to(hidden_states.dtype)
    for expert in topk_ids.unique().tolist():  # sorted: experts in increasing id, as HF
        token_idx, choice = torch.where(topk_ids == expert)
        x = hidden_states[token_idx]
        y = F.linear(torch_ops.silu_and_mul(F.linear(x, w1[expert])), w2[expert])
        out.index_add_(0, token_idx, y * weights[token_idx, choice, None])
    return out


class TorchMoe(BaseMoeBackend):
    """Router top-k, then :func:`torch_experts`."""

    supports_cuda_graph = False  # torch_experts asks the GPU which experts were hit

    def experts(
        self,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        return torch_experts(hidden_states, w1, w2, topk_weights, topk_ids)
