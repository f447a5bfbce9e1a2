"""References, in plain torch, of the fused decode path's ops (chapter 19).

Each is the unfused composition of ``torch_ops`` that a Triton kernel of ``triton/fused.py``
or ``triton/lm_head.py`` does in one launch; the kernels are tested against these, and on a
machine without Triton the fused path runs them (correct, but no faster than unfused).
"""

from __future__ import annotations

import torch

from .torch_ops import linear, rms_norm, silu_and_mul


def norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    swiglu: bool = False,
) -> torch.Tensor:
    """``linear(rms_norm(x), weight, bias)``, then ``silu_and_mul`` when ``swiglu``:
    ``x: [M, K]`` -> ``[M, N]`` or ``[M, N/2]`` (the reference of ``fused.norm_gemv``)."""
    y = linear(rms_norm(x, norm_weight, eps), weight, bias)
    return silu_and_mul(y) if swiglu else y


def linear_add_residual_(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``residual += linear(x, weight, bias)`` in place (``[M, N]``); returns ``residual``."""
    return residual.add_(linear(x, weight, bias))


def norm_lm_head(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> torch.Tensor:
    """Logits ``linear(rms_norm(x), weight)``: ``x: [M, K]``, ``weight: [V, K]`` -> ``[M, V]``."""
    return linear(rms_norm(x, norm_weight, eps), weight)
