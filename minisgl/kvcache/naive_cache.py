"""The prefix cache that caches nothing: every request computes its whole prompt.

It is the simplest thing that satisfies ``BasePrefixCache``, and the baseline any real
prefix cache is measured against. Mirrors upstream ``minisgl.kvcache.naive_cache``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import PREFIX_CACHES
from .base import BaseCacheHandle, BasePrefixCache, InsertResult, MatchResult, SizeInfo


@dataclass(frozen=True)
class NaiveCacheHandle(BaseCacheHandle):
    empty: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int32))

    def get_matched_indices(self) -> torch.Tensor:
        return self.empty


class NaivePrefixCache(BasePrefixCache):
    def __init__(self, device: torch.device) -> None:
        self._empty = torch.empty(0, dtype=torch.int32, device=device)

    def _handle(self) -> NaiveCacheHandle:
        return NaiveCacheHandle(cached_len=0, empty=self._empty)

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        pass

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        return MatchResult(self._handle())

    def insert_prefix(self, input_ids: torch.Tensor, indices: torch.Tensor) -> InsertResult:
        # nothing is kept: the caller frees every slot beyond handle.cached_len == 0
        return InsertResult(0, self._handle())

    def evict(self, size: int) -> torch.Tensor:
        if size > 0:
            raise RuntimeError(f"the naive cache holds nothing to evict (asked for {size} tokens)")
        return self._empty

    def reset(self) -> None:
        pass

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(evictable_size=0, protected_size=0)

    def check_integrity(self) -> None:
        pass


@PREFIX_CACHES.register("naive")
def _naive(device: torch.device, page_size: int) -> BasePrefixCache:
    return NaivePrefixCache(device)
