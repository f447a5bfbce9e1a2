"""The LM head of a decode step of up to four requests: the final RMSNorm and the
vocabulary projection in one persistent Triton kernel.

The LM head is the step's largest single read (Qwen3-0.6B's ``[151936, 1024]`` bf16 weight
is 311 MB, a quarter of the model), and at a few rows of ``x`` it is a pure streaming
problem. One program per 8 rows, as the layers' fused GEMVs have, leaves each program too
little time to hide the latency of its one load. So this kernel is *persistent*:
``LM_HEAD_PROGRAMS_PER_SM`` programs per SM each normalise ``x`` once and then walk the
vocabulary with a stride of the grid, ``BLOCK_N`` rows at a time, and Triton's software
pipeline (``tl.range(..., num_stages=STAGES)``) keeps the next tiles' loads in flight (into
shared memory) while the current tile is reduced. The final norm's kernel is gone too.

Unlike the layers' kernels it is launched plainly, without PDL: a persistent kernel counts
on its programs being spread evenly over the SMs, which programs launched early, beside the
last layer's on SMs busy to different degrees, are not. Chapter 19 measures both.

The norm rounds where ``torch_ops.rms_norm`` does (as ``fused.norm_gemv``); the reference is
``torch_fused.norm_lm_head``, which the CPU tests compare it with under
``TRITON_INTERPRET=1``. Upstream mini-sglang computes the LM head with ``F.linear``; this
module is the book's own.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from minisgl.kernel import speedups

from .. import Impl, register
from .checks import check_gemv_args
from .fused import MAX_BLOCK_K

# two programs per SM, each with three tiles in flight, keep enough loads in flight to
# stream the weight (chapter 19 measures the alternatives)
LM_HEAD_PROGRAMS_PER_SM = 2
# a row of x and of the weight is one tile: the kernel table keeps wider ones on torch
MAX_K = MAX_BLOCK_K
INTERPRETER_SMS = 4  # the grid of the CPU interpreter: a few programs, each walking many tiles


class LMHeadConfig(NamedTuple):
    """Programs in the grid, rows per tile, tiles per program (the loop's trip count), warps,
    and the software pipeline's stages (tiles in flight, the one being reduced included)."""

    programs: int
    block_n: int
    iters: int
    num_warps: int
    stages: int


def lm_head_config(n: int, num_sms: int) -> LMHeadConfig:
    """The grid for ``n`` vocabulary rows on ``num_sms`` SMs (``LM_HEAD_PROGRAMS_PER_SM`` each,
    or fewer when there are fewer tiles). Raises ValueError for a non-positive size."""
    if n < 1 or num_sms < 1:
        raise ValueError(f"lm_head_config needs positive sizes, got N={n}, num_sms={num_sms}")
    block_n = 8
    tiles = triton.cdiv(n, block_n)
    programs = min(tiles, LM_HEAD_PROGRAMS_PER_SM * num_sms)
    return LMHeadConfig(programs, block_n, triton.cdiv(tiles, programs), num_warps=4, stages=3)


@triton.jit
def _norm_lm_head_kernel(
    x_ptr,
    norm_w_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    stride_xm,
    stride_wn,
    stride_om,
    eps,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ITERS: tl.constexpr,
    STAGES: tl.constexpr,
):
    dtype = x_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask, k_mask = offs_m < M, offs_k < K
    norm_w = tl.load(norm_w_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
    x = tl.load(
        x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
        mask=m_mask[:, None] & k_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / K + eps)
    x = (x * inv_rms[:, None]).to(dtype).to(tl.float32)  # rounded where the unfused norm writes it
    x = (x * norm_w[None, :]).to(dtype).to(tl.float32)  # [BLOCK_M, BLOCK_K]

    # tile i of this program is rows (program + i * programs) * BLOCK_N...: the grid strides
    # through the vocabulary; the pipeline loads the next STAGES - 1 tiles while one is reduced
    first = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    stride = tl.num_programs(0) * BLOCK_N
    for i in tl.range(0, ITERS, num_stages=STAGES):
        offs_n = first + i * stride
        n_mask = offs_n < N
        w = tl.load(
            w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :],
            mask=n_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        logits = tl.sum(x[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)  # [BLOCK_M, BLOCK_N]
        tl.store(
            out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
            logits.to(dtype),
            mask=m_mask[:, None] & n_mask[None, :],
        )


def norm_lm_head(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> torch.Tensor:
    """Logits ``linear(rms_norm(x, norm_weight, eps), weight)`` in one kernel.

    ``x: [M, K]`` (a few rows of the residual stream, before the final norm),
    ``norm_weight: [K]``, ``weight: [V, K]`` with contiguous rows (the LM head, or the tied
    embedding). Returns ``[M, V]`` in x's dtype. Same reference as
    ``torch_fused.norm_lm_head``. ``K`` is read in one tile: at most ``MAX_K`` (4,096).

    Raises:
        ValueError: on mismatched shapes or dtypes, or ``K`` over 4,096.
    """
    check_gemv_args(x, weight, None, weight.shape[0])
    m, k = x.shape
    if norm_weight.shape != (k,) or not norm_weight.is_contiguous():
        raise ValueError(f"norm_weight must be a contiguous [{k}], got {tuple(norm_weight.shape)}")
    if k > MAX_K:
        raise ValueError(f"the LM head reads a row in one tile: K <= {MAX_K}, got {k}")
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    sms = (
        torch.cuda.get_device_properties(x.device).multi_processor_count
        if x.is_cuda
        else INTERPRETER_SMS
    )
    cfg = lm_head_config(n, sms)
    _norm_lm_head_kernel[(cfg.programs,)](
        x,
        norm_weight.to(x.dtype),
        weight,
        out,
        m,
        n,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        eps,
        K=k,
        BLOCK_M=triton.next_power_of_2(m),
        BLOCK_N=cfg.block_n,
        BLOCK_K=triton.next_power_of_2(k),
        ITERS=cfg.iters,
        STAGES=cfg.stages,
        num_warps=cfg.num_warps,
    )
    return out


# ---- the kernel table's entry ---------------------------------------------------------------
def lm_head_fits(x: torch.Tensor, *_: Any) -> bool:
    """A row of ``K`` in one tile, unless the speed-up ``lm_head_kernel`` is off."""
    return speedups.current().lm_head_kernel and x.shape[1] <= MAX_K


register("norm_lm_head", Impl("triton", norm_lm_head, lm_head_fits))
