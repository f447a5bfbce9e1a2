"""Chapter 7: the scheduler and the offline LLM, end to end against Hugging Face."""

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV  # +ch11
from minisgl.kvcache import create_prefix_cache  # noqa: F401  (registry import check)
from minisgl.llm import LLM
from minisgl.message import UserMsg
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import PrefillManager
from minisgl.scheduler.table import TableManager
from tests.helpers import DEVICE, hf_encode, hf_greedy, hf_model

PROMPTS = [
    "The capital of France is",
    "List three prime numbers:",
    "def fibonacci(n):",
    "1 + 1 =",
    "Once upon a time,",
]


def greedy(n):
    return SamplingParams(max_tokens=n, ignore_eos=True)


def build_llm(
    path,
    overlap=False,  # +ch11
    **kwargs,
):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap  # +ch11
    options = dict(
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=8,
        num_page_override=1024,
        max_seq_len_override=512,
        cache_type="naive",  # +ch09
    )
    options.update(kwargs)
    return LLM(str(path), **options)


def trace(llm):
    """Record (phase, [uid, ...]) of every batch the scheduler runs."""
    steps, original = [], llm._forward

    def traced(forward_input):
        steps.append((forward_input.batch.phase, [r.uid for r in forward_input.batch.reqs]))
        return original(forward_input)

    llm._forward = traced
    return steps


@pytest.mark.parametrize("which", ["smollm2", "qwen3", "qwen2"])
def test_outputs_equal_hf_greedy(which, request):
    path = request.getfixturevalue(f"{which}_path")
    llm = build_llm(path)
    out = llm.generate(PROMPTS, greedy(8))
    assert [o["token_ids"] for o in out] == hf_greedy(path, PROMPTS, 8)
    llm.shutdown()


def feed_on_arrival(llm, arrivals, steps):
    """Hand prompt ``i`` (uid ``i``: the LLM's first generate) to the scheduler only from step
    ``arrivals[i]`` on, as a server's socket would; ``steps`` (filled by ``trace``) is the clock.
    Returns the original ``receive_msg``."""
    original = llm.receive_msg

    def receive(blocking=False):
        due = sum(step <= len(steps) for step in arrivals) - llm.counter
        if blocking and due == 0 and llm.pending_requests:
            due = 1  # nothing runs: a server would block until the next request comes
        later = llm.pending_requests[due:]
        llm.pending_requests = llm.pending_requests[:due]
        msgs = original(blocking)
        llm.pending_requests += later
        return msgs

    llm.receive_msg = receive
    return original


def test_requests_join_a_running_batch_and_leave_it_when_done(smollm2_path):
    """The chapter's trace (examples/ch07_scheduler.py): a request that arrives while others
    decode is prefilled at once and joins their batch; a request leaves the step its last
    token is sampled; a second generate's uids keep counting; every row and page comes back."""
    llm = build_llm(smollm2_path)
    steps = trace(llm)
    lengths, arrivals = [6, 3, 5, 1, 2], [0, 0, 2, 4, 4]
    original_receive = feed_on_arrival(llm, arrivals, steps)
    out = llm.generate(PROMPTS, [greedy(n) for n in lengths])
    ref = hf_greedy(smollm2_path, PROMPTS, max(lengths))
    assert [o["token_ids"] for o in out] == [r[:n] for r, n in zip(ref, lengths)]
    assert steps == [
        ("prefill", [0, 1]),
        ("decode", [0, 1]),
        ("prefill", [2]),  # uid2 arrives: prefill first, the decoders wait one step
        ("decode", [0, 1, 2]),  # ... and then it decodes with them
        ("prefill", [3, 4]),  # uid1 has its 3 tokens; uid3 gets its only token here
        ("decode", [0, 2, 4]),
        ("decode", [0, 2]),  # uid4 has its 2 tokens
        ("decode", [0, 2]),
    ]
    assert llm.table_manager.available_size == 8
    assert llm.cache_manager.num_free_pages == llm.engine.num_pages

    llm.receive_msg = original_receive
    second = llm.generate(PROMPTS[:2], greedy(4))
    assert [o["token_ids"] for o in second] == [r[:4] for r in ref[:2]]
    assert steps[-4] == ("prefill", [5, 6])  # uids keep counting
    assert llm.table_manager.available_size == 8
    llm.cache_manager.check_integrity()
    llm.shutdown()


def test_table_rows_limit_the_batch(qwen3_path):
    llm = build_llm(qwen3_path, max_running_req=2)
    steps = trace(llm)
    out = llm.generate(PROMPTS[:3], greedy(3))
    assert [o["token_ids"] for o in out] == hf_greedy(qwen3_path, PROMPTS[:3], 3)
    assert steps[0] == ("prefill", [0, 1])  # the third waits for a free row
    assert ("prefill", [2]) in steps
    llm.shutdown()


def test_eos_ends_a_request_and_is_not_returned(smollm2_path):
    llm = build_llm(smollm2_path)
    tok = llm.tokenizer
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], add_generation_prompt=True, tokenize=False
    )
    out = llm.generate([chat], SamplingParams(max_tokens=40))[0]["token_ids"]
    ids = torch.tensor([tok.encode(chat)])
    with torch.inference_mode():  # plain generate: EOS may end it (hf_greedy forbids that)
        ref = (
            hf_model(smollm2_path)
            .generate(ids, max_new_tokens=40, do_sample=False)[0, ids.shape[1] :]
            .tolist()
        )
    assert ref[-1] in llm.eos_token_ids and len(ref) < 40  # the model does answer and stop
    assert out == ref[:-1]
    llm.shutdown()


def test_sampling_is_seeded_and_top_k_1_is_greedy(qwen3_path):
    llm = build_llm(qwen3_path)
    hot = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True)
    first = llm.generate(PROMPTS[:2], hot)
    llm.shutdown()
    llm = build_llm(qwen3_path)
    assert llm.generate(PROMPTS[:2], hot) == first
    top1 = llm.generate(
        PROMPTS[:2], SamplingParams(temperature=0.7, top_k=1, max_tokens=6, ignore_eos=True)
    )
    assert [o["token_ids"] for o in top1] == hf_greedy(qwen3_path, PROMPTS[:2], 6)
    llm.shutdown()


def test_a_seeded_request_gives_the_same_tokens_alone_and_in_any_row_of_a_batch(qwen3_path):
    check_a_seeded_request_alone_and_in_any_row(build_llm(qwen3_path))


def check_a_seeded_request_alone_and_in_any_row(llm):
    """A seeded request gives the same tokens alone and in rows 0, 4 and 7 of a batch of
    others, seeded or not; another seed gives other tokens. Shuts ``llm`` down."""
    mine = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=10, ignore_eos=True, seed=42)
    alone = llm.generate([PROMPTS[0]], mine)[0]["token_ids"]
    others = [
        SamplingParams(
            temperature=1.0, max_tokens=4 + i, ignore_eos=True, seed=i if i % 2 else None
        )
        for i in range(7)
    ]
    for row in (0, 4, 7):
        params = others[:row] + [mine] + others[row:]
        prompts = [PROMPTS[1 + i % 4] for i in range(7)]
        out = llm.generate(prompts[:row] + [PROMPTS[0]] + prompts[row:], params)
        assert out[row]["token_ids"] == alone, row
    other_seed = llm.generate([PROMPTS[0]], SamplingParams(**{**mine.__dict__, "seed": 43}))
    assert other_seed[0]["token_ids"] != alone  # the seed does choose the draws
    llm.shutdown()


def test_logprobs_of_greedy_tokens_equal_transformers_log_softmax(qwen3_path):
    llm = build_llm(qwen3_path)
    k = 3
    outs = llm.generate(PROMPTS[:3], SamplingParams(max_tokens=8, ignore_eos=True, logprobs=k))
    model = hf_model(qwen3_path)
    for prompt, out in zip(PROMPTS, outs):
        ids = hf_encode(qwen3_path, prompt)
        with torch.no_grad():
            logits = model(torch.tensor([ids + out["token_ids"]])).logits[0, len(ids) - 1 : -1]
        ref = logits.float().log_softmax(-1)
        assert len(out["logprobs"]) == len(out["token_ids"]) == 8
        for pos, (token, (lp, top)) in enumerate(zip(out["token_ids"], out["logprobs"])):
            assert abs(lp - ref[pos, token].item()) < 1e-4
            best = ref[pos].topk(k)
            assert [t for t, _ in top] == best.indices.tolist()
            torch.testing.assert_close(
                torch.tensor([v for _, v in top]), best.values, atol=1e-4, rtol=0
            )
    plain = llm.generate(PROMPTS[:1], greedy(4))[0]
    assert "logprobs" not in plain  # only a request that asks pays for them
    llm.shutdown()


def test_too_long_prompt_raises_naming_the_request_and_limit(qwen3_path):
    llm = build_llm(qwen3_path, max_seq_len_override=16)
    with pytest.raises(ValueError, match=r"prompt 1 has 20 tokens.*limit is 16"):
        llm.generate([[1, 2, 3], list(range(20))], greedy(2))
    # nothing was admitted, and the engine still works
    assert (
        llm.generate([[1, 2, 3]], greedy(2))[0]["token_ids"]
        == hf_greedy(qwen3_path, [[1, 2, 3]], 2)[0]
    )
    llm.shutdown()


def test_max_tokens_is_cut_to_the_context(qwen3_path):
    llm = build_llm(qwen3_path, max_seq_len_override=16)
    out = llm.generate([list(range(10, 20))], greedy(100))[0]["token_ids"]
    assert len(out) == 6
    llm.shutdown()


def test_missing_model_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m tools.models smollm2"):
        LLM(str(tmp_path / "no-model"), dtype=torch.float32, device=DEVICE)


# ---- the managers on their own, no model -------------------------------------------------


def managers(num_pages=64, rows=4, page_size=1):
    page_table = torch.zeros((rows + 1, 128), dtype=torch.int32)
    table = TableManager(rows, page_table)
    cache = CacheManager(num_pages, page_size, page_table)
    decode = DecodeManager(page_size)
    return PrefillManager(cache, table, decode), cache, table, decode


def user(uid, prompt_len, max_tokens):
    return UserMsg(
        uid,
        torch.arange(1, prompt_len + 1, dtype=torch.int32),
        SamplingParams(max_tokens=max_tokens),
    )


def test_admission_is_first_come_first_served():
    prefill, *_ = managers(num_pages=64)
    for msg in [user(0, 10, 10), user(1, 50, 50), user(2, 3, 3)]:
        prefill.add_one_req(msg)
    batch = prefill.schedule_next_batch(prefill_budget=1000)
    # uid1 needs 100 KV tokens but only 44 are left: it waits, and uid2 may not jump it
    assert [r.uid for r in batch.reqs] == [0]
    assert [p.uid for p in prefill.pending_list] == [1, 2]


def test_admission_keeps_room_for_decoding_requests():
    prefill, cache, table, decode = managers(num_pages=64)
    prefill.add_one_req(user(0, 10, 20))
    first = prefill.schedule_next_batch(1000).reqs[0]
    decode.filter_reqs([first])  # it is decoding now and may still grow by 20 tokens
    prefill.add_one_req(user(1, 30, 20))
    # uid1 needs 30 + 20 = 50 of the 64 slots left, but uid0 may still grow by 20
    assert prefill.schedule_next_batch(1000) is None


def test_decode_batches_are_sorted_by_uid():
    prefill, cache, table, decode = managers()
    for uid in [3, 1, 2]:
        prefill.add_one_req(user(uid, 2, 5))
    decode.filter_reqs(prefill.schedule_next_batch(100).reqs)
    assert [r.uid for r in decode.schedule_next_batch().reqs] == [1, 2, 3]
