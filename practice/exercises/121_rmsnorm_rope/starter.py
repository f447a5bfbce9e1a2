"""Reference implementations, in plain torch, of the few kernels the model needs.

They run everywhere and are written to round exactly as Hugging Face ``transformers``
does, so CPU float32 runs match it token for token. On CUDA, chapter 17 swaps in
FlashInfer's fused kernels and chapter 19 custom ones; these stay the reference that
those are tested against.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dim, computed in float32.

    ``x: [..., N]``, ``weight: [N]``; returns ``x``'s shape and dtype.
    """
    raise NotImplementedError("Exercise 121: implement rms_norm")


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Add the residual stream, then normalise: returns ``(rms_norm(x + r), x + r)``."""
    raise NotImplementedError("Exercise 121: implement fused_add_rms_norm")


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gate: ``x: [T, 2I]`` holding ``[gate | up]`` -> ``silu(gate) * up``, ``[T, I]``."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("Exercise 121: implement _rotate_half")


def apply_rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q: [T, H_q, D]`` and ``k: [T, H_kv, D]`` by their positions (neox layout).

    ``positions: [T]`` int; ``cos_sin_cache: [max_position, D]`` float32 holding
    ``[cos | sin]`` of each frequency. Returns new tensors in the inputs' dtype.
    """
    raise NotImplementedError("Exercise 121: implement apply_rotary")


def store_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Scatter this step's K/V into the pool: ``k_cache[indices[i]] = k[i]``.

    ``k_cache, v_cache: [num_slots, H_kv, D]`` (a layer's pool, viewed per token);
    ``indices: [T]`` slot of each token (``out_loc``); ``k, v: [T, H_kv, D]``.
    """
    k_cache[indices] = k
    v_cache[indices] = v


def norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    swiglu: bool = False,
) -> torch.Tensor:
    """``linear(rms_norm(x), weight, bias)``, then ``silu_and_mul`` when ``swiglu``: the
    reference of the fused decode path's ``norm_gemv`` (``x: [M, K]`` -> ``[M, N]`` or ``[M, N/2]``)."""
    y = F.linear(rms_norm(x, norm_weight, eps), weight, bias)
    return silu_and_mul(y) if swiglu else y


def linear_add_residual_(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``residual += linear(x, weight, bias)`` in place (``[M, N]``); returns ``residual``."""
    return residual.add_(F.linear(x, weight, bias))


def qk_norm_rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    out_loc: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Split ``qkv: [T, (H_q + 2 H_kv) D]``, normalise q and k per head when the norms are
    given, rotate them, store k and v at ``out_loc`` of the ``[num_slots, H_kv, D]`` slots,
    and return the queries ``[T, H_q, D]``: what the attention layer does, op by op."""
    q, k, v = qkv.split(
        [num_qo_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1
    )
    q = q.reshape(-1, num_qo_heads, head_dim)
    k = k.reshape(-1, num_kv_heads, head_dim)
    v = v.reshape(-1, num_kv_heads, head_dim)
    if q_norm is not None and k_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    q, k = apply_rotary(positions, q, k, cos_sin_cache)
    store_cache(k_slots, v_slots, out_loc, k, v)
    return q


def embedding_gather(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rows of ``weight: [V, hidden]`` for ``ids: [T]`` -> ``[T, hidden]``."""
    return F.embedding(ids, weight)
