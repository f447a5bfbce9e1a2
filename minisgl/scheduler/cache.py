"""The KV-cache manager: free pages, allocation for each batch, and the prefix cache.

Every KV slot is in exactly one of three places: free (``free_slots``, kept one entry per
page), held by the prefix cache (evictable or protected), or owned by a running request
beyond what the prefix cache holds. ``check_integrity`` verifies that pages add up.

Mirrors upstream ``minisgl.scheduler.cache.CacheManager``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, List, Tuple

import torch

from minisgl.core import Req
from minisgl.kvcache import BaseCacheHandle, MatchResult, create_prefix_cache
from minisgl.utils import div_ceil

if TYPE_CHECKING:
    from .utils import PendingReq


class CacheManager:
    """``num_pages`` pages of ``page_size`` tokens, handed out for the page table's rows;
    ``type`` names the prefix cache in front of them (``"naive"`` caches nothing)."""

    def __init__(
        self, num_pages: int, page_size: int, page_table: torch.Tensor, type: str = "naive"
    ) -> None:
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
        plan: List[Tuple[int, int, int]] = []  # (row, first new page, end page)
        needed = 0
        for req in reqs:
            first, last = (
                div_ceil(req.cached_len, self.page_size),
                div_ceil(req.device_len, self.page_size),
            )
            if last > first:
                plan.append((req.table_idx, first, last))
                needed += last - first
        if needed == 0:
            return
        slots = self._page_to_token(self._allocate(needed))
        rows = torch.cat(
            [torch.full(((e - f) * self.page_size,), r, dtype=torch.int64) for r, f, e in plan]
        )
        cols = torch.cat([torch.arange(f * self.page_size, e * self.page_size) for _, f, e in plan])
        self.page_table[rows.to(self.device), cols.to(self.device)] = slots

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """Hand the KV of ``req``'s positions ``[0, cached_len)`` to the prefix cache.

        Of those positions, ``[0, handle.cached_len)`` came from the cache at admission;
        the rest the request computed. Inserting tells us how much was already cached by
        the time we insert (another request may have inserted the same tokens meanwhile):
        our duplicate slots for that part are freed. A finished request also frees the
        unaligned tail the cache cannot hold; a running one keeps it, re-locks the longer
        prefix, and has its page-table row pointed at the cache's copy of the duplicates.
        """
        # a copy, not a view of the row: the row may be rewritten below before a lazy free runs
        slots = self.page_table[req.table_idx, : req.cached_len].clone()
        old_handle = req.cache_handle
        already_cached, new_handle = self.prefix_cache.insert_prefix(
            req.input_ids[: req.cached_len], slots
        )
        self.unlock(old_handle)
        self._free(slots[old_handle.cached_len : already_cached])
        if finished:
            self._free(slots[new_handle.cached_len :])
        else:
            if already_cached > old_handle.cached_len:
                # our copy of those tokens was just freed and may soon belong to another
                # request: the rest of this request's steps must read the cache's copy
                cached = new_handle.get_matched_indices()[old_handle.cached_len : already_cached]
                self.page_table[req.table_idx, old_handle.cached_len : already_cached] = cached
            req.cache_handle = new_handle
            self.lock(new_handle)

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
        pending: List[torch.Tensor] = []

        def lazy_free(slots: torch.Tensor) -> None:
            if len(slots) > 0:
                pending.append(slots[:: self.page_size])

        self._free = lazy_free  # type: ignore[method-assign]
        try:
            yield
        finally:
            del self._free
            if pending:
                self.free_slots = torch.cat([self.free_slots, *pending])

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
