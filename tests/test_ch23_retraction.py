"""Chapter 23: admission on an estimate of future tokens, and retraction of running requests
when a decode step runs out of KV pages. Mostly on the fake-model scheduler of
``tests/scheduler_harness.py``, which checks every page and row before every step."""

import time
from collections import Counter
from contextlib import contextmanager
from typing import Iterator
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from minisgl.core import Req, SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import PrefillManager
from minisgl.scheduler.retract import (
    NewTokenRatio,
    RetractManager,
    pages_for_next_decode,
    retract_order,
)
from minisgl.scheduler.table import TableManager
from tests.helpers import DEVICE, hf_greedy
from tests.scheduler_harness import (
    FakeEngineScheduler,
    ScriptedLLM,
    Workload,
    fake_reference,
    run_script,
    user,
    workloads,
)

CONTEXT = 128  # max_seq_len of the fake-engine runs


def req(uid: int, prompt_len: int, max_tokens: int, generated: int = 0) -> Req:
    r = Req(
        input_ids=torch.arange(1, prompt_len + 1, dtype=torch.int32),
        table_idx=uid,
        cached_len=0,
        output_len=max_tokens,
        uid=uid,
        sampling_params=SamplingParams(max_tokens=max_tokens),
    )
    for _ in range(generated):  # as if prefilled and decoded: `generated` tokens so far
        r.complete_one()
    return r


@contextmanager
def counting_retractions() -> Iterator[Counter]:
    """uid -> how many times the scheduler retracted it, while the block runs."""
    counts: Counter = Counter()
    real = RetractManager.retract_decode

    def counted(self, s):
        out = real(self, s)
        counts.update(p.uid for p in out)
        return out

    with mock.patch.object(RetractManager, "retract_decode", counted):
        yield counts


# ---- the ratio and the order ------------------------------------------------------------------


def test_the_ratio_decays_to_its_floor_and_a_retraction_resets_it_upward():
    ratio = NewTokenRatio(init=0.7, floor=0.1, decay=0.25)
    assert ratio.value == 0.7
    values = []
    for _ in range(4):
        ratio.decay_one_step()
        values.append(ratio.value)
    assert values == pytest.approx([0.45, 0.2, 0.1, 0.1])
    # two kept requests have used 60 and 0 of budgets of 100: (60 + 20 * 2) / 200 = 0.5 -> init
    ratio.reset_after_retraction([req(0, 4, 100, generated=60), req(1, 4, 100)])
    assert ratio.value == 0.7
    # used 90 and 80 of 100 each: (170 + 40) / 200 > 1 -> reserve everything
    ratio.reset_after_retraction([req(0, 4, 100, generated=90), req(1, 4, 100, generated=80)])
    assert ratio.value == 1.0
    with pytest.raises(ValueError, match="floor"):
        NewTokenRatio(init=0.5, floor=0.6)


def test_the_decode_reservation_scales_each_remaining_budget_and_rounds_up():
    dm = DecodeManager(page_size=4)
    dm.running_reqs = {req(0, 4, 10, generated=3), req(1, 4, 100, generated=1)}  # 7 and 99 left
    assert dm.estimated_tokens(1.0) == dm.inflight_tokens == 7 + 99 + 2 * 3
    assert dm.estimated_tokens(0.5) == 4 + 50 + 2 * 3  # ceil(3.5) and ceil(49.5)


@pytest.mark.parametrize("ratio, admitted", [(1.0, 1), (0.7, 2)])
def test_admission_reserves_the_estimate_of_the_output(ratio, admitted):
    """18 pages of 4 (72 tokens), two requests of 8 + 32: reserving everything, the first
    holds 8 + 32 + 3 = 43 and the second needs 40 more; at 0.7 it holds 8 + 23 + 3 = 34 and
    the second needs 8 + 23 = 31, which fits."""
    page_table = torch.zeros((5, 64), dtype=torch.int32)
    cache = CacheManager(18, 4, page_table, "naive")
    prefill = PrefillManager(cache, TableManager(4, page_table), DecodeManager(4))
    for uid in range(2):
        prefill.add_one_req(user(uid, range(1, 9), 32))
    prefill.new_token_ratio = ratio
    batch = prefill.schedule_next_batch(1000)
    assert [r.uid for r in batch.reqs] == list(range(admitted))
    assert all(r.max_device_len == 8 + 32 for r in batch.reqs)  # the budget itself is kept


def test_the_longest_remaining_output_is_retracted_first():
    a, b, c, d = req(0, 4, 100, 90), req(1, 4, 100, 10), req(2, 50, 20), req(3, 4, 100, 10)
    # remaining 10, 90, 20, 90: of the two tied at 90 the later arrival (uid 3) goes first
    assert [r.uid for r in retract_order([a, b, c, d])] == [3, 1, 2, 0]


@pytest.mark.parametrize("P", [1, 4])
def test_a_decode_step_needs_a_page_only_where_a_position_starts_one(P):
    reqs = [req(0, 4, 20, generated=g) for g in range(1, 10)]  # next positions 4 .. 12
    assert [r.cached_len for r in reqs] == list(range(4, 13))
    assert pages_for_next_decode(reqs, P) == (9 if P == 1 else 3)  # P = 4: at 4, 8 and 12


# ---- the starvation case ----------------------------------------------------------------------


def starvation(retract: bool, overlap: bool) -> FakeEngineScheduler:
    """Two long requests that may run to the context (the default ``max_tokens``) arrive
    at step 0, a 4-token request at step 1; the pool holds 1.75 contexts."""
    s = FakeEngineScheduler(
        num_pages=56,
        page_size=4,
        max_seq_len=CONTEXT,
        cache_type="radix",
        enable_retraction=retract,
    )
    longs = [user(0, range(1, 9), CONTEXT - 8), user(1, range(2, 10), CONTEXT - 8)]
    with counting_retractions() as retracted:
        run_script(s, {0: longs, 1: [user(2, [5, 6, 7, 8], 4)]}, overlap)
    s.retracted = retracted  # type: ignore[attr-defined]
    for uid, msg in [(0, longs[0]), (1, longs[1])]:
        assert s.outputs()[uid] == fake_reference(msg.input_ids.tolist(), CONTEXT - 8, True)
    assert s.outputs()[2] == fake_reference([5, 6, 7, 8], 4, True)
    return s


@pytest.mark.parametrize("overlap", [False, True])
def test_a_short_request_is_not_starved_by_long_default_max_tokens(overlap):
    """Reserving every ``max_tokens``, the second long request waits for the first to
    finish and the short one waits behind it; reserving an estimate, all three run
    together, the short one finishes within a few steps, and a long one is retracted
    when their KV outgrows the pool (and still gives its tokens)."""
    before, after = starvation(False, overlap), starvation(True, overlap)
    finished_before = before.state.replies[2][-1][0] - 1  # steps from arrival to last token
    finished_after = after.state.replies[2][-1][0] - 1
    assert finished_before >= CONTEXT - 8, "the short request should have waited behind"
    assert finished_after <= 8, f"the short request took {finished_after} steps"
    assert sum(after.retracted.values()) >= 1 and not before.retracted
    assert after.state.step < before.state.step  # the long ones ran together too


def short_request_seconds(server, wait_s: float) -> float | None:
    """Two chats that may run to the context (no ``max_tokens``, EOS ignored), then a
    4-token one a second later: its latency, or None if it is still waiting after
    ``wait_s`` seconds. The long ones are dropped (their clients hang up) at the end."""
    import asyncio

    import httpx

    def chat(content: str, **extra) -> dict:
        return {
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": content}],
            **extra,
        }

    async def main() -> float | None:
        async with httpx.AsyncClient(base_url=server.url, timeout=600) as http:
            longs = [
                asyncio.create_task(
                    http.post("/v1/chat/completions", json=chat(f"A story {i}", ignore_eos=True))
                )
                for i in range(2)
            ]
            await asyncio.sleep(1.0)
            t0 = time.monotonic()
            short = http.post("/v1/chat/completions", json=chat("Hi", max_tokens=4))
            try:
                r = await asyncio.wait_for(short, wait_s)
                assert r.status_code == 200, r.text
                return time.monotonic() - t0
            except asyncio.TimeoutError:
                return None
            finally:
                for task in longs:
                    task.cancel()

    return asyncio.run(main())


@pytest.mark.slow
def test_the_servers_defaults_do_not_starve_a_short_request(smollm2_path, tmp_path):
    """The server's own defaults (the model's 8,192-token context, the CPU's default pool):
    with retraction, on by default, the short request is answered at once; with
    ``--disable-retraction`` (chapter 7's admission) it is still waiting 15 s later."""
    from tests.helpers.server import Server

    on = Server(smollm2_path, tmp_path / "on.log", small=False).wait_ready()
    try:
        took = short_request_seconds(on, wait_s=20)
    finally:
        assert on.stop() == 0
    off = Server(smollm2_path, tmp_path / "off.log", "--disable-retraction", small=False)
    try:
        starved = short_request_seconds(off.wait_ready(), wait_s=15)
    finally:
        assert off.stop() == 0
    print(f"\nshort request, server defaults: {took:.1f} s; --disable-retraction: {starved}")
    assert took is not None and took < 20 and starved is None


# ---- retraction keeps every token -------------------------------------------------------------


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("cache_type", ["naive", "radix"])
def test_a_retracted_request_resumes_with_the_tokens_it_had(overlap, cache_type):
    """Three requests of 8 + 32 tokens (10 pages of 4 each) in a pool of 18 pages: the
    estimate (8 + ceil(0.7 * 32) + 3 = 34 tokens) admits two together, they outgrow the
    pool, one is retracted, re-prefilled over prompt + output from the head of the queue,
    and every output equals the fake model's alone."""
    s = FakeEngineScheduler(
        num_pages=18, page_size=4, max_seq_len=64, cache_type=cache_type, enable_retraction=True
    )
    prompts = [list(range(10 * u + 1, 10 * u + 9)) for u in range(3)]
    with counting_retractions() as retracted:
        run_script(s, {0: [user(u, p, 32) for u, p in enumerate(prompts)]}, overlap)
    assert sum(retracted.values()) >= 1
    for uid, prompt in enumerate(prompts):
        assert s.outputs()[uid] == fake_reference(prompt, 32, True)
        assert s.state.freed[uid] == 1 + retracted[uid]  # released once per admission
    # a re-admission prefills past the prompt: the tokens it generated are in its input
    readmitted = [
        r
        for launch in s.state.launches
        if launch.phase == "prefill"
        for r in launch.reqs
        if r[1] + r[2] > 8
    ]
    assert readmitted, "no prefill covered a retracted request's generated tokens"
    if cache_type == "radix":  # the radix cache kept its computed prefix: less to recompute
        assert any(cached > 0 for _, cached, _, _ in readmitted)


# ---- random workloads -------------------------------------------------------------------------


def retraction_workloads():
    """A hypothesis strategy like the harness's ``workloads`` but sized to retract: outputs
    long beside prompts (up to 6 pages), a pool of one to 1.5 requests' worth, and a ratio
    that decays slowly (SGLang's pace) or fast (0.05 per step, to reach its floor)."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw):
        P = draw(st.sampled_from([1, 4, 16]))
        tokens = st.integers(1, 40)
        prefix = draw(st.lists(tokens, max_size=2 * P + 2))
        requests = []
        for uid in range(draw(st.integers(2, 8))):
            base = prefix if draw(st.booleans()) else []
            prompt = base + draw(st.lists(tokens, min_size=0 if base else 1, max_size=P + 2))
            requests.append(
                (
                    uid,
                    prompt,
                    draw(st.integers(1, 6 * P)),
                    draw(st.sampled_from([True, True, True, False])),
                    draw(st.integers(0, 12)),
                    draw(st.one_of(st.none(), st.none(), st.integers(0, 20))),
                )
            )
        need = max(-(-(len(prompt) + max_tokens) // P) for _, prompt, max_tokens, *_ in requests)
        w = Workload(
            P,
            max(2, need + draw(st.integers(0, need // 2))),
            draw(st.sampled_from(["naive", "radix"])),
            draw(st.booleans()),
            draw(st.integers(1, 24)),
            draw(st.integers(1, 4)),
            requests,
        )
        return w, draw(st.sampled_from([0.05, NewTokenRatio().decay]))

    return build()


def check_retraction_workload(w: Workload, decay: float = NewTokenRatio().decay) -> Counter:
    """Run ``w`` with retraction on: every step's pages and rows add up and the prefix
    cache is consistent (``check_resources``, before every step), the run ends idle with
    every page back, no request starves (the step limit), each one not aborted gets
    exactly the fake model's tokens (none lost, none twice: a token after the last is
    refused by the harness), and each admission is released exactly once."""
    s = FakeEngineScheduler(
        num_pages=w.num_pages,
        page_size=w.page_size,
        cache_type=w.cache_type,
        max_extend_tokens=w.budget,
        max_running_req=w.rows,
        max_seq_len=CONTEXT,
        enable_retraction=True,
    )
    s.retract_manager = RetractManager(NewTokenRatio(decay=decay))
    with counting_retractions() as retracted:
        run_script(s, w.script(), w.overlap, max_steps=1000)
    out = s.outputs()
    admitted = {uid for launch in s.state.launches for uid, *_ in launch.reqs}
    for uid, prompt, max_tokens, ignore_eos, _, abort in w.requests:
        ref, got = fake_reference(prompt, max_tokens, ignore_eos), out.get(uid, [])
        if abort is None:
            assert got == ref, f"uid {uid}: got {got}, alone it gives {ref}"
        else:
            assert got == ref[: len(got)], f"uid {uid} (aborted): got {got}, alone {ref}"
        released = (1 if uid in admitted else 0) + retracted[uid]
        assert s.state.freed[uid] == released, (
            f"uid {uid}: released {s.state.freed[uid]} times, admitted {released}"
        )
    return retracted


RETRACTED_IN: Counter = Counter()  # examples of the property below that retracted, by count


@settings(
    max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(retraction_workloads())
def test_random_workloads_with_retraction_lose_nothing(case):
    w, decay = case
    retracted = check_retraction_workload(w, decay)
    RETRACTED_IN[min(sum(retracted.values()), 2)] += 1


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(workloads())
def test_chapter_8s_random_workloads_lose_nothing_with_retraction_on(w):
    check_retraction_workload(w)


def test_the_random_workloads_do_retract():
    """The property above is not vacuous: many of its examples retract, some repeatedly."""
    if not RETRACTED_IN:  # run alone (-k): draw the same examples again
        test_random_workloads_with_retraction_lose_nothing()
    assert RETRACTED_IN[1] + RETRACTED_IN[2] >= 15 and RETRACTED_IN[2] >= 5, RETRACTED_IN


# ---- a real model -----------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", [False, True])
def test_greedy_outputs_equal_an_unretracted_run_and_hf(qwen3_path, overlap):
    """The tiny Qwen3 with 9 pages of 4 tokens for four requests of 6 + 12 (5 pages each):
    the estimate admits two at a time, retractions happen, and the tokens equal a run that
    reserves everything (one at a time), and Hugging Face's."""
    prompts = [list(range(5 * u + 3, 5 * u + 9)) for u in range(4)]
    options = dict(
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=9,
        page_size=4,
        max_seq_len_override=64,
    )
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    outputs = {}
    for retract in (False, True):
        llm = LLM(str(qwen3_path), enable_retraction=retract, **options)
        with counting_retractions() as retracted:
            out = llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
        assert (sum(retracted.values()) > 0) == retract
        outputs[retract] = [o["token_ids"] for o in out]
        llm.cache_manager.check_integrity()
        llm.shutdown()
    assert outputs[True] == outputs[False] == hf_greedy(qwen3_path, prompts, 12)


def test_seeded_samples_equal_an_unretracted_run(qwen3_path):
    """Chapter 6's per-request seeds key each draw by the position drawn, so a retracted
    request, recomputed from its tokens, draws the same numbers again."""
    prompts = [list(range(5 * u + 3, 5 * u + 9)) for u in range(4)]
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, ignore_eos=True, seed=100 + u)
        for u in range(4)
    ]
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True
    outputs = {}
    for retract in (False, True):
        llm = LLM(
            str(qwen3_path),
            enable_retraction=retract,
            dtype=torch.float32,
            device=DEVICE,
            attention_backend="torch",
            max_running_req=4,
            num_page_override=9,
            page_size=4,
            max_seq_len_override=64,
        )
        with counting_retractions() as retracted:
            outputs[retract] = [o["token_ids"] for o in llm.generate(prompts, params)]
        assert (sum(retracted.values()) > 0) == retract
        llm.shutdown()
    assert outputs[True] == outputs[False]


def test_the_scripted_model_checks_every_step_under_retraction(qwen3_path):
    """The real model in the scripted loop: pages and rows add up before every step while
    requests are retracted and re-admitted, under overlap."""
    llm = ScriptedLLM(
        str(qwen3_path),
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=3,
        num_page_override=8,
        page_size=4,
        max_seq_len_override=32,
        enable_retraction=True,
    )
    prompts = [[7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18]]
    script = {0: [user(0, prompts[0], 14), user(1, prompts[1], 14)], 2: [user(2, prompts[2], 14)]}
    with counting_retractions() as retracted:
        run_script(llm, script, overlap=True)
    assert sum(retracted.values()) > 0
    assert [llm.outputs()[u] for u in range(3)] == hf_greedy(qwen3_path, prompts, 14)
    llm.shutdown()


def test_the_offline_benchmark_takes_the_switch(qwen3_path):
    from minisgl.benchmark import offline
    from minisgl.benchmark.workload import nano_vllm_workload

    argv = ["--model", str(qwen3_path), "--device", "cpu", "--num-seqs", "3"]
    argv += ["--input-len", "4", "12", "--output-len", "2", "4", "--page-size", "4"]
    argv += ["--max-seq-len", "64", "--max-running-req", "4", "--enable-retraction"]
    [result] = offline.main(argv)
    assert result.variant.endswith(", retraction")
    expected = nano_vllm_workload(3, input_len=(4, 12), output_len=(2, 4)).output_tokens
    assert result.output_tokens == expected
