"""Chapter 9: the radix prefix cache: page-aligned match and insert, locks by reference
count, LRU eviction of unreferenced leaves, and the manager around it. Page sizes 1, 4, 16."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from minisgl.core import SamplingParams
from minisgl.env import ENV  # +ch11
from minisgl.kvcache.radix_cache import RadixPrefixCache
from minisgl.llm import LLM
from minisgl.message import UserMsg
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import PrefillManager
from minisgl.scheduler.table import TableManager
from tests import test_ch07_scheduler as ch07
from tests import test_ch07_trace as ch07_trace
from tests.helpers import DEVICE, hf_greedy
from tests.scheduler_harness import (
    FakeEngineScheduler,
    check_workload,
    fake_reference,
    run_script,
    user,
    workloads,
)

PAGE_SIZES = [1, 4, 16]
CPU = torch.device("cpu")


def ids(*values):
    return torch.tensor(values, dtype=torch.int32)


def seq(start, n):
    """``n`` token ids from ``start``: distinct first pages for distinct starts."""
    return torch.arange(start, start + n, dtype=torch.int32)


def slots(first, n):
    return torch.arange(first, first + n, dtype=torch.int32)


def sizes(cache):
    info = cache.size_info
    return info.evictable_size, info.protected_size


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_match_and_insert_work_in_whole_pages(P):
    cache = RadixPrefixCache(CPU, page_size=P)
    tokens = seq(100, 2 * P + P // 2)  # two pages and half a page
    already, handle = cache.insert_prefix(tokens, slots(0, len(tokens)))
    assert already == 0 and handle.cached_len == 2 * P  # the partial page is not cached
    assert sizes(cache) == (2 * P, 0)
    query = torch.cat([tokens[: P + P // 2], seq(900, 3)])  # diverges inside page 2
    match = cache.match_prefix(query).cuda_handle
    assert match.cached_len == P
    assert torch.equal(match.get_matched_indices(), slots(0, P))
    assert sizes(cache) == (2 * P, 0)  # matching changes no sizes (it may split a node)
    cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_insert_reports_what_was_cached_already(P):
    cache = RadixPrefixCache(CPU, page_size=P)
    first = seq(100, 3 * P)
    cache.insert_prefix(first, slots(0, 3 * P))
    second = torch.cat([first[: 2 * P], seq(500, P)])  # shares two pages, then differs
    already, handle = cache.insert_prefix(second, slots(1000, 3 * P))
    assert already == 2 * P  # the caller frees its own copy of those two pages
    assert torch.equal(
        handle.get_matched_indices(), torch.cat([slots(0, 2 * P), slots(1000 + 2 * P, P)])
    )
    assert sizes(cache) == (4 * P, 0)
    assert cache.match_prefix(first).cuda_handle.cached_len == 3 * P
    cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_locks_count_references_and_protect_the_whole_path(P):
    cache = RadixPrefixCache(CPU, page_size=P)
    a = seq(100, 3 * P)
    cache.insert_prefix(a, slots(0, 3 * P))
    b = torch.cat([a[:P], seq(700, P)])
    cache.insert_prefix(b, slots(500, 2 * P))  # splits a's edge after one page
    ha = cache.match_prefix(a).cuda_handle
    hb = cache.match_prefix(b).cuda_handle
    cache.lock_handle(ha)
    assert sizes(cache) == (P, 3 * P)  # a's path is protected, b's own page is not
    cache.lock_handle(hb)
    assert sizes(cache) == (0, 4 * P)
    cache.lock_handle(ha)  # a second user of a's path
    cache.lock_handle(ha, unlock=True)
    assert sizes(cache) == (0, 4 * P)
    cache.lock_handle(ha, unlock=True)
    assert sizes(cache) == (2 * P, 2 * P)  # the shared first page is still b's
    cache.lock_handle(hb, unlock=True)
    assert sizes(cache) == (4 * P, 0)
    cache.check_integrity()
    with pytest.raises(AssertionError, match="not locked"):
        cache.lock_handle(hb, unlock=True)


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_eviction_takes_unreferenced_leaves_least_recently_used_first(P):
    cache = RadixPrefixCache(CPU, page_size=P)
    shared = seq(100, P)
    paths = {name: torch.cat([shared, seq(1000 * (k + 1), P)]) for k, name in enumerate("abc")}
    for k, name in enumerate("abc"):
        cache.insert_prefix(paths[name], torch.cat([slots(0, P), slots(100 * (k + 1), P)]))
    cache.match_prefix(paths["a"])  # a is now the most recently used
    hc = cache.match_prefix(paths["c"]).cuda_handle
    cache.lock_handle(hc)  # c is in use: never evicted
    assert sizes(cache) == (2 * P, 2 * P)
    assert torch.equal(cache.evict(1), slots(200, P))  # b: the least recently used leaf
    assert torch.equal(cache.evict(P), slots(100, P))  # then a; the shared page stays (c holds it)
    with pytest.raises(RuntimeError, match="evictable"):
        cache.evict(1)
    cache.lock_handle(hc, unlock=True)
    freed = cache.evict(2 * P)  # c's leaf, then the shared page once it became a leaf
    assert sorted(freed.tolist()) == sorted(torch.cat([slots(0, P), slots(300, P)]).tolist())
    assert sizes(cache) == (0, 0)
    cache.check_integrity()


@pytest.mark.parametrize("P", PAGE_SIZES)
def test_the_manager_matches_all_but_the_last_token(P):
    page_table = torch.zeros((3, 64), dtype=torch.int32)
    manager = CacheManager(num_pages=64 // P, page_size=P, page_table=page_table, type="radix")
    prompt = seq(100, 2 * P)
    manager.prefix_cache.insert_prefix(prompt, slots(0, 2 * P))
    pending = PrefillManager(manager, TableManager(2, page_table), DecodeManager(P))
    pending.add_one_req(UserMsg(0, prompt, SamplingParams(max_tokens=1)))
    # the whole prompt is cached, but prefill must still compute the last token's logits
    assert manager.match_req(pending.pending_list[0]).cuda_handle.cached_len == (2 * P - 1) // P * P


@pytest.mark.parametrize("P", [1, 4])
def test_a_running_request_reads_the_cache_copy_of_a_prefix_another_inserted_first(P):
    """Two requests with the same prompt prefill together, so neither finds the other in
    the cache; the second to insert frees its own copy of the prompt. Its page-table row
    must then point at the first one's copy, or its later steps read pages that a third
    request is given (engine fix in ``CacheManager.cache_req``). The fake engine checks,
    at every forward pass, that each row reads back the KV its request wrote."""
    shared = list(range(100, 100 + 5 * P))
    s = FakeEngineScheduler(num_pages=-(-(2 * 5 * P + 8) // P) + 2, page_size=P, cache_type="radix")
    script = {
        0: [user(0, shared, 8), user(1, shared, 8)],
        2: [user(2, list(range(300, 300 + 4 * P)), 1)],
    }
    run_script(s, script, overlap=False)
    assert s.outputs() == {
        0: fake_reference(shared, 8, True),
        1: fake_reference(shared, 8, True),
        2: fake_reference(range(300, 300 + 4 * P), 1, True),
    }


def test_two_identical_prompts_in_one_batch_match_hf_when_the_pool_is_reused(qwen3_path):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # +ch11
    llm = LLM(
        str(qwen3_path),
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=64,
        max_seq_len_override=128,
        cache_type="radix",
        max_extend_tokens=40,
    )
    shared, other = list(range(100, 120)), list(range(300, 320))
    # the third prompt arrives a step later and is given the pages the second one freed
    out = llm.generate(
        [shared, shared, other], [SamplingParams(max_tokens=n, ignore_eos=True) for n in (8, 8, 1)]
    )
    ref = hf_greedy(qwen3_path, [shared, other], 8)
    assert [o["token_ids"] for o in out] == [ref[0], ref[0], ref[1][:1]]
    llm.shutdown()


def test_a_second_round_reuses_the_shared_prefix_and_still_matches_hf(qwen3_path):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # +ch11
    llm = LLM(
        str(qwen3_path),
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=64,
        page_size=4,
        max_seq_len_override=128,
        cache_type="radix",
    )
    extend = []
    original = llm._forward

    def traced(forward_input):
        if forward_input.batch.is_prefill:
            extend.append([r.extend_len for r in forward_input.batch.reqs])
        return original(forward_input)

    llm._forward = traced
    system = list(range(1000, 1030))  # 30 tokens: 7 whole pages of 4
    prompts = [system + [7, 8, 9], system + [10, 11]]
    for _ in range(2):
        out = llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
        assert [o["token_ids"] for o in out] == hf_greedy(qwen3_path, prompts, 4)
    # round two: prompt 0's 8 pages are cached, but its last token must be computed;
    # prompt 1 matches all but its last token, 31 tokens, so 7 whole pages
    assert extend == [[33, 32], [1, 4]]
    llm.cache_manager.check_integrity()
    llm.shutdown()


@settings(
    max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(workloads(cache_types=["radix"]))
def test_random_workloads_with_shared_prefixes_keep_every_page_accounted_for(w):
    """As in chapter 8, now with the radix cache: requests share prefixes, pages move
    between requests and the tree, and eviction makes room in a tiny pool. After every
    step each node's ref_count equals its live users and free + cached + owned pages add
    up; at the end nothing is locked, every page is free or cached, every row is free."""
    check_workload(w)


def test_two_identical_prompts_in_one_batch_read_the_cached_copy(qwen3_path):
    """Regression: the second identical prompt of a batch frees its duplicate KV when it is
    cached; its row must then point at the cache's copy, or it decodes from pages that the
    third request is given."""
    llm = ch07.build_llm(
        qwen3_path,
        cache_type="radix",
        max_running_req=4,
        num_page_override=64,
        max_seq_len_override=128,
        max_extend_tokens=40,
    )
    shared, other = list(range(100, 120)), list(range(300, 320))
    out = llm.generate([shared, shared, other], [ch07.greedy(n) for n in (8, 8, 1)])
    ref = hf_greedy(qwen3_path, [shared, other], 8)
    assert [o["token_ids"] for o in out] == [ref[0], ref[0], ref[1][:1]]
    llm.shutdown()


def test_radix_trace_records_locks_and_evictions(qwen3_path):
    # 48 pages: the second round's prompts do not fit beside the first round's cached KV
    llm = ch07_trace.build_llm(qwen3_path, cache_type="radix", num_page_override=48)
    shared = "Here is a list of the planets of the solar system, in order:"
    rec, outputs, _ = ch07_trace.record(llm, [shared + " Mercury", shared + " Venus"], [3, 3])
    llm.generate(
        ["Once upon a time, in a land far away, there lived a king with three daughters"] * 2,
        SamplingParams(max_tokens=4, ignore_eos=True),
    )
    doc = rec.document()
    llm.shutdown()
    ch07_trace.validate(doc)
    first = doc["steps"][0]
    assert first["kind"] == "prefill" and first["radix"] is not None
    nodes = first["radix"]["nodes"]
    # after the first prefill both prompts are in the tree: a shared edge locked twice, split
    # into two locked leaves (each prompt minus the last token it must compute)
    shared_node = next(n for n in nodes if n["parent"] == first["radix"]["root"])
    assert shared_node["ref_count"] == 2
    assert sorted(n["ref_count"] for n in nodes if n["parent"] == shared_node["id"]) == [1, 1]
    assert first["radix"]["protected_tokens"] == sum(n["length"] for n in nodes)
    evicted = [p for s in doc["steps"] for p in s["evicted"]]
    assert evicted, "the second round must evict the first round's prefixes"
    before = next(i for i, s in enumerate(doc["steps"]) if s["evicted"]) - 1
    cached = {p for n in doc["steps"][before]["radix"]["nodes"] for p in n["pages"]}
    assert set(evicted) <= cached
    for step in doc["steps"]:  # ids are unique, and every parent is in the same tree
        ids = [n["id"] for n in step["radix"]["nodes"]]
        assert len(set(ids)) == len(ids)
        assert {n["parent"] for n in step["radix"]["nodes"]} <= {*ids, step["radix"]["root"]}
    last = doc["steps"][-1]["radix"]
    assert all(n["ref_count"] == 0 for n in last["nodes"])  # nothing runs any more
