"""Activations. Mirrors upstream ``minisgl.layers.activation``."""

from __future__ import annotations

import torch

from minisgl.kernel import silu_and_mul as _silu_and_mul


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``[T, 2I]`` holding ``[gate | up]`` -> ``silu(gate) * up``, ``[T, I]``."""
    return _silu_and_mul(x)
