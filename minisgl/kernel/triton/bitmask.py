"""A grammar's token bitmask applied in place: one Triton kernel that writes and never reads
the logits.

Program ``(b, k)`` covers tokens ``[k * BLOCK, (k + 1) * BLOCK)`` of row ``b``: it loads the
``BLOCK / 32`` mask words that cover them, takes each token's bit, and stores ``-inf`` where the
bit is 0. The logits are not read at all: the traffic is the mask (one bit a token) plus the
stores of the forbidden tokens, where the torch reference expands the mask to a byte a token
and rewrites every logit. Registered for the op ``apply_token_bitmask``
(``kernel/bitmask.py``). llguidance and xgrammar ship kernels of the same shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import Impl, register

BLOCK = 4096  # tokens a program covers: 128 mask words


@triton.jit
def _apply_token_bitmask_kernel(
    logits_ptr, bitmask_ptr, V, logits_stride, bitmask_stride, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = tokens < V
    words = tl.load(bitmask_ptr + row * bitmask_stride + tokens // 32, mask=inside, other=-1)
    forbidden = ((words >> (tokens % 32)) & 1) == 0
    minus_inf = tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * logits_stride + tokens, minus_inf, mask=inside & forbidden)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """``logits: [B, V]`` (rows contiguous), ``bitmask: [B, ceil(V / 32)]`` int32: forbidden
    tokens get ``-inf``, in place."""
    B, V = logits.shape
    grid = (B, triton.cdiv(V, BLOCK))
    _apply_token_bitmask_kernel[grid](
        logits, bitmask, V, logits.stride(0), bitmask.stride(0), BLOCK=BLOCK
    )


def _fits(logits: torch.Tensor, bitmask: torch.Tensor) -> bool:
    return (
        logits.stride(1) == 1
        and bitmask.is_contiguous()
        and bitmask.device == logits.device
        and logits.dtype in (torch.float16, torch.bfloat16, torch.float32)
    )


register("apply_token_bitmask", Impl("triton", apply_token_bitmask_triton, _fits))
