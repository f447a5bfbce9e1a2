"""Chapter 13: the tokenize worker and incremental detokenization, with real tokenizers."""

import functools
import random
import shutil
import threading

import pytest
import torch
from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    SampledLogprobs,
    StatsQueryMsg,
    TokenizeMsg,
    UserMsg,
)
from minisgl.message.frontend import BatchFrontendMsg, StatsReply, UserReply
from minisgl.message.utils import dumps, loads
from minisgl.tokenizer import DetokenizeManager, TokenizeManager, TokenizerWorker
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue, new_ipc_dir

TRICKY = [
    "Hi 👋🏽! Family: 👨‍👩‍👧‍👦, flags 🇫🇷🇯🇵, robot 🤖.",
    "中文字符测试：我爱北京天安门。日本語のテキスト、한국어 문장.",
    "Ünïcödé çåñ bé trîcky — “quotes” … and ½ ∑ ∞ 𝕏 𝔸.",
    "mixed\n\tlines 🎉\n\n中 end",
]


@functools.lru_cache(maxsize=None)
def load(path):
    """Each tokenizer once per session: loading Qwen3's takes seconds."""
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module", params=["qwen3", "smollm2"])
def tokenizer(request):
    return load(
        request.getfixturevalue(
            "qwen3_tokenizer_path" if request.param == "qwen3" else "smollm2_path"
        )
    )


def stream(tokenizer, ids, eos=frozenset(), ignore_eos=True, finish_reason_token=None):
    """Feed ``ids`` one token per step; returns every chunk and the last Delta."""
    dm = DetokenizeManager(tokenizer, eos)
    dm.add(0, num_prompt_tokens=4, ignore_eos=ignore_eos)
    chunks, last = [], None
    for k, t in enumerate(ids):
        [last] = dm.detokenize([DetokenizeMsg(uid=0, next_token=t, finished=k == len(ids) - 1)])
        chunks.append(last.text)
    assert dm.status == {}  # a finished request is forgotten
    return chunks, last


@pytest.mark.parametrize("text", TRICKY, ids=["emoji", "cjk", "symbols", "newlines"])
def test_streamed_text_has_no_broken_characters_and_equals_the_full_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    broken = sum("\ufffd" in tokenizer.decode([i]) for i in ids)
    chunks, last = stream(tokenizer, ids)
    assert all("\ufffd" not in c for c in chunks), chunks
    assert "".join(chunks) == tokenizer.decode(ids) == text
    if broken:  # some tokens are parts of a character: the stream waited for the rest
        assert chunks.count("") > 0
    assert (last.finish_reason, last.num_output_tokens, last.num_prompt_tokens) == (
        "length",
        len(ids),
        4,
    )


def test_random_tokens_still_concatenate_to_the_full_decode(tokenizer):
    """Arbitrary ids may decode to genuine U+FFFD; the stream may hold them back but must
    never lose or duplicate text."""
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 40))]
        chunks, _ = stream(tokenizer, ids)
        assert "".join(chunks) == tokenizer.decode(ids)
        assert all(not c.endswith("\ufffd") for c in chunks[:-1])


def test_a_final_eos_is_not_text_and_means_stop(qwen3_tokenizer_path):
    tok = load(qwen3_tokenizer_path)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode("Bonjour 🇫🇷", add_special_tokens=False) + [eos]
    chunks, last = stream(tok, ids, eos={eos}, ignore_eos=False)
    assert "".join(chunks) == "Bonjour 🇫🇷"
    assert (last.finish_reason, last.num_output_tokens) == (
        "stop",
        len(ids),
    )  # EOS counted in usage
    chunks, last = stream(tok, ids, eos={eos}, ignore_eos=True)  # ignore_eos: an ordinary token
    assert "".join(chunks) == "Bonjour 🇫🇷<|im_end|>" and last.finish_reason == "length"


def test_requests_interleave_and_forgotten_ones_are_skipped(qwen3_tokenizer_path):
    tok = load(qwen3_tokenizer_path)
    a, b = (
        tok.encode("中文字符测试", add_special_tokens=False),
        tok.encode("emoji 🤖🎉!", add_special_tokens=False),
    )
    dm = DetokenizeManager(tok, frozenset())
    for uid in (1, 2, 3):
        dm.add(uid, 1, True)
    dm.forget(3)
    out = {1: "", 2: ""}
    for k in range(max(len(a), len(b))):
        msgs = [DetokenizeMsg(3, 100, False)]  # unknown now: no reply at all
        msgs += [DetokenizeMsg(1, a[k], k == len(a) - 1)] if k < len(a) else []
        msgs += [DetokenizeMsg(2, b[k], k == len(b) - 1)] if k < len(b) else []
        for d in dm.detokenize(msgs):
            out[d.uid] += d.text
    assert out == {1: "中文字符测试", 2: "emoji 🤖🎉!"}


def test_a_refused_request_gets_its_error(qwen3_tokenizer_path):
    dm = DetokenizeManager(load(qwen3_tokenizer_path), frozenset())
    dm.add(5, 9000, False)
    [d] = dm.detokenize([DetokenizeMsg(5, -1, True, error="prompt too long")])
    assert (d.text, d.finished, d.error, d.finish_reason, d.num_output_tokens) == (
        "",
        True,
        "prompt too long",
        None,
        0,
    )


def test_chat_requests_get_the_chat_template(tokenizer):
    tm = TokenizeManager(tokenizer)
    chat = [{"role": "user", "content": "What is 2+2? 🤔"}]
    [prompt_ids] = tm.tokenize([TokenizeMsg(0, chat, SamplingParams())])
    rendered = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert prompt_ids.dtype == torch.int32
    assert prompt_ids.tolist() == tokenizer.encode(rendered, add_special_tokens=False)
    assert tokenizer.decode(prompt_ids.tolist()) == rendered and rendered.rstrip().endswith(
        "assistant"
    )
    [plain] = tm.tokenize([TokenizeMsg(1, "The capital of France is", SamplingParams())])
    assert plain.tolist() == tokenizer.encode("The capital of France is")  # as the offline LLM does


def test_a_tokenizer_without_chat_template_says_so(qwen3_tokenizer_path):
    tok = load(qwen3_tokenizer_path)
    template, tok.chat_template = tok.chat_template, None
    try:
        with pytest.raises(ValueError, match="no chat template"):
            TokenizeManager(tok).tokenize(
                [TokenizeMsg(0, [{"role": "user", "content": "hi"}], SamplingParams())]
            )
    finally:
        tok.chat_template = template


def test_several_steps_of_a_request_in_one_call(qwen3_tokenizer_path):
    """The worker drains its queue, so one call may hold several tokens of one request."""
    tok = load(qwen3_tokenizer_path)
    ids = tok.encode("a 👋🏽 b 中文 c", add_special_tokens=False)
    dm = DetokenizeManager(tok, frozenset())
    dm.add(0, 1, True)
    dm.add(1, 1, True)
    msgs = [DetokenizeMsg(u, t, k == len(ids) - 1) for k, t in enumerate(ids) for u in (0, 1)]
    deltas = dm.detokenize(msgs[:5]) + dm.detokenize(msgs[5:])
    assert [d.uid for d in deltas] == [m.uid for m in msgs]
    assert "".join(d.text for d in deltas if d.uid == 0) == "a 👋🏽 b 中文 c"
    assert "".join(d.text for d in deltas if d.uid == 1) == "a 👋🏽 b 中文 c"


def test_the_worker_between_api_server_and_scheduler(smollm2_path):
    """Drive a real TokenizerWorker over ipc:// from both sides, as the server does."""
    d = new_ipc_dir()
    addr, backend, frontend = (f"ipc://{d}/{n}" for n in ("worker", "backend", "frontend"))
    worker = TokenizerWorker(str(smollm2_path), addr, backend, frontend)
    from_worker_to_backend = ZmqPullQueue(backend, create=True, decoder=loads)
    from_worker_to_frontend = ZmqPullQueue(frontend, create=True, decoder=loads)
    to_worker = ZmqPushQueue(addr, create=False, encoder=dumps)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        to_worker.put(
            TokenizeMsg(uid=1, text="Hello 🌍", sampling_params=SamplingParams(max_tokens=3))
        )
        msg = from_worker_to_backend.get()
        tok = worker.tokenize_manager.tokenizer
        assert isinstance(msg, UserMsg) and msg.input_ids.tolist() == tok.encode("Hello 🌍")

        out_ids = tok.encode(" 世界 ✓", add_special_tokens=False)
        last = len(out_ids) - 1
        to_worker.put(
            BatchTokenizerMsg(data=[DetokenizeMsg(1, t, i == last) for i, t in enumerate(out_ids)])
        )
        replies = []
        while not (replies and replies[-1].finished):
            got = from_worker_to_frontend.get()
            replies += got.data if isinstance(got, BatchFrontendMsg) else [got]
        assert all(isinstance(r, UserReply) for r in replies)
        assert "".join(r.incremental_output for r in replies) == " 世界 ✓"
        assert (replies[-1].num_prompt_tokens, replies[-1].num_output_tokens) == (
            len(msg.input_ids),
            len(out_ids),
        )

        to_worker.put(StatsQueryMsg(uid=9))  # passed on to the scheduler unchanged
        assert from_worker_to_backend.get() == StatsQueryMsg(uid=9)
        to_worker.put(StatsReply(uid=9, stats={"x": 1}))  # and the answer back to the API server
        assert from_worker_to_frontend.get() == StatsReply(uid=9, stats={"x": 1})
        to_worker.put(AbortMsg(uid=1))
        assert from_worker_to_backend.get().uid == 1
        to_worker.put(
            TokenizeMsg(uid=2, text=[{"role": "bogus"}], sampling_params=SamplingParams())
        )
        bad = (
            from_worker_to_frontend.get()
        )  # a bad chat message: an error reply, the worker lives on
        assert bad.uid == 2 and bad.finished and "cannot tokenize" in bad.error
        to_worker.put(ExitMsg())
        thread.join(10)
        assert not thread.is_alive()
    finally:
        for q in (to_worker, from_worker_to_backend, from_worker_to_frontend):
            q.stop()
        worker.stop()
        shutil.rmtree(d, ignore_errors=True)


# ---- stop sequences: hold back what may be a stop string -------------------------------


def _feed_all(checker, pieces):
    """Everything ``checker`` lets out for ``pieces``, chunk by chunk, and whether it stopped."""
    out = []
    for piece in pieces:
        text, stopped = checker.feed(piece)
        out.append(text)
        if stopped:
            return out, True
    return out + [checker.flush()], False


def test_a_stop_string_split_over_pieces_is_never_sent():
    from minisgl.tokenizer.stop import StopChecker

    out, stopped = _feed_all(StopChecker(["###"]), ["Hello #", "#", "# world"])
    assert stopped and "".join(out) == "Hello " and out[0] == "Hello "  # "#" was held back
    out, stopped = _feed_all(StopChecker(["###"]), ["a #", "b ##", "c"])
    assert not stopped and "".join(out) == "a #b ##c"  # held, then released


def test_stop_checker_equals_cutting_the_whole_text_at_the_first_stop():
    """Random texts over a small alphabet, random splits, random stops: the output is the
    text before the earliest stop, and no chunk ever holds the beginning of a stop string
    that then completes."""
    from minisgl.tokenizer.stop import StopChecker

    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice("ab\n") for _ in range(rng.randint(0, 30)))
        stops = ["".join(rng.choice("ab\n") for _ in range(rng.randint(1, 4))) for _ in range(2)]
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        out, stopped = _feed_all(StopChecker(stops), pieces)
        hits = [i for i in (text.find(s) for s in stops) if i != -1]
        assert "".join(out) == (text[: min(hits)] if hits else text), (text, stops, pieces)
        assert stopped == bool(hits)


def test_the_detokenizer_stops_on_a_string_and_on_a_token_id(smollm2_path):
    tok = load(smollm2_path)
    ids = tok.encode("One, two, three, four, five, six.")
    full = tok.decode(ids)
    stop = ", fo"  # spans tokens: ", " "four"
    dm = DetokenizeManager(tok, frozenset())
    dm.add(0, 3, True, stop=[stop])
    dm.add(1, 3, True, stop_token_ids=[ids[4]])
    sent = {0: [], 1: []}
    last = {}
    for k, t in enumerate(ids):
        msgs = [DetokenizeMsg(uid=u, next_token=t, finished=k == len(ids) - 1) for u in (0, 1)]
        for d in dm.detokenize(msgs):
            sent[d.uid].append(d.text)
            last[d.uid] = (d, k)
    assert "".join(sent[0]) == full[: full.index(stop)]
    d0, k0 = last[0]
    assert d0.finished and d0.finish_reason == "stop" and d0.abort  # the scheduler is told
    assert d0.num_output_tokens == k0 + 1 < len(ids)
    d1, k1 = last[1]
    assert "".join(sent[1]) == tok.decode(ids[:4]) and k1 == 4  # the stop token is not text
    assert d1.finish_reason == "stop" and d1.abort and dm.status == {}


# ---- logprobs: one entry per token, in step with the text ----------------------------------


def stream_logprobs(tokenizer, ids, stop=(), eos=frozenset()):
    """Feed ``ids`` with logprob ``-k`` for the k-th token (and alternatives ``ids[k]``,
    ``ids[k] + 1``); returns (text, entries) per delta and the last Delta."""
    dm = DetokenizeManager(tokenizer, eos)
    dm.add(0, 4, ignore_eos=not eos, stop=list(stop), logprobs=True)
    out, last = [], None
    for k, t in enumerate(ids):
        lp = SampledLogprobs(-float(k), top_ids=[t, t + 1], top_logprobs=[-0.5, -1.5])
        msg = DetokenizeMsg(0, t, k == len(ids) - 1, logprobs=lp)
        for d in dm.detokenize([msg]):
            out.append((d.text, d.logprobs))
            last = d
        if last is not None and last.finished:
            break
    assert dm.status == {}
    return out, last


@pytest.mark.parametrize("text", TRICKY, ids=["emoji", "cjk", "symbols", "newlines"])
def test_logprob_entries_follow_the_text_and_carry_the_tokens_bytes(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    out, _ = stream_logprobs(tokenizer, ids)
    entries = [e for _, chunk in out for e in chunk]
    assert [e.logprob for e in entries] == [
        -float(k) for k in range(len(ids))
    ]  # none lost or repeated
    assert bytes(b for e in entries for b in e.bytes).decode("utf-8") == tokenizer.decode(ids)
    sent = 0
    for chunk_text, chunk in out:
        sent += len(chunk_text)
        assert all(e.text_offset <= sent for e in chunk)  # never ahead of the text
    offsets = [e.text_offset for e in entries]
    assert offsets == sorted(offsets)
    top = entries[0].top_logprobs
    assert [t.logprob for t in top] == [-0.5, -1.5] and top[0].token == tokenizer.decode(ids[:1])


def test_logprob_entries_are_held_back_with_the_text_and_cut_at_a_stop(smollm2_path):
    tok = load(smollm2_path)
    ids = tok.encode("One, two, three, four, five, six.")
    for stop in (", fo", ", f", "ee", "six", "seven"):
        out, last = stream_logprobs(tok, ids, stop=[stop])
        text = "".join(t for t, _ in out)
        entries = [e for _, chunk in out for e in chunk]
        # the entries are exactly the tokens that contributed text before the cut
        kept = [k for k in range(len(ids)) if len(tok.decode(ids[:k])) < len(text)]
        assert [e.logprob for e in entries] == [-float(k) for k in kept], stop
        assert [e.text_offset for e in entries] == [len(tok.decode(ids[:k])) for k in kept]
        sent = 0
        for chunk_text, chunk in out[:-1]:  # until the end, only wholly sent tokens go out
            sent += len(chunk_text)
            assert all(e.text_offset + len(e.token) <= sent for e in chunk), stop
        assert last.finish_reason == ("length" if stop == "seven" else "stop")


def test_a_final_eos_gets_no_logprob_entry(qwen3_tokenizer_path):
    tok = load(qwen3_tokenizer_path)
    ids = tok.encode("Hello world") + [tok.convert_tokens_to_ids("<|im_end|>")]
    out, last = stream_logprobs(tok, ids, eos=frozenset({ids[-1]}))
    assert len([e for _, chunk in out for e in chunk]) == len(ids) - 1
    assert last.finish_reason == "stop" and last.num_output_tokens == len(ids)
