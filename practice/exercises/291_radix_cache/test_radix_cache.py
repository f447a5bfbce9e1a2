"""Exercise 291: the radix prefix cache: match, insert, lock/unlock and LRU eviction, in
whole pages of P = 1, 4 and 16 tokens.

The cache only stores token ids (CPU) and slot numbers: no KV pool and no model are needed.
``check_integrity`` (given) recounts every node after each test: page-aligned edges, a
parent locked at least as often as its children, and the evictable/protected totals.
"""

from __future__ import annotations

import random
from typing import Dict, List, Tuple

import pytest
import torch

from minisgl.kvcache.radix_cache import RadixPrefixCache

PAGE_SIZES = [1, 4, 16]
CPU = torch.device("cpu")


def seq(start: int, n: int) -> torch.Tensor:
    """``n`` token ids from ``start``: distinct starts give distinct first pages."""
    return torch.arange(start, start + n, dtype=torch.int32)


def slots(first: int, n: int) -> torch.Tensor:
    return torch.arange(first, first + n, dtype=torch.int32)


def sizes(cache: RadixPrefixCache) -> Tuple[int, int]:
    info = cache.size_info
    return info.evictable_size, info.protected_size


def matched(cache: RadixPrefixCache, ids: torch.Tensor) -> Tuple[int, List[int]]:
    handle = cache.match_prefix(ids).cuda_handle
    return handle.cached_len, handle.get_matched_indices().tolist()


# ---- match and insert ----------------------------------------------------------------------


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_an_empty_cache_matches_nothing(P):
    cache = RadixPrefixCache(CPU, page_size=P)
    assert matched(cache, seq(100, 3 * P)) == (0, []), "an empty cache has no prefix of anything"
    assert len(cache.evict(0)) == 0, "evicting 0 tokens frees nothing (and does not raise)"
    cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_insert_then_match_in_whole_pages(P):
    cache = RadixPrefixCache(CPU, page_size=P)
    tokens = seq(100, 2 * P + P - 1)  # two pages and (for P > 1) a partial third
    already, handle = cache.insert_prefix(tokens, slots(0, len(tokens)))
    assert (already, handle.cached_len) == (0, 2 * P), (
        f"inserting {len(tokens)} tokens into an empty cache with pages of {P}: expected "
        f"(already cached 0, handle.cached_len {2 * P}: the partial page is not kept), got ({already}, {handle.cached_len})"
    )
    assert sizes(cache) == (2 * P, 0), (
        f"{2 * P} new, unlocked tokens are evictable; sizes are {sizes(cache)}"
    )
    assert matched(cache, tokens) == (2 * P, slots(0, 2 * P).tolist())
    if P > 1:
        assert matched(cache, tokens[: P - 1]) == (0, []), "less than a page matches nothing"
    cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_a_match_that_ends_inside_an_edge_splits_it(P):
    cache = RadixPrefixCache(CPU, page_size=P)
    tokens = seq(100, 3 * P)
    cache.insert_prefix(tokens, slots(0, 3 * P))  # one edge of 3 pages
    query = torch.cat([tokens[: P + P // 2], seq(900, 2)])  # leaves the edge inside page 2
    length, indices = matched(cache, query)
    assert length == P, (
        f"the query shares {P + P // 2} tokens, so {P} in whole pages; got cached_len {length}"
    )
    assert indices == slots(0, P).tolist(), (
        f"the handle must end exactly after {P} tokens (split the edge there), so get_matched_indices "
        f"gives {P} slots; got {len(indices)}"
    )
    assert sizes(cache) == (3 * P, 0), (
        "matching never changes what is cached, only how the edges are cut"
    )
    assert matched(cache, tokens) == (3 * P, slots(0, 3 * P).tolist()), (
        "after the split the whole prompt still matches"
    )
    cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_insert_reports_what_was_cached_already(P):
    cache = RadixPrefixCache(CPU, page_size=P)
    first = seq(100, 3 * P)
    cache.insert_prefix(first, slots(0, 3 * P))
    second = torch.cat([first[: 2 * P], seq(500, P)])  # shares two pages, then differs
    already, handle = cache.insert_prefix(second, slots(1000, 3 * P))
    assert already == 2 * P, (
        f"the first {2 * P} tokens were cached already: insert_prefix must report {2 * P} so the caller "
        f"frees its duplicate slots; got {already}"
    )
    assert handle.cached_len == 3 * P
    assert (
        handle.get_matched_indices().tolist()
        == slots(0, 2 * P).tolist() + slots(1000 + 2 * P, P).tolist()
    ), "the handle's slots are the cache's (older) copy of the shared part, then the new page"
    assert sizes(cache) == (4 * P, 0), f"3 pages + 1 new page = {4 * P} tokens, got {sizes(cache)}"
    cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_inserting_a_shorter_prefix_splits_and_changes_nothing_else(P):
    cache = RadixPrefixCache(CPU, page_size=P)
    tokens = seq(100, 3 * P)
    cache.insert_prefix(tokens, slots(0, 3 * P))
    already, handle = cache.insert_prefix(tokens[: 2 * P], slots(700, 2 * P))
    assert (already, handle.cached_len) == (2 * P, 2 * P), f"got ({already}, {handle.cached_len})"
    assert handle.get_matched_indices().tolist() == slots(0, 2 * P).tolist(), (
        "the cache keeps its own slots"
    )
    assert sizes(cache) == (3 * P, 0), f"nothing new was cached, got sizes {sizes(cache)}"
    cache.lock_handle(handle)
    assert sizes(cache) == (P, 2 * P), (
        f"locking the handle of the first {2 * P} tokens protects exactly those (the edge must be split "
        f"where the insert ended); got sizes {sizes(cache)}"
    )
    cache.lock_handle(handle, unlock=True)
    cache.check_integrity()


# ---- lock and unlock ----------------------------------------------------------------------------


def path_of_three(P: int) -> Tuple[RadixPrefixCache, torch.Tensor]:
    """A path root -> P -> 2P -> 3P tokens: three nodes of one page each."""
    cache = RadixPrefixCache(CPU, page_size=P)
    tokens = seq(100, 3 * P)
    for k in (1, 2, 3):
        cache.insert_prefix(tokens[: k * P], slots(0, k * P))
    return cache, tokens


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_a_lock_protects_the_whole_path_to_the_root(P):
    cache, tokens = path_of_three(P)
    deep = cache.match_prefix(tokens).cuda_handle
    cache.lock_handle(deep)
    assert sizes(cache) == (0, 3 * P), (
        f"a request using 3 pages needs all of them: locking must walk from the handle's node up to the "
        f"root; sizes (evictable, protected) are {sizes(cache)}, expected (0, {3 * P})"
    )
    cache.check_integrity()
    cache.lock_handle(deep, unlock=True)
    assert sizes(cache) == (3 * P, 0)
    cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_locks_are_reference_counts(P):
    cache, tokens = path_of_three(P)
    deep = cache.match_prefix(tokens).cuda_handle
    short = cache.match_prefix(tokens[:P]).cuda_handle
    cache.lock_handle(deep)
    cache.lock_handle(short)  # a second user of the first page
    cache.lock_handle(deep, unlock=True)
    assert sizes(cache) == (2 * P, P), (
        f"the first page still has a user: only the two pages below it become evictable; got {sizes(cache)}"
    )
    cache.lock_handle(deep)
    cache.lock_handle(deep)
    cache.lock_handle(deep, unlock=True)
    assert sizes(cache) == (0, 3 * P), "locked twice, unlocked once: still protected"
    cache.lock_handle(deep, unlock=True)
    cache.lock_handle(short, unlock=True)
    assert sizes(cache) == (3 * P, 0)
    cache.check_integrity()
    with pytest.raises(AssertionError, match="not locked"):
        cache.lock_handle(short, unlock=True)
    root = cache.match_prefix(seq(900, P)).cuda_handle  # matches nothing: the root's handle
    cache.lock_handle(root)
    cache.lock_handle(root, unlock=True)
    assert sizes(cache) == (3 * P, 0), "the root holds no tokens: locking it changes no size"


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_a_split_keeps_the_locks_of_the_path_through_it(P):
    cache = RadixPrefixCache(CPU, page_size=P)
    tokens = seq(100, 3 * P)
    _, handle = cache.insert_prefix(tokens, slots(0, 3 * P))
    cache.lock_handle(handle)  # a running request uses all three pages
    assert matched(cache, torch.cat([tokens[:P], seq(900, P)]))[0] == P  # splits the locked edge
    assert sizes(cache) == (0, 3 * P)
    try:
        cache.check_integrity()
    except RuntimeError as e:
        raise AssertionError(
            "after splitting a locked edge, the new upper node must carry the same ref_count "
            f"(every lock through the lower part passes through it): {e}"
        ) from None
    cache.lock_handle(handle, unlock=True)
    assert sizes(cache) == (3 * P, 0)
    cache.check_integrity()


# ---- eviction ------------------------------------------------------------------------------------


def three_leaves(P: int) -> Tuple[RadixPrefixCache, Dict[str, torch.Tensor]]:
    """A shared first page (slots 0..P-1) and leaves a, b, c (slots 100.., 200.., 300..),
    inserted in that order."""
    cache = RadixPrefixCache(CPU, page_size=P)
    shared = seq(100, P)
    paths = {name: torch.cat([shared, seq(1000 * (k + 1), P)]) for k, name in enumerate("abc")}
    for k, name in enumerate("abc"):
        cache.insert_prefix(paths[name], torch.cat([slots(0, P), slots(100 * (k + 1), P)]))
    return cache, paths


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_eviction_takes_the_least_recently_used_leaf_first(P):
    cache, _ = three_leaves(P)
    first = cache.evict(1)
    assert first.tolist() == slots(100, P).tolist(), (
        f"a, b, c were inserted in that order and none used since: evict(1) frees a whole leaf, a's "
        f"(slots 100..), got {first.tolist()}"
    )
    assert cache.evict(P).tolist() == slots(200, P).tolist(), "then b"
    assert sizes(cache) == (2 * P, 0)
    cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_a_match_counts_as_a_use(P):
    cache, paths = three_leaves(P)
    cache.match_prefix(paths["a"])  # a is now the most recently used
    assert cache.evict(1).tolist() == slots(200, P).tolist(), (
        "a was just matched (a request is about to reuse it): touch every node a match walks "
        "through, so b is now the least recently used"
    )


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_locked_leaves_stay_and_too_large_an_eviction_raises(P):
    cache, paths = three_leaves(P)
    hc = cache.match_prefix(paths["c"]).cuda_handle
    cache.lock_handle(hc)
    assert sizes(cache) == (2 * P, 2 * P)
    freed = cache.evict(2 * P)
    assert sorted(freed.tolist()) == slots(100, P).tolist() + slots(200, P).tolist(), (
        f"only a and b are unlocked; c and the shared page are in use. Freed {sorted(freed.tolist())}"
    )
    with pytest.raises(RuntimeError, match="evictable"):
        cache.evict(1)
    assert matched(cache, paths["c"])[0] == 2 * P, (
        "a failed eviction must leave the cache as it was"
    )
    cache.lock_handle(hc, unlock=True)
    cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_evicting_a_leaf_can_make_its_parent_evictable(P):
    cache, paths = three_leaves(P)
    freed = cache.evict(4 * P)  # every leaf, then the shared page once it became a leaf
    assert sorted(freed.tolist()) == sorted(
        torch.cat([slots(0, P), slots(100, P), slots(200, P), slots(300, P)]).tolist()
    ), (
        "once its last child is evicted, an unlocked parent is a leaf too and must become a "
        "candidate for the same eviction"
    )
    assert sizes(cache) == (0, 0)
    assert matched(cache, paths["a"]) == (0, [])
    cache.check_integrity()


# ---- many random operations against a brute-force model -------------------------------------------


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_random_operations_agree_with_a_brute_force_model(P):
    """Inserts, matches, locks, unlocks and evictions of sequences made of four page
    "words" (three differ only in their last token, so matches end inside pages and edges
    split) and a partial last page. The model keeps every cached page-aligned prefix and the
    slots of its last page; a match must give the longest cached prefix and its slots, an
    insert must report what was cached before it."""
    rng = random.Random(291 + P)
    words = [[1] * (P - 1) + [k] for k in (1, 2, 3)] + [[2] * P]
    cache = RadixPrefixCache(CPU, page_size=P)
    model: Dict[
        Tuple[int, ...], List[int]
    ] = {}  # cached prefix (whole pages) -> its last page's slots
    locked: List[Tuple[object, Tuple[int, ...]]] = []  # (handle, prefix it covers)
    next_slot = 0

    def longest(ids: List[int]) -> int:
        k = 0
        while k + P <= len(ids) and tuple(ids[: k + P]) in model:
            k += P
        return k

    def slots_of(ids: List[int], k: int) -> List[int]:
        return [s for j in range(P, k + 1, P) for s in model[tuple(ids[:j])]]

    for op in range(300):
        ids = [t for _ in range(rng.randint(0, 5)) for t in rng.choice(words)]
        ids += [rng.randint(1, 3) for _ in range(rng.randint(0, P - 1))]
        what = rng.choice(["insert", "insert", "match", "lock", "unlock", "evict"])
        where = f"operation {op} ({what} of {ids if len(ids) < 20 else f'{len(ids)} tokens'})"
        if what == "insert":
            new = list(range(next_slot, next_slot + len(ids)))
            next_slot += len(ids) + 1
            expect = longest(ids)
            already, handle = cache.insert_prefix(
                torch.tensor(ids, dtype=torch.int32), torch.tensor(new, dtype=torch.int32)
            )
            assert already == expect, (
                f"{where}: {expect} tokens were cached already, insert_prefix said {already}"
            )
            for j in range(P, len(ids) // P * P + 1, P):
                model.setdefault(tuple(ids[:j]), new[j - P : j])
            assert handle.cached_len == len(ids) // P * P, (
                f"{where}: handle.cached_len {handle.cached_len}"
            )
        elif what in ("match", "lock"):
            k = longest(ids)
            length, indices = matched(cache, torch.tensor(ids, dtype=torch.int32))
            assert (length, indices) == (k, slots_of(ids, k)), (
                f"{where}: the longest cached prefix has {k} tokens at {slots_of(ids, k)}, "
                f"match_prefix gave {length} at {indices}"
            )
            if what == "lock":
                handle = cache.match_prefix(torch.tensor(ids, dtype=torch.int32)).cuda_handle
                cache.lock_handle(handle)
                locked.append((handle, tuple(ids[:k])))
        elif what == "unlock" and locked:
            handle, _ = locked.pop(rng.randrange(len(locked)))
            cache.lock_handle(handle, unlock=True)
        elif what == "evict":
            evictable = cache.size_info.evictable_size
            size = rng.randint(0, evictable)
            freed = set(cache.evict(size).tolist())
            assert len(freed) >= size, f"{where}: evict({size}) freed only {len(freed)} tokens"
            gone = [prefix for prefix, page in model.items() if set(page) <= freed]
            for prefix in gone:
                assert not any(held[: len(prefix)] == prefix for _, held in locked), (
                    f"{where}: evicted a page of {list(prefix)}, which a locked handle still uses"
                )
                del model[prefix]
        protected = {
            prefix
            for _, held in locked
            for prefix in (held[:j] for j in range(P, len(held) + 1, P))
        }
        assert sizes(cache) == ((len(model) - len(protected)) * P, len(protected) * P), (
            f"after {where}: the model has {len(model)} cached pages, {len(protected)} of them locked; "
            f"the cache says (evictable, protected) = {sizes(cache)}"
        )
        cache.check_integrity()
