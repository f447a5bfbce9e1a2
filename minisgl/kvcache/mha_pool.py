"""The KV pool of multi-head (and grouped-query) attention.

One tensor holds everything: ``[2, L, num_pages, P, H_kv, D]`` — K and V, per layer, per
page of ``P`` token slots. A token's KV lives at slot ``page * P + offset``; the page table
maps (request, position) to that slot, so a request's KV may be scattered over any pages.
Mirrors upstream ``minisgl.kvcache.mha_pool.MHAKVCache``.
"""

from __future__ import annotations

import torch

from minisgl.distributed import get_tp_info
from minisgl.kernel import store_cache
from minisgl.utils import div_even

from .base import BaseKVCachePool


class MHAKVCache(BaseKVCachePool):
    def __init__(
        self,
        num_kv_heads: int,
        num_layers: int,
        head_dim: int,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        local_kv_heads = div_even(num_kv_heads, get_tp_info().size, allow_replicate=True)
        self._kv_buffer = torch.zeros(
            (2, num_layers, num_pages, page_size, local_kv_heads, head_dim),
            dtype=dtype,
            device=device,
        )
        self._num_layers = num_layers
        self._slot_shape = (num_pages * page_size, local_kv_heads, head_dim)

    def k_cache(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s keys, ``[num_pages, P, H_kv, D]``."""
        return self._kv_buffer[0, layer_id]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._kv_buffer[1, layer_id]

    def k_slots(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s keys per token slot, ``[num_pages * P, H_kv, D]`` (a view)."""
        return self._kv_buffer[0, layer_id].view(self._slot_shape)

    def v_slots(self, layer_id: int) -> torch.Tensor:
        return self._kv_buffer[1, layer_id].view(self._slot_shape)

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:
        """Write ``k, v: [T, H_kv, D]`` to slots ``out_loc: [T]`` of layer ``layer_id``."""
        store_cache(self.k_slots(layer_id), self.v_slots(layer_id), out_loc, k, v)

    @property
    def device(self) -> torch.device:
        return self._kv_buffer.device

    @property
    def dtype(self) -> torch.dtype:
        return self._kv_buffer.dtype

    @property
    def num_layers(self) -> int:
        return self._num_layers

    @property
    def num_slots(self) -> int:
        return self._slot_shape[0]
