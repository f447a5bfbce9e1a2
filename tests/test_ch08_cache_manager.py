"""Chapter 8: the CacheManager: KV pages in and out of the pool, and admission that keeps
room for every request it lets in. Mostly without a model; page sizes 1, 4 and 16."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from minisgl.core import SamplingParams
from minisgl.env import ENV  # +ch11
from minisgl.llm import LLM
from minisgl.message import UserMsg
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import PrefillManager
from minisgl.scheduler.table import TableManager
from tests.helpers import DEVICE, hf_greedy
from tests.scheduler_harness import check_workload, workloads

PAGE_SIZES = [1, 4, 16]


def managers(num_pages, page_size, rows=4, max_seq_len=256):
    page_table = torch.zeros((rows + 1, max_seq_len), dtype=torch.int32)
    table = TableManager(rows, page_table)
    cache = CacheManager(num_pages, page_size, page_table, "naive")
    decode = DecodeManager(page_size)
    return PrefillManager(cache, table, decode), cache, table, decode


def user(uid, prompt_len, max_tokens):
    return UserMsg(
        uid,
        torch.arange(1, prompt_len + 1, dtype=torch.int32),
        SamplingParams(max_tokens=max_tokens),
    )


def step(cache, decode, reqs):
    """What the scheduler does around a forward pass, minus the model."""
    cache.allocate_paged(reqs)
    for req in reqs:
        req.complete_one()
    decode.filter_reqs(reqs)


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_allocate_paged_takes_whole_pages_and_fills_the_row(P):
    prefill, cache, _, decode = managers(num_pages=8, page_size=P)
    prefill.add_one_req(user(0, 5, 2 * P))
    req = prefill.schedule_next_batch(1000).reqs[0]
    step(cache, decode, [req])
    assert cache.num_free_pages == 8 - -(-5 // P)  # ceil(5 / P) pages for the prompt
    row = cache.page_table[req.table_idx, :5]
    assert (row % P == torch.arange(5) % P).all()  # token p sits at offset p % P of its page
    assert len(set((row // P).tolist())) == -(-5 // P)
    free_before = cache.num_free_pages
    new_pages = []
    for _ in range(2 * P - 1):  # decode: a new page exactly when a position starts one
        position = req.device_len - 1
        step(cache, decode, [req])
        new_pages.append(free_before - cache.num_free_pages)
        assert cache.page_table[req.table_idx, position] % P == position % P
    starts = [p for p in range(5, 5 + 2 * P - 1) if p % P == 0]
    assert new_pages[-1] == len(starts)


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_a_finished_request_gives_every_page_back(P):
    num_pages = 32 // P
    prefill, cache, table, decode = managers(num_pages=num_pages, page_size=P)
    prefill.add_one_req(user(0, 7, 3))
    req = prefill.schedule_next_batch(1000).reqs[0]
    for _ in range(3):
        step(cache, decode, [req])
    with cache.lazy_free_region():
        cache.cache_req(req, finished=True)  # the naive cache keeps nothing
        assert cache.num_free_pages < num_pages  # a lazy free waits for the end of the region
    table.free(req.table_idx)
    assert cache.num_free_pages == num_pages
    cache.check_integrity()


def test_check_integrity_catches_a_leak_a_double_free_and_a_misaligned_slot():
    _, cache, _, _ = managers(num_pages=6, page_size=4)
    cache.check_integrity()
    pages = cache.free_slots.clone()
    cache.free_slots = pages[1:]
    with pytest.raises(RuntimeError, match="leaked"):
        cache.check_integrity()
    cache.free_slots = torch.cat([pages[1:], pages[1:2]])
    with pytest.raises(RuntimeError, match="twice"):
        cache.check_integrity()
    cache.free_slots = torch.cat([pages[1:], pages[:1] + 1])
    with pytest.raises(RuntimeError, match="start of a page"):
        cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_admission_keeps_room_for_the_decoding_requests(P):
    prefill, cache, _, decode = managers(num_pages=64 // P * 2, page_size=P)  # 128 tokens
    prefill.add_one_req(user(0, 10, 20))
    step(cache, decode, prefill.schedule_next_batch(1000).reqs)
    # uid0 may still write 19 tokens, plus up to P - 1 of a page it starts but cannot fill
    assert decode.inflight_tokens == 19 + P - 1
    free = cache.available_size
    fits = free - decode.inflight_tokens - 20
    prefill.add_one_req(user(1, fits + 1, 20))  # one token too many
    assert prefill.schedule_next_batch(1000) is None
    prefill.pending_list.clear()
    prefill.add_one_req(user(2, fits, 20))
    assert [r.uid for r in prefill.schedule_next_batch(1000).reqs] == [2]


@pytest.mark.parametrize("P", [4, 16])
def test_requests_admitted_together_fit_in_whole_pages(P):
    """Four one-token prompts with max_tokens 1 need 2 tokens each, 8 in all, but a page
    each: a pool of two pages takes two of them, not four (each admitted request also
    reserves P - 1 tokens of slack)."""
    prefill, cache, _, decode = managers(num_pages=2, page_size=P)
    for uid in range(4):
        prefill.add_one_req(user(uid, 1, 1))
    batch = prefill.schedule_next_batch(1000)
    assert [r.uid for r in batch.reqs] == [0, 1]
    cache.allocate_paged(batch.reqs)  # four admitted would need four pages: it would raise
    assert cache.num_free_pages == 0


def test_a_two_page_pool_serves_its_requests_one_at_a_time(qwen3_path):
    """Each request reserves 2 + 2 + 3 = 7 of the 8 slots (prompt, max_tokens, page slack),
    so the four run one after another, and still give Hugging Face's tokens."""
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # +ch11
    llm = LLM(
        str(qwen3_path),
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=2,
        page_size=4,
        max_seq_len_override=64,
        cache_type="naive",  # +ch09
    )
    prompts = [[5, 6], [7, 8], [9, 10], [11, 12]]
    out = llm.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True))
    assert [o["token_ids"] for o in out] == hf_greedy(qwen3_path, prompts, 2)
    llm.cache_manager.check_integrity()
    llm.shutdown()


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(workloads(cache_types=["naive"]))
def test_random_workloads_keep_every_page_accounted_for(w):
    """Random arrivals, lengths, aborts and a tiny pool, the scheduler's own loop around a
    fake model: after every step free + owned pages add up (``check_resources``), at the
    end every page is free and every row too, and every request finishes (FCFS)."""
    check_workload(w)
