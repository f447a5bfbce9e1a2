"""RMSNorm, plain and fused with the residual add. Mirrors upstream ``minisgl.layers.norm``."""

from __future__ import annotations

from typing import Tuple

import torch

from minisgl.kernel import fused_add_rms_norm, rms_norm

from .base import BaseOP


class RMSNorm(BaseOP):
    """``x: [..., size]`` -> ``x / sqrt(mean(x^2) + eps) * weight``."""

    def __init__(self, size: int, eps: float) -> None:
        self.eps = eps
        self.weight = torch.empty(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class RMSNormFused(RMSNorm):
    """The pre-norm of a decoder layer, which first adds the residual stream.

    ``forward(x, None)`` normalises the embedding output and starts the residual stream;
    ``forward(x, residual)`` adds ``x`` to it first. Returns ``(normed, residual)``.
    """

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return rms_norm(x, self.weight, self.eps), x
        return fused_add_rms_norm(x, residual, self.weight, self.eps)
