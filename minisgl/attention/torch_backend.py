"""A paged attention backend in plain torch: the reference every faster backend must match.

For each request it gathers the request's keys and values from the pool through its row
of the page table, then runs ``scaled_dot_product_attention`` for that request's queries
with a causal mask shifted by ``cached_len`` (query ``j`` sits at absolute position
``cached_len + j`` and may see keys ``0 .. cached_len + j``). One loop iteration per
request is slow but obviously right, works for any page size (the page table stores token
slots) and on any device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List

import torch
import torch.nn.functional as F

from minisgl.core import get_global_ctx

from . import local_heads, register_backend
from .base import BaseAttnBackend, BaseAttnMetadata

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.kvcache import MHAKVCache
    from minisgl.models import ModelConfig


@dataclass
class TorchAttnMetadata(BaseAttnMetadata):
    """Per request ``i``: queries are rows ``cu_seqlens_q[i]:cu_seqlens_q[i+1]`` of the packed
    batch; its context is ``seq_lens[i]`` tokens long, starting ``cached_lens[i]`` before
    the first query; the context's KV slots are ``kv_indices[i]`` (``[seq_lens[i]]``)."""

    cu_seqlens_q: List[int]
    cached_lens: List[int]
    seq_lens: List[int]
    kv_indices: List[torch.Tensor]
    last_indices: torch.Tensor  # [B] int64, on the device

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return self.last_indices[:bs]


class TorchAttnBackend(BaseAttnBackend):
    def __init__(self, num_qo_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = num_kv_heads
        self.scale = head_dim**-0.5

    def prepare_metadata(self, batch: Batch) -> None:
        page_table = get_global_ctx().page_table
        cu, cached, seq, kv = [0], [], [], []
        for req in batch.padded_reqs:
            cu.append(cu[-1] + req.extend_len)
            cached.append(req.cached_len)
            seq.append(req.device_len)
            kv.append(page_table[req.table_idx, : req.device_len])
        last = torch.tensor(cu[1:], dtype=torch.int64) - 1
        batch.attn_metadata = TorchAttnMetadata(cu, cached, seq, kv, last.to(page_table.device))

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        pool: MHAKVCache = get_global_ctx().kv_cache  # type: ignore[assignment]
        pool.store_kv(k, v, batch.out_loc, layer_id)
        k_slots, v_slots = pool.k_slots(layer_id), pool.v_slots(layer_id)
        meta: TorchAttnMetadata = batch.attn_metadata  # type: ignore[assignment]
        out = torch.empty_like(q)
        for i, slots in enumerate(meta.kv_indices):
            start, end = meta.cu_seqlens_q[i], meta.cu_seqlens_q[i + 1]
            out[start:end] = self._attend(
                q[start:end], k_slots[slots], v_slots[slots], meta.cached_lens[i]
            )
        return out

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int
    ) -> torch.Tensor:
        """``q: [n, H_q, D]`` at positions ``offset ..``; ``k, v: [offset + n, H_kv, D]``."""
        n, s = q.shape[0], k.shape[0]
        # query j may see keys 0 .. offset + j
        mask = torch.ones(n, s, dtype=torch.bool, device=q.device).tril(diagonal=offset)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            attn_mask=mask,
            scale=self.scale,
            enable_gqa=self.num_qo_heads != self.num_kv_heads,
        )
        return o.transpose(0, 1)


@register_backend("torch", rank=100, serves=lambda device, dtype: True)
def _build(config: ModelConfig) -> BaseAttnBackend:
    return TorchAttnBackend(*local_heads(config), config.head_dim)
