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
Only ``float16`` and ``bfloat16`` are supported; the ``accepts`` checks registered at the end
of this module keep every other call on the torch references. Importing this module
imports no FlashInfer. Mirrors upstream ``minisgl.layers`` (which calls ``flashinfer``
directly) and ``minisgl.engine.sample.sample_impl``.
"""

from __future__ import annotations

import functools
from typing import Any, Tuple

import torch

from minisgl.env import ENV

from . import HALF, Impl, Library, Where, register, register_library


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


# ---- the kernel table's entries ---------------------------------------------------------------
def runs_on(where: Where) -> bool:
    """CUDA, where ``flashinfer`` imports, unless ``MINISGL_TORCH_KERNELS`` keeps the torch
    references (the switch to reach for when a fast kernel is suspected of a wrong answer)."""
    if where is None:
        return False
    is_cuda = where.is_cuda if isinstance(where, torch.Tensor) else where.type == "cuda"
    return is_cuda and flashinfer_available() and not ENV.TORCH_KERNELS


def _rms_norm_fits(x: torch.Tensor, *_: Any) -> bool:
    return x.dtype in HALF and x.dim() in (2, 3) and x.stride(-1) == 1


def _add_rms_norm_fits(x: torch.Tensor, residual: torch.Tensor, *_: Any) -> bool:
    return x.dtype in HALF and x.dim() == 2 and x.is_contiguous() and residual.is_contiguous()


def _silu_and_mul_fits(x: torch.Tensor) -> bool:
    return x.dtype in HALF and x.is_contiguous() and (x.shape[-1] * x.element_size()) % 16 == 0


def _rotary_fits(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, table: torch.Tensor
) -> bool:
    return (
        q.dtype in HALF
        and q.stride(-1) == 1
        and k.stride(-1) == 1
        and table.dtype == torch.float32
        and table.shape[-1] == q.shape[-1]
    )


def _sample_fits(logits: torch.Tensor, *_: Any) -> bool:
    return logits.dtype in HALF  # a float32 model keeps the torch sampler, run for run


def register_flashinfer() -> None:
    """FlashInfer into the kernel table: the library, ranked ahead of torch (100), and one
    implementation per op, each with the check of what its kernel takes."""
    register_library(Library("flashinfer", 50, runs_on))
    register("rms_norm", Impl("flashinfer", rms_norm, _rms_norm_fits))
    register("fused_add_rms_norm", Impl("flashinfer", fused_add_rms_norm, _add_rms_norm_fits))
    register("silu_and_mul", Impl("flashinfer", silu_and_mul, _silu_and_mul_fits))
    register("apply_rotary", Impl("flashinfer", apply_rotary, _rotary_fits))
    register("sample", Impl("flashinfer", sample, _sample_fits))


register_flashinfer()
