"""Exercise 191: PrefillAdder admission control, and the first-come-first-served queue.

Everything runs on the real CacheManager / TableManager / DecodeManager with a few dozen
KV slots, on ``MINISGL_DEVICE`` (the CPU by default). Sizes are in tokens; page size 1
unless a test says otherwise.
"""

from __future__ import annotations

import os
import random

import torch

from minisgl.core import SamplingParams
from minisgl.message import UserMsg
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import PrefillAdder, PrefillManager
from minisgl.scheduler.table import TableManager
from minisgl.scheduler.utils import PendingReq

DEVICE = torch.device(os.environ.get("MINISGL_DEVICE") or "cpu")
ROWS, MAX_LEN = 4, 64


class Setup:
    """A KV cache of ``num_pages`` one-token pages and a request table of ``rows`` rows."""

    def __init__(self, num_pages: int = 32, rows: int = ROWS, page_size: int = 1) -> None:
        self.page_table = torch.zeros(rows + 1, MAX_LEN, dtype=torch.int32, device=DEVICE)
        self.cache = CacheManager(
            num_pages=num_pages, page_size=page_size, page_table=self.page_table, type="naive"
        )
        self.table = TableManager(rows, self.page_table)
        self.rows = rows

    def adder(self, token_budget: int = 1000, reserved_size: int = 0) -> PrefillAdder:
        return PrefillAdder(
            token_budget=token_budget,
            reserved_size=reserved_size,
            cache_manager=self.cache,
            table_manager=self.table,
        )


def pending(uid: int, prompt_len: int, max_tokens: int, start: int = 100) -> PendingReq:
    ids = torch.arange(start, start + prompt_len, dtype=torch.int32)
    return PendingReq(uid, ids, SamplingParams(max_tokens=max_tokens))


# ---- PrefillAdder: admission -------------------------------------------------------------


def test_admits_a_request_that_fits():
    s = Setup()
    adder = s.adder(token_budget=100, reserved_size=3)
    req = adder.try_add_one(pending(7, 10, 5))
    assert req is not None, (
        "a 10-token prompt with max_tokens=5 fits in 32 free KV tokens but was refused"
    )
    assert type(req).__name__ == "Req", f"the adder returns a Req, got {type(req).__name__}"
    assert (req.uid, req.cached_len, req.device_len, req.output_len) == (7, 0, 10, 5), req
    assert s.table.available_size == ROWS - 1, "admission must take one row of the request table"
    assert adder.token_budget == 90, (
        f"the budget drops by the 10 prompt tokens, got {adder.token_budget}"
    )
    assert adder.reserved_size == 3 + 10 + 5, (
        f"reserved_size must grow by prompt + max_tokens (3 -> 18), got {adder.reserved_size}"
    )


def test_writes_the_prompt_into_the_token_pool():
    s = Setup()
    req = s.adder().try_add_one(pending(0, 6, 2, start=500))
    row = s.table.token_pool[req.table_idx, :6].cpu()
    assert row.tolist() == list(range(500, 506)), (
        f"token_pool[{req.table_idx}, :6] = {row.tolist()}"
    )


def test_refuses_a_request_past_the_kv_limit():
    s = Setup(num_pages=32)
    req = s.adder().try_add_one(pending(0, 20, 13))
    assert req is None, (
        "admitted a request that needs 20 + 13 = 33 KV tokens with only 32 available: "
        "the estimate is prompt + max_tokens (+ reserved_size) against "
        "cache_manager.available_size"
    )
    assert s.table.available_size == ROWS, "a refused request must not keep a table row"


def test_admits_a_request_that_exactly_fills_the_cache():
    s = Setup(num_pages=32)
    assert s.adder().try_add_one(pending(0, 20, 12)) is not None, (
        "20 + 12 = 32 KV tokens fit in 32 (use >, not >=)"
    )


def test_counts_the_decode_reservation():
    s = Setup(num_pages=32)
    req = s.adder(reserved_size=10).try_add_one(pending(0, 15, 10))
    assert req is None, (
        "admitted 25 KV tokens with 32 available but 10 already reserved for running "
        "decodes: compare needed + reserved_size with available_size"
    )


def test_reservations_add_up_within_one_step():
    s = Setup(num_pages=32)
    adder = s.adder()
    assert adder.try_add_one(pending(0, 10, 10)) is not None
    second = adder.try_add_one(pending(1, 8, 7))
    assert second is None, (
        "the first request reserved 20 of 32 KV tokens, the second needs 15: "
        "pages are only allocated later, so each admission must add to reserved_size"
    )


def test_each_admission_reserves_a_page_of_slack():
    # pages of 4 tokens, 2 pages: each one-token request with max_tokens=1 needs 2 KV tokens
    # but occupies a whole page, so only two of them can run at once
    s = Setup(num_pages=2, page_size=4)
    adder = s.adder()
    first = adder.try_add_one(pending(0, 1, 1))
    assert first is not None
    assert adder.reserved_size == 1 + 1 + 3, (
        f"reserved_size must grow by prompt 1 + max_tokens 1 + (page_size - 1) = 5, got {adder.reserved_size}"
    )
    assert adder.try_add_one(pending(1, 1, 1)) is not None, (
        "a second request fits in the second page"
    )
    third = adder.try_add_one(pending(2, 1, 1))
    assert third is None, (
        "admitted a third request into a pool of 2 pages: each request takes a whole page "
        "of 4 slots, but only 2 + 2 + 2 = 6 of 8 tokens were counted; reserve page_size - 1 "
        "more per admitted request"
    )
    s.cache.allocate_paged(
        [first]
    )  # pages are allocated after scheduling: both must still be there


def test_refuses_when_no_table_row_is_free():
    s = Setup(rows=2)
    adder = s.adder()
    assert adder.try_add_one(pending(0, 2, 1)) and adder.try_add_one(pending(1, 2, 1))
    assert adder.try_add_one(pending(2, 2, 1)) is None, (
        "both rows are taken: the third request must wait"
    )


def test_refuses_when_the_token_budget_is_spent():
    s = Setup()
    assert s.adder(token_budget=0).try_add_one(pending(0, 4, 1)) is None
    assert s.table.available_size == ROWS


# ---- PrefillManager: the queue ----------------------------------------------------------------


def manager(s: Setup, decoding=()) -> PrefillManager:
    dm = DecodeManager(page_size=1)
    dm.filter_reqs(decoding)
    return PrefillManager(cache_manager=s.cache, table_manager=s.table, decode_manager=dm)


def enqueue(pm: PrefillManager, uid: int, prompt_len: int, max_tokens: int) -> None:
    ids = torch.arange(100, 100 + prompt_len, dtype=torch.int32)
    pm.add_one_req(
        UserMsg(uid=uid, input_ids=ids, sampling_params=SamplingParams(max_tokens=max_tokens))
    )


def test_queue_stops_at_the_first_request_that_does_not_fit():
    s = Setup(num_pages=32)
    pm = manager(s)
    enqueue(pm, 0, 10, 5)  # 15
    enqueue(pm, 1, 20, 10)  # 30: does not fit beside the first
    enqueue(pm, 2, 2, 1)  # 3: would fit, but must not overtake request 1
    batch = pm.schedule_next_batch(prefill_budget=100)
    uids = [r.uid for r in batch.reqs]
    assert uids == [0], (
        f"admitted {uids}: first come, first served stops at request 1, which does not "
        "fit; skipping it lets small requests overtake a large one forever"
    )
    assert [p.uid for p in pm.pending_list] == [1, 2]


def test_queue_admits_in_arrival_order():
    s = Setup(num_pages=64)
    pm = manager(s)
    for uid in (3, 1, 2):
        enqueue(pm, uid, 4, 2)
    batch = pm.schedule_next_batch(prefill_budget=100)
    assert batch.is_prefill and [r.uid for r in batch.reqs] == [3, 1, 2]
    assert pm.pending_list == [] and not pm.runnable


def test_queue_keeps_the_decode_reservation():
    s = Setup(num_pages=32)
    running = s.adder().try_add_one(
        pending(9, 4, 21)
    )  # will still need 21 KV tokens while decoding
    running.complete_one()
    pm = manager(s, [running])
    enqueue(pm, 0, 10, 5)  # 15 more: 21 + 15 > 32
    assert pm.schedule_next_batch(prefill_budget=100) is None, (
        "the running request may still take 21 KV tokens (decode_manager.inflight_tokens); "
        "admitting 15 more could run out of KV mid-decode"
    )
    assert [p.uid for p in pm.pending_list] == [0]


def test_queue_returns_none_when_nothing_fits():
    s = Setup(num_pages=8)
    pm = manager(s)
    enqueue(pm, 0, 10, 5)
    assert pm.schedule_next_batch(prefill_budget=100) is None
    assert [p.uid for p in pm.pending_list] == [0] and s.table.available_size == ROWS


def test_admit_then_release_leaves_no_leak():
    s = Setup(num_pages=32)
    pm = manager(s)
    enqueue(pm, 0, 6, 2)
    batch = pm.schedule_next_batch(prefill_budget=100)
    (req,) = batch.reqs
    s.cache.allocate_paged([req])
    req.complete_one()
    s.cache.cache_req(req, finished=True)
    s.table.free(req.table_idx)
    s.cache.check_integrity()
    assert s.cache.available_size == 32 and s.table.available_size == ROWS


def test_drawn_workloads_admit_first_come_first_served_within_the_cache(drawn_seed):
    """Workloads drawn at random (each judged run draws new ones): page size, cache, rows,
    prompts, budgets. Each step admits a prefix of the queue whose
    whole future fits the free KV, and once every request is released nothing is held."""
    rng = random.Random(drawn_seed)
    for _ in range(6):
        page = rng.choice([1, 2, 4])
        num_pages = rng.randint(48, 95) // page
        s = Setup(num_pages=num_pages, rows=rng.randint(1, ROWS), page_size=page)
        pm = manager(s)
        lengths = {}
        for uid in range(rng.randint(3, 9)):
            prompt, out = rng.randint(1, 39), rng.randint(1, 19)
            enqueue(pm, uid, prompt, out)
            lengths[uid] = (prompt, out)
        while pm.pending_list:
            queue = [p.uid for p in pm.pending_list]
            budget = rng.randint(1, 63)
            free = s.cache.available_size
            batch = pm.schedule_next_batch(prefill_budget=budget)
            if batch is None:
                head = lengths[queue[0]]
                assert sum(head) + page - 1 > free or budget <= 0, (
                    f"nothing admitted, but request {queue[0]} {head} fits {free} free tokens"
                )
                break
            uids = [r.uid for r in batch.reqs]
            assert uids == queue[: len(uids)], f"admitted {uids} out of the queue {queue}"
            needed = sum(sum(lengths[u]) for u in uids) + (page - 1) * (len(uids) - 1)
            assert needed <= free, f"admitted {uids} needing {needed} KV tokens of {free}"
            prompts = [lengths[u][0] for u in uids]
            assert sum(prompts[:-1]) < budget, f"prompts {prompts} past the budget {budget}"
            s.cache.allocate_paged(batch.reqs)
            for req in batch.reqs:  # each finishes at once: its slots and row come back
                req.complete_one()
                s.cache.cache_req(req, finished=True)
                s.table.free(req.table_idx)
        s.cache.check_integrity()
        assert s.cache.available_size == num_pages * page and s.table.available_size == s.rows
