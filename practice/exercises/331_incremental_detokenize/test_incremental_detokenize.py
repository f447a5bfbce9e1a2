"""Exercise 331: DetokenizeManager.detokenize with the real Qwen3 tokenizer.

Every stream is checked against ``tokenizer.decode`` of the same ids (the oracle), never
against text typed here, except where the text is the input that was encoded.
"""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from minisgl.message import DetokenizeMsg
from minisgl.tokenizer import DetokenizeManager

TEXTS = {
    "emoji": "Hi 👋🏽! Flags 🇫🇷🇯🇵, family 👨‍👩‍👧, robot 🤖.",
    "cjk": "我爱北京天安门。日本語のテキスト、한국어 문장.",
    "symbols": "naïve café — “quotes” … ½ ∑ ∞ 𝕏",
    "mixed": "line one 🎉\n\tline two 中 end",
}
BROKEN = "\ufffd"


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_path):
    return AutoTokenizer.from_pretrained(qwen3_tokenizer_path)


def stream(tok, ids, eos=frozenset(), ignore_eos=True, uid=0, prompt_len=5):
    """Send ``ids`` one per call, the last one finished; return the Deltas."""
    dm = DetokenizeManager(tok, eos)
    dm.add(uid, num_prompt_tokens=prompt_len, ignore_eos=ignore_eos)
    deltas = []
    for k, t in enumerate(ids):
        out = dm.detokenize([DetokenizeMsg(uid=uid, next_token=t, finished=k == len(ids) - 1)])
        assert len(out) == 1, f"one message of a known request gives one Delta, got {out}"
        deltas.append(out[0])
    assert dm.status == {}, "a finished request must be forgotten (status still holds it)"
    return deltas


def show(ids, tok):
    return [tok.decode([i]) for i in ids]


@pytest.mark.parametrize("name", list(TEXTS))
def test_no_chunk_holds_a_broken_character(tok, name):
    ids = tok.encode(TEXTS[name], add_special_tokens=False)
    chunks = [d.text for d in stream(tok, ids)]
    bad = [(k, c) for k, c in enumerate(chunks) if BROKEN in c]
    assert not bad, (
        f"chunks {bad[:3]} contain U+FFFD: those tokens are part of one character "
        f"(alone they decode to {show(ids, tok)[:8]}...); wait for the rest"
    )


@pytest.mark.parametrize("name", list(TEXTS))
def test_the_stream_equals_the_full_decode(tok, name):
    ids = tok.encode(TEXTS[name], add_special_tokens=False)
    chunks = [d.text for d in stream(tok, ids)]
    full = tok.decode(ids)
    assert "".join(chunks) == full, (
        f"streamed {''.join(chunks)!r}\n   decode {full!r}\n   chunks {chunks}"
    )


@pytest.mark.parametrize("name", list(TEXTS))
def test_every_prefix_of_the_stream_is_final_text(tok, name):
    """What was sent cannot be taken back: each prefix must already be right."""
    ids = tok.encode(TEXTS[name], add_special_tokens=False)
    full, sent = tok.decode(ids), ""
    for k, d in enumerate(stream(tok, ids)):
        sent += d.text
        assert full.startswith(sent), (
            f"after token {k} the stream is {sent!r}, not a prefix of {full!r}"
        )


def test_the_stream_waits_inside_a_character(tok):
    # Qwen3 has "👋" as one token but splits " 👋" (space included) into bytes
    text = next(
        t
        for t in (" 👋", " 🤖", " 🦀")
        if BROKEN in tok.decode(tok.encode(t, add_special_tokens=False)[:1])
    )
    ids = tok.encode(text, add_special_tokens=False)
    chunks = [d.text for d in stream(tok, ids)]
    assert chunks[:-1] == [""] * (len(ids) - 1) and chunks[-1] == text, (
        f"{text!r} is {len(ids)} tokens {show(ids, tok)}: send '' until its last token, then {text!r}; sent {chunks}"
    )


def test_spaces_between_words_survive(tok):
    text = "The quick brown fox jumps over the lazy dog,  twice."
    ids = tok.encode(text, add_special_tokens=False)
    chunks = [d.text for d in stream(tok, ids)]
    assert "".join(chunks) == text, f"got {''.join(chunks)!r} from chunks {chunks}"


@pytest.mark.parametrize("source", ["published", "drawn"])
def test_random_ids_still_add_up_to_the_full_decode(tok, source, drawn_seed):
    # the published ids hold a genuine U+FFFD; the drawn ones are new in every judged run
    rng = random.Random(1 if source == "published" else drawn_seed)
    for trial in range(30):
        ids = [rng.randrange(151643) for _ in range(rng.randrange(1, 30))]
        chunks = [d.text for d in stream(tok, ids)]
        assert "".join(chunks) == tok.decode(ids), (
            f"trial {trial}: ids {ids} streamed {''.join(chunks)!r}, decode is {tok.decode(ids)!r}"
        )


def test_a_final_eos_is_not_text_and_means_stop(tok):
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode("Bonjour 🇫🇷", add_special_tokens=False) + [eos]
    deltas = stream(tok, ids, eos={eos}, ignore_eos=False)
    text = "".join(d.text for d in deltas)
    assert text == tok.decode(ids[:-1]), f"the final EOS is not part of the text: got {text!r}"
    last = deltas[-1]
    assert (last.finished, last.finish_reason) == (True, "stop"), (
        f"ended on EOS: finish_reason 'stop', got {last}"
    )
    assert last.num_output_tokens == len(ids), (
        f"the EOS counts as an output token: {len(ids)}, got {last.num_output_tokens}"
    )
    assert all(d.finish_reason is None and not d.finished for d in deltas[:-1]), (
        "only the last Delta finishes"
    )


def test_ignore_eos_makes_it_an_ordinary_token(tok):
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode("Bonjour", add_special_tokens=False) + [eos]
    deltas = stream(tok, ids, eos={eos}, ignore_eos=True)
    assert "".join(d.text for d in deltas) == tok.decode(ids)
    assert deltas[-1].finish_reason == "length", (
        f"ignore_eos: the request ran to max_tokens, got {deltas[-1]}"
    )


def test_an_eos_that_is_not_last_is_text(tok):
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = [eos] + tok.encode(" ok", add_special_tokens=False)
    deltas = stream(tok, ids, eos={eos}, ignore_eos=False)
    assert (
        "".join(d.text for d in deltas) == tok.decode(ids) and deltas[-1].finish_reason == "length"
    )


def test_counters_ride_on_every_delta(tok):
    ids = tok.encode("中文 ok", add_special_tokens=False)
    deltas = stream(tok, ids, prompt_len=42)
    got = [(d.num_prompt_tokens, d.num_output_tokens) for d in deltas]
    assert got == [(42, k + 1) for k in range(len(ids))], (
        f"(prompt, output) tokens per delta: {got}"
    )


def test_requests_interleave_and_unknown_ones_are_skipped(tok):
    a = tok.encode("中文字符", add_special_tokens=False)
    b = tok.encode("emoji 🤖🎉!", add_special_tokens=False)
    dm = DetokenizeManager(tok, frozenset())
    for uid in (1, 2, 3):
        dm.add(uid, 1, True)
    dm.forget(3)
    out = {1: "", 2: ""}
    for k in range(max(len(a), len(b))):
        msgs = [DetokenizeMsg(3, 100, False), DetokenizeMsg(77, 5, False)]  # forgotten, never added
        msgs += [DetokenizeMsg(1, a[k], k == len(a) - 1)] if k < len(a) else []
        msgs += [DetokenizeMsg(2, b[k], k == len(b) - 1)] if k < len(b) else []
        deltas = dm.detokenize(msgs)
        assert [d.uid for d in deltas] == [m.uid for m in msgs if m.uid in (1, 2)], (
            f"one Delta per message of a known request, in order; got uids {[d.uid for d in deltas]}"
        )
        for d in deltas:
            out[d.uid] += d.text
    assert out == {1: tok.decode(a), 2: tok.decode(b)}, out


def test_several_tokens_of_one_request_in_one_call(tok):
    ids = tok.encode("a 👋🏽 b 中文 c", add_special_tokens=False)
    dm = DetokenizeManager(tok, frozenset())
    dm.add(0, 1, True)
    dm.add(1, 1, True)
    msgs = [DetokenizeMsg(u, t, k == len(ids) - 1) for k, t in enumerate(ids) for u in (0, 1)]
    deltas = dm.detokenize(msgs[:7]) + dm.detokenize(msgs[7:])
    assert [d.uid for d in deltas] == [m.uid for m in msgs], (
        "one Delta per message, in message order"
    )
    for uid in (0, 1):
        got = [d.text for d in deltas if d.uid == uid]
        assert "".join(got) == tok.decode(ids) and all(BROKEN not in c for c in got), (
            f"request {uid}: {got}"
        )


def test_a_refused_request_gets_its_error(tok):
    dm = DetokenizeManager(tok, frozenset())
    dm.add(5, 9000, False)
    [d] = dm.detokenize([DetokenizeMsg(5, -1, True, error="prompt too long")])
    got = (d.uid, d.text, d.finished, d.error, d.finish_reason, d.num_output_tokens)
    assert got == (5, "", True, "prompt too long", None, 0), f"got {got}"
    assert dm.status == {}, "the refused request must be forgotten"
