"""Kernels, chosen per call: fast ones on CUDA, the torch references everywhere else.

Every layer calls the names below and never a library directly. Each call looks at its
input and picks:

* FlashInfer (``fi_ops``, chapter 17) for the norms, the SwiGLU gate and RoPE, when the
  tensor is on CUDA, in ``float16``/``bfloat16`` (all FlashInfer supports), and
  ``flashinfer`` imports;
* Triton (``triton_store``, chapter 19) for the KV store and the embedding gather, when
  the tensor is on CUDA and ``triton`` imports;
* Triton (``triton_gemv``, chapter 19) for linear layers of at most ``GEMV_MAX_M`` rows
  whose weight has at least as many inputs as outputs (``K >= N``), in ``float16``/``bfloat16``
  on CUDA, unless ``MINISGL_DISABLE_GEMV=1``; ``F.linear`` (cuBLAS on CUDA) for every other
  linear layer;
* Triton (``triton_fused``, chapter 19) for the fused decode path of a decoder layer
  (``norm_linear``, ``linear_add_residual_``, ``qk_norm_rope_store``) and of the final
  norm with the LM head (``norm_lm_head``, ``triton_lm_head``), which the model
  takes when ``use_fused_decode`` says so: the GEMV's conditions, unless
  ``MINISGL_DISABLE_FUSED_DECODE=1``; the same switch governs the split-KV decode
  attention (``triton_decode``) the FlashInfer backend uses for one or two requests
  (``use_small_decode_attention``);
* the torch reference (``torch_ops``) otherwise: on the CPU, in float32, or when
  ``MINISGL_TORCH_KERNELS=1`` asks for it.

A Triton module may be absent from an earlier chapter's step tree (``introduced``); its
op then keeps the fallback. The choice costs a few attribute reads per call; inside a CUDA
graph it is made once, at capture. The switches live in ``minisgl.env`` (chapter 7) and are
imported only on the CUDA path, so the CPU-only chapters before it need no ``env.py``. Mirrors upstream
``minisgl.kernel`` (which has no fallback: upstream is CUDA only, and has no GEMV kernel:
its linear layers call ``F.linear``).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from . import fi_ops, torch_ops

_FI_DTYPES = (torch.float16, torch.bfloat16)
# Where the Triton GEMV beats cuBLAS, measured on an H200 (benchmarks/gemv.py, chapter 19):
# at 1 or 2 rows, on weights with K >= N (o_proj, down_proj), which cuBLAS's one-row kernels
# read at 330-950 GB/s against the GEMV's 700-1,070. Where N > K (qkv, gate_up, the LM head)
# cuBLAS already streams at 1.6-4 TB/s; at 4 rows the GEMV's lead is small or gone, and at 8
# rows cuBLAS wins on every shape.
GEMV_MAX_M = 2


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether ``import triton`` works (checked once)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def introduced(module: str) -> bool:
    """Whether ``minisgl.kernel.<module>`` is in this tree. In the book's step folders
    (``tools/steps.py``) a later chapter's kernel module is absent; its op then keeps the
    torch reference instead of failing to import (say, chapter 18 run on a GPU)."""
    try:
        return importlib.util.find_spec(f"{__name__}.{module}") is not None
    except ImportError:
        return False


def _torch_kernels_forced() -> bool:
    from minisgl.env import ENV

    return bool(ENV.TORCH_KERNELS)


def use_flashinfer(x: torch.Tensor) -> bool:
    """Whether FlashInfer serves a kernel whose main input is ``x`` (CUDA, fp16/bf16)."""
    if not x.is_cuda or x.dtype not in _FI_DTYPES:
        return False
    return not _torch_kernels_forced() and fi_ops.flashinfer_available()


def use_triton(x: torch.Tensor) -> bool:
    """Whether the Triton kernels serve an op whose main input is ``x`` (CUDA)."""
    if not x.is_cuda:
        return False
    return not _torch_kernels_forced() and triton_available()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x: [..., N]`` -> ``x / rms(x) * weight``, same shape (see ``torch_ops.rms_norm``)."""
    if use_flashinfer(x) and x.dim() in (2, 3) and x.stride(-1) == 1:
        return fi_ops.rms_norm(x, weight, eps)
    return torch_ops.rms_norm(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``; on FlashInfer computed in place in
    ``x`` and ``residual`` (callers use the returned tensors only)."""
    if use_flashinfer(x) and x.dim() == 2 and x.is_contiguous() and residual.is_contiguous():
        return fi_ops.fused_add_rms_norm(x, residual, weight, eps)
    return torch_ops.fused_add_rms_norm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``[T, 2I]`` holding ``[gate | up]`` -> ``silu(gate) * up``, ``[T, I]``."""
    if use_flashinfer(x) and x.is_contiguous() and (x.shape[-1] * x.element_size()) % 16 == 0:
        return fi_ops.silu_and_mul(x)
    return torch_ops.silu_and_mul(x)


def apply_rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE on ``q: [T, H_q, D]``, ``k: [T, H_kv, D]`` (see ``torch_ops.apply_rotary``);
    on FlashInfer in place."""
    if (
        use_flashinfer(q)
        and q.stride(-1) == 1
        and k.stride(-1) == 1
        and cos_sin_cache.dtype == torch.float32
        and cos_sin_cache.shape[-1] == q.shape[-1]
    ):
        return fi_ops.apply_rotary(positions, q, k, cos_sin_cache)
    return torch_ops.apply_rotary(positions, q, k, cos_sin_cache)


def _gemv_disabled() -> bool:
    from minisgl.env import ENV

    return bool(ENV.DISABLE_GEMV)


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear(x, weight)`` goes to the Triton GEMV: a contiguous fp16/bf16
    ``x: [M, K]`` on CUDA with ``M <= GEMV_MAX_M``, a weight ``[N, K]`` of its dtype with
    contiguous rows and ``K >= N`` (see ``GEMV_MAX_M``), Triton allowed (``use_triton``) and
    ``MINISGL_DISABLE_GEMV`` unset."""
    return (
        x.dim() == 2
        and weight.dim() == 2
        and 0 < x.shape[0] <= GEMV_MAX_M
        and weight.shape[1] >= weight.shape[0]
        and x.dtype in _FI_DTYPES
        and weight.dtype == x.dtype
        and x.is_contiguous()
        and weight.stride(-1) == 1
        and use_triton(x)
        and not _gemv_disabled()
        and introduced("triton_gemv")
    )


def _fused_decode_disabled() -> bool:
    from minisgl.env import ENV

    return bool(ENV.DISABLE_FUSED_DECODE)


def use_fused_decode(x: torch.Tensor) -> bool:
    """Whether a decoder layer whose hidden states are ``x: [T, hidden]`` takes the fused
    decode path (chapter 19): ``T <= GEMV_MAX_M`` rows, contiguous fp16/bf16 on CUDA, Triton
    allowed (``use_triton``) and ``MINISGL_DISABLE_FUSED_DECODE`` unset. The model checks
    the rest (one rank, dense MLPs)."""
    return (
        x.dim() == 2
        and 0 < x.shape[0] <= GEMV_MAX_M
        and x.dtype in _FI_DTYPES
        and x.is_contiguous()
        and use_triton(x)
        and not _fused_decode_disabled()
        and introduced("triton_fused")
    )


def use_small_decode_attention(kv: torch.Tensor) -> bool:
    """Whether a decode batch of one or two requests over the KV pool ``kv`` goes to chapter
    19's split-KV Triton kernel (``triton_decode``) instead of FlashInfer's: fp16/bf16 on
    CUDA, Triton allowed, ``MINISGL_DISABLE_FUSED_DECODE`` unset."""
    return (
        kv.dtype in _FI_DTYPES
        and use_triton(kv)
        and not _fused_decode_disabled()
        and introduced("triton_decode")
    )


def norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    swiglu: bool = False,
) -> torch.Tensor:
    """``linear(rms_norm(x), weight, bias)`` (then ``silu_and_mul`` when ``swiglu``):
    ``x: [M, K]`` -> ``[M, N]`` (``[M, N/2]``); one Triton kernel on CUDA
    (``triton_fused.norm_gemv``), else ``torch_ops.norm_linear``."""
    if use_triton(x):
        from . import triton_fused

        return triton_fused.norm_gemv(x, norm_weight, eps, weight, bias, swiglu)
    return torch_ops.norm_linear(x, norm_weight, eps, weight, bias, swiglu)


def norm_lm_head(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> torch.Tensor:
    """Logits ``linear(rms_norm(x, norm_weight, eps), weight)``: ``x: [M, K]`` (the residual
    stream of a fused decode batch, before the final norm), ``weight: [V, K]`` -> ``[M, V]``.
    One persistent Triton kernel on CUDA (``triton_lm_head.norm_lm_head``) for a hidden size
    up to its ``MAX_K``, else ``torch_ops.norm_linear``."""
    if use_triton(x) and introduced("triton_lm_head"):
        from . import triton_lm_head

        if x.shape[1] <= triton_lm_head.MAX_K:
            return triton_lm_head.norm_lm_head(x, norm_weight, eps, weight)
    return torch_ops.norm_linear(x, norm_weight, eps, weight)


def linear_add_residual_(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``residual += linear(x, weight, bias)`` in place, ``[M, N]``; returns ``residual``.
    One Triton kernel on CUDA (``triton_fused.gemv_add_residual_``)."""
    if use_triton(x):
        from . import triton_fused

        return triton_fused.gemv_add_residual_(x, weight, residual, bias)
    return torch_ops.linear_add_residual_(x, weight, residual, bias)


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
    """Queries ``[T, H_q, D]`` from ``qkv: [T, (H_q + 2 H_kv) D]`` after the per-head norms
    and RoPE, with k and v stored at ``out_loc`` (see ``torch_ops.qk_norm_rope_store``);
    one Triton kernel on CUDA (``triton_fused.qk_norm_rope_store``)."""
    args = (
        qkv,
        positions,
        cos_sin_cache,
        q_norm,
        k_norm,
        eps,
        k_slots,
        v_slots,
        out_loc,
        num_qo_heads,
        num_kv_heads,
        head_dim,
    )
    if use_triton(qkv):
        from . import triton_fused

        return triton_fused.qk_norm_rope_store(*args)
    return torch_ops.qk_norm_rope_store(*args)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``x @ weight.T + bias``: ``x: [T, K]``, ``weight: [N, K]``, ``bias: [N]`` -> ``[T, N]``,
    like ``F.linear``. At most ``GEMV_MAX_M`` rows on CUDA times a weight with ``K >= N`` (a
    small decode batch in ``o_proj`` or ``down_proj``) use the Triton GEMV
    (``triton_gemv.gemv``); everything else, the CPU included, is ``F.linear`` itself."""
    if use_gemv(x, weight) and (bias is None or (bias.dtype == x.dtype and bias.is_contiguous())):
        from . import triton_gemv

        return triton_gemv.gemv(x, weight, bias)
    return F.linear(x, weight, bias)


def store_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """``k_cache[indices[i]] = k[i]``, same for v (see ``torch_ops.store_cache``)."""
    if use_triton(k) and introduced("triton_store"):
        from . import triton_store

        triton_store.store_cache(k_cache, v_cache, indices, k, v)
    else:
        torch_ops.store_cache(k_cache, v_cache, indices, k, v)


def embedding_gather(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rows of ``weight: [V, hidden]`` for ``ids: [T]`` -> ``[T, hidden]``."""
    if use_triton(weight) and introduced("triton_store"):
        from . import triton_store

        return triton_store.embedding_gather(ids, weight)
    return torch_ops.embedding_gather(ids, weight)


__all__ = [
    "apply_rotary",
    "embedding_gather",
    "fused_add_rms_norm",
    "introduced",
    "linear",
    "linear_add_residual_",
    "norm_linear",
    "qk_norm_rope_store",
    "rms_norm",
    "silu_and_mul",
    "store_cache",
    "triton_available",
    "use_flashinfer",
    "use_fused_decode",
    "use_gemv",
    "use_small_decode_attention",
    "use_triton",
]
