"""Exercise 281: the CacheManager: pages for each batch, KV handed to the prefix cache, and
frees batched over one result-processing pass.

Requests are admitted by the engine's own ``PrefillManager`` onto a real ``CacheManager`` and
``TableManager`` on ``MINISGL_DEVICE`` (the CPU by default); a "forward pass" is
``allocate_paged`` then ``complete_one`` and a sampled token. Page sizes 1 and 4; sizes in
tokens unless a name says pages.
"""

from __future__ import annotations

import os
from typing import List

import pytest
import torch

from minisgl.core import Req, SamplingParams
from minisgl.message import UserMsg
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import PrefillManager
from minisgl.scheduler.table import TableManager

DEVICE = torch.device(os.environ.get("MINISGL_DEVICE") or "cpu")
PAGE_SIZES = [1, 4]
MAX_LEN = 64


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Setup:
    """``num_pages`` pages of ``P`` tokens, a table of ``rows`` rows, the given prefix cache."""

    def __init__(self, P: int, num_pages: int, cache: str = "naive", rows: int = 4) -> None:
        self.P, self.num_pages = P, num_pages
        self.page_table = torch.zeros(rows + 1, MAX_LEN, dtype=torch.int32, device=DEVICE)
        self.cache = CacheManager(
            num_pages=num_pages, page_size=P, page_table=self.page_table, type=cache
        )
        self.table = TableManager(rows, self.page_table)
        self.prefill = PrefillManager(self.cache, self.table, DecodeManager(P))

    def admit(self, *requests: tuple) -> List[Req]:
        """Admit ``(uid, prompt, max_tokens)`` requests together, through the real queue."""
        for uid, prompt, max_tokens in requests:
            ids = torch.tensor(prompt, dtype=torch.int32)
            self.prefill.add_one_req(UserMsg(uid, ids, SamplingParams(max_tokens=max_tokens)))
        batch = self.prefill.schedule_next_batch(10_000)
        assert batch is not None and len(batch.reqs) == len(requests), (
            "test setup: admission refused"
        )
        return batch.reqs

    def forward(self, *reqs: Req) -> None:
        """One step: pages for this step's positions, then the model "computes" and samples."""
        self.cache.allocate_paged(list(reqs))
        for req in reqs:
            req.complete_one()
            req.append_host(torch.tensor([7], dtype=torch.int32))

    def row(self, req: Req, n: int) -> List[int]:
        return self.page_table[req.table_idx, :n].cpu().tolist()

    def finish(self, req: Req) -> None:
        """What the scheduler does when a request ends."""
        self.cache.cache_req(req, finished=True)
        self.table.free(req.table_idx)

    def pages_in_use(self) -> int:
        return self.num_pages - self.cache.num_free_pages


def prompt(start: int, n: int) -> List[int]:
    return list(range(start, start + n))


def assert_in_pages(row: List[int], P: int, what: str) -> None:
    """Token ``p`` of a row must sit at offset ``p % P`` of its page, and consecutive
    positions of one page must share that page."""
    for p, slot in enumerate(row):
        assert slot % P == p % P, (
            f"{what}: position {p} got slot {slot}, at offset {slot % P} of its page, not {p % P}"
        )
        first = row[p - p % P]  # the slot of the first position of this page
        assert slot == first + p % P, (
            f"{what}: positions {p - p % P}..{p} are in one page but got slots {row[p - p % P : p + 1]}"
        )


# ---- allocate_paged ---------------------------------------------------------------------------


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_allocate_paged_gives_a_prompt_whole_pages(P):
    s = Setup(P, num_pages=32 // P)
    (req,) = s.admit((0, prompt(100, 5), 4))
    s.cache.allocate_paged([req])
    want = ceil_div(5, P)
    assert s.pages_in_use() == want, (
        f"a 5-token prompt needs ceil(5 / {P}) = {want} pages, {s.pages_in_use()} were taken"
    )
    row = s.row(req, 5)
    assert_in_pages(row, P, "page_table row")
    assert len({slot // P for slot in row}) == want, f"the row {row} must use {want} distinct pages"


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_allocate_paged_continues_in_a_partly_used_page(P):
    s = Setup(P, num_pages=32 // P)
    (req,) = s.admit((0, prompt(100, 5), 8))
    s.forward(req)  # prefill: positions [0, 5)
    before = s.row(req, 5)
    for position in range(5, 12):  # decode: one position per step
        used = s.pages_in_use()
        s.forward(req)
        new = s.pages_in_use() - used
        starts_a_page = position % P == 0
        assert new == int(starts_a_page), (
            f"page size {P}: writing position {position} must take {int(starts_a_page)} new page(s) "
            f"(only a position that starts a page needs one; cached_len={position} means positions "
            f"up to ceil({position} / {P}) * {P} already have their page), took {new}"
        )
        assert s.row(req, 5) == before, (
            f"the slots of positions [0, 5) changed from {before} to {s.row(req, 5)}: never reallocate "
            "a page the request already has"
        )
    assert_in_pages(s.row(req, 12), P, "page_table row after decoding")


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_allocate_paged_serves_a_whole_batch_in_one_call(P):
    s = Setup(P, num_pages=64 // P)
    reqs = s.admit((0, prompt(100, 3), 2), (1, prompt(200, 9), 2), (2, prompt(300, 1), 2))
    s.cache.allocate_paged(reqs)
    want = sum(ceil_div(r.device_len, P) for r in reqs)
    assert s.pages_in_use() == want, (
        f"3 + 9 + 1 tokens need {want} pages of {P}, took {s.pages_in_use()}"
    )
    seen = {}
    for req in reqs:
        row = s.row(req, req.device_len)
        assert_in_pages(row, P, f"row of uid {req.uid}")
        for slot in row:
            assert slot not in seen, (
                f"slot {slot} was given to uid {seen[slot]} and to uid {req.uid}"
            )
            seen[slot] = req.uid
    s.cache.allocate_paged([])  # nothing to do is not an error


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_allocate_paged_evicts_from_the_prefix_cache_when_free_pages_run_out(P):
    s = Setup(P, num_pages=4, cache="radix")
    (a,) = s.admit((0, prompt(100, 3 * P), 1))
    s.forward(a)
    s.finish(a)  # its 3 pages stay in the radix cache, evictable
    assert s.cache.num_free_pages == 1 and s.cache.prefix_cache.size_info.evictable_size == 3 * P
    (b,) = s.admit((1, prompt(500, 3 * P), 1))  # shares nothing with a
    s.cache.allocate_paged([b])  # needs 3 pages, 1 is free: the other 2 must come from eviction
    assert s.cache.prefix_cache.size_info.evictable_size == 0, (
        "allocate_paged needed pages the free list did not have: it must evict cached pages "
        "(CacheManager._allocate does) instead of failing or reusing pages still cached"
    )
    assert s.cache.num_free_pages == 1, (
        f"4 pages, 3 in use by b: 1 must be free, {s.cache.num_free_pages} are"
    )
    assert_in_pages(s.row(b, 3 * P), P, "row of the request that got evicted pages")


# ---- cache_req: the naive cache -----------------------------------------------------------------


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_a_finished_request_gives_every_page_back(P):
    s = Setup(P, num_pages=32 // P, cache="naive")
    (req,) = s.admit((0, prompt(100, 7), 3))
    for _ in range(3):
        s.forward(req)
    assert s.pages_in_use() > 0
    s.finish(req)
    assert s.pages_in_use() == 0, (
        f"the naive cache keeps nothing, so a finished request must free all its pages; "
        f"{s.pages_in_use()} of {s.num_pages} are still out"
    )
    s.cache.check_integrity()


# ---- cache_req: the radix cache -----------------------------------------------------------------


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_a_finished_request_leaves_whole_pages_in_the_radix_cache(P):
    s = Setup(P, num_pages=32 // P, cache="radix")
    n = 2 * P + 1
    (req,) = s.admit((0, prompt(100, n), 3))
    for _ in range(3):
        s.forward(req)
    computed = req.cached_len  # the prompt and the first two outputs have KV
    aligned = computed // P * P
    row = s.row(req, computed)
    s.finish(req)
    info = s.cache.prefix_cache.size_info
    assert (info.evictable_size, info.protected_size) == (aligned, 0), (
        f"{computed} positions have KV: the {aligned} in whole pages go to the cache, unlocked "
        f"(evictable); got evictable={info.evictable_size}, protected={info.protected_size}"
    )
    assert s.cache.num_free_pages == s.num_pages - aligned // P, (
        f"the {computed - aligned} tokens of the last, partial page cannot be cached: free that page "
        f"(expected {s.num_pages - aligned // P} free pages, got {s.cache.num_free_pages})"
    )
    handle = s.cache.prefix_cache.match_prefix(req.input_ids).cuda_handle
    assert handle.get_matched_indices().cpu().tolist() == row[:aligned], (
        "the cache must keep the request's own slots"
    )
    s.cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_a_running_request_locks_the_longer_prefix_it_inserted(P):
    s = Setup(P, num_pages=32 // P, cache="radix")
    (req,) = s.admit((0, prompt(100, 2 * P + 1), 4))
    s.forward(req)  # prefill
    s.cache.cache_req(req, finished=False)  # what the scheduler does after a prefill
    aligned = (2 * P + 1) // P * P
    info = s.cache.prefix_cache.size_info
    assert (info.evictable_size, info.protected_size) == (0, aligned), (
        f"the running request still reads its prompt: the {aligned} cached tokens must be locked "
        f"(protected), got evictable={info.evictable_size}, protected={info.protected_size}"
    )
    assert req.cache_handle.cached_len == aligned, (
        f"req.cache_handle must become the handle of the longer prefix, cached_len {aligned}, "
        f"got {req.cache_handle.cached_len}"
    )
    assert s.pages_in_use() == ceil_div(2 * P + 1, P), "a running request keeps every page it has"
    s.forward(req)
    s.finish(req)
    assert s.cache.prefix_cache.size_info.protected_size == 0, (
        "finishing must unlock what was locked"
    )
    s.cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_a_prefix_matched_at_admission_is_unlocked_when_the_request_ends(P):
    s = Setup(P, num_pages=32 // P, cache="radix")
    system = prompt(100, 2 * P)
    (a,) = s.admit((0, system + [1], 1))
    s.forward(a)
    s.finish(a)
    (b,) = s.admit((1, system + [2, 3], 2))
    assert b.cache_handle.cached_len == 2 * P, "test setup: b should find the shared prefix"
    assert s.cache.prefix_cache.size_info.protected_size == 2 * P
    s.forward(b)
    s.forward(b)
    s.finish(b)
    info = s.cache.prefix_cache.size_info
    assert info.protected_size == 0, (
        f"b locked its matched prefix at admission; cache_req must unlock that old handle, "
        f"but {info.protected_size} tokens are still protected"
    )
    s.cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_duplicate_pages_of_a_prefix_another_request_cached_first_are_freed(P):
    s = Setup(P, num_pages=32 // P, cache="radix")
    shared = prompt(100, 3 * P)
    a, b = s.admit((0, shared, 2), (1, shared, 2))  # admitted together: neither finds the other
    s.forward(a, b)
    s.forward(a, b)
    s.finish(a)
    s.finish(b)
    aligned = a.cached_len // P * P
    cached = s.cache.prefix_cache.size_info.total_size
    assert cached == aligned, f"one copy of the {aligned} shared tokens is cached, got {cached}"
    assert s.cache.num_free_pages == s.num_pages - aligned // P, (
        f"b computed the same {aligned} tokens a had already cached: insert_prefix reports them as "
        f"cached already and b's copies must be freed; {s.cache.num_free_pages} pages are free, "
        f"{s.num_pages - aligned // P} should be"
    )
    s.cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_a_running_request_points_its_row_at_the_cache_copy_of_a_duplicate(P):
    s = Setup(P, num_pages=32 // P, cache="radix")
    shared = prompt(100, 2 * P)
    a, b = s.admit((0, shared + [1], 4), (1, shared + [1], 4))
    s.forward(a, b)
    aligned = (2 * P + 1) // P * P  # what cache_req inserts
    s.cache.cache_req(a, finished=False)
    b_own = s.row(b, aligned)
    s.cache.cache_req(b, finished=False)
    assert s.row(b, aligned) == s.row(a, aligned), (
        f"b's own copy of the prefix ({b_own}) was just freed and may be handed to another request; "
        f"b's row must point at the cache's copy {s.row(a, aligned)}, got {s.row(b, aligned)}"
    )
    assert b.cache_handle.get_matched_indices().cpu().tolist() == s.row(b, aligned)
    freed = set(slot // P for slot in b_own)
    free = set((s.cache.free_slots // P).cpu().tolist())
    assert freed <= free, f"b's duplicate pages {sorted(freed)} must be back on the free list"


# ---- lazy_free_region ------------------------------------------------------------------------------


def finished_requests(s: Setup, n: int) -> List[Req]:
    reqs = s.admit(*[(uid, prompt(100 * (uid + 1), 5), 2) for uid in range(n)])
    s.forward(*reqs)
    s.forward(*reqs)
    return reqs


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_frees_inside_a_lazy_region_wait_for_its_end(P):
    s = Setup(P, num_pages=32 // P, cache="naive")
    reqs = finished_requests(s, 3)
    in_use = s.pages_in_use()
    with s.cache.lazy_free_region():
        for req in reqs:
            s.finish(req)
        assert s.pages_in_use() == in_use, (
            f"inside lazy_free_region, frees must wait for the end of the region (one concatenation "
            f"for the whole pass); {in_use - s.pages_in_use()} pages came back early"
        )
    assert s.pages_in_use() == 0, (
        f"at the end of the region every freed page is back; {s.pages_in_use()} are not"
    )
    s.cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_frees_after_a_lazy_region_are_immediate_again(P):
    s = Setup(P, num_pages=32 // P, cache="naive")
    first, second = finished_requests(s, 2)
    with s.cache.lazy_free_region():
        s.finish(first)
    s.finish(second)
    assert s.pages_in_use() == 0, (
        "after the region ends, CacheManager._free must be the eager method again (undo what the "
        f"region changed); a free after the region was lost and {s.pages_in_use()} pages leaked"
    )
    s.cache.check_integrity()


def test_a_lazy_region_still_frees_when_an_error_leaves_it():
    s = Setup(4, num_pages=8, cache="naive")
    first, second = finished_requests(s, 2)
    with pytest.raises(KeyError):
        with s.cache.lazy_free_region():
            s.finish(first)
            raise KeyError("something failed while handling results")
    assert s.pages_in_use() == ceil_div(second.cached_len, 4), (
        "the pages freed before the error must come back when the region is left by an exception "
        "(use try/finally)"
    )
    s.finish(second)
    assert s.pages_in_use() == 0, "and frees after it must be immediate again"
    s.cache.check_integrity()
