"""Two memory-bound kernels written in Triton: the KV store and the embedding gather.

Both move whole rows and compute nothing, so the only thing a kernel can win is doing it
in one launch with wide, coalesced loads: one Triton program per token copies that
token's row (``H_kv * D`` elements of K and of V, or ``hidden`` elements of the
embedding). The torch references (``torch_ops.store_cache``, ``torch_ops.embedding_gather``)
are an ``index_put_`` per tensor and ``F.embedding``; chapter 19 tests these kernels
against them and times both.

Row offsets are computed in int64: a pool of about 2.1 million token slots times a
1,024-element row already passes 2**31. Triton compiles each kernel on first use for every
distinct ``BLOCK`` (the row length rounded up to a power of two), in about a second.

They also run on the CPU under ``TRITON_INTERPRET=1`` (slowly), which is how the CPU
test suite checks their indexing. Mirrors upstream ``minisgl.kernel.store`` and
``minisgl.kernel.index`` (JIT-compiled CUDA there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import Impl, register


@triton.jit
def _store_kv_kernel(
    k_cache_ptr,
    v_cache_ptr,
    loc_ptr,
    k_ptr,
    v_ptr,
    k_row_stride,
    v_row_stride,
    cache_row_stride,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + token).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < ROW
    k_row = tl.load(k_ptr + token * k_row_stride + cols, mask=mask)
    tl.store(k_cache_ptr + slot * cache_row_stride + cols, k_row, mask=mask)
    v_row = tl.load(v_ptr + token * v_row_stride + cols, mask=mask)
    tl.store(v_cache_ptr + slot * cache_row_stride + cols, v_row, mask=mask)


@triton.jit
def _gather_rows_kernel(
    out_ptr,
    weight_ptr,
    ids_ptr,
    weight_row_stride,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    row = tl.load(ids_ptr + token).to(tl.int64)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    values = tl.load(weight_ptr + row * weight_row_stride + cols, mask=mask)
    tl.store(out_ptr + token * HIDDEN + cols, values, mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x: [T, H, D]`` as ``[T, H * D]`` rows with contiguous elements (a view if possible)."""
    t = x.shape[0]
    flat = x.reshape(t, -1)
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def store_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """``k_cache[indices[i]] = k[i]`` and the same for v, in one kernel launch.

    ``k_cache, v_cache: [num_slots, H_kv, D]`` contiguous; ``indices: [T]`` int32/int64
    (``out_loc``); ``k, v: [T, H_kv, D]``, whose rows may be strided (views of the fused
    qkv output) as long as each row's ``H_kv * D`` elements are contiguous.

    Raises:
        ValueError: when shapes or dtypes disagree.
    """
    if k.shape != v.shape or k.shape[1:] != k_cache.shape[1:] or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k, v must be [T, H_kv, D] matching the cache {tuple(k_cache.shape)}, got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype:
        raise ValueError(f"dtype mismatch: cache {k_cache.dtype}, k {k.dtype}, v {v.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV cache must be contiguous")
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    k_rows, v_rows = _rows(k), _rows(v)
    row = k_rows.shape[1]
    _store_kv_kernel[(num_tokens,)](
        k_cache,
        v_cache,
        indices.contiguous(),
        k_rows,
        v_rows,
        k_rows.stride(0),
        v_rows.stride(0),
        row,
        ROW=row,
        BLOCK=triton.next_power_of_2(row),
    )


def embedding_gather(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rows of ``weight: [V, hidden]`` (last dim contiguous) for ``ids: [T]`` -> ``[T, hidden]``.

    Ids are not range-checked (the tokenizer and the token pool only produce valid ones),
    exactly like the CUDA ``F.embedding`` in release builds would not either.
    """
    if weight.stride(-1) != 1:
        raise ValueError("the embedding table's rows must be contiguous")
    num_tokens, hidden = ids.shape[0], weight.shape[1]
    out = torch.empty((num_tokens, hidden), dtype=weight.dtype, device=weight.device)
    if num_tokens == 0:
        return out
    block = min(triton.next_power_of_2(hidden), 4096)
    grid = (num_tokens, triton.cdiv(hidden, block))
    _gather_rows_kernel[grid](
        out, weight, ids.contiguous(), weight.stride(0), HIDDEN=hidden, BLOCK=block
    )
    return out


# ---- the kernel table's entries -------------------------------------------------------------
register("store_cache", Impl("triton", store_cache))
register("embedding_gather", Impl("triton", embedding_gather))
