"""The layer's GEMVs of a decode step of up to four requests, fused with the work around them.

At decode batch 1 a layer is a chain of about fifteen kernels (norm, qkv GEMV, q-norm,
k-norm, RoPE, KV store, attention, o GEMV, residual add and norm, gate/up GEMV, SwiGLU, down
GEMV...). Most of them touch a few kilobytes, yet each costs a few microseconds however
little it does: the launch, one round trip to memory, the tail. The step's time is then the
number of kernels, not the bytes. One kernel here, ``_fused_gemv_kernel``, reads each weight
matrix once and does the small work around it:

* ``norm_gemv``: the RMSNorm before a linear layer becomes the GEMV's *prologue*: every
  program reads the whole input row (a few KB, from cache), computes its mean square, and
  normalises each chunk of ``x`` as it multiplies it. Used for ``qkv_proj`` (after the
  input norm) and ``gate_up_proj`` (after the post-attention norm);
* ``swiglu=True``: a program owns rows ``j`` of the gate *and* of the up projection, so
  ``silu(gate) * up`` is its *epilogue* and the ``[M, 2I]`` intermediate is never written;
* ``gemv_add_residual_``: the residual add is the epilogue of ``o_proj`` and ``down_proj``:
  each program adds its outputs into the residual stream in place. With the add there and
  the norm in the next GEMV's prologue, the separate add-and-norm kernel disappears.

No split-K here (unlike ``gemv``): an epilogue needs the whole sum in one program, so
enough bytes are kept in flight by giving each program long rows instead, each whole in one
tile when the registers allow. Every kernel here is launched with programmatic dependent
launch (``pdl``) and lets the next one be scheduled first thing: it reads its weights before
waiting for the kernel before it, so weights stream in while those finish.

Every intermediate that the unfused path writes to memory is rounded to the input dtype at
the same point here (the normalised row, the gate and up outputs, the linear output before
the residual add), so the fused path rounds like the unfused one except that sums run in
another order. The torch references are ``torch_fused.norm_linear`` and
``torch_fused.linear_add_residual_``; the CPU tests run these kernels under
``TRITON_INTERPRET=1`` against them. Upstream mini-sglang has no fused decode path (its
layers call FlashInfer and cuBLAS one op at a time); this module is the book's own.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from .. import Impl, register
from . import timeline
from .checks import check_gemv_args
from .pdl import launch_options, use_pdl

# A program holds its weights in registers while it waits for the kernel before, so the
# bounds below are about registers as much as bandwidth (chapter 19 measures them): BLOCK_N is
# the largest power of two that leaves a GEMV MIN_PROGRAMS programs and a program at most
# MAX_TILE_WEIGHTS weights; a row of K up to MAX_BLOCK_K is one tile, read whole before the wait.
MAX_TILE_WEIGHTS = 8192
MIN_PROGRAMS = 256
MAX_BLOCK_N = 8
MAX_BLOCK_K = 4096
# float32 accumulator elements per thread at most (BLOCK_M x BLOCK_N x BLOCK_K, twice for
# SwiGLU, over the threads): past this the registers spill.
MAX_ACC_PER_THREAD = 128


class FusedGemvConfig(NamedTuple):
    """Tiles of one fused GEMV: rows of ``x``, output columns and inputs per program."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int


def fused_gemv_config(m: int, n: int, k: int, swiglu: bool = False) -> FusedGemvConfig:
    """``BLOCK_N``: the largest power of two <= both ``N / MIN_PROGRAMS`` and
    ``MAX_TILE_WEIGHTS`` over a row's weights, from 1 to ``MAX_BLOCK_N``; ``BLOCK_K`` the
    next power of two >= ``K`` up to ``MAX_BLOCK_K`` (the lanes past ``K`` are masked off);
    4 warps, or 8 when 4 would hold more than ``MAX_ACC_PER_THREAD`` accumulators each, and
    ``BLOCK_K`` halved while even 8 would. ``n`` counts outputs (for SwiGLU, ``I``).

    Raises:
        ValueError: for a non-positive size.
    """
    if m < 1 or n < 1 or k < 1:
        raise ValueError(f"gemv needs positive sizes, got M={m}, N={n}, K={k}")
    rows_per_output = 2 if swiglu else 1  # SwiGLU reads a gate row and an up row
    block_n = min(n // MIN_PROGRAMS, MAX_TILE_WEIGHTS // (k * rows_per_output))
    block_n = min(MAX_BLOCK_N, 1 << max(0, block_n.bit_length() - 1))
    block_m, block_k = triton.next_power_of_2(m), min(MAX_BLOCK_K, triton.next_power_of_2(k))

    def per_thread(bk: int, warps: int) -> int:
        return block_m * block_n * bk * rows_per_output // (32 * warps)

    num_warps = 4 if per_thread(block_k, 4) <= MAX_ACC_PER_THREAD else 8
    while block_k > 16 and per_thread(block_k, num_warps) > MAX_ACC_PER_THREAD:
        block_k //= 2
    return FusedGemvConfig(block_m, block_n, block_k, num_warps)


@triton.jit
def _load_weight_tile(w_rows, up_rows, k0, offs_k, n_mask, K: tl.constexpr, SWIGLU: tl.constexpr):
    """The ``[BLOCK_N, BLOCK_K]`` weight tile at ``k0`` (and the up projection's), as float32;
    zeros past ``K``, where the loads are masked off and read nothing."""
    mask = n_mask[:, None] & (k0 + offs_k < K)[None, :]
    w = tl.load(w_rows + k0 + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    w_up = w
    if SWIGLU:
        w_up = tl.load(up_rows + k0 + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    return w, w_up


@triton.jit
def _fused_gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    norm_w_ptr,
    res_ptr,
    out_ptr,
    stamps_ptr,
    M,
    N,
    stride_xm,
    stride_wn,
    stride_rm,
    stride_om,
    eps,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NORM: tl.constexpr,
    SWIGLU: tl.constexpr,
    ADD_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr,
    TIMELINE: tl.constexpr,
):
    dtype = x_ptr.dtype.element_ty
    if TIMELINE:
        started = timeline.now()
    if PDL:  # the next kernel may be scheduled as soon as every program of this one runs
        tl.extra.cuda.gdc_launch_dependents()
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    up_rows = w_rows + N * stride_wn  # SwiGLU: the up projection's row j follows the gate's
    out_mask = m_mask[:, None] & n_mask[None, :]

    # The weights (and the norm's, and the bias) do not depend on the previous kernel: read
    # them before waiting for it. With PDL this program may run while the kernels before it
    # are still finishing; a row of K <= BLOCK_K is then read whole before the wait.
    w, w_up = _load_weight_tile(w_rows, up_rows, 0, offs_k, n_mask, K, SWIGLU)
    if NORM:
        norm_w = tl.load(norm_w_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        if SWIGLU:
            bias_up = tl.load(bias_ptr + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_wait()  # the previous kernel's writes (x, the residual) are visible
    if TIMELINE:
        waited = timeline.now()
    # then what it wrote, at once: x's first tile and the residual the epilogue adds to
    x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & (offs_k < K)[None, :], other=0.0)
    if ADD_RESIDUAL:
        r_ptrs = res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :]
        residual = tl.load(r_ptrs, mask=out_mask, other=0.0).to(tl.float32)

    if NORM:  # prologue, pass 1: each row's mean square, over all of K
        sum_sq = tl.sum(x.to(tl.float32) * x.to(tl.float32), axis=1)
        for k0 in range(BLOCK_K, K, BLOCK_K):  # the tiles after the first, if any
            mask = m_mask[:, None] & (k0 + offs_k < K)[None, :]
            x_k = tl.load(x_rows + k0 + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
            sum_sq += tl.sum(x_k * x_k, axis=1)
        inv_rms = tl.rsqrt(sum_sq / K + eps)

    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)  # unused without SWIGLU
    for k0 in range(0, K, BLOCK_K):
        x_f = x.to(tl.float32)
        if NORM:  # prologue, pass 2: rounded where the unfused norm writes its output
            x_f = (x_f * inv_rms[:, None]).to(dtype).to(tl.float32)
            x_f = (x_f * norm_w[None, :]).to(dtype).to(tl.float32)
        acc += x_f[:, None, :] * w[None, :, :]
        if SWIGLU:
            acc_up += x_f[:, None, :] * w_up[None, :, :]
        # the next tile of each (masked off, reading nothing, after the last)
        k_next = k0 + BLOCK_K + offs_k
        w, w_up = _load_weight_tile(w_rows, up_rows, k0 + BLOCK_K, offs_k, n_mask, K, SWIGLU)
        x = tl.load(
            x_rows + k_next[None, :], mask=m_mask[:, None] & (k_next < K)[None, :], other=0.0
        )
        if NORM:
            norm_w = tl.load(norm_w_ptr + k_next, mask=k_next < K, other=0.0).to(tl.float32)
    y = tl.sum(acc, axis=2)  # [BLOCK_M, BLOCK_N]

    if HAS_BIAS:
        y += bias[None, :]
    if SWIGLU:  # epilogue: silu(gate) * up, each rounded as the unfused matmul writes it
        up = tl.sum(acc_up, axis=2)
        if HAS_BIAS:
            up += bias_up[None, :]
        gate = y.to(dtype).to(tl.float32)
        y = gate * tl.sigmoid(gate) * up.to(dtype).to(tl.float32)
    if ADD_RESIDUAL:  # epilogue: the residual stream += this layer's output, in place
        y = y.to(dtype).to(tl.float32) + residual
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], y.to(dtype), mask=out_mask)
    if TIMELINE:
        timeline.record(stamps_ptr, started, waited)


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    out: torch.Tensor,
    n: int,
    *,
    norm_weight: Optional[torch.Tensor] = None,
    eps: float = 0.0,
    swiglu: bool = False,
    residual: Optional[torch.Tensor] = None,
    config: Optional[FusedGemvConfig] = None,
    stamps: Optional[torch.Tensor] = None,
) -> None:
    m, k = x.shape
    if m == 0 or n == 0:
        return
    cfg = config or fused_gemv_config(m, n, k, swiglu)
    if cfg.block_m < m:
        raise ValueError(f"config.block_m={cfg.block_m} is smaller than M={m}")
    grid = (triton.cdiv(n, cfg.block_n),)
    timeline.check_stamps(stamps, grid[0])
    pdl = use_pdl(x)
    _fused_gemv_kernel[grid](
        x,
        weight,
        bias if bias is not None else x,
        norm_weight if norm_weight is not None else x,
        residual if residual is not None else out,
        out,
        stamps if stamps is not None else x,
        m,
        n,
        x.stride(0),
        weight.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        eps,
        K=k,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        NORM=norm_weight is not None,
        SWIGLU=swiglu,
        ADD_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None,
        PDL=pdl,
        TIMELINE=stamps is not None,
        num_warps=cfg.num_warps,
        **launch_options(pdl),
    )


def norm_gemv(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    swiglu: bool = False,
    config: Optional[FusedGemvConfig] = None,
    stamps: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``linear(rms_norm(x, norm_weight, eps), weight, bias)`` in one kernel.

    ``x: [M, K]`` (a few rows), ``norm_weight: [K]``, ``weight: [N, K]``, ``bias: [N]``.
    Returns ``[M, N]``; with ``swiglu=True`` the weight holds ``[gate | up]`` (``N = 2I``)
    and the result is ``silu(gate) * up``, ``[M, I]``. Same reference as
    ``torch_fused.norm_linear``. ``config`` overrides ``fused_gemv_config`` (the benchmark's
    sweep); ``stamps`` (``timeline.stamps_buffer``) records each program's timeline.

    Raises:
        ValueError: on mismatched shapes or dtypes.
    """
    check_gemv_args(x, weight, bias, weight.shape[0])
    if norm_weight.shape != (x.shape[1],) or not norm_weight.is_contiguous():
        raise ValueError(
            f"norm_weight must be a contiguous [{x.shape[1]}], got {tuple(norm_weight.shape)}"
        )
    n = weight.shape[0]
    if swiglu and n % 2:
        raise ValueError(f"a [gate | up] weight has an even number of rows, got {n}")
    n = n // 2 if swiglu else n
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    _launch(
        x,
        weight,
        bias,
        out,
        n,
        norm_weight=norm_weight.to(x.dtype),
        eps=eps,
        swiglu=swiglu,
        config=config,
        stamps=stamps,
    )
    return out


def gemv_add_residual_(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    config: Optional[FusedGemvConfig] = None,
    stamps: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``residual += linear(x, weight, bias)``, in place, in one kernel; returns ``residual``.

    ``x: [M, K]``, ``weight: [N, K]``, ``residual: [M, N]`` with contiguous rows, not
    overlapping ``x`` (programs write the residual while others still read ``x``). Same
    reference as ``torch_fused.linear_add_residual_``; ``config`` and ``stamps`` as in
    ``norm_gemv``.

    Raises:
        ValueError: on mismatched shapes or dtypes.
    """
    check_gemv_args(x, weight, bias, weight.shape[0])
    if residual.shape != (x.shape[0], weight.shape[0]) or residual.dtype != x.dtype:
        raise ValueError(
            f"residual must be [{x.shape[0]}, {weight.shape[0]}] in {x.dtype}, "
            f"got {tuple(residual.shape)} in {residual.dtype}"
        )
    if residual.stride(1) != 1:
        raise ValueError("the residual's rows must be contiguous")
    _launch(
        x, weight, bias, residual, weight.shape[0], residual=residual, config=config, stamps=stamps
    )
    return residual


# ---- the kernel table's entries -------------------------------------------------------------
register("norm_linear", Impl("triton", norm_gemv))
register("linear_add_residual_", Impl("triton", gemv_add_residual_))
