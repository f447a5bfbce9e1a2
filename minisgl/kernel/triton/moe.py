"""The grouped GEMM of a fused MoE, in Triton: one launch multiplies every token by its experts.

``fused_experts`` (``minisgl.moe.fused``) has already listed the ``T * k`` routing slots
grouped by expert, each group padded to ``BLOCK_SIZE_M`` (``moe_align_block_size``). The
kernel's grid is (blocks of sorted slots) x (blocks of output columns). A program:

1. returns at once if its block is past ``num_tokens_post_padded`` (the grid is sized for
   the worst case, so a CUDA graph can replay it for any routing);
2. reads its ``BLOCK_SIZE_M`` slot ids and the block's one expert id; padding slots
   (id >= ``num_valid_tokens``) are masked out of every load and store;
3. walks ``K`` in steps of ``BLOCK_SIZE_K``, loading the slots' rows of ``A`` (row
   ``slot // top_k``: the first GEMM reads each token once per choice) and the expert's
   ``[BLOCK_SIZE_K, BLOCK_SIZE_N]`` tile of ``B``, accumulating ``tl.dot`` in float32;
4. optionally scales each row by the slot's routing weight, and stores row ``slot`` of
   ``C``, so the output comes back in slot order and needs no un-permutation.

Rows of ``A`` are gathered by index, which is why no sorted copy of the tokens is ever
made. Float32 inputs use IEEE products (``input_precision="ieee"``), not TF32, so a float32
run matches the torch reference to rounding. Also runs on the CPU under
``TRITON_INTERPRET=1``. Mirrors upstream ``minisgl.kernel.triton.fused_moe.fused_moe_kernel``
and ``minisgl.kernel.moe_impl.fused_moe_kernel_triton`` (without upstream's grouped
program ordering for L2 reuse, see chapter 21's exercises).
"""

from __future__ import annotations

from typing import Dict

import torch
import triton
import triton.language as tl

from .. import Impl, register


@triton.jit
def fused_moe_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    topk_weights_ptr,
    sorted_token_ids_ptr,
    expert_ids_ptr,
    num_tokens_post_padded_ptr,
    N,
    num_valid_tokens,
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    K: tl.constexpr,  # compile-time: a model has two Ks (H, I); also, Triton 3.6's interpreter
    # cannot loop over a runtime bound under NumPy 2
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    top_k: tl.constexpr,
    IEEE_FP32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
        return
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    slots = tl.load(sorted_token_ids_ptr + offs_m).to(tl.int64)
    slot_mask = slots < num_valid_tokens
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (slots // top_k)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k_block in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_mask = offs_k < K - k_block * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=slot_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if IEEE_FP32:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    if MUL_ROUTED_WEIGHT:
        weight = tl.load(topk_weights_ptr + slots, mask=slot_mask, other=0.0)
        acc = acc * weight[:, None]
    c_ptrs = c_ptr + slots[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=slot_mask[:, None] & n_mask[None, :])


def fused_moe_kernel_triton(
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    topk_weights: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    mul_routed_weight: bool,
    top_k: int,
    config: Dict[str, int],
) -> None:
    """``C[s] = A[s // top_k] @ B[expert(s)].T`` (times ``topk_weights[s]`` if asked) for
    every routing slot ``s``, in one launch.

    ``A: [rows, K]`` (rows = ``T`` with ``top_k = k`` for the first GEMM, ``T*k`` with
    ``top_k = 1`` for the second); ``B: [E, N, K]`` (a linear layer's weight per expert);
    ``C: [T*k, N]``, written only at valid slots; ``topk_weights: [T, k]`` float32,
    contiguous; the three routing tensors from ``moe_align_block_size`` with
    ``config["BLOCK_SIZE_M"]``. ``config`` holds ``BLOCK_SIZE_M/N/K``.

    Raises:
        ValueError: when ``B``'s ``K`` differs from ``A``'s or ``C`` has the wrong shape.
    """
    num_slots = topk_weights.numel()
    if B.shape[2] != A.shape[1] or C.shape != (num_slots, B.shape[1]):
        raise ValueError(
            f"A {tuple(A.shape)}, B {tuple(B.shape)}, C {tuple(C.shape)} do not fit "
            f"{num_slots} slots"
        )
    if not topk_weights.is_contiguous():
        raise ValueError("topk_weights must be contiguous: it is indexed by slot")
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    grid = (triton.cdiv(sorted_token_ids.shape[0], bm), triton.cdiv(B.shape[1], bn))
    fused_moe_kernel[grid](
        A,
        B,
        C,
        topk_weights,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        B.shape[1],
        num_slots,
        A.stride(0),
        A.stride(1),
        B.stride(0),
        B.stride(1),
        B.stride(2),
        C.stride(0),
        C.stride(1),
        K=B.shape[2],
        BLOCK_SIZE_M=bm,
        BLOCK_SIZE_N=bn,
        BLOCK_SIZE_K=bk,
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        top_k=top_k,
        IEEE_FP32=A.dtype == torch.float32,
    )


# ---- the kernel table's entry ---------------------------------------------------------------
register("moe_grouped_gemm", Impl("triton", fused_moe_kernel_triton))
