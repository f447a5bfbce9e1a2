"""The KV-cache manager: free pages, allocation for each batch, and the prefix cache.

Every KV slot is in exactly one of three places: free (``free_slots``, kept one entry per
page), held by the prefix cache (evictable or protected), or owned by a running request
beyond what the prefix cache holds. ``check_integrity`` verifies that pages add up.

Mirrors upstream ``minisgl.scheduler.cache.CacheManager`` (explained in chapter 8).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, List

import torch

from minisgl.core import Req
from minisgl.kvcache import BaseCacheHandle, MatchResult, create_prefix_cache

if TYPE_CHECKING:
    from .utils import PendingReq


class CacheManager:
    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor, type: str) -> None:
        device = page_table.device
        # one entry per free page: the slot of its first token (page * P)
        self.free_slots = torch.arange(num_pages, dtype=torch.int32, device=device) * page_size
        self.prefix_cache = create_prefix_cache(device=device, type=type, page_size=page_size)
        self.device = device
        self.num_pages = num_pages
        self.page_size = page_size
        self.page_table = page_table

    # ---- admission --------------------------------------------------------------------
    def match_req(self, req: PendingReq) -> MatchResult:
        """Longest cached prefix of the prompt, leaving at least its last token uncached:
        prefill must compute the last token's logits to sample the first output token."""
        if req.input_len == 0:
            raise ValueError(f"request {req.uid} has an empty prompt")
        return self.prefix_cache.match_prefix(req.input_ids[: req.input_len - 1])

    @property
    def available_size(self) -> int:
        """Tokens that could be stored now: free pages plus evictable cached tokens."""
        return len(self.free_slots) * self.page_size + self.prefix_cache.size_info.evictable_size

    @property
    def num_free_pages(self) -> int:
        return len(self.free_slots)

    def lock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle, unlock=False)

    def unlock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle, unlock=True)

    # ---- allocation -------------------------------------------------------------------
    def allocate_paged(self, reqs: List[Req]) -> None:
        """Give every request the pages its positions ``[cached_len, device_len)`` need and
        write their slots into the page table. A request's last page may be partly used;
        only pages starting at or after ``ceil(cached_len / P)`` are new."""
        raise NotImplementedError("Exercise 281: implement CacheManager.allocate_paged")

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """Hand the KV of ``req``'s positions ``[0, cached_len)`` to the prefix cache.

        Of those positions, ``[0, handle.cached_len)`` came from the cache at admission;
        the rest the request computed. Inserting tells us how much was already cached by
        the time we insert (another request may have inserted the same tokens meanwhile):
        our duplicate slots for that part are freed. A finished request also frees the
        unaligned tail the cache cannot hold; a running one keeps it, re-locks the longer
        prefix, and has its page-table row pointed at the cache's copy of the duplicates.
        """
        raise NotImplementedError("Exercise 281: implement CacheManager.cache_req")

    def _allocate(self, num_pages: int) -> torch.Tensor:
        if num_pages > len(self.free_slots):
            evicted = self.prefix_cache.evict((num_pages - len(self.free_slots)) * self.page_size)
            self.free_slots = torch.cat([self.free_slots, evicted[:: self.page_size]])
            if num_pages > len(self.free_slots):
                raise RuntimeError(
                    f"out of KV pages: need {num_pages}, have {len(self.free_slots)}"
                )
        pages, self.free_slots = self.free_slots[:num_pages], self.free_slots[num_pages:]
        return pages

    def _free(self, slots: torch.Tensor) -> None:
        """Return the pages of ``slots`` (page-aligned runs of token slots)."""
        if len(slots) > 0:
            self.free_slots = torch.cat([self.free_slots, slots[:: self.page_size]])

    def _page_to_token(self, pages: torch.Tensor) -> torch.Tensor:
        """First slots of pages ``[N]`` -> every slot of those pages ``[N * P]``."""
        if self.page_size == 1:
            return pages
        offsets = torch.arange(self.page_size, dtype=pages.dtype, device=pages.device)
        return (pages.unsqueeze(1) + offsets).flatten()

    @contextmanager
    def lazy_free_region(self) -> Iterator[None]:
        """Batch the frees of one result-processing pass into a single concatenation."""
        raise NotImplementedError("Exercise 281: implement CacheManager.lazy_free_region")

    # ---- invariants -------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise ``RuntimeError`` unless free pages + cached pages == all pages (call when
        no request is running) and no page is free twice."""
        self.prefix_cache.check_integrity()
        cached_pages = self.prefix_cache.size_info.total_size // self.page_size
        if len(self.free_slots) + cached_pages != self.num_pages:
            raise RuntimeError(
                f"KV pages leaked: free {len(self.free_slots)} + cached {cached_pages} "
                f"!= total {self.num_pages}"
            )
        if len(torch.unique(self.free_slots)) != len(self.free_slots):
            raise RuntimeError("a KV page is on the free list twice")
        if self.page_size > 1 and bool((self.free_slots % self.page_size != 0).any()):
            raise RuntimeError("a free slot is not the start of a page")
