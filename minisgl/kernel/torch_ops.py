"""Reference implementations, in plain torch, of the few kernels the model needs.

They run everywhere and are written to round exactly as Hugging Face ``transformers``
does, so CPU float32 runs match it token for token. On CUDA, later chapters add faster
kernels for the same ops (the table in ``minisgl.kernel`` picks one per call); these stay
the reference that those are tested against.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dim, computed in float32.

    ``x: [..., N]``, ``weight: [N]``; returns ``x``'s shape and dtype.
    """
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Add the residual stream, then normalise: returns ``(rms_norm(x + r), x + r)``."""
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gate: ``x: [T, 2I]`` holding ``[gate | up]`` -> ``silu(gate) * up``, ``[T, I]``."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q: [T, H_q, D]`` and ``k: [T, H_kv, D]`` by their positions (neox layout).

    ``positions: [T]`` int; ``cos_sin_cache: [max_position, D]`` float32 holding
    ``[cos | sin]`` of each frequency. Returns new tensors in the inputs' dtype.
    """
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)
    cos = torch.cat((cos, cos), dim=-1).unsqueeze(1)  # [T, 1, D]
    sin = torch.cat((sin, sin), dim=-1).unsqueeze(1)
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias``: ``x: [T, K]``, ``weight: [N, K]`` -> ``[T, N]`` (``F.linear``)."""
    return F.linear(x, weight, bias)


# >>> ch04: the KV pool's store
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


# <<< ch04


def embedding_gather(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rows of ``weight: [V, hidden]`` for ``ids: [T]`` -> ``[T, hidden]``."""
    return F.embedding(ids, weight)
