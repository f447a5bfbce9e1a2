"""A small-batch matrix-vector product (GEMV) in Triton: ``y = x @ weight.T + bias`` for a few rows.

At decode batch 1 every linear layer multiplies one row by a weight of ``N x K`` elements:
two flops per weight element read once, so the layer is bound by memory bandwidth and the
only goal is to stream the weight at the memory's speed. A GEMM kernel tiles the output in
blocks of many rows to reuse each weight tile; with 1 to 8 rows most of such a tile is
padding, and any kernel must keep megabytes of loads in flight to reach the bandwidth
(chapter 19 measures how far below it a general library's one-row kernels can stay). This
kernel is written for ``M <= 8``:

* a program owns ``BLOCK_N`` output columns (rows of ``weight``) and **all** ``M`` rows of
  ``x`` (``BLOCK_M``, ``M`` rounded up to a power of two: sizes 5..8 share one compilation,
  ``M`` itself is a runtime argument and masks the rest), so each weight tile is loaded
  from memory once and used for every row;
* it walks ``K`` in chunks of ``BLOCK_K``, loading a ``[BLOCK_N, BLOCK_K]`` tile whose rows
  are contiguous, so a warp reads whole 512-byte segments of a row;
* products are accumulated elementwise in a float32 ``[BLOCK_M, BLOCK_N, BLOCK_K]`` block
  and summed over ``K`` once at the end (``tl.dot`` needs 16 rows; a sum of broadcast
  products does the same work on the FMA units, which have time to spare while the
  loads are in flight);
* when ``N`` alone gives too few programs to fill the GPU (``o_proj`` and ``down`` have
  ``N = hidden``), ``K`` is split too (*split-K*): each program writes a float32 partial
  sum, and a second small kernel adds the ``SPLIT_K`` partials (and the bias) in a fixed
  order, so the result is deterministic, unlike atomic adds.

The tile sizes come from ``gemv_config``, a heuristic on ``(M, N, K)`` and the SM count:
no autotuning, because the calls happen while a CUDA graph is captured and a choice made
by timing could differ from run to run. Float32 inputs work as well (the CPU tests run the
kernels under ``TRITON_INTERPRET=1``); the engine only routes fp16/bf16 here.

Upstream mini-sglang has no such kernel: its linear layers call ``F.linear`` (cuBLAS on
CUDA) at every batch size. This module is the book's own.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from minisgl.kernel import speedups

from .. import HALF, Impl, register
from .checks import check_gemv_args

# A program per (N block, K split). With fewer than about this many programs per SM the
# GPU has too few loads in flight to reach its bandwidth on a 4-12 MB weight.
PROGRAMS_PER_SM = 4
# Elements of the float32 accumulator per thread: more spills registers, and fewer
# resident programs per SM mean fewer loads in flight.
ACC_PER_THREAD = 64
# Elements of weight per tile and iteration, at most: 8 KB in bf16, four 16-byte loads per
# thread of 4 warps. Larger tiles mean fewer, longer programs for the same weight.
MAX_TILE = 4096
MAX_SPLIT_K = 8
H200_SMS = 132  # the SM count assumed off CUDA (the interpreter), for a deterministic config


class GemvConfig(NamedTuple):
    """Launch parameters of one GEMV shape: tiles, the number of K splits, warps."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int


def gemv_config(m: int, n: int, k: int, num_sms: int = H200_SMS) -> GemvConfig:
    """The heuristic: the largest tiles that still give ``PROGRAMS_PER_SM`` programs per SM.

    ``BLOCK_K`` is 256 (one warp's 32 lanes x 8 elements: 512 contiguous bytes of a bf16
    row) or ``K`` rounded up when smaller. ``BLOCK_N`` starts at the largest tile the
    accumulator budget allows for ``BLOCK_M`` rows (at least one row per warp; past
    ``M = 8`` that takes more than ``ACC_PER_THREAD`` registers) and halves, down to one
    row per warp, while there are fewer N blocks than the target; if the target is still
    not met, K is
    split into up to ``MAX_SPLIT_K`` parts of whole ``BLOCK_K`` chunks. Deterministic:
    the same shapes always give the same config. Raises ValueError for a non-positive dim.
    """
    if m < 1 or n < 1 or k < 1:
        raise ValueError(f"gemv needs positive sizes, got M={m}, N={n}, K={k}")
    num_warps = 4
    block_m = triton.next_power_of_2(m)
    block_k = min(256, triton.next_power_of_2(k))
    tile = min(MAX_TILE, ACC_PER_THREAD * 32 * num_warps // block_m)
    block_n = max(num_warps, tile // block_k)  # at least a row per warp: no idle warps
    target = PROGRAMS_PER_SM * num_sms
    while block_n > num_warps and triton.cdiv(n, block_n) < target:
        block_n //= 2
    n_blocks = triton.cdiv(n, block_n)
    chunks = triton.cdiv(k, block_k)
    split_k = 1
    while split_k < MAX_SPLIT_K and split_k < chunks and n_blocks * split_k < target:
        split_k *= 2
    split_k = triton.cdiv(chunks, triton.cdiv(chunks, split_k))  # no empty splits
    return GemvConfig(block_m, block_n, block_k, split_k, num_warps)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    stride_xm,
    stride_wn,
    stride_om,
    stride_split,
    K: tl.constexpr,  # compile-time, like moe.py's K: a model has a handful of Ks
    K_PER_SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PARTIAL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * K_PER_SPLIT + tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    # int64 rows: a vocabulary of 256k times a hidden size of 8k passes 2**31 elements
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]

    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k in range(0, K_PER_SPLIT, BLOCK_K):
        if EVEN_K:  # no K mask: whole 16-byte vectors per load
            w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
            x = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
        else:
            k_mask = offs_k < K - k
            w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        # the weight tile, read once, meets every row of x
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    y = tl.sum(acc, axis=2)  # [BLOCK_M, BLOCK_N]

    out_mask = m_mask[:, None] & n_mask[None, :]
    out_ptrs = out_ptr + pid_k * stride_split + offs_m[:, None] * stride_om + offs_n[None, :]
    if PARTIAL:  # split-K: a float32 partial sum, finished by _splitk_reduce_kernel
        tl.store(out_ptrs, y, mask=out_mask)
    else:
        if HAS_BIAS:
            y += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _splitk_reduce_kernel(
    part_ptr,
    bias_ptr,
    out_ptr,
    N,
    stride_split,
    stride_om,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):  # a fixed order: the same bits on every run
        acc += tl.load(part_ptr + s * stride_split + row * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    config: Optional[GemvConfig] = None,
) -> torch.Tensor:
    """``x @ weight.T + bias`` for a few rows: ``x: [M, K]``, ``weight: [N, K]``, ``bias: [N]``
    or None -> ``[M, N]`` in ``x``'s dtype, the same as ``F.linear(x, weight, bias)``.

    Meant for ``M <= 8`` (``minisgl.kernel.linear`` sends it at most ``GEMV_MAX_M`` rows;
    larger M works but wastes registers). fp16, bf16 or float32, all three tensors of one dtype; ``x``'s and
    ``weight``'s rows must be contiguous. Products are summed in float32, then rounded once
    to the output dtype. ``config`` overrides the heuristic ``gemv_config`` (benchmarks and
    tests use it to try other tiles); its ``block_m`` must be at least ``M``.

    Raises:
        ValueError: on mismatched shapes or dtypes, non-contiguous rows, or a config too
            small for ``M``.
    """
    check_gemv_args(x, weight, bias, weight.shape[0])
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand(m, n))
    if config is None:
        config = gemv_config(m, n, k, _num_sms(x.device) if x.is_cuda else H200_SMS)
    if config.block_m < m:
        raise ValueError(f"config.block_m={config.block_m} is smaller than M={m}")

    k_per_split = triton.cdiv(triton.cdiv(k, config.split_k), config.block_k) * config.block_k
    split_k = triton.cdiv(k, k_per_split)  # a config may ask for more splits than K has chunks
    even_k = k % k_per_split == 0  # every split ends inside K: no K mask at all
    partial = split_k > 1
    target = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device) if partial else out
    grid = (triton.cdiv(n, config.block_n), split_k)
    _gemv_kernel[grid](
        x,
        weight,
        bias if bias is not None else x,
        target,
        m,
        n,
        x.stride(0),
        weight.stride(0),
        n,
        m * n,
        K=k,
        K_PER_SPLIT=k_per_split,
        EVEN_K=even_k,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        HAS_BIAS=bias is not None and not partial,
        PARTIAL=partial,
        num_warps=config.num_warps,
    )
    if partial:
        block = min(1024, triton.next_power_of_2(n))
        _splitk_reduce_kernel[(m, triton.cdiv(n, block))](
            target,
            bias if bias is not None else x,
            out,
            n,
            m * n,
            n,
            SPLIT_K=split_k,
            BLOCK=block,
            HAS_BIAS=bias is not None,
        )
    return out


# ---- the kernel table's entry ---------------------------------------------------------------
# The GEMV serves at most this many rows, and only weights with K >= N (o_proj, down_proj):
# where N > K, and from a few rows on, cuBLAS streams the weight as fast.
GEMV_MAX_M = 2


def gemv_fits(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> bool:
    """Whether ``linear(x, weight, bias)`` runs on the GEMV (unless the speed-up ``gemv`` is off)."""
    return (
        speedups.current().gemv
        and x.dim() == 2
        and weight.dim() == 2
        and 0 < x.shape[0] <= GEMV_MAX_M
        and weight.shape[1] >= weight.shape[0]
        and x.dtype in HALF
        and weight.dtype == x.dtype
        and x.is_contiguous()
        and weight.stride(-1) == 1
        and (bias is None or (bias.dtype == x.dtype and bias.is_contiguous()))
    )


register("linear", Impl("triton", gemv, gemv_fits))
