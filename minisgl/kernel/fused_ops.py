"""The fused decode path's ops: a decode step of a few requests as few kernels as possible.

``norm_linear``, ``linear_add_residual_`` and ``norm_lm_head`` fuse a norm, an add or
SwiGLU into a GEMV; their torch references (``torch_fused``) serve every call and are what
the Triton kernels are tested against. ``decode_attention`` and ``decode_attention_qkv``
are split-KV attention for a few requests, with no reference at this level: the attention
backend that calls them runs only where Triton does, and the torch attention backend is
their reference.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from . import Impl, register, run, torch_fused

register("norm_linear", Impl("torch", torch_fused.norm_linear))
register("linear_add_residual_", Impl("torch", torch_fused.linear_add_residual_))
register("norm_lm_head", Impl("torch", torch_fused.norm_lm_head))


def norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    swiglu: bool = False,
) -> torch.Tensor:
    """``linear(rms_norm(x), weight, bias)``, then ``silu_and_mul`` when ``swiglu``:
    ``x: [M, K]`` -> ``[M, N]`` (``[M, N/2]``) (``torch_fused.norm_linear``)."""
    return run("norm_linear", x, norm_weight, eps, weight, bias, swiglu)


def linear_add_residual_(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``residual += linear(x, weight, bias)`` in place, ``[M, N]``; returns ``residual``."""
    return run("linear_add_residual_", x, weight, residual, bias)


def norm_lm_head(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> torch.Tensor:
    """Logits ``linear(rms_norm(x, norm_weight, eps), weight)``: ``x: [M, K]`` (the residual
    stream before the final norm), ``weight: [V, K]`` -> ``[M, V]``."""
    return run("norm_lm_head", x, norm_weight, eps, weight)


def decode_attention(q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Split-KV attention of one query per request, ``q: [B, H_q, D]`` -> ``[B, H_q, D]``
    (``triton.decode.decode_attention`` gives the arguments)."""
    return run("decode_attention", q, *args, **kwargs)


def decode_attention_qkv(qkv: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The same from the qkv GEMV's output, with the q/k norms, RoPE and the KV store
    inside: ``qkv: [B, (H_q + 2 H_kv) D]`` -> ``[B, H_q, D]``
    (``triton.decode.decode_attention_qkv``)."""
    return run("decode_attention_qkv", qkv, *args, **kwargs)
