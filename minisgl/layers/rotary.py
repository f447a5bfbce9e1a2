"""Rotary position embedding (RoPE), including Llama 3's frequency scaling.

RoPE rotates each pair of dimensions of q and k by an angle ``position * inv_freq``, so
the dot product of a query and a key depends only on their distance. The table of
``cos``/``sin`` for every position is computed once and indexed by ``positions``; because
positions come from the batch, a packed batch of many requests needs nothing special.
Mirrors upstream ``minisgl.layers.rotary``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch

from minisgl.kernel import apply_rotary

from .base import StateLessOP


@dataclass(frozen=True)
class RotaryConfig:
    """A model's RoPE: ``rotary_dim`` of each ``head_dim``-wide head rotate, with frequencies
    ``base ** (-2i / rotary_dim)``, over positions up to ``max_position``, optionally rescaled
    (``scaling``: Hugging Face's ``rope_scaling``). Upstream keeps it with the model's
    config."""

    head_dim: int
    rotary_dim: int
    max_position: int
    base: float
    scaling: Dict[str, Any] | None


def _llama3_scale(inv_freq: torch.Tensor, scaling: Dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's long-context fix: slow down low frequencies by ``factor``, keep high
    ones, and blend smoothly in between (wavelengths measured against the original context).
    """
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(is_medium, blended, scaled)


@functools.lru_cache(maxsize=16)
def _cos_sin_cache(
    rotary_dim: int,
    max_position: int,
    base: float,
    scaling: Tuple[Tuple[str, Any], ...] | None,
    device: torch.device,
) -> torch.Tensor:
    """``[max_position, rotary_dim]`` float32 holding ``[cos | sin]`` of each frequency."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    scaling_map = dict(scaling) if scaling else {}
    rope_type = scaling_map.get("rope_type", scaling_map.get("type", "default"))
    if rope_type == "llama3":
        inv_freq = _llama3_scale(inv_freq, scaling_map)
    elif rope_type != "default":
        raise ValueError(f"unsupported rope scaling {rope_type!r} (supported: default, llama3)")
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)


class RotaryEmbedding(StateLessOP):
    """Applies RoPE to ``q: [T, H_q, D]`` and ``k: [T, H_kv, D]`` at ``positions: [T]``.

    The table is built on first use, on the device of ``positions``, and shared by every
    layer with the same settings.
    """

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        max_position: int,
        base: float,
        scaling: Dict[str, Any] | None = None,
    ) -> None:
        if rotary_dim != head_dim:
            raise ValueError("partial rotary embeddings are not supported")
        self.head_dim = head_dim
        self._args = (rotary_dim, max_position, float(base), _freeze(scaling))

    def cos_sin_cache(self, device: torch.device) -> torch.Tensor:
        """The shared table, ``[max_position, D]`` float32 holding ``[cos | sin]``."""
        return _cos_sin_cache(*self._args, device)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        return apply_rotary(positions, q, k, self.cos_sin_cache(positions.device))


def _freeze(scaling: Dict[str, Any] | None) -> Tuple[Tuple[str, Any], ...] | None:
    if not scaling:
        return None
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in scaling.items()))
