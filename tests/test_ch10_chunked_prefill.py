"""Chapter 10: chunked prefill. A prompt longer than the step's token budget is prefilled
in chunks that sample nothing, continue first in the next step, and give the same tokens
as prefilling it in one go."""

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV  # +ch11
from minisgl.llm import LLM
from minisgl.message import AbortBackendMsg
from minisgl.scheduler.prefill import ChunkedReq
from tests import test_ch07_scheduler as ch07
from tests import test_ch07_trace as ch07_trace
from tests.helpers import DEVICE, hf_greedy
from tests.scheduler_harness import (
    LOOPS,
    FakeEngineScheduler,
    ScriptedLLM,
    fake_reference,
    run_script,
    user,
)

LONG = list(range(200, 240))  # 40 tokens
SHORT = list(range(500, 510))  # 10 tokens


@pytest.mark.parametrize("overlap", LOOPS)
def test_a_long_prompt_is_cut_at_the_budget_and_continues_first(overlap):
    s = FakeEngineScheduler(num_pages=128, cache_type="naive", max_extend_tokens=16)
    run_script(s, {0: [user(0, LONG, 3), user(1, SHORT, 3)]}, overlap)
    prefills = [launch.reqs for launch in s.state.launches if launch.phase == "prefill"]
    # (uid, cached_len, extend_len, is a chunk): 16 + 16 + 8 tokens, and uid1 takes what
    # is left of the third step's budget, so it is chunked too and continues first
    assert prefills == [
        [(0, 0, 16, True)],
        [(0, 16, 16, True)],
        [(0, 32, 8, False), (1, 0, 8, True)],
        [(1, 8, 2, False)],
    ]
    assert s.outputs() == {0: fake_reference(LONG, 3, True), 1: fake_reference(SHORT, 3, True)}


def test_chunks_produce_no_output():
    s = FakeEngineScheduler(num_pages=128, cache_type="naive", max_extend_tokens=16)
    run_script(s, {0: [user(0, LONG, 2)]}, overlap=False)
    steps_with_reply = [step for step, _ in s.state.replies[0]]
    chunk_steps = [launch.step for launch in s.state.launches if launch.reqs[0][3]]
    assert len(chunk_steps) == 2 and not set(chunk_steps) & set(steps_with_reply)
    assert len(steps_with_reply) == 2  # one token from the last chunk's step, one from decode


@pytest.mark.parametrize("P,budget", [(4, 6), (16, 5), (4, 1)])
def test_chunks_that_end_inside_a_page_continue_in_it(P, budget):
    """The fake engine checks at every step that each row reads back what was written,
    so a chunk boundary that splits a page must continue in the same page."""
    s = FakeEngineScheduler(
        num_pages=-(-60 // P) + 1, page_size=P, cache_type="radix", max_extend_tokens=budget
    )
    run_script(s, {0: [user(0, LONG, 4)], 3: [user(1, LONG[:20] + SHORT, 4)]}, overlap=LOOPS[-1])
    assert s.outputs() == {
        0: fake_reference(LONG, 4, True),
        1: fake_reference(LONG[:20] + SHORT, 4, True),
    }


def test_chunked_and_one_shot_prefill_give_the_same_tokens_as_hf(qwen3_path):
    prompts = [LONG, SHORT, LONG[::-1]]
    ref = hf_greedy(qwen3_path, prompts, 5)
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # +ch11
    llm = LLM(
        str(qwen3_path),
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=256,
        max_seq_len_override=128,
        cache_type="naive",
    )
    for budget in [7, 16, 8192]:
        llm.prefill_budget = budget  # what max_extend_tokens sets; one engine keeps the test short
        out = llm.generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True))
        assert [o["token_ids"] for o in out] == ref, f"max_extend_tokens={budget}"
    llm.shutdown()


@pytest.mark.parametrize("overlap", LOOPS)
def test_a_request_aborted_while_its_prompt_is_chunked_releases_it_once(qwen3_path, overlap):
    llm = ScriptedLLM(
        str(qwen3_path),
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=128,
        max_seq_len_override=128,
        cache_type="radix",
        page_size=4,
        max_extend_tokens=16,
    )
    # step 0 prefills the first 16 tokens of uid0; at step 1 (when the scheduler overlaps
    # steps, its chunk still in flight) the abort arrives; uid1 waits behind uid0 and then runs normally
    run_script(llm, {0: [user(0, LONG, 4), user(1, SHORT, 4)], 1: [AbortBackendMsg(0)]}, overlap)
    assert llm.state.launches[0].reqs == [(0, 0, 16, True)]
    assert 0 not in llm.state.replies  # a chunk replies nothing, and nothing comes after
    assert llm.outputs()[1] == hf_greedy(qwen3_path, [SHORT], 4)[0]
    assert llm.state.freed[0] == 1 and llm.state.freed[1] == 1
    llm.shutdown()


def test_chunked_prefill_gives_the_same_tokens(qwen3_path):
    llm = ch07.build_llm(qwen3_path, max_extend_tokens=3)
    steps = ch07.trace(llm)
    out = llm.generate(ch07.PROMPTS[:2], ch07.greedy(5))
    assert [o["token_ids"] for o in out] == hf_greedy(qwen3_path, ch07.PROMPTS[:2], 5)
    assert steps[0] == ("prefill", [0])  # 3 of its 5 prompt tokens: a chunk
    llm.shutdown()


def test_a_long_prompt_is_chunked_and_resumes_first():
    prefill, *_ = ch07.managers(num_pages=64)
    prefill.add_one_req(ch07.user(0, 10, 2))
    prefill.add_one_req(ch07.user(1, 4, 2))
    batch = prefill.schedule_next_batch(prefill_budget=6)
    assert isinstance(batch.reqs[0], ChunkedReq) and batch.reqs[0].extend_len == 6
    assert len(batch.reqs) == 1  # the budget is spent
    assert prefill.pending_list[0].uid == 0 and prefill.pending_list[0].chunked_req is batch.reqs[0]


def test_chunks_are_marked_and_sample_nothing(qwen3_path):
    llm = ch07_trace.build_llm(qwen3_path, max_extend_tokens=4)
    rec, outputs, _ = ch07_trace.record(
        llm, ["Once upon a time, in a land far away, there lived"], [2]
    )
    doc = rec.document()
    llm.shutdown()
    ch07_trace.validate(doc)
    prefills = [s["reqs"][0] for s in doc["steps"] if s["kind"] == "prefill"]
    assert len(prefills) > 1 and all(r["extend_len"] <= 4 for r in prefills)
    assert all(r["chunked"] and r["sampled"] is None for r in prefills[:-1])
    assert not prefills[-1]["chunked"] and prefills[-1]["sampled"] == outputs[0]["token_ids"][0]
