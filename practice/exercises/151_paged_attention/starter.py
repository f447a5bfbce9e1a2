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
from typing import TYPE_CHECKING, List, Optional

import torch

from .base import BaseAttnBackend, BaseAttnMetadata

if TYPE_CHECKING:
    from minisgl.core import Batch


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
        raise NotImplementedError("Exercise 151: implement TorchAttnBackend.prepare_metadata")

    def forward(
        self,
        q: torch.Tensor,
        k: Optional[torch.Tensor],
        v: Optional[torch.Tensor],
        layer_id: int,
        batch: Batch,
    ) -> torch.Tensor:
        raise NotImplementedError("Exercise 151: implement TorchAttnBackend.forward")

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int
    ) -> torch.Tensor:
        """``q: [n, H_q, D]`` at positions ``offset ..``; ``k, v: [offset + n, H_kv, D]``."""
        raise NotImplementedError("Exercise 151: implement TorchAttnBackend._attend")
