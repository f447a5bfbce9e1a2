"""Decode attention for a batch of a few requests, in Triton (split-KV, "flash-decoding").

One query token per request attends over its whole context. With a single request there
are only ``H_kv`` independent pieces of work (one per KV head), far too few to spread a few
megabytes of KV reads over 132 SMs, so the context is also split into ``num_splits``
chunks: a program per (request, KV head, chunk) computes the attention of the head's
``G = H_q / H_kv`` query heads over its chunk, with the chunk's own softmax, and writes
an unnormalised partial result and its log-sum-exp; a second kernel weighs the partials
by ``exp(lse - max lse)`` and sums them. Both steps are exact: the result equals one
softmax over the whole context, up to the order of sums. In a decode step every token but
the last was stored by an earlier step, so a program reads its first K/V tile before its
PDL wait, while the kernel before (which stores the last token) still runs, and adds the
last token after.

``decode_attention_qkv`` is the fused decode path's version: it starts from the qkv GEMV's
raw output, and each program also does Qwen3's q/k norms and RoPE for its own heads; the
one whose chunk holds this step's token stores its K/V and scores it from registers. The
layer's q-norm, k-norm, RoPE and KV-store kernels are then gone.

The KV lives in the paged pool as FlashInfer indexes it (chapter 17): request ``b``'s pages
are ``kv_page_ids[kv_indptr[b]:kv_indptr[b+1]]``, its last page holds
``kv_last_page_len[b]`` tokens, and position ``t`` is slot ``page(t) * P + t % P`` of the
``[num_slots, H_kv, D]`` pool. Everything is read from device tensors, so the kernel
replays in a CUDA graph with new lengths. The scores use ``tl.dot`` (tensor cores) with the
query heads of a group padded to 16 rows.

Reference: the torch attention backend (``attention/torch_backend.py``), after the attention
layer's own norms, RoPE and store for the qkv version; the CPU tests run these kernels under
``TRITON_INTERPRET=1``. Upstream mini-sglang uses FlashInfer's decode kernel at every batch
size; this module is the book's own.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl

from .. import Impl, register
from . import timeline
from .pdl import launch_options, use_pdl

BLOCK_T = 64  # tokens per iteration of a program
# chunks of a request's context, by default: at most one tile each up to 4,096 tokens
NUM_SPLITS = 64
NUM_WARPS = 4
# The merge: a one-warp program per (request, query head, 32 of the head's dims), so that its
# sums over the chunks stay inside the warp, with no shared memory or barrier between warps
MERGE_BLOCK_D = 32
MERGE_WARPS = 1


class FromQKV(NamedTuple):
    """What ``decode_attention_qkv`` does to q and k before attending: Qwen3's per-head
    RMSNorm (``q_norm, k_norm: [D]``, both or neither) and RoPE at ``positions: [B]`` from
    ``cos_sin_cache: [max_pos, D]``, with this step's K/V stored at ``out_loc: [B]``."""

    positions: torch.Tensor
    out_loc: torch.Tensor
    cos_sin_cache: torch.Tensor
    q_norm: Optional[torch.Tensor]
    k_norm: Optional[torch.Tensor]
    eps: float


@triton.jit
def _chunking(indptr_ptr, last_len_ptr, b, num_splits, PAGE: tl.constexpr, BLOCK_T: tl.constexpr):
    """Request ``b``'s first page, context length and chunk length (a multiple of
    ``BLOCK_T``, so that ``cdiv(seq_len, chunk)`` chunks hold tokens, the rest none): the
    one split rule both kernels follow."""
    first_page = tl.load(indptr_ptr + b)
    num_pages = tl.load(indptr_ptr + b + 1) - first_page
    seq_len = (num_pages - 1) * PAGE + tl.load(last_len_ptr + b)
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_T) * BLOCK_T
    return first_page, seq_len, chunk


@triton.jit
def _kv_rows(
    page_ids_ptr,
    first_page,
    pos,
    limit,
    kv_head,
    stride_slot,
    PAGE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Where the K/V rows of positions ``pos: [R]`` of one request start in the pool (element
    offsets), and the mask ``pos < limit`` (the page lookups past it read nothing)."""
    mask = pos < limit
    page = tl.load(page_ids_ptr + first_page + pos // PAGE, mask=mask, other=0).to(tl.int64)
    return (page * PAGE + pos % PAGE) * stride_slot + kv_head * HEAD_DIM, mask


@triton.jit
def _load_kv(k_ptr, v_ptr, rows, mask, HEAD_DIM: tl.constexpr):
    """K and V at ``rows: [R]``, ``[R, D]`` each; zeros (nothing read) where ``mask`` is off."""
    offs_d = tl.arange(0, HEAD_DIM)
    k = tl.load(k_ptr + rows[:, None] + offs_d[None, :], mask=mask[:, None], other=0.0)
    v = tl.load(v_ptr + rows[:, None] + offs_d[None, :], mask=mask[:, None], other=0.0)
    return k, v


@triton.jit
def _norm_rope(
    heads, mask, w, w_partner, cos, sin, eps, HAS_NORM: tl.constexpr, HEAD_DIM: tl.constexpr
):
    """Qwen3's per-head RMSNorm (weights ``w``) and RoPE, neox layout, on the rows that
    ``heads: [R]`` point to; returns ``[R, D]`` in their dtype. Rounds where
    ``torch_ops.rms_norm`` and ``torch_ops.apply_rotary`` do. A row's partner element ``(d + D/2) % D``
    is loaded as a second tile, so the rotation is elementwise."""
    dtype = heads.dtype.element_ty
    offs_d = tl.arange(0, HEAD_DIM)
    partner = (offs_d + HEAD_DIM // 2) % HEAD_DIM
    x = tl.load(heads[:, None] + offs_d[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
    x_p = tl.load(heads[:, None] + partner[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
    if HAS_NORM:
        inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
        x = ((x * inv_rms).to(dtype).to(tl.float32) * w[None, :]).to(dtype).to(tl.float32)
        x_p = (
            ((x_p * inv_rms).to(dtype).to(tl.float32) * w_partner[None, :]).to(dtype).to(tl.float32)
        )
    sign = tl.where(
        offs_d < HEAD_DIM // 2, -1.0, 1.0
    )  # first half: x1 cos - x2 sin; second: x2 cos + x1 sin
    return (x * cos[None, :] + sign[None, :] * x_p * sin[None, :]).to(dtype)


@triton.jit
def _decode_partial_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    indptr_ptr,
    page_ids_ptr,
    last_len_ptr,
    part_o_ptr,
    part_lse_ptr,
    pos_ptr,
    loc_ptr,
    cos_sin_ptr,
    q_norm_ptr,
    k_norm_ptr,
    stamps_ptr,
    sm_scale,
    stride_slot,
    num_splits,
    stride_q,
    eps,
    MAX_ITERS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr,
    FROM_QKV: tl.constexpr,
    HAS_QK_NORM: tl.constexpr,
    TIMELINE: tl.constexpr,
):
    if TIMELINE:
        started = timeline.now()
    if PDL:  # the next kernel may be scheduled as soon as every program of this one runs
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    first_page, seq_len, chunk = _chunking(indptr_ptr, last_len_ptr, b, num_splits, PAGE, BLOCK_T)
    start = split * chunk
    if start >= seq_len:  # an empty chunk (a short context split many ways): the merge skips it
        if TIMELINE:  # (chunk 0 always holds a token, so its programs still wait)
            timeline.record(stamps_ptr, started, 0)
        return
    end = tl.minimum(start + chunk, seq_len)
    offs_t = tl.arange(0, BLOCK_T)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)

    # Every token but this step's (the last) was stored by an earlier step: the first tile
    # of them is read before waiting for the kernel before, which writes q and the last
    # token's K/V; so is where the last token's K/V go (the index is the host's, copied
    # before the step). Its [BLOCK_G, D] tile repeats one row, so its score is a row sum.
    before_last = tl.minimum(end, seq_len - 1)
    rows, t_mask = _kv_rows(
        page_ids_ptr, first_page, start + offs_t, before_last, kv_head, stride_slot, PAGE, HEAD_DIM
    )
    k, v = _load_kv(k_ptr, v_ptr, rows, t_mask, HEAD_DIM)
    last = seq_len - 1 + 0 * offs_g
    last_rows, has_last = _kv_rows(
        page_ids_ptr, first_page, last, end, kv_head, stride_slot, PAGE, HEAD_DIM
    )
    has_last = has_last & (last >= start)  # only the chunk that holds it
    if FROM_QKV:  # this token's angles, the norms' weights and its slot: not the GEMV's either
        half = offs_d % (HEAD_DIM // 2)
        partner = (offs_d + HEAD_DIM // 2) % HEAD_DIM
        pos = tl.load(pos_ptr + b).to(tl.int64)
        cos = tl.load(cos_sin_ptr + pos * HEAD_DIM + half)
        sin = tl.load(cos_sin_ptr + pos * HEAD_DIM + HEAD_DIM // 2 + half)
        qw, qw_p, kw, kw_p = cos, cos, cos, cos  # unused without the norms
        if HAS_QK_NORM:
            qw = tl.load(q_norm_ptr + offs_d).to(tl.float32)
            qw_p = tl.load(q_norm_ptr + partner).to(tl.float32)
            kw = tl.load(k_norm_ptr + offs_d).to(tl.float32)
            kw_p = tl.load(k_norm_ptr + partner).to(tl.float32)
        slot = tl.load(loc_ptr + b).to(tl.int64)
    if PDL:
        tl.extra.cuda.gdc_wait()
    if TIMELINE:
        waited = timeline.now()
    g_mask = offs_g < GROUP
    q_head = kv_head * GROUP + offs_g  # this KV head's query heads
    if FROM_QKV:  # q from the GEMV's output; this token's K and V too, stored by their chunk
        qkv_row = q_ptr + b.to(tl.int64) * stride_q
        q = _norm_rope(
            qkv_row + q_head * HEAD_DIM, g_mask, qw, qw_p, cos, sin, eps, HAS_QK_NORM, HEAD_DIM
        )
        k_src = qkv_row + (NUM_KV_HEADS * GROUP + kv_head) * HEAD_DIM + 0 * offs_g
        k_last = _norm_rope(k_src, offs_g < BLOCK_G, kw, kw_p, cos, sin, eps, HAS_QK_NORM, HEAD_DIM)
        v_last = tl.load(k_src[:, None] + NUM_KV_HEADS * HEAD_DIM + offs_d[None, :])
        dst = slot * stride_slot + kv_head * HEAD_DIM + 0 * offs_g[:, None] + offs_d[None, :]
        first_row = (offs_g == 0)[:, None] & has_last[:, None]
        tl.store(k_ptr + dst, k_last, mask=first_row)
        tl.store(v_ptr + dst, v_last, mask=first_row)
    else:
        q_ptrs = q_ptr + (b * NUM_KV_HEADS * GROUP + q_head)[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(q_ptrs, mask=g_mask[:, None], other=0.0)
        k_last, v_last = _load_kv(k_ptr, v_ptr, last_rows, has_last, HEAD_DIM)

    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, HEAD_DIM), dtype=tl.float32)
    # a bound fixed at compile time (from the longest context a request may have), so one
    # graph serves every length; iterations past the chunk's last stored token do nothing
    for it in range(0, MAX_ITERS):
        if start + it * BLOCK_T < before_last:
            s = tl.dot(q, tl.trans(k)) * sm_scale  # [BLOCK_G, BLOCK_T], float32
            s = tl.where(t_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: the tile holds a token
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
            rows, t_mask = _kv_rows(
                page_ids_ptr,
                first_page,
                start + (it + 1) * BLOCK_T + offs_t,
                before_last,
                kv_head,
                stride_slot,
                PAGE,
                HEAD_DIM,
            )
            k, v = _load_kv(
                k_ptr, v_ptr, rows, t_mask, HEAD_DIM
            )  # the next tile (nothing after the last)

    # the last token, in the chunk that holds it
    s_last = tl.sum(q.to(tl.float32) * k_last.to(tl.float32), axis=1) * sm_scale
    s_last = tl.where(has_last, s_last, float("-inf"))
    m_new = tl.maximum(m_i, s_last)  # finite: the chunk holds a token, in a tile or this one
    alpha = tl.exp(m_i - m_new)
    p_last = tl.exp(s_last - m_new)
    l_i = l_i * alpha + p_last
    acc = acc * alpha[:, None] + p_last.to(v_last.dtype).to(tl.float32)[:, None] * v_last.to(
        tl.float32
    )
    m_i = m_new

    row = (b * NUM_KV_HEADS * GROUP + q_head) * num_splits + split  # [B, H_q, splits] order
    tl.store(part_lse_ptr + row, m_i + tl.log(l_i), mask=g_mask)
    tl.store(
        part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
        acc / l_i[:, None],
        mask=g_mask[:, None],
    )
    if TIMELINE:
        timeline.record(stamps_ptr, started, waited)


@triton.jit
def _decode_merge_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    indptr_ptr,
    last_len_ptr,
    stamps_ptr,
    num_splits,
    NUM_QO_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
    TIMELINE: tl.constexpr,
):
    if TIMELINE:
        started = timeline.now()
    row = tl.program_id(0)  # b * H_q + head; program_id(1) picks BLOCK_D of its dims
    if PDL:  # o_proj's GEMV may start loading its weights
        tl.extra.cuda.gdc_launch_dependents()
    # which chunks hold tokens: from the index, written before the step (read before the wait)
    _, seq_len, chunk = _chunking(
        indptr_ptr, last_len_ptr, row // NUM_QO_HEADS, num_splits, PAGE, BLOCK_T
    )
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    s_mask = offs_s < tl.cdiv(seq_len, chunk)  # the empty chunks' programs wrote nothing
    if PDL:
        tl.extra.cuda.gdc_wait()  # the partials are visible
    if TIMELINE:
        waited = timeline.now()
    lse = tl.load(part_lse_ptr + row * num_splits + offs_s, mask=s_mask, other=float("-inf"))
    o = tl.load(
        part_o_ptr + (row * num_splits + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
        mask=s_mask[:, None],
        other=0.0,
    )
    weight = tl.exp(lse - tl.max(lse, axis=0))
    out = tl.sum(o * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    tl.store(out_ptr + row * HEAD_DIM + offs_d, out.to(out_ptr.dtype.element_ty))
    if TIMELINE:
        timeline.record(stamps_ptr, started, waited)


def _check_slots(k_slots: torch.Tensor, v_slots: torch.Tensor, dtype: torch.dtype) -> None:
    if k_slots.dim() != 3 or v_slots.shape != k_slots.shape:
        raise ValueError(
            f"the slots must be [num_slots, H_kv, D], got {tuple(k_slots.shape)} and {tuple(v_slots.shape)}"
        )
    if not dtype == k_slots.dtype == v_slots.dtype or not dtype.is_floating_point:
        raise ValueError(
            f"q, k_slots and v_slots must share a float dtype, got {dtype}, {k_slots.dtype}, {v_slots.dtype}"
        )
    head_dim = k_slots.shape[2]
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"the head size must be a power of two >= 16, got {head_dim}")
    if not (k_slots.is_contiguous() and v_slots.is_contiguous()):
        raise ValueError("the KV slots must be contiguous")


def _check_index(
    bs: int,
    kv_indptr: torch.Tensor,
    kv_page_ids: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    page_size: int,
    max_seq_len: int,
    num_splits: int,
) -> None:
    if kv_indptr.shape != (bs + 1,) or kv_last_page_len.shape != (bs,):
        raise ValueError(
            f"kv_indptr must be [{bs + 1}] and kv_last_page_len [{bs}], "
            f"got {tuple(kv_indptr.shape)} and {tuple(kv_last_page_len.shape)}"
        )
    for name, x in (
        ("kv_indptr", kv_indptr),
        ("kv_page_ids", kv_page_ids),
        ("kv_last_page_len", kv_last_page_len),
    ):
        if x.dtype not in (torch.int32, torch.int64) or not x.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int32 or int64 tensor, got {x.dtype}")
    if page_size < 1 or max_seq_len < 1 or num_splits < 1:
        raise ValueError(
            f"page_size, max_seq_len and num_splits must be >= 1, got {page_size}, {max_seq_len}, {num_splits}"
        )


def _check_qk_args(
    t: int,
    head_dim: int,
    positions: torch.Tensor,
    out_loc: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm: Optional[torch.Tensor],
    k_norm: Optional[torch.Tensor],
) -> None:
    """What ``decode_attention_qkv`` takes besides qkv: ``positions``, ``out_loc: [T]`` integers, the
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


def _check_q(q: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor) -> None:
    """``q: [B, H_q, D]`` contiguous, in the slots' dtype, ``H_q`` a multiple of their
    ``H_kv``, and the slots as ``_check_slots`` wants them. Raises ValueError."""
    if q.dim() != 3:
        raise ValueError(f"q must be [B, H_q, D], got {tuple(q.shape)}")
    _check_slots(k_slots, v_slots, q.dtype)
    num_qo_heads, head_dim = q.shape[1:]
    if k_slots.shape[2] != head_dim or num_qo_heads % k_slots.shape[1] or not q.is_contiguous():
        raise ValueError(
            f"q {tuple(q.shape)} (contiguous) and slots {tuple(k_slots.shape)} disagree"
        )


def _check_qkv(
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
) -> Tuple[torch.Tensor, FromQKV]:
    """The checks of a call from ``qkv: [B, (H_q + 2 H_kv) D]`` (and ``_check_qk_args``'),
    then the output ``[B, H_q, D]`` to fill and the kernel's ``FromQKV``, the norms in
    qkv's dtype. Raises ValueError."""
    _check_slots(k_slots, v_slots, qkv.dtype)
    bs = qkv.shape[0]
    num_kv_heads, head_dim = k_slots.shape[1:]
    width = (num_qo_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width or qkv.stride(1) != 1 or num_qo_heads % num_kv_heads:
        raise ValueError(
            f"qkv must be [B, {width}] with contiguous rows ({num_qo_heads} query heads over "
            f"{num_kv_heads} KV heads), got {tuple(qkv.shape)}"
        )
    _check_qk_args(bs, head_dim, positions, out_loc, cos_sin_cache, q_norm, k_norm)
    out = torch.empty((bs, num_qo_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    norms = (
        (q_norm.to(qkv.dtype).contiguous(), k_norm.to(qkv.dtype).contiguous())
        if q_norm is not None
        else (None, None)
    )
    return out, FromQKV(positions.contiguous(), out_loc.contiguous(), cos_sin_cache, *norms, eps)


def _launch(
    q_or_qkv: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    index: Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    page_size: int,
    sm_scale: float,
    max_seq_len: int,
    num_splits: int,
    from_qkv: Optional[FromQKV] = None,
    stamps: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> torch.Tensor:
    """Both kernels, on ``index = (kv_indptr, kv_page_ids, kv_last_page_len)``; ``from_qkv``
    when ``q_or_qkv`` is the qkv GEMV's output; ``stamps``: the two kernels' buffers."""
    bs, num_qo_heads, head_dim = out.shape
    num_kv_heads = k_slots.shape[1]
    if bs == 0:
        return out
    part_o = torch.empty(
        (bs, num_qo_heads, num_splits, head_dim), dtype=torch.float32, device=out.device
    )
    part_lse = torch.empty((bs, num_qo_heads, num_splits), dtype=torch.float32, device=out.device)
    pdl = use_pdl(out)
    positions, out_loc, cos_sin, q_norm, k_norm, eps = from_qkv or (out, out, out, None, None, 0.0)
    has_norm = q_norm is not None  # _check_qk_args: both norms or neither
    group = num_qo_heads // num_kv_heads
    block_d = min(MERGE_BLOCK_D, head_dim)
    partial_grid, merge_grid = (
        (bs, num_kv_heads, num_splits),
        (bs * num_qo_heads, head_dim // block_d),
    )
    partial_stamps, merge_stamps = stamps or (None, None)
    timeline.check_stamps(partial_stamps, bs * num_kv_heads * num_splits)
    timeline.check_stamps(merge_stamps, merge_grid[0] * merge_grid[1])
    _decode_partial_kernel[partial_grid](
        q_or_qkv,
        k_slots,
        v_slots,
        *index,
        part_o,
        part_lse,
        positions,
        out_loc,
        cos_sin,
        q_norm if has_norm else out,
        k_norm if has_norm else out,
        partial_stamps if partial_stamps is not None else out,
        sm_scale,
        k_slots.stride(0),
        num_splits,
        q_or_qkv.stride(0),
        eps,
        MAX_ITERS=triton.cdiv(triton.cdiv(max_seq_len, num_splits), BLOCK_T),
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        NUM_KV_HEADS=num_kv_heads,
        PAGE=page_size,
        BLOCK_T=BLOCK_T,
        PDL=pdl,
        FROM_QKV=from_qkv is not None,
        HAS_QK_NORM=has_norm,
        TIMELINE=partial_stamps is not None,
        num_warps=NUM_WARPS,
        **launch_options(pdl),
    )
    kv_indptr, _, kv_last_page_len = index  # the merge needs only the lengths, to count the chunks
    _decode_merge_kernel[merge_grid](
        part_o,
        part_lse,
        out,
        kv_indptr,
        kv_last_page_len,
        merge_stamps if merge_stamps is not None else out,
        num_splits,
        NUM_QO_HEADS=num_qo_heads,
        HEAD_DIM=head_dim,
        PAGE=page_size,
        BLOCK_T=BLOCK_T,
        BLOCK_S=triton.next_power_of_2(num_splits),
        BLOCK_D=block_d,
        PDL=pdl,
        TIMELINE=merge_stamps is not None,
        num_warps=MERGE_WARPS,
        **launch_options(pdl),
    )
    return out


def decode_attention(
    q: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_page_ids: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    page_size: int,
    sm_scale: float,
    max_seq_len: int,
    num_splits: int = NUM_SPLITS,
) -> torch.Tensor:
    """Attention of one query token per request over its paged context.

    ``q: [B, H_q, D]``; ``k_slots, v_slots: [num_slots, H_kv, D]`` contiguous (the pool's
    per-token view); ``kv_indptr: [B + 1]``, ``kv_page_ids``, ``kv_last_page_len: [B]``
    int32 on the device (FlashInfer's paged index); ``sm_scale`` usually ``D ** -0.5``;
    ``max_seq_len`` bounds every request's context (it sets the programs' loop count; a longer
    context would be cut short, which only the caller can rule out without a device sync), and
    every context holds at least one token (a decode step's own).
    With PDL, q and each request's last token's K/V may be written by the kernel just
    before; the rest of the context must have been stored earlier (a decode step: it is read
    before the wait). The index tensors are contiguous int32/int64; that every page id lies
    inside the pool is the caller's to ensure (the host cannot read them without a sync).
    Returns ``[B, H_q, D]`` in q's dtype. Two launches: ``B x H_kv x num_splits`` partial
    programs, then ``B x H_q`` one-warp merges per 32 of the head's dims (one for ``D = 16``).
    ``D`` must be a power of two of at least 16.

    Raises:
        ValueError: on shapes, dtypes or sizes that disagree.
    """
    _check_q(q, k_slots, v_slots)
    _check_index(
        q.shape[0], kv_indptr, kv_page_ids, kv_last_page_len, page_size, max_seq_len, num_splits
    )
    return _launch(
        q,
        k_slots,
        v_slots,
        (kv_indptr, kv_page_ids, kv_last_page_len),
        torch.empty_like(q),
        page_size,
        sm_scale,
        max_seq_len,
        num_splits,
    )


def decode_attention_qkv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm: Optional[torch.Tensor],
    k_norm: Optional[torch.Tensor],
    eps: float,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    out_loc: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_page_ids: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    page_size: int,
    sm_scale: float,
    max_seq_len: int,
    num_qo_heads: int,
    num_splits: int = NUM_SPLITS,
    stamps: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> torch.Tensor:
    """The attention layer's q/k norms, RoPE and KV store, then ``decode_attention``, in its
    two kernels, straight from the qkv GEMV's output (the fused decode path's attention).

    ``qkv: [B, (H_q + 2 H_kv) D]`` with contiguous rows, one token per request, at
    ``positions: [B]``; its K and V go to slots ``out_loc: [B]`` of the pool, whose index
    (``kv_indptr``...) already counts them. ``q_norm, k_norm: [D]`` (both or neither) are
    Qwen3's per-head RMSNorm weights, ``cos_sin_cache: [max_pos, D]`` float32 the RoPE table;
    the rest as in ``decode_attention``, ``stamps`` (the partial and the merge kernels'
    ``timeline.stamps_buffer``) records each program's timeline. Every program
    normalises and rotates its own query heads and this token's K (a few hundred bytes);
    the one whose chunk holds the token stores its K/V and scores it from registers.
    Every position must be below ``cos_sin_cache.shape[0]`` (not checked: a device read).
    Returns ``[B, H_q, D]``.

    Raises:
        ValueError: on shapes, dtypes or sizes that disagree.
    """
    qk = (positions, cos_sin_cache, q_norm, k_norm, eps)
    out, from_qkv = _check_qkv(qkv, *qk, k_slots, v_slots, out_loc, num_qo_heads)
    _check_index(
        qkv.shape[0], kv_indptr, kv_page_ids, kv_last_page_len, page_size, max_seq_len, num_splits
    )
    return _launch(
        qkv,
        k_slots,
        v_slots,
        (kv_indptr, kv_page_ids, kv_last_page_len),
        out,
        page_size,
        sm_scale,
        max_seq_len,
        num_splits,
        from_qkv=from_qkv,
        stamps=stamps,
    )


# ---- the kernel table's entries -------------------------------------------------------------
register("decode_attention", Impl("triton", decode_attention))
register("decode_attention_qkv", Impl("triton", decode_attention_qkv))
