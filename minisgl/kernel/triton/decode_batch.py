"""Decode attention for a large batch, in Triton: one program per (request, KV head), pipelined.

At batch 1 the split-KV kernel (``triton/decode.py``) splits a context many ways because one
request has only ``H_kv`` pieces of work. At 64 requests there are already ``64 x H_kv``
programs, several per SM, and the split and the merge would only add traffic: each program
here attends over its request's whole context and writes the normalised output itself. What
limits it is how many bytes are in flight: a program that loads a tile and then waits for it
reads at a fraction of the memory's speed. The loop is a ``tl.range`` with ``num_stages``, so
Triton's software pipeliner issues the loads of the next ``NUM_STAGES - 1`` tiles (the page
lookups, then K and V, as asynchronous copies into shared memory) while the current one is
scored. The trip count comes from the request's length on the device, so one CUDA graph
serves every length, and no host plan pads the schedule to the longest context.

Longest first. The GPU hands out programs roughly in the order of their ids, and on ragged
lengths a long context that starts last is read by a handful of programs while the rest of
the GPU idles. ``order`` lists the batch's requests longest first when they make more than
one wave (the host knows every length when it builds the index), and program ``p`` takes
request ``order[p // H_kv]``: the long contexts start in the first wave and the short ones
fill the gaps at the end, the rule a scheduler of jobs on identical machines calls LPT
(longest processing time first).

The KV is indexed as in the split-KV kernel (FlashInfer's paged index, chapter 17), with the
same helpers for the rows of a tile. As there, the loop reads the tokens before this step's,
which earlier steps stored, and this step's token is scored on its own; here before the loop,
so that its K and V hold no registers through it. ``decode_attention_batch_qkv`` starts from
the qkv projection's raw output: each program does Qwen3's q/k norms and RoPE for its own
heads, stores its KV head's K/V and scores the token from registers, and the layer's q-norm,
k-norm, RoPE and store kernels are gone. Under PDL a program reads the index, the
positions and the slots (all written before the step) before it waits, and q, qkv and the
KV after.

Reference: the torch attention backend (``attention/torch_backend.py``); the CPU tests run the
kernel under ``TRITON_INTERPRET=1``. Upstream mini-sglang runs FlashInfer's decode kernel at
every batch size; this kernel is the book's own.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .. import Impl, register
from .decode import FromQKV, _check_index, _check_q, _check_qkv, _kv_rows, _load_kv, _norm_rope
from .pdl import launch_options, use_pdl

BLOCK_T = 64  # tokens per tile
NUM_STAGES = 3  # tiles in flight per program: the one scored and the next two loading
NUM_WARPS = 4
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2 e): the scores are scaled once, to base 2


@triton.jit
def _decode_batch_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    order_ptr,
    indptr_ptr,
    page_ids_ptr,
    last_len_ptr,
    pos_ptr,
    loc_ptr,
    cos_sin_ptr,
    q_norm_ptr,
    k_norm_ptr,
    scale_log2,
    stride_slot,
    stride_q,
    eps,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr,
    FROM_QKV: tl.constexpr,
    HAS_QK_NORM: tl.constexpr,
):
    if PDL:  # the next kernel may be scheduled as soon as every program of this one runs
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)  # the GPU starts programs by id; ``order`` picks each one's request
    b = tl.load(order_ptr + pid // NUM_KV_HEADS)
    kv_head = pid % NUM_KV_HEADS
    first_page = tl.load(indptr_ptr + b)
    seq_len = (tl.load(indptr_ptr + b + 1) - first_page - 1) * PAGE + tl.load(last_len_ptr + b)
    offs_t = tl.arange(0, BLOCK_T)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    g_mask = offs_g < GROUP
    q_head = kv_head * GROUP + offs_g  # this KV head's query heads
    # this step's token is the last one: the loop reads the earlier ones, stored by earlier steps
    last = seq_len - 1 + 0 * offs_g
    last_rows, _ = _kv_rows(
        page_ids_ptr, first_page, last, seq_len, kv_head, stride_slot, PAGE, HEAD_DIM
    )
    if FROM_QKV:  # its angles, the norms' weights and its slot: written before the step
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
        tl.extra.cuda.gdc_wait()  # q (or qkv) and, without FROM_QKV, this step's K/V are written
    if FROM_QKV:  # q, k and v from the GEMV's row: normalised, rotated, this token's K/V stored
        qkv_row = q_ptr + b.to(tl.int64) * stride_q
        q = _norm_rope(
            qkv_row + q_head * HEAD_DIM, g_mask, qw, qw_p, cos, sin, eps, HAS_QK_NORM, HEAD_DIM
        )
        k_src = qkv_row + (NUM_KV_HEADS * GROUP + kv_head) * HEAD_DIM + 0 * offs_g
        k_last = _norm_rope(k_src, offs_g < BLOCK_G, kw, kw_p, cos, sin, eps, HAS_QK_NORM, HEAD_DIM)
        v_last = tl.load(k_src[:, None] + NUM_KV_HEADS * HEAD_DIM + offs_d[None, :])
        dst = slot * stride_slot + kv_head * HEAD_DIM + 0 * offs_g[:, None] + offs_d[None, :]
        tl.store(k_ptr + dst, k_last, mask=(offs_g == 0)[:, None])
        tl.store(v_ptr + dst, v_last, mask=(offs_g == 0)[:, None])
    else:  # [BLOCK_G, D]: the group's query heads, padded to the 16 rows tl.dot needs
        q_rows = (b * NUM_KV_HEADS * GROUP + q_head)[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(q_ptr + q_rows, mask=g_mask[:, None], other=0.0)
        k_last, v_last = _load_kv(k_ptr, v_ptr, last_rows, offs_g < BLOCK_G, HEAD_DIM)

    # the last token first, from registers ([BLOCK_G, D] repeats its row, so its score is a
    # row sum): the softmax starts from it, and its K and V need no registers in the loop
    m_i = tl.sum(q.to(tl.float32) * k_last.to(tl.float32), axis=1) * scale_log2  # base-2 units
    l_i = tl.full((BLOCK_G,), 1.0, dtype=tl.float32)
    acc = v_last.to(tl.float32)
    for it in tl.range(0, tl.cdiv(seq_len - 1, BLOCK_T), num_stages=NUM_STAGES):
        rows, t_mask = _kv_rows(
            page_ids_ptr, first_page, it * BLOCK_T + offs_t, seq_len - 1, kv_head, stride_slot,
            PAGE, HEAD_DIM,
        )  # fmt: skip
        k, v = _load_kv(k_ptr, v_ptr, rows, t_mask, HEAD_DIM)
        s = tl.dot(q, tl.trans(k)) * scale_log2  # [BLOCK_G, BLOCK_T], float32
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    out = (acc / l_i[:, None]).to(out_ptr.dtype.element_ty)
    out_rows = (b * NUM_KV_HEADS * GROUP + q_head)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(out_ptr + out_rows, out, mask=g_mask[:, None])


def _check_order(order: Optional[torch.Tensor], like: torch.Tensor) -> None:
    bs = like.shape[0]
    if order is not None and (
        order.shape != (bs,)
        or order.dtype not in (torch.int32, torch.int64)
        or not order.is_contiguous()
        or order.device != like.device
    ):
        raise ValueError(
            f"order must be a contiguous [{bs}] int32 or int64 tensor on {like.device}, "
            f"got {tuple(order.shape)} {order.dtype} on {order.device}"
        )


def _launch(
    q_or_qkv: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    index: Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    page_size: int,
    sm_scale: float,
    order: Optional[torch.Tensor],
    from_qkv: Optional[FromQKV] = None,
) -> torch.Tensor:
    """The kernel on ``index = (kv_indptr, kv_page_ids, kv_last_page_len)``: ``B x H_kv``
    programs, in ``order`` (the batch's order when None); ``from_qkv`` when ``q_or_qkv`` is
    the qkv GEMV's output."""
    bs, num_qo_heads, head_dim = out.shape
    num_kv_heads = k_slots.shape[1]
    if bs == 0:
        return out
    positions, out_loc, cos_sin, q_norm, k_norm, eps = from_qkv or (out, out, out, None, None, 0.0)
    has_norm = q_norm is not None  # _check_qk_args: both norms or neither
    group = num_qo_heads // num_kv_heads
    pdl = use_pdl(out)
    if order is None:
        order = torch.arange(bs, dtype=torch.int32, device=out.device)
    _decode_batch_kernel[(bs * num_kv_heads,)](
        q_or_qkv,
        k_slots,
        v_slots,
        out,
        order,
        *index,
        positions,
        out_loc,
        cos_sin,
        q_norm if has_norm else out,
        k_norm if has_norm else out,
        sm_scale * LOG2E,
        k_slots.stride(0),
        q_or_qkv.stride(0),
        eps,
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        NUM_KV_HEADS=num_kv_heads,
        PAGE=page_size,
        BLOCK_T=BLOCK_T,
        NUM_STAGES=NUM_STAGES,
        PDL=pdl,
        FROM_QKV=from_qkv is not None,
        HAS_QK_NORM=has_norm,
        num_warps=NUM_WARPS,
        **launch_options(pdl),
    )
    return out


def decode_attention_batch(
    q: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_page_ids: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    page_size: int,
    sm_scale: float,
    order: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Attention of one query token per request over its paged context, for a large batch.

    ``q: [B, H_q, D]`` contiguous; ``k_slots, v_slots: [num_slots, H_kv, D]`` contiguous (the
    pool's per-token view); ``kv_indptr: [B + 1]``, ``kv_page_ids: [kv_indptr[B]]`` and
    ``kv_last_page_len: [B]`` int32/int64 on the device (FlashInfer's paged index, pages of
    ``page_size`` slots), every context at least one token;
    ``sm_scale`` usually ``D ** -0.5``. ``order: [B]`` int32/int64 on q's device, a
    permutation of the batch's rows (``attention.split_kv.longest_first``), is the order in
    which the requests' programs start; None keeps the batch's. No length bound: each
    program's trip count is read from the index. With PDL, q and each request's last
    token's K/V may be written by the kernel just before. That every page id lies inside
    the pool is the caller's to ensure (the host cannot read them without a sync), and so
    is ``order`` being a permutation (a repeated row leaves another unwritten). Returns
    ``[B, H_q, D]`` in q's dtype, from one launch of ``B x H_kv`` programs. ``D`` must be
    a power of two of at least 16.

    Raises:
        ValueError: on shapes, dtypes, sizes or devices that disagree.
    """
    _check_q(q, k_slots, v_slots)
    # a length bound and a split count of 1: neither is a parameter of this kernel
    _check_index(q.shape[0], kv_indptr, kv_page_ids, kv_last_page_len, page_size, 1, 1)
    _check_order(order, q)
    index = (kv_indptr, kv_page_ids, kv_last_page_len)
    return _launch(q, k_slots, v_slots, index, torch.empty_like(q), page_size, sm_scale, order)


def decode_attention_batch_qkv(
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
    num_qo_heads: int,
    order: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The attention layer's q/k norms, RoPE and KV store, then ``decode_attention_batch``, in
    one launch, from the qkv GEMV's output (the arguments of ``decode.decode_attention_qkv``,
    less the length bound and split count, and ``decode_attention_batch``'s ``order``).

    ``qkv: [B, (H_q + 2 H_kv) D]`` with contiguous rows, one token per request, at
    ``positions: [B]``; its K and V go to slots ``out_loc: [B]`` of the pool, whose index
    already counts them. ``q_norm, k_norm: [D]`` (both or neither) are Qwen3's per-head
    RMSNorm weights, ``cos_sin_cache: [max_pos, D]`` float32 the RoPE table. Each program
    normalises and rotates its own query heads and its KV head's key, stores that K/V and
    scores the token from registers. Every position must be below ``cos_sin_cache.shape[0]``
    (not checked: a device read), and ``order`` a permutation: a row it leaves out is
    neither attended nor stored, and the pool keeps that token's old K/V. Returns
    ``[B, H_q, D]`` in qkv's dtype.

    Raises:
        ValueError: on shapes, dtypes, sizes or devices that disagree.
    """
    qk = (positions, cos_sin_cache, q_norm, k_norm, eps)
    out, from_qkv = _check_qkv(qkv, *qk, k_slots, v_slots, out_loc, num_qo_heads)
    _check_index(qkv.shape[0], kv_indptr, kv_page_ids, kv_last_page_len, page_size, 1, 1)
    _check_order(order, qkv)
    return _launch(
        qkv,
        k_slots,
        v_slots,
        (kv_indptr, kv_page_ids, kv_last_page_len),
        out,
        page_size,
        sm_scale,
        order,
        from_qkv,
    )


# ---- the kernel table's entries -------------------------------------------------------------
register("decode_attention_batch", Impl("triton", decode_attention_batch))
register("decode_attention_batch_qkv", Impl("triton", decode_attention_batch_qkv))
