"""Exercise 291 through admission: the scheduler's PrefillAdder matches a prompt in your radix
cache, points the request's row at the cached slots and locks the prefix, and unlocks it
again when the request does not fit after all.

The real CacheManager, TableManager and PrefillAdder of chapter 9, with one-token pages, on
``MINISGL_DEVICE`` (the CPU by default).
"""

from __future__ import annotations

import os

import torch

from minisgl.core import SamplingParams
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.prefill import PrefillAdder
from minisgl.scheduler.table import TableManager
from minisgl.scheduler.utils import PendingReq

DEVICE = torch.device(os.environ.get("MINISGL_DEVICE") or "cpu")
ROWS, MAX_LEN = 4, 64


class Setup:
    """A radix-cached KV pool of ``num_pages`` one-token pages and a table of ``ROWS`` rows."""

    def __init__(self, num_pages: int) -> None:
        self.page_table = torch.zeros(ROWS + 1, MAX_LEN, dtype=torch.int32, device=DEVICE)
        self.cache = CacheManager(
            num_pages=num_pages, page_size=1, page_table=self.page_table, type="radix"
        )
        self.table = TableManager(ROWS, self.page_table)

    def adder(self, token_budget: int = 1000) -> PrefillAdder:
        return PrefillAdder(
            token_budget=token_budget,
            reserved_size=0,
            cache_manager=self.cache,
            table_manager=self.table,
        )

    def cache_prefix(self, ids: torch.Tensor) -> torch.Tensor:
        """Put ``ids`` in the radix cache (unlocked, so evictable); returns their slots."""
        slots, self.cache.free_slots = (
            self.cache.free_slots[: len(ids)],
            self.cache.free_slots[len(ids) :],
        )
        self.cache.prefix_cache.insert_prefix(ids, slots)
        return slots


def pending(uid: int, prompt_len: int, max_tokens: int) -> PendingReq:
    ids = torch.arange(100, 100 + prompt_len, dtype=torch.int32)
    return PendingReq(uid, ids, SamplingParams(max_tokens=max_tokens))


def test_a_prefix_hit_computes_only_the_uncached_tail():
    s = Setup(num_pages=32)
    p = pending(0, 12, 4)
    slots = s.cache_prefix(p.input_ids[:8])
    adder = s.adder(token_budget=100)
    req = adder.try_add_one(p)
    assert req is not None and req.cached_len == 8, f"8 prompt tokens are cached, got {req}"
    assert adder.token_budget == 96, (
        f"only the 4 uncached tokens cost budget, budget is {adder.token_budget}"
    )
    assert s.page_table[req.table_idx, :8].cpu().tolist() == slots.cpu().tolist(), (
        "the row must point at the cached slots: match_prefix returned other ones"
    )
    assert s.cache.available_size == 32 - 8, (
        "the admitted request locked its 8-token prefix: it is no longer evictable"
    )


def test_a_refused_request_leaves_its_prefix_evictable():
    # 4 free + 8 evictable = 12. Locking the matched 8 leaves 4, too few for the 2 + 5 needed.
    s = Setup(num_pages=12)
    p = pending(0, 10, 5)
    s.cache_prefix(p.input_ids[:8])
    assert s.cache.available_size == 12
    assert s.adder().try_add_one(p) is None, (
        "once the prefix is locked only 4 tokens are available for 7"
    )
    assert s.cache.available_size == 12, (
        "the refused request unlocked its prefix, yet it is not evictable again: "
        "unlocking must move the tokens back from protected to evictable"
    )
