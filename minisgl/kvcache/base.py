"""Interfaces of the KV cache: the pool that stores K/V, and the prefix cache that indexes it.

Mirrors upstream ``minisgl.kvcache.base``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import NamedTuple

import torch


class BaseKVCachePool(ABC):
    """Storage for every layer's keys and values, addressed by token slot."""

    @abstractmethod
    def k_cache(self, layer_id: int) -> torch.Tensor: ...

    @abstractmethod
    def v_cache(self, layer_id: int) -> torch.Tensor: ...

    @abstractmethod
    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None: ...

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype: ...

    @property
    @abstractmethod
    def num_layers(self) -> int: ...


@dataclass(frozen=True)
class BaseCacheHandle(ABC):
    """A matched prefix: ``cached_len`` tokens whose KV already sits in the pool."""

    cached_len: int

    @abstractmethod
    def get_matched_indices(self) -> torch.Tensor:
        """The KV slots of the matched tokens, ``[cached_len]`` int32."""


class SizeInfo(NamedTuple):
    """Tokens held by the prefix cache: evictable (unreferenced) and protected (in use)."""

    evictable_size: int
    protected_size: int

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size


class InsertResult(NamedTuple):
    cached_len: int  # how much of the inserted prefix was already cached (its slots are duplicates)
    handle: BaseCacheHandle  # handle of the whole inserted (page-aligned) prefix


class MatchResult(NamedTuple):
    cuda_handle: BaseCacheHandle  # upstream's name: the device-memory match


class BasePrefixCache(ABC):
    """Maps token prefixes to KV slots so later requests can skip recomputing them."""

    @abstractmethod
    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        """Protect (or release) the matched prefix from eviction; changes sizes only."""

    @abstractmethod
    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        """Longest cached prefix of ``input_ids: [N]``; does not modify the cache."""

    @abstractmethod
    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        """Cache ``input_ids: [N]`` stored at slots ``indices: [N]`` (page-aligned part only)."""

    @abstractmethod
    def evict(self, size: int) -> torch.Tensor:
        """Drop unreferenced prefixes holding at least ``size`` tokens; returns their slots.

        Raises:
            RuntimeError: when less than ``size`` tokens are evictable.
        """

    @abstractmethod
    def reset(self) -> None: ...

    @property
    @abstractmethod
    def size_info(self) -> SizeInfo: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise ``RuntimeError`` if the bookkeeping is inconsistent."""
