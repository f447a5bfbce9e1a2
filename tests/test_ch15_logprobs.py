"""Chapter 15 (and chapter 6's seeds): ``seed``, ``logprobs`` and ``top_logprobs`` over HTTP,
on the shared SmolLM2 server, against the offline LLM with the same settings."""

import asyncio
import math

import httpx
import pytest

from minisgl.core import SamplingParams
from tests.helpers.server import offline_llm

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name two colours."}]


@pytest.fixture(scope="module")
def offline(smollm2_path):
    llm = offline_llm(smollm2_path)
    yield llm
    llm.shutdown()


def post(server, endpoint, **body):
    r = httpx.post(f"{server.url}/v1/{endpoint}", json={"model": MODEL, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def stream_events(server, endpoint, **body):
    """The JSON payloads of a streamed answer, ``[DONE]`` excluded."""
    import json

    events = []
    with httpx.stream(
        "POST",
        f"{server.url}/v1/{endpoint}",
        json={"model": MODEL, "stream": True, **body},
        timeout=120,
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


HOT = dict(temperature=1.0, top_p=0.95, max_tokens=10, ignore_eos=True)


def test_a_seeded_completion_is_reproducible_alone_batched_and_streamed(server, offline):
    want = offline.generate([PROMPT], SamplingParams(**HOT, seed=7))[0]["text"]
    alone = post(server, "completions", prompt=PROMPT, seed=7, **HOT)["choices"][0]["text"]
    assert alone == want  # the server's draws are the offline engine's: seed and position only

    async def many():
        async with httpx.AsyncClient(timeout=120) as client:

            async def one(i):
                body = {"model": MODEL, "prompt": PROMPT if i == 3 else f"Count to {i}:", **HOT}
                body["seed"] = 7 if i == 3 else (i if i % 2 else None)
                r = await client.post(f"{server.url}/v1/completions", json=body)
                return r.json()["choices"][0]["text"]

            return await asyncio.gather(*(one(i) for i in range(8)))

    assert (await_(many()))[3] == want
    chunks = stream_events(server, "completions", prompt=PROMPT, seed=7, **HOT)
    assert "".join(c["choices"][0]["text"] for c in chunks) == want
    other = post(server, "completions", prompt=PROMPT, seed=8, **HOT)["choices"][0]["text"]
    assert other != want


def await_(coro):
    return asyncio.run(coro)


def _check_chat_entries(content, k):
    for e in content:
        tops = e["top_logprobs"]
        assert len(tops) == k and all(math.isfinite(t["logprob"]) for t in tops)
        assert [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
        assert tops[0]["token"] == e["token"] and tops[0]["logprob"] == e["logprob"]  # greedy
        assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] or "\ufffd" in e["token"]


def test_chat_logprobs_equal_the_offline_engines_streamed_or_not(server, offline):
    out = post(
        server,
        "chat/completions",
        messages=CHAT,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    choice = out["choices"][0]
    content = choice["logprobs"]["content"]
    text = choice["message"]["content"]
    assert "".join(e["token"] for e in content) == text
    n_text_tokens = out["usage"]["completion_tokens"] - (choice["finish_reason"] == "stop")
    assert len(content) == n_text_tokens  # a final EOS is not text and has no entry
    _check_chat_entries(content, 3)
    chat_text = offline.tokenizer.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )
    ids = offline.tokenizer.encode(chat_text, add_special_tokens=False)
    ref = offline.generate([ids], SamplingParams(max_tokens=12, logprobs=3))[0]
    for e, (lp, top) in zip(content, ref["logprobs"]):
        assert abs(e["logprob"] - lp) < 1e-4
        assert [t["token"] for t in e["top_logprobs"]] == [
            offline.tokenizer.decode([i]) for i, _ in top
        ]

    chunks = stream_events(
        server,
        "chat/completions",
        messages=CHAT,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    streamed = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0].get("logprobs")
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    # the second run finds the prompt in the prefix cache: equal up to float rounding
    assert [e["token"] for e in streamed] == [e["token"] for e in content]
    assert all(abs(a["logprob"] - b["logprob"]) < 1e-4 for a, b in zip(streamed, content))
    for c in chunks:  # each chunk's entries spell that chunk's text
        delta = c["choices"][0]["delta"] if c["choices"] else {}
        if c["choices"] and c["choices"][0].get("logprobs"):
            assert "".join(e["token"] for e in c["choices"][0]["logprobs"]["content"]) == delta.get(
                "content", ""
            )


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_in_the_legacy_shape(server, stream):
    body = dict(prompt=PROMPT, max_tokens=10, temperature=0, logprobs=2, stop=["is:"])
    if stream:
        chunks = stream_events(server, "completions", **body)
        text = "".join(c["choices"][0]["text"] for c in chunks)
        reason = chunks[-1]["choices"][0]["finish_reason"]
        lps = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for c in chunks:
            for key in lps:
                lps[key] += c["choices"][0]["logprobs"][key]
    else:
        choice = post(server, "completions", **body)["choices"][0]
        text, lps, reason = choice["text"], choice["logprobs"], choice["finish_reason"]
    tokens = lps["tokens"]
    assert reason == "stop" and text.endswith("answer ")  # " Paris.\n\nThe answer is: 2"
    # the token " is" straddles the cut: it gave the answer its last space, so it is listed
    assert "".join(tokens) == text + "is"
    assert lps["text_offset"] == [len("".join(tokens[:i])) for i in range(len(tokens))]
    for tok, lp, top in zip(tokens, lps["token_logprobs"], lps["top_logprobs"]):
        assert tok in top and top[tok] == lp and len(top) <= 3 and lp <= 0
        assert lp == max(top.values())  # greedy: the sampled token is the most likely


def test_without_logprobs_the_field_is_null(server):
    out = post(server, "completions", prompt=PROMPT, max_tokens=3, temperature=0)
    assert out["choices"][0]["logprobs"] is None
    out = post(server, "chat/completions", messages=CHAT, max_tokens=3, logprobs=False)
    assert out["choices"][0]["logprobs"] is None


def test_the_openai_client_reads_the_logprobs(server):
    client = server.client()
    out = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=4, logprobs=True, top_logprobs=2, seed=3
    )
    entry = out.choices[0].logprobs.content[0]
    assert len(entry.top_logprobs) == 2 and entry.logprob <= 0 and entry.bytes


def test_entries_go_on_the_chunk_with_their_text_or_on_the_closing_one():
    from minisgl.message.frontend import TokenLogprob, UserReply
    from minisgl.server.api_server import chat_chunks, completion_chunks
    from minisgl.server.logprobs import with_chat_logprobs, with_completion_logprobs

    head = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
    entry = TokenLogprob("Hi", [72, 105], -0.5, 0)
    mid = UserReply(1, "Hi", False, logprobs=[entry])
    role, text = with_chat_logprobs(chat_chunks(head, mid, True), mid)
    assert "logprobs" not in role["choices"][0]
    assert text["choices"][0]["logprobs"]["content"][0]["bytes"] == [72, 105]
    last = UserReply(1, "", True, "stop", logprobs=[entry])  # entries released at the end only
    [closing] = with_chat_logprobs(chat_chunks(head, last, False), last)
    assert closing["choices"][0]["finish_reason"] == "stop"
    assert closing["choices"][0]["logprobs"]["content"][0]["token"] == "Hi"
    [chunk] = with_completion_logprobs(completion_chunks(head, last, False), last)
    assert chunk["choices"][0]["logprobs"]["tokens"] == ["Hi"]
    floor = TokenLogprob("x", [120], float("-inf"), 0)
    done = UserReply(1, "x", True, logprobs=[floor])
    [chunk] = with_completion_logprobs(completion_chunks(head, done, False), done)
    assert chunk["choices"][0]["logprobs"]["token_logprobs"] == [-9999.0]  # JSON has no -inf
