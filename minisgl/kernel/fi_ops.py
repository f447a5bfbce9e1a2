"""FlashInfer's fused kernels for norms, the SwiGLU gate, RoPE and sampling (CUDA only).

Each function has the signature of its torch reference in ``torch_ops.py`` and returns
the same values, with two differences a caller must know:

* ``fused_add_rms_norm`` and ``apply_rotary`` work **in place** (FlashInfer's kernels
  overwrite their inputs); they return the overwritten tensors, so callers that use the
  return values, as every layer here does, cannot tell.
* They round differently: FlashInfer keeps float32 inside a fused kernel where the
  reference rounds to bf16 between steps, so results agree to bf16 precision, not bit
  for bit (chapter 17 states the tolerance).

FlashInfer compiles each kernel on first use (seconds to a minute, cached on disk).
Only ``float16`` and ``bfloat16`` are supported; ``minisgl.kernel`` checks that before
calling here. Mirrors upstream ``minisgl.layers`` (which calls ``flashinfer`` directly)
and ``minisgl.engine.sample.sample_impl``.
"""

from __future__ import annotations

import functools
from typing import Tuple

import torch


@functools.lru_cache(maxsize=1)
def flashinfer_available() -> bool:
    """Whether ``import flashinfer`` works (checked once)."""
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x: [T, N]`` or ``[T, H, D]`` (last dim contiguous) -> a new tensor, same shape."""
    from flashinfer.norm import rmsnorm

    return rmsnorm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``x, residual: [T, N]``. In place: ``residual += x``, then ``x = rms_norm(residual)``.

    Returns ``(x, residual)``, the same tensors, now holding the new values.
    """
    from flashinfer.norm import fused_add_rmsnorm

    fused_add_rmsnorm(x, residual, weight, eps)
    return x, residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``x: [T, 2I]`` holding ``[gate | up]`` -> ``silu(gate) * up``, ``[T, I]``.

    Needs ``2I * itemsize`` to be a multiple of 16 bytes (``minisgl.kernel`` checks).
    """
    from flashinfer.activation import silu_and_mul as fi_silu_and_mul

    return fi_silu_and_mul(x)


def apply_rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Neox-style RoPE, in place on ``q: [T, H_q, D]`` and ``k: [T, H_kv, D]``.

    ``positions: [T]`` int32/int64; ``cos_sin_cache: [max_position, D]`` float32,
    contiguous, ``[cos | sin]``. Returns ``(q, k)``.
    """
    from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace

    apply_rope_with_cos_sin_cache_inplace(
        positions=positions,
        query=q,
        key=k,
        head_size=q.shape[-1],
        cos_sin_cache=cos_sin_cache,
        is_neox=True,
    )
    return q, k


def sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    generator: torch.Generator,
) -> torch.Tensor:
    """Sample one token per row: ``logits: [B, V]`` (any float dtype), ``temperatures: [B]`` > 0,
    ``top_k: [B]`` int (V = off) or None, ``top_p: [B]`` in (0, 1] or None -> ``[B]`` int64.

    Softmax with temperature, then FlashInfer's rejection sampler, which filters top-k
    first and then top-p, as ``torch_sampling.top_k_top_p_filter`` does, without sorting
    the vocabulary. ``generator`` (a CUDA generator) makes runs reproducible.
    """
    import flashinfer.sampling as fs

    probs = fs.softmax(logits.float(), temperatures)
    if top_k is None and top_p is None:
        tokens = fs.sampling_from_probs(probs, generator=generator)
    elif top_p is None:
        tokens = fs.top_k_sampling_from_probs(probs, top_k, generator=generator)
    elif top_k is None:
        tokens = fs.top_p_sampling_from_probs(probs, top_p, generator=generator)
    else:
        tokens = fs.top_k_top_p_sampling_from_probs(probs, top_k, top_p, generator=generator)
    return tokens.long()
