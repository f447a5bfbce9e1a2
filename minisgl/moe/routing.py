"""Routing: which experts each token goes to, and the token order a grouped GEMM wants.

``fused_topk`` is the router: softmax over the experts, keep the ``k`` largest, optionally
renormalise them to sum to 1 (Qwen3-MoE's ``norm_topk_prob``). ``moe_align_block_size``
turns the ``[T, k]`` table of choices into a permutation that lists every (token, choice)
*slot* grouped by expert, each expert's group padded to a multiple of the kernel's
``BLOCK_SIZE_M``, so that each block of rows the Triton kernel loads belongs to exactly
one expert. Both are plain torch with static output shapes (no ``.item()``, no
data-dependent sizes), so they run on the CPU, on CUDA, and inside a CUDA graph.

Mirrors upstream ``minisgl.moe.fused.fused_topk`` and ``moe_align_block_size`` (which call
the CUDA kernels ``topk_softmax`` and ``moe_align_block_size`` of ``sgl_kernel``).
"""

from __future__ import annotations

from typing import Tuple

import torch


def fused_topk(
    gating_output: torch.Tensor, topk: int, renormalize: bool
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: ``[T, E]`` router logits -> ``(topk_weights, topk_ids)``, both ``[T, k]``.

    ``topk_weights`` (float32) are the softmax probabilities of the chosen experts, in
    decreasing order, divided by their sum when ``renormalize``; ``topk_ids`` (int32) are
    the experts. The softmax runs in float32 whatever the logits' dtype, and ties go to
    the lower expert id, exactly as ``transformers``' ``Qwen3MoeTopKRouter`` computes them.
    No epsilon guards the division: the sum includes the largest probability, >= 1/E.

    Raises:
        ValueError: when ``gating_output`` is not 2-D or ``topk`` is not in ``[1, E]``.
    """
    if gating_output.dim() != 2:
        raise ValueError(f"router logits must be [T, E], got {tuple(gating_output.shape)}")
    if not 1 <= topk <= gating_output.shape[1]:
        raise ValueError(f"topk must be in [1, {gating_output.shape[1]}], got {topk}")
    probs = torch.softmax(gating_output, dim=-1, dtype=torch.float32)
    topk_weights, topk_ids = torch.topk(probs, topk, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids.to(torch.int32)


def moe_align_block_size(
    topk_ids: torch.Tensor, block_size: int, num_experts: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the ``T * k`` routing slots by expert and pad each expert's run to ``block_size``.

    Slot ``s`` is row-major in ``topk_ids: [T, k]``: token ``s // k``, its ``s % k``-th
    choice. Returns, all int32 and of sizes fixed by the input shapes:

    * ``sorted_token_ids: [T*k + E*(block_size-1)]``: the slots of expert 0 (in increasing
      slot order), then padding up to a multiple of ``block_size``, then those of expert 1,
      and so on; padding entries and the unused tail hold ``T*k`` (a slot that does not
      exist, which the kernel masks);
    * ``expert_ids: [ceil(len(sorted_token_ids) / block_size)]``: the expert of each block
      of ``block_size`` entries, ``-1`` for blocks past the end;
    * ``num_tokens_post_padded: [1]``: how many entries are in use (a multiple of
      ``block_size``; experts with no token take no block).

    Example: ``topk_ids = [[2, 0], [0, 1]]``, ``block_size = 2``, ``E = 3`` -> slots of
    expert 0 are 1 and 2, of expert 1 slot 3 (+ one pad), of expert 2 slot 0 (+ one pad):
    ``sorted_token_ids = [1, 2, 3, 4, 0, 4, 4]`` (7 = 4 slots + 3 experts * 1 pad at most),
    ``expert_ids = [0, 1, 2, -1]``, ``num_tokens_post_padded = [6]``.

    Raises:
        ValueError: when ``block_size`` < 1 or ``topk_ids`` is not 2-D.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [T, k], got {tuple(topk_ids.shape)}")
    device = topk_ids.device
    flat = topk_ids.flatten().long()  # [T*k], the expert of each slot
    num_slots = flat.numel()
    max_padded = num_slots + num_experts * (block_size - 1)
    max_blocks = (max_padded + block_size - 1) // block_size

    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_size - 1) // block_size * block_size
    padded_end = padded.cumsum(0)  # where each expert's padded run ends
    start = counts.cumsum(0) - counts  # where each expert's slots start, unpadded

    # a stable sort keeps each expert's slots in slot order (so in token order)
    order = torch.sort(flat, stable=True).indices
    experts = flat[order]
    rank_in_expert = torch.arange(num_slots, device=device) - start[experts]
    dest = (padded_end - padded)[experts] + rank_in_expert

    sorted_token_ids = torch.full((max_padded,), num_slots, dtype=torch.int32, device=device)
    sorted_token_ids[dest] = order.to(torch.int32)
    block_start = torch.arange(max_blocks, device=device) * block_size
    expert_ids = torch.searchsorted(padded_end, block_start, right=True)
    expert_ids = torch.where(block_start < padded_end[-1], expert_ids, -1).to(torch.int32)
    return sorted_token_ids, expert_ids, padded_end[-1:].to(torch.int32)
