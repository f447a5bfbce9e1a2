"""Exercise 221: the new-token ratio's decay and reset, the retraction order, and
``RetractManager.retract_decode`` inside the scheduler's own loops around the fake model of
``tests/scheduler_harness.py`` (which accounts for every page and row before every step)."""

from __future__ import annotations

from typing import List

import pytest
import torch

from minisgl.core import Req, SamplingParams
from minisgl.scheduler.retract import NewTokenRatio, RetractedReq, RetractManager, retract_order
from tests.scheduler_harness import FakeEngineScheduler, fake_reference, run_script, user


def req(uid: int, prompt_len: int, max_tokens: int, generated: int = 0) -> Req:
    r = Req(
        input_ids=torch.arange(1, prompt_len + 1, dtype=torch.int32),
        table_idx=uid,
        cached_len=0,
        output_len=max_tokens,
        uid=uid,
        sampling_params=SamplingParams(max_tokens=max_tokens),
    )
    for _ in range(generated):
        r.complete_one()
    return r


def test_decay_stops_at_the_floor():
    ratio = NewTokenRatio(init=0.5, floor=0.2, decay=0.2)
    seen = []
    for _ in range(3):
        ratio.decay_one_step()
        seen.append(round(ratio.value, 6))
    assert seen == [0.3, 0.2, 0.2], f"0.5 decaying by 0.2 to a floor of 0.2, got {seen}"


def test_reset_is_never_below_init_nor_above_one():
    ratio = NewTokenRatio(init=0.5, floor=0.1, decay=0.1)
    ratio.reset_after_retraction([req(0, 4, 200, generated=50)])  # (50 + 20) / 200 = 0.35
    assert ratio.value == 0.5, f"0.35 is below init 0.5, got {ratio.value}"
    ratio.reset_after_retraction([req(0, 4, 100, generated=60)])  # (60 + 20) / 100 = 0.8
    assert ratio.value == pytest.approx(0.8), f"expected 0.8, got {ratio.value}"
    ratio.reset_after_retraction([req(0, 4, 30, generated=25)])  # (25 + 20) / 30 > 1
    assert ratio.value == 1.0, f"never above 1, got {ratio.value}"


def test_ties_go_to_the_latest_arrival():
    reqs = [req(0, 4, 50, 10), req(1, 4, 50, 40), req(2, 4, 50, 10), req(3, 30, 100)]
    got = [r.uid for r in retract_order(reqs)]
    assert got == [3, 2, 0, 1], f"remaining 40, 10, 40, 100 -> [3, 2, 0, 1], got {got}"


def run(num_pages: int, prompts: List[List[int]], max_tokens: int, overlap: bool):
    s = FakeEngineScheduler(num_pages=num_pages, page_size=4, max_seq_len=64, cache_type="radix")
    s.retract_manager = RetractManager()
    retracted: List[RetractedReq] = []
    real = s.retract_manager.retract_decode

    def watched(scheduler):
        out = real(scheduler)
        if out:
            head = scheduler.prefill_manager.pending_list[: len(out)]
            assert head == out, "the retracted requests must be at the head of the queue"
        retracted.extend(out)
        return out

    s.retract_manager.retract_decode = watched  # type: ignore[method-assign]
    run_script(s, {0: [user(u, p, max_tokens) for u, p in enumerate(prompts)]}, overlap)
    for uid, prompt in enumerate(prompts):
        ref = fake_reference(prompt, max_tokens, True)
        assert s.outputs()[uid] == ref, f"uid {uid}: got {s.outputs()[uid]}, alone {ref}"
    return s, retracted


@pytest.mark.parametrize("overlap", [False, True])
def test_nothing_is_retracted_while_the_pages_suffice(overlap):
    s, retracted = run(40, [list(range(1, 9)), list(range(11, 19))], 32, overlap)
    assert retracted == [], f"a pool of 40 pages holds both: retracted {retracted}"
    assert s.retract_manager.new_token_ratio.value < 0.7, "the ratio decays every decode step"


def test_an_in_flight_result_of_a_retracted_request_is_dropped():
    prompts = [list(range(10 * u + 1, 10 * u + 9)) for u in range(2)]
    s, retracted = run(18, prompts, 32, overlap=True)  # outputs compared inside run()
    assert retracted
    assert all(len(sent) == 32 for sent in s.state.replies.values()), "a token sent twice"


@pytest.mark.parametrize("overlap", [False, True])
def test_a_retracted_request_keeps_its_tokens_and_goes_first(overlap):
    prompts = [list(range(10 * u + 1, 10 * u + 9)) for u in range(3)]
    s, retracted = run(18, prompts, 32, overlap)
    assert retracted, "18 pages for two requests of 10 pages each: someone must be retracted"
    for p in retracted:
        full = prompts[p.uid] + fake_reference(prompts[p.uid], 32, True)
        n = p.input_len
        assert n > 8 and p.input_ids.tolist() == full[:n], (
            f"uid {p.uid} must come back with its prompt and output so far, got {p.input_ids}"
        )
        assert p.output_len == 8 + 32 - n, (
            f"uid {p.uid}: {8 + 32 - n} tokens left, got {p.output_len}"
        )
    assert s.retract_manager.new_token_ratio.value >= 0.7 - 0.05, "a retraction resets the ratio"
