"""The attention layer: split qkv, normalise (Qwen3), rotate, hand over to the backend.

The layer does not know how the KV cache is laid out nor which kernel runs: it reads
the batch, the positions and the backend from the global context. That is why it is
"stateless": the K/V it produces are written into the shared pool by the backend.
Mirrors upstream ``minisgl.layers.attention.AttentionLayer``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.core import get_global_ctx
from minisgl.distributed import get_tp_info
from minisgl.utils import div_even

from .base import StateLessOP
from .rotary import RotaryEmbedding

if TYPE_CHECKING:
    from .norm import RMSNorm
    from .rotary import RotaryConfig


class AttentionLayer(StateLessOP):
    """``qkv: [T, (H_q + 2 H_kv) D]`` -> attention output ``[T, H_q D]`` (local heads)."""

    def __init__(
        self,
        layer_id: int,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rotary_config: RotaryConfig,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
    ) -> None:
        if num_qo_heads % num_kv_heads != 0:
            raise ValueError(f"{num_qo_heads} query heads cannot share {num_kv_heads} KV heads")
        tp = get_tp_info().size
        self.layer_id = layer_id
        self.head_dim = head_dim
        self.num_qo_heads = div_even(num_qo_heads, tp)
        self.num_kv_heads = div_even(num_kv_heads, tp, allow_replicate=True)
        self.rotary = RotaryEmbedding(
            head_dim,
            rotary_config.rotary_dim,
            rotary_config.max_position,
            rotary_config.base,
            rotary_config.scaling,
        )
        self._q_norm = q_norm  # owned (and loaded) by the model's attention block
        self._k_norm = k_norm

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        ctx = get_global_ctx()
        q_size, kv_size = self.num_qo_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(-1, self.num_qo_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self._q_norm is not None and self._k_norm is not None:  # Qwen3: per-head RMSNorm
            q, k = self._q_norm.forward(q), self._k_norm.forward(k)
        q, k = self.rotary.forward(ctx.batch.positions, q, k)
        o = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)
        return o.reshape(-1, self.num_qo_heads * self.head_dim)
