"""Chapter 11: overlap scheduling. Batch N+1 is launched before batch N's results are
handled; the guards that makes safe (finished requests, held-back table rows, aborts of
requests in flight); and every combination of cache, chunk budget and overlap against HF."""

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM
from minisgl.message import AbortBackendMsg
from tests import test_ch07_scheduler as ch07
from tests import test_ch07_trace as ch07_trace
from tests.helpers import DEVICE, hf_greedy
from tests.scheduler_harness import (
    FakeEngineScheduler,
    ScriptedLLM,
    fake_reference,
    run_script,
    user,
)


def eos_prompt(min_len=2, max_len=4):
    """A prompt whose fake-model answer hits EOS after ``min_len..max_len`` tokens."""
    for start in range(1, 1000):
        prompt = list(range(start, start + 6))
        if min_len <= len(fake_reference(prompt, 8, ignore_eos=False)) <= max_len:
            return prompt
    raise AssertionError("no such prompt")


@pytest.mark.parametrize("overlap", [False, True])
def test_overlap_launches_the_next_batch_before_handling_results(overlap):
    s = FakeEngineScheduler(num_pages=64, cache_type="naive")
    run_script(s, {0: [user(0, [1, 2, 3], 4)]}, overlap)
    order = [f"{what[0]}{index}" for what, index, _ in s.state.events]  # l = launch, r = results
    if overlap:
        assert order == ["l0", "l1", "r0", "l2", "r1", "l3", "r2", "r3"]
    else:
        assert order == ["l0", "r0", "l1", "r1", "l2", "r2", "l3", "r3"]
    assert s.outputs() == {0: fake_reference([1, 2, 3], 4, True)}


def test_a_request_that_hits_eos_gets_no_reply_from_the_batch_in_flight():
    prompt = eos_prompt()
    ref = fake_reference(prompt, 8, ignore_eos=False)
    s = FakeEngineScheduler(num_pages=64, cache_type="radix")
    run_script(s, {0: [user(0, prompt, 8, ignore_eos=False)]}, overlap=True)
    # EOS is only seen on the CPU after the next step was launched with the request in it
    assert sum(1 for launch in s.state.launches if launch.reqs[0][0] == 0) == len(ref) + 1
    assert s.outputs() == {0: ref} and s.state.freed[0] == 1


def test_a_freed_row_is_not_reused_while_the_batch_in_flight_may_write_it():
    """One table row: uid1 waits for uid0's. uid0 ends at EOS, but the batch in flight
    still writes its next token into that row, so uid1 may only get the row once that
    batch's results are handled (the harness checks this at every launch)."""
    prompt = eos_prompt()
    s = FakeEngineScheduler(num_pages=64, max_running_req=1, cache_type="naive")
    run_script(s, {0: [user(0, prompt, 8, ignore_eos=False), user(1, [7, 8], 2)]}, overlap=True)
    last_with_0 = max(launch.index for launch in s.state.launches if launch.reqs[0][0] == 0)
    first_with_1 = min(launch.index for launch in s.state.launches if launch.reqs[0][0] == 1)
    handled = s.state.events.index(("results", last_with_0, s.state.launches[last_with_0].step + 1))
    assert (
        s.state.events.index(("launch", first_with_1, s.state.launches[first_with_1].step))
        > handled
    )
    assert s.outputs()[1] == fake_reference([7, 8], 2, True)


def test_a_held_back_row_is_released_when_nothing_is_in_flight():
    """Engine fix: with one row and two one-token requests, uid0's row is held back when
    its result is handled; the next step has nothing in flight and must release it, or
    uid1 waits forever (no batch would ever be handled again to release it)."""
    s = FakeEngineScheduler(num_pages=64, max_running_req=1, cache_type="naive")
    run_script(s, {0: [user(0, [1, 2], 1), user(1, [3, 4], 1)]}, overlap=True, max_steps=20)
    assert s.outputs() == {0: fake_reference([1, 2], 1, True), 1: fake_reference([3, 4], 1, True)}


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_of_a_request_whose_last_token_is_in_flight(overlap):
    """Engine fix: the last step of a request leaves the decode set when it is launched;
    under overlap an abort arriving before its result is handled must still find it (in
    the batch in flight), free it once and drop that result."""
    s = FakeEngineScheduler(num_pages=64, cache_type="radix")
    run_script(s, {0: [user(0, [1, 2, 3], 3)], 3: [AbortBackendMsg(0)]}, overlap)
    assert len(s.state.launches) == 3  # prefill and two decode steps, the last launched at step 2
    assert s.outputs()[0] == fake_reference([1, 2, 3], 3, True)[: 2 if overlap else 3]
    assert s.state.freed[0] == 1


def scripted(path, **kwargs):
    options = dict(
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=128,
        max_seq_len_override=128,
        cache_type="radix",
    )
    options.update(kwargs)
    return ScriptedLLM(str(path), **options)


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_while_decoding_and_while_the_batch_is_in_flight(qwen3_path, overlap):
    """uid0 is aborted at step 4 while decoding: under overlap its step-3 batch is still
    in flight and that result is dropped. uid1 shares its prompt and goes on unharmed."""
    prompt = list(range(40, 52))
    llm = scripted(qwen3_path, page_size=4)
    run_script(
        llm, {0: [user(0, prompt, 10), user(1, prompt + [9], 10)], 4: [AbortBackendMsg(0)]}, overlap
    )
    ref = hf_greedy(qwen3_path, [prompt, prompt + [9]], 10)
    assert [
        launch.step for launch in llm.state.launches if any(r[0] == 0 for r in launch.reqs)
    ] == [0, 1, 2, 3]
    replied = llm.outputs()[0]
    assert replied == ref[0][: 3 if overlap else 4]  # step 3's token is in flight under overlap
    assert llm.outputs()[1] == ref[1]
    assert llm.state.freed[0] == 1 and llm.state.freed[1] == 1
    llm.shutdown()


def test_abort_of_a_last_token_in_flight_with_a_real_model(qwen3_path):
    prompt = list(range(60, 70))
    llm = scripted(qwen3_path)
    run_script(llm, {0: [user(0, prompt, 3)], 3: [AbortBackendMsg(0)]}, overlap=True)
    assert llm.outputs()[0] == hf_greedy(qwen3_path, [prompt], 3)[0][:2]
    assert llm.state.freed[0] == 1
    llm.shutdown()


# ---- every combination against Hugging Face --------------------------------------------------

# Completions, not questions: a question invites an end-of-turn token, which the reference
# (min_new_tokens) forbids while the engine (ignore_eos) does not.
SYSTEM = "Here are some facts, each written as one complete sentence.\n"
QUESTIONS = [
    "The capital of France is",
    "The largest planet in the solar system is",
    "Water boils at a temperature of",
    "The author of Hamlet was",
    "Bees collect nectar and make",
    "Mount Fuji is a volcano in",
    "A cat usually has four",
    "The first person to walk on the moon was",
]
# (max_extend_tokens, overlap); each round asks new questions after the same system prompt,
# so with the radix cache later rounds also start from a cached prefix
COMBINATIONS = [(16, False), (8192, True), (16, True), (8192, False)]


@pytest.mark.parametrize("cache_type", ["naive", "radix"])
@pytest.mark.parametrize("which", ["smollm2", "qwen3"])
@pytest.mark.slow
def test_every_combination_matches_hf_greedy(which, cache_type, request):
    path = request.getfixturevalue(f"{which}_path")
    # one engine per cache type keeps this short: the budget is read from prefill_budget and
    # the overlap switch from ENV at every generate
    llm = LLM(
        str(path),
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=512,
        max_seq_len_override=256,
        cache_type=cache_type,
    )
    for k, (budget, overlap) in enumerate(COMBINATIONS):
        prompts = [SYSTEM + q for q in QUESTIONS[2 * k : 2 * k + 2]]
        ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
        llm.prefill_budget = budget
        out = llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
        assert [o["token_ids"] for o in out] == hf_greedy(path, prompts, 6), (
            f"{which}: cache {cache_type}, max_extend_tokens {budget}, overlap {overlap}"
        )
        assert llm.table_manager.available_size == 4
    llm.cache_manager.check_integrity()
    llm.shutdown()


@pytest.mark.gpu
def test_overlap_on_cuda_gives_the_same_tokens(qwen3_path):
    prompts = [SYSTEM + q for q in QUESTIONS[:4]]
    outputs = []
    for overlap in [False, True]:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
        llm = LLM(
            str(qwen3_path),
            dtype=torch.float32,
            device="cuda",
            attention_backend="torch",
            max_running_req=4,
            num_page_override=512,
            max_seq_len_override=256,
            cuda_graph_max_bs=0,
        )
        outputs.append(
            [
                o["token_ids"]
                for o in llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
            ]
        )
        llm.shutdown()
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize(
    "cache_type,overlap,page_size", [("radix", False, 1), ("radix", True, 4), ("naive", True, 16)]
)
def test_cache_and_overlap_settings_do_not_change_outputs(
    qwen2_path, cache_type, overlap, page_size
):
    llm = ch07.build_llm(qwen2_path, overlap=overlap, cache_type=cache_type, page_size=page_size)
    prompts = ch07.PROMPTS + [ch07.PROMPTS[0] + " a city"]  # shares a prefix with prompt 0
    for _ in range(2):  # the second round hits the radix cache
        out = llm.generate(prompts, ch07.greedy(6))
        assert [o["token_ids"] for o in out] == hf_greedy(qwen2_path, prompts, 6)
    assert llm.table_manager.available_size == 8
    llm.cache_manager.check_integrity()
    llm.shutdown()


@pytest.mark.timeout(300)
def test_overlap_releases_a_held_back_row_when_nothing_is_in_flight(qwen3_path):
    """Regression: with one table row and overlap on, the row of a finished request is held
    back; it must come back once nothing is in flight, or the next request waits forever."""
    llm = ch07.build_llm(qwen3_path, overlap=True, max_running_req=1)
    out = llm.generate([[1, 2], [3, 4]], ch07.greedy(1))
    assert [o["token_ids"] for o in out] == [
        r[:1] for r in hf_greedy(qwen3_path, [[1, 2], [3, 4]], 1)
    ]
    assert llm.table_manager.available_size == 1
    llm.shutdown()


def test_overlap_trace_names_the_batch_handled_while_each_ran(qwen3_path):
    llm = ch07_trace.build_llm(qwen3_path, overlap=True)
    rec, outputs, batches = ch07_trace.record(llm, ch07_trace.PROMPTS, ch07_trace.LENGTHS)
    doc = rec.document()
    llm.shutdown()
    ch07_trace.validate(doc)
    assert doc["config"]["overlap"] is True
    steps = doc["steps"]
    assert len(steps) == len(batches)
    # batch k+1 is launched before batch k's results are handled, except after an idle gap
    overlapped = [s["index"] for s in steps if s["handled_while_running"] is not None]
    assert overlapped and all(steps[i]["handled_while_running"] == i - 1 for i in overlapped)
    assert ch07_trace.sampled_by_uid(doc) == {i: o["token_ids"] for i, o in enumerate(outputs)}


def test_a_seeded_request_gives_the_same_tokens_alone_and_in_any_row_under_overlap(qwen3_path):
    ch07.check_a_seeded_request_alone_and_in_any_row(ch07.build_llm(qwen3_path, overlap=True))
