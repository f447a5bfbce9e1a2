"""The batch-1 decode step, fused: each weight matrix is read by one kernel that also does
the small work around it.

At decode batch 1 a step is a chain of about fifteen kernels per layer (norm, qkv GEMV,
q-norm, k-norm, RoPE, KV store, attention, o GEMV, residual add and norm, gate/up GEMV,
SwiGLU, down GEMV...). Most of them touch a few kilobytes, yet each costs a few
microseconds however little it does: the launch, one round trip to memory, the tail. The
step's time is then the number of kernels, not the bytes. Four fusions bring a layer down
to four GEMV kernels and the attention:

* ``norm_gemv``: the RMSNorm before a linear layer becomes the GEMV's *prologue*: every
  program reads the whole input row (a few KB, from cache), computes its mean square, and
  normalises each chunk of ``x`` as it multiplies it. Used for ``qkv_proj`` (after the
  input norm) and ``gate_up_proj`` (after the post-attention norm);
* ``swiglu=True``: a program owns rows ``j`` of the gate *and* of the up projection, so
  ``silu(gate) * up`` is its *epilogue* and the ``[M, 2I]`` intermediate is never written;
* ``gemv_add_residual_``: the residual add is the epilogue of ``o_proj`` and ``down_proj``:
  each program adds its outputs into the residual stream in place. With the add there and
  the norm in the next GEMV's prologue, the separate add-and-norm kernel disappears;
* ``qk_norm_rope_store``: one kernel does Qwen3's per-head q/k norm, RoPE, and the store of
  this step's K and V into the pool at ``out_loc``, writing only the rotated queries (for
  one or two requests on FlashInfer, ``triton_decode.decode_attention_qkv`` does this
  inside the attention kernel instead).

No split-K here (unlike ``triton_gemv``): an epilogue needs the whole sum in one program,
so enough bytes are kept in flight by giving each program long rows instead: one to eight
of them (at most 16 KiB of weights, at least 256 programs per GEMV), each whole in one tile
when the registers allow (``BLOCK_K`` up to 4,096). Every kernel here is launched with
programmatic dependent launch (``pdl``) and lets the next one be scheduled first thing: it
reads its weights (all of them, when the row fits one tile) before waiting for the kernel
before it, so weights stream in while those finish.

Every intermediate that the unfused path would write to memory is rounded to the input
dtype at the same point here (the normalised row, the gate and up outputs, the linear
output before the residual add), so the fused path rounds like the unfused one except that
sums run in another order. The torch references are ``torch_ops.norm_linear``,
``torch_ops.linear_add_residual_`` and ``torch_ops.qk_norm_rope_store``; the CPU tests run
these kernels under ``TRITON_INTERPRET=1`` against them. Upstream mini-sglang has no fused
decode path (its layers call FlashInfer and cuBLAS one op at a time); this module is the
book's own.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from .pdl import launch_options, use_pdl
from .triton_gemv import check_gemv_args

# Tiles measured on an H200, in the whole layer's chain of kernels (a layer's ~18 us, not
# each GEMV alone). BLOCK_N is the largest power of two that leaves a GEMV at least
# MIN_PROGRAMS programs and a program at most MAX_TILE_WEIGHTS weights (16 KiB of bf16), and
# at least 1. For Qwen3-0.6B: qkv_proj 8 rows, gate_up_proj 4 (each a gate and an up row),
# o_proj 4, down_proj 2. The program floor sets o_proj (4 rows, 256 programs, ~0.4 us a
# layer faster than 2 rows and 512 programs); the byte bound keeps gate_up_proj and
# down_proj where the floor alone would double them (gate/up at 8 rows and down at 4 were
# slower). A whole row of K sits in one tile, so that a program reads all of its weights
# before its PDL wait (down_proj's K = 3,072 in one masked 4,096-wide tile saved 2 us a
# layer over three 1,024-wide ones).
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
    ``BLOCK_K`` halved while even 8 would. ``n`` counts outputs (for SwiGLU, ``I``). Raises
    ValueError for a non-positive size."""
    if m < 1 or n < 1 or k < 1:
        raise ValueError(f"gemv needs positive sizes, got M={m}, N={n}, K={k}")
    rows_per_output = 2 if swiglu else 1  # SwiGLU reads a gate row and an up row
    block_n = min(n // MIN_PROGRAMS, MAX_TILE_WEIGHTS // (k * rows_per_output))
    block_n = min(MAX_BLOCK_N, 1 << max(0, block_n.bit_length() - 1))
    block_m, block_k = triton.next_power_of_2(m), min(MAX_BLOCK_K, triton.next_power_of_2(k))
    per_thread = lambda bk, warps: block_m * block_n * bk * rows_per_output // (32 * warps)  # noqa: E731
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
):
    dtype = x_ptr.dtype.element_ty
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


def _check_gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], rows: int
) -> None:
    """``triton_gemv``'s checks, and a float dtype (the epilogues round to it)."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be fp16, bf16 or float32, got {x.dtype}")
    check_gemv_args(x, weight, bias, rows)


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
) -> None:
    m, k = x.shape
    if m == 0 or n == 0:
        return
    cfg = config or fused_gemv_config(m, n, k, swiglu)
    pdl = use_pdl(x)
    if cfg.block_m < m:
        raise ValueError(f"config.block_m={cfg.block_m} is smaller than M={m}")
    _fused_gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        x,
        weight,
        bias if bias is not None else x,
        norm_weight if norm_weight is not None else x,
        residual if residual is not None else out,
        out,
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
) -> torch.Tensor:
    """``linear(rms_norm(x, norm_weight, eps), weight, bias)`` in one kernel.

    ``x: [M, K]`` (a few rows), ``norm_weight: [K]``, ``weight: [N, K]``, ``bias: [N]``.
    Returns ``[M, N]``; with ``swiglu=True`` the weight holds ``[gate | up]`` (``N = 2I``)
    and the result is ``silu(gate) * up``, ``[M, I]``. Same reference as
    ``torch_ops.norm_linear``. ``config`` overrides ``fused_gemv_config`` (the benchmark's
    sweep). Raises ValueError on mismatched shapes or dtypes.
    """
    _check_gemv(x, weight, bias, weight.shape[0])
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
    )
    return out


def gemv_add_residual_(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    config: Optional[FusedGemvConfig] = None,
) -> torch.Tensor:
    """``residual += linear(x, weight, bias)``, in place, in one kernel; returns ``residual``.

    ``x: [M, K]``, ``weight: [N, K]``, ``residual: [M, N]`` with contiguous rows, not
    overlapping ``x`` (programs write the residual while others still read ``x``). Same
    reference as ``torch_ops.linear_add_residual_``. Raises ValueError on mismatched shapes.
    """
    _check_gemv(x, weight, bias, weight.shape[0])
    if residual.shape != (x.shape[0], weight.shape[0]) or residual.dtype != x.dtype:
        raise ValueError(
            f"residual must be [{x.shape[0]}, {weight.shape[0]}] in {x.dtype}, "
            f"got {tuple(residual.shape)} in {residual.dtype}"
        )
    if residual.stride(1) != 1:
        raise ValueError("the residual's rows must be contiguous")
    _launch(x, weight, bias, residual, weight.shape[0], residual=residual, config=config)
    return residual


def check_qk_args(
    t: int,
    head_dim: int,
    positions: torch.Tensor,
    out_loc: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm: Optional[torch.Tensor],
    k_norm: Optional[torch.Tensor],
) -> None:
    """The checks of what both q/k kernels take besides qkv (``qk_norm_rope_store`` here,
    ``triton_decode.decode_attention_qkv``): ``positions``, ``out_loc: [T]`` integers, the
    norms both ``[D]`` or both None, ``cos_sin_cache: [max_pos, D]`` contiguous float32.
    What the host cannot see without a device sync stays the caller's: every position must
    be below ``max_pos`` and every slot inside the pool. Raises ValueError."""
    for name, x in (("positions", positions), ("out_loc", out_loc)):
        if x.shape != (t,) or x.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be [{t}] int32 or int64, got {tuple(x.shape)} {x.dtype}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm go together: give both or neither")
    if q_norm is not None and (q_norm.shape != (head_dim,) or k_norm.shape != (head_dim,)):
        raise ValueError(
            f"q_norm and k_norm must be [{head_dim}], got {tuple(q_norm.shape)} and {tuple(k_norm.shape)}"
        )
    if (
        cos_sin_cache.dtype != torch.float32
        or cos_sin_cache.dim() != 2
        or cos_sin_cache.shape[1] != head_dim
        or not cos_sin_cache.is_contiguous()
    ):
        raise ValueError(
            f"cos_sin_cache must be a contiguous float32 [max_pos, {head_dim}], "
            f"got {tuple(cos_sin_cache.shape)} {cos_sin_cache.dtype}"
        )


@triton.jit
def _qk_norm_rope_store_kernel(
    qkv_ptr,
    q_out_ptr,
    k_slots_ptr,
    v_slots_ptr,
    loc_ptr,
    pos_ptr,
    cos_sin_ptr,
    q_norm_ptr,
    k_norm_ptr,
    stride_qkv,
    stride_slot,
    eps,
    NUM_QO_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_QK_NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    dtype = qkv_ptr.dtype.element_ty
    if PDL:  # the next kernel may be scheduled as soon as every program of this one runs
        tl.extra.cuda.gdc_launch_dependents()
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # a query head, or (from NUM_QO_HEADS on) a KV head
    half = tl.arange(0, HEAD_DIM // 2)
    # what the previous kernel does not write: this token's angles, the norm's weights, its slot
    pos = tl.load(pos_ptr + token).to(tl.int64)
    cos = tl.load(cos_sin_ptr + pos * HEAD_DIM + half)
    sin = tl.load(cos_sin_ptr + pos * HEAD_DIM + HEAD_DIM // 2 + half)
    if HAS_QK_NORM:  # q's or k's weights (both are a few hundred bytes in cache)
        is_q = head < NUM_QO_HEADS
        w1 = tl.where(is_q, tl.load(q_norm_ptr + half), tl.load(k_norm_ptr + half)).to(tl.float32)
        w2 = tl.where(
            is_q,
            tl.load(q_norm_ptr + HEAD_DIM // 2 + half),
            tl.load(k_norm_ptr + HEAD_DIM // 2 + half),
        ).to(tl.float32)
    slot = tl.load(loc_ptr + token).to(tl.int64)  # where this token's K/V go
    if PDL:
        tl.extra.cuda.gdc_wait()  # qkv, written by the GEMV before, is visible
    src = qkv_ptr + token * stride_qkv + head * HEAD_DIM  # k heads follow the q heads
    x1 = tl.load(src + half).to(tl.float32)
    x2 = tl.load(src + HEAD_DIM // 2 + half).to(tl.float32)
    if HAS_QK_NORM:  # Qwen3: RMSNorm over each head, weights per query or per key
        inv_rms = tl.rsqrt((tl.sum(x1 * x1) + tl.sum(x2 * x2)) / HEAD_DIM + eps)
        x1 = ((x1 * inv_rms).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        x2 = ((x2 * inv_rms).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    # RoPE, neox layout: the row's halves are the pairs' two coordinates
    y1 = (x1 * cos - x2 * sin).to(dtype)
    y2 = (x2 * cos + x1 * sin).to(dtype)
    if head < NUM_QO_HEADS:
        q_dst = q_out_ptr + (token * NUM_QO_HEADS + head) * HEAD_DIM
        tl.store(q_dst + half, y1)
        tl.store(q_dst + HEAD_DIM // 2 + half, y2)
    else:  # store K, and the V head of the same index, into this token's slot
        kv_head = head - NUM_QO_HEADS
        kv_off = slot * stride_slot + kv_head * HEAD_DIM
        tl.store(k_slots_ptr + kv_off + half, y1)
        tl.store(k_slots_ptr + kv_off + HEAD_DIM // 2 + half, y2)
        v_src = src + NUM_KV_HEADS * HEAD_DIM
        cols = tl.arange(0, HEAD_DIM)
        tl.store(v_slots_ptr + kv_off + cols, tl.load(v_src + cols))


def qk_norm_rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm: Optional[torch.Tensor],
    k_norm: Optional[torch.Tensor],
    eps: float,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    out_loc: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Split ``qkv: [T, (H_q + 2 H_kv) D]``, RMS-normalise q and k per head (when
    ``q_norm, k_norm: [D]`` are given), rotate them (``cos_sin_cache: [max_pos, D]`` float32,
    ``positions: [T]``), store k and v at ``k_slots[out_loc]``, ``v_slots[out_loc]``
    (``[num_slots, H_kv, D]``), and return the queries, ``[T, H_q, D]``. One program per
    (token, q or k head). Same reference as ``torch_ops.qk_norm_rope_store``.
    Raises ValueError on shapes that disagree or a head size that is not a power of two.
    """
    t = qkv.shape[0]
    if (
        qkv.dim() != 2
        or qkv.shape[1] != (num_qo_heads + 2 * num_kv_heads) * head_dim
        or qkv.stride(1) != 1
    ):
        raise ValueError(
            f"qkv must be [T, {(num_qo_heads + 2 * num_kv_heads) * head_dim}] with "
            f"contiguous rows, got {tuple(qkv.shape)}"
        )
    if head_dim & (head_dim - 1) or head_dim < 2:
        raise ValueError(f"the head size must be a power of two, got {head_dim}")
    if k_slots.shape[1:] != (num_kv_heads, head_dim) or not (
        k_slots.is_contiguous() and v_slots.is_contiguous()
    ):
        raise ValueError(
            f"the KV slots must be contiguous [num_slots, {num_kv_heads}, {head_dim}], "
            f"got {tuple(k_slots.shape)}"
        )
    if (
        v_slots.shape != k_slots.shape
        or v_slots.dtype != k_slots.dtype
        or k_slots.dtype != qkv.dtype
    ):
        raise ValueError(
            f"k_slots {tuple(k_slots.shape)} {k_slots.dtype}, v_slots {tuple(v_slots.shape)} "
            f"{v_slots.dtype} and qkv {qkv.dtype} must agree"
        )
    check_qk_args(t, head_dim, positions, out_loc, cos_sin_cache, q_norm, k_norm)
    q = torch.empty((t, num_qo_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if t == 0:
        return q
    has_norm, pdl = q_norm is not None, use_pdl(qkv)
    _qk_norm_rope_store_kernel[(t, num_qo_heads + num_kv_heads)](
        qkv,
        q,
        k_slots,
        v_slots,
        out_loc.contiguous(),
        positions.contiguous(),
        cos_sin_cache,
        q_norm.to(qkv.dtype).contiguous() if has_norm else qkv,
        k_norm.to(qkv.dtype).contiguous() if has_norm else qkv,
        qkv.stride(0),
        k_slots.stride(0),
        eps,
        NUM_QO_HEADS=num_qo_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HAS_QK_NORM=has_norm,
        PDL=pdl,
        **launch_options(pdl),
    )
    return q
