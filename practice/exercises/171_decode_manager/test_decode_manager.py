"""Exercise 171: DecodeManager, driven with real Req objects on the CPU."""

from __future__ import annotations

import random

import torch

from minisgl.core import Req, SamplingParams
from minisgl.kvcache import create_prefix_cache
from minisgl.scheduler.decode import DecodeManager

HANDLE = (
    create_prefix_cache(torch.device("cpu"), "naive")
    .match_prefix(torch.empty(0, dtype=torch.int32))
    .cuda_handle
)


def make_req(uid: int, prompt_len: int = 4, max_tokens: int = 3) -> Req:
    ids = torch.arange(prompt_len, dtype=torch.int32)
    return Req(
        input_ids=ids,
        table_idx=uid,
        cached_len=0,
        output_len=max_tokens,
        uid=uid,
        sampling_params=SamplingParams(max_tokens=max_tokens),
        cache_handle=HANDLE,
    )


def step(req: Req) -> Req:
    """What one forward pass and its result processing do to a request."""
    req.complete_one()
    req.append_host(torch.tensor([7], dtype=torch.int32))
    return req


def test_prefilled_requests_join():
    dm = DecodeManager(page_size=1)
    a, b = step(make_req(1)), step(make_req(2))
    dm.filter_reqs([a, b])
    assert dm.running_reqs == {a, b}, (
        f"both requests can still decode, running_reqs = {dm.running_reqs}"
    )
    dm.filter_reqs([a])
    assert dm.running_reqs == {a, b}, "filtering merges: a request already running must stay"


def test_finished_requests_leave():
    dm = DecodeManager(page_size=1)
    done = step(make_req(1, max_tokens=1))  # its only output token is being produced
    alive = step(make_req(3))
    dm.filter_reqs([done, alive])
    assert dm.running_reqs == {alive}, (
        f"only requests with can_decode stay: remain_len of done={done.remain_len}; "
        f"got uids {sorted(r.uid for r in dm.running_reqs)}"
    )


def test_remove_and_abort():
    dm = DecodeManager(page_size=1)
    a, b = step(make_req(1)), step(make_req(2))
    dm.filter_reqs([a, b])
    dm.remove_req(a)
    dm.remove_req(a)  # removing twice is not an error
    assert dm.running_reqs == {b}
    assert dm.abort_req(99) is None
    assert dm.abort_req(2) is b and dm.running_reqs == set()


def test_inflight_tokens_count_what_is_left():
    dm = DecodeManager(page_size=1)
    a, b = step(make_req(1, max_tokens=5)), step(make_req(2, max_tokens=3))
    dm.filter_reqs([a, b])
    assert dm.inflight_tokens == a.remain_len + b.remain_len == 4 + 2, (
        f"inflight_tokens is the sum of remain_len with page size 1, got {dm.inflight_tokens}"
    )


def test_inflight_tokens_reserve_a_page_each():
    dm = DecodeManager(page_size=4)
    a, b = step(make_req(1, max_tokens=5)), step(make_req(2, max_tokens=3))
    dm.filter_reqs([a, b])
    assert dm.inflight_tokens == 6 + 2 * 3, (
        f"remain_len 6 plus (page_size - 1) per request = 12, got {dm.inflight_tokens}"
    )


def test_batch_is_sorted_by_uid():
    dm = DecodeManager(page_size=1)
    reqs = [step(make_req(uid)) for uid in (5, 1, 9, 3, 7, 2)]
    dm.filter_reqs(reqs)
    batch = dm.schedule_next_batch()
    assert batch.is_decode, f"phase must be 'decode', got {batch.phase!r}"
    assert [r.uid for r in batch.reqs] == [1, 2, 3, 5, 7, 9], f"got {[r.uid for r in batch.reqs]}"


def test_nothing_to_run():
    dm = DecodeManager(page_size=1)
    assert not dm.runnable and dm.schedule_next_batch() is None and dm.inflight_tokens == 0
    dm.filter_reqs([step(make_req(1))])
    assert dm.runnable


def test_drawn_requests_decode_until_each_is_done(drawn_seed):
    """Requests of drawn lengths join, decode, are aborted or finish (each judged run draws
    new ones): every batch is the running set sorted by uid, and ``inflight_tokens`` is
    what they may still add."""
    rng = random.Random(drawn_seed)
    page = rng.choice([1, 2, 4, 16])
    dm = DecodeManager(page_size=page)
    waiting = [make_req(uid, rng.randint(1, 30), rng.randint(1, 12)) for uid in range(12)]
    rng.shuffle(waiting)
    while waiting or dm.runnable:
        joining = [step(waiting.pop()) for _ in range(min(len(waiting), rng.randint(0, 3)))]
        dm.filter_reqs(joining)
        if dm.running_reqs and rng.random() < 0.1:
            victim = rng.choice(sorted(r.uid for r in dm.running_reqs))
            assert dm.abort_req(victim).uid == victim and dm.abort_req(victim) is None
        running = sorted(dm.running_reqs, key=lambda r: r.uid)
        want = sum(r.remain_len + page - 1 for r in running)
        assert dm.inflight_tokens == want, f"inflight_tokens {dm.inflight_tokens}, want {want}"
        batch = dm.schedule_next_batch()
        if batch is None:
            assert not running and not dm.runnable
            continue
        assert batch.is_decode and [r.uid for r in batch.reqs] == [r.uid for r in running]
        dm.filter_reqs([step(r) for r in batch.reqs])
