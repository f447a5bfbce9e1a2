"""Chapter 4: the KV pool, the page table rows and the naive prefix cache."""

import pytest
import torch

from minisgl.kvcache import MHAKVCache, create_prefix_cache
from minisgl.scheduler.table import TableManager


def make_pool(page_size=4, num_pages=8):
    return MHAKVCache(
        num_kv_heads=2,
        num_layers=3,
        head_dim=8,
        num_pages=num_pages,
        page_size=page_size,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )


def test_pool_layout_is_documented_shape():
    pool = make_pool(page_size=4, num_pages=8)
    assert tuple(pool.k_cache(0).shape) == (8, 4, 2, 8)  # [pages, P, H_kv, D]
    assert tuple(pool.k_slots(2).shape) == (32, 2, 8)  # [pages * P, H_kv, D]
    assert pool.num_layers == 3 and pool.dtype == torch.float32 and pool.num_slots == 32


def test_store_kv_writes_only_the_given_slots_of_one_layer():
    pool = make_pool()
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    slots = torch.tensor([13, 2, 30])
    pool.store_kv(k, v, slots, layer_id=1)
    assert torch.equal(pool.k_slots(1)[slots], k) and torch.equal(pool.v_slots(1)[slots], v)
    assert pool.k_slots(0).abs().sum() == 0 and pool.k_slots(2).abs().sum() == 0
    # slot 13 is offset 1 of page 3 when P = 4
    assert torch.equal(pool.k_cache(1)[3, 1], k[0])


def test_table_rows_are_handed_out_and_returned():
    tables = TableManager(3, torch.zeros((4, 16), dtype=torch.int32))
    rows = [tables.allocate() for _ in range(3)]
    assert sorted(rows) == [0, 1, 2] and tables.available_size == 0
    with pytest.raises(RuntimeError, match="no free row"):
        tables.allocate()
    tables.free(rows[1])
    assert tables.available_size == 1
    with pytest.raises(ValueError, match="not an allocated row"):
        tables.free(rows[1])  # double free
    with pytest.raises(ValueError):
        tables.free(3)  # the dummy row is never handed out


def test_token_pool_mirrors_the_page_table():
    page_table = torch.zeros((5, 32), dtype=torch.int32)
    tables = TableManager(4, page_table)
    assert tables.token_pool.shape == page_table.shape and tables.token_pool.dtype == torch.int32
    assert tables.page_table is page_table


def test_naive_cache_caches_nothing():
    cache = create_prefix_cache(torch.device("cpu"), "naive")
    handle = cache.match_prefix(torch.tensor([1, 2, 3])).cuda_handle
    assert handle.cached_len == 0 and len(handle.get_matched_indices()) == 0
    already, new = cache.insert_prefix(torch.tensor([1, 2, 3]), torch.tensor([7, 8, 9]))
    assert already == 0 and new.cached_len == 0
    assert cache.size_info.total_size == 0
    assert len(cache.evict(0)) == 0
    with pytest.raises(RuntimeError):
        cache.evict(1)


def test_unknown_prefix_cache_is_refused():
    with pytest.raises(ValueError, match="unknown prefix cache 'lru'"):
        create_prefix_cache(torch.device("cpu"), "lru")
