"""Exercise 351: the server's streamed answers, as Server-Sent Events.

No model and no worker process: replies are scripted ``UserReply`` objects. The chunk
functions and ``sse_stream`` are called directly, then the real FastAPI app runs on a
stand-in ``FrontendManager`` and is read by the official ``openai`` client (in process,
through httpx's ASGI transport), which is the strictest judge of the format.
"""

from __future__ import annotations

import asyncio
import json
import random
import types
from typing import AsyncGenerator, Dict, List

import httpx
import openai

from minisgl.message.frontend import UserReply
from minisgl.server.api_server import (
    _sse,
    chat_chunks,
    completion_chunks,
    create_app,
    generate_chunks,
    sse_stream,
    usage_chunk,
)

HEAD = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}


def script(*texts: str, reason: str = "stop", prompt: int = 5) -> List[UserReply]:
    """Replies for ``texts``; the last one finished, with token counts."""
    return [
        UserReply(
            uid=0,
            incremental_output=t,
            finished=k == len(texts) - 1,
            finish_reason=reason if k == len(texts) - 1 else None,
            num_prompt_tokens=prompt,
            num_output_tokens=k + 1,
        )
        for k, t in enumerate(texts)
    ]


class Source:
    """The replies after the first, as ``FrontendManager.replies`` gives them (``anext`` and
    ``aclose``), recording how many were taken and whether it was closed."""

    def __init__(self, replies: List[UserReply]) -> None:
        self.replies, self.closed, self.taken = replies, False, 0

    def gen(self) -> "Source":
        return self

    def __aiter__(self) -> "Source":
        return self

    async def __anext__(self) -> UserReply:
        if self.closed:
            raise RuntimeError("read from the replies after closing them")
        if self.taken == len(self.replies):
            raise AssertionError("read past the finished reply: nothing comes after it")
        self.taken += 1
        await asyncio.sleep(0)
        return self.replies[self.taken - 1]

    async def aclose(self) -> None:
        self.closed = True


def events(raw: bytes) -> List[str]:
    """Split an SSE body into its ``data`` payloads, checking the framing on the way."""
    text = raw.decode()
    assert text.endswith("\n\n"), (
        f"every event ends with a blank line; the body ends with {text[-20:]!r}"
    )
    out = []
    for block in text[:-2].split("\n\n"):
        assert block.startswith("data: ") and "\n" not in block, (
            f"an event is one 'data: ...' line, got {block!r}"
        )
        out.append(block[len("data: ") :])
    return out


def run_stream(replies: List[UserReply], chunker, usage=None) -> tuple[List[str], Source]:
    src = Source(replies[1:])

    async def main() -> bytes:
        return b"".join([e async for e in sse_stream(replies[0], src.gen(), chunker, usage)])

    return events(asyncio.run(main())), src


# ---- one event -------------------------------------------------------------------------


def test_an_event_is_a_data_line_and_a_blank_line():
    assert _sse("[DONE]") == b"data: [DONE]\n\n", _sse("[DONE]")
    raw = _sse({"text": '中文 "q"\n', "n": 1})
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n") and raw.count(b"\n") == 2, (
        f"the JSON must stay on one line (newlines in text escaped), got {raw!r}"
    )
    assert json.loads(raw[6:]) == {"text": '中文 "q"\n', "n": 1}


# ---- chunks of each endpoint ---------------------------------------------------------------


def test_completion_chunks_carry_the_new_text():
    [c] = completion_chunks(HEAD, UserReply(0, "Hello", False), True)
    assert {k: c[k] for k in HEAD} == HEAD, (
        f"each chunk starts with the head (id, object, created, model): {c}"
    )
    assert c["choices"] == [
        {"index": 0, "text": "Hello", "logprobs": None, "finish_reason": None}
    ], c["choices"]
    assert completion_chunks(HEAD, UserReply(0, "", False), False) == [], (
        "a reply with no new text (a character still incomplete) sends nothing"
    )
    [last] = completion_chunks(HEAD, UserReply(0, "", True, "length"), False)
    assert last["choices"][0]["finish_reason"] == "length" and last["choices"][0]["text"] == "", (
        last
    )


def test_chat_chunks_open_with_the_role_and_close_with_the_reason():
    first = chat_chunks(HEAD, UserReply(0, "Hi", False), True)
    assert [c["choices"][0]["delta"] for c in first] == [
        {"role": "assistant", "content": ""},
        {"content": "Hi"},
    ], f"the first reply: a delta with the role, then one with the text; got {first}"
    assert chat_chunks(HEAD, UserReply(0, "", False), False) == []
    mid = chat_chunks(HEAD, UserReply(0, " there", False), False)
    assert [c["choices"][0] for c in mid] == [
        {"index": 0, "delta": {"content": " there"}, "finish_reason": None}
    ]
    last = chat_chunks(HEAD, UserReply(0, "!", True, "stop"), False)
    assert [c["choices"][0] for c in last] == [
        {"index": 0, "delta": {"content": "!"}, "finish_reason": None},
        {"index": 0, "delta": {}, "finish_reason": "stop"},
    ], f"text, then an empty delta with the reason: {last}"


def test_a_one_reply_chat_answer_has_all_three_chunks():
    only = chat_chunks(HEAD, UserReply(0, "Yes", True, "stop"), True)
    assert [c["choices"][0]["delta"] for c in only] == [
        {"role": "assistant", "content": ""},
        {"content": "Yes"},
        {},
    ]
    assert only[-1]["choices"][0]["finish_reason"] == "stop"


def test_generate_chunks_and_usage():
    assert generate_chunks(UserReply(0, "ab", False), True) == [{"text": "ab"}]
    assert generate_chunks(UserReply(0, "", False), False) == []
    last = generate_chunks(
        UserReply(0, "c", True, "stop", num_prompt_tokens=4, num_output_tokens=3), False
    )
    assert last == [
        {
            "text": "c",
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
        }
    ], last
    u = usage_chunk(HEAD, UserReply(0, "", True, "stop", num_prompt_tokens=4, num_output_tokens=3))
    assert u["choices"] == [] and u["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 3,
        "total_tokens": 7,
    }, u


# ---- the stream ------------------------------------------------------------------------------


def test_the_stream_ends_with_done():
    replies = script("The", " capital", "", " is", reason="length")
    got, src = run_stream(replies, lambda r, first: completion_chunks(HEAD, r, first))
    assert got[-1] == "[DONE]", f"the last event is data: [DONE], got {got[-1]!r}"
    chunks = [json.loads(e) for e in got[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "The capital is"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"], (
        f"one chunk per reply with text (3), the last with finish_reason: {[c['choices'] for c in chunks]}"
    )
    assert src.taken == 3 and src.closed, "read every reply after the first, then close the replies"


def test_drawn_streams_carry_every_piece_of_text_then_done(drawn_seed):
    """Replies of drawn text, some empty (each judged run draws new ones): the chunks carry
    the text in order, one per reply with text (the last one always), then ``[DONE]``."""
    rng = random.Random(drawn_seed)
    for _ in range(10):
        pieces = [
            "".join(
                rng.choice(["a", " b", "é", "中", '"', "\n", ""]) for _ in range(rng.randint(0, 3))
            )
            for _ in range(rng.randint(1, 8))
        ]
        reason = rng.choice(["stop", "length"])
        got, src = run_stream(
            script(*pieces, reason=reason), lambda r, first: completion_chunks(HEAD, r, first)
        )
        assert got[-1] == "[DONE]", got
        chunks = [json.loads(e)["choices"][0] for e in got[:-1]]
        assert "".join(c["text"] for c in chunks) == "".join(pieces), (pieces, chunks)
        want = sum(1 for p in pieces[:-1] if p) + 1
        assert len(chunks) == want and chunks[-1]["finish_reason"] == reason, (pieces, chunks)
        assert src.taken == len(pieces) - 1 and src.closed


def test_usage_comes_last_when_asked():
    replies = script("a", "b", prompt=7)
    usage = lambda r: usage_chunk(HEAD, r)  # noqa: E731
    got, _ = run_stream(replies, lambda r, first: completion_chunks(HEAD, r, first), usage)
    assert got[-1] == "[DONE]"
    u = json.loads(got[-2])
    assert u["choices"] == [] and u["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 2,
        "total_tokens": 9,
    }, f"with include_usage the chunk before [DONE] is the usage of the last reply, got {u}"
    without, _ = run_stream(replies, lambda r, first: completion_chunks(HEAD, r, first))
    assert not any('"usage"' in e for e in without), "no usage chunk unless it was asked for"


def test_is_first_is_true_once():
    seen = []

    def chunker(r, first):
        seen.append(first)
        return []

    got, _ = run_stream(script("a", "b", "c"), chunker)
    assert seen == [True, False, False], f"is_first for each reply: {seen}"
    assert got == ["[DONE]"]


def test_a_one_reply_answer_streams_without_reading_more():
    got, src = run_stream(script("Paris"), lambda r, first: chat_chunks(HEAD, r, first))
    assert len(got) == 4 and got[-1] == "[DONE]", got
    assert src.taken == 0 and src.closed, (
        "the first reply was already finished: do not wait for another"
    )


def test_an_error_mid_stream_ends_it_with_the_error_then_done():
    replies = script("a", "b") + [UserReply(0, "", True, error="worker died")]
    replies[1].finished, replies[1].finish_reason = False, None
    usage = lambda r: usage_chunk(HEAD, r)  # noqa: E731
    got, src = run_stream(replies, lambda r, first: completion_chunks(HEAD, r, first), usage)
    assert got[-1] == "[DONE]", f"the stream must still end with [DONE]: {got}"
    err = json.loads(got[-2])
    assert "error" in err, f"the error event comes right before [DONE], no usage after it: {got}"
    assert err["error"]["message"] == "worker died" and err["error"]["code"] == 503, err
    assert src.closed


def test_leaving_early_closes_the_replies():
    """A client that goes away cancels the response; closing the stream must close the
    replies generator, whose ``finally`` aborts the request."""
    replies = script("a", "b", "c", "d")
    src = Source(replies[1:])

    async def main():
        stream = sse_stream(
            replies[0], src.gen(), lambda r, first: completion_chunks(HEAD, r, first), None
        )
        first = await anext(stream)
        second = await anext(stream)
        await stream.aclose()
        return first, second

    first, second = asyncio.run(main())
    assert json.loads(first[6:])["choices"][0]["text"] == "a"
    assert src.closed, (
        "closing the SSE stream early must close the replies generator (it aborts the request)"
    )


# ---- the real app, read by the openai client -----------------------------------------------


class FakeFrontend:
    """What ``create_app`` uses of ``FrontendManager``, with scripted replies."""

    def __init__(self, replies: List[UserReply]) -> None:
        self.args = types.SimpleNamespace(
            model_name="m",
            model_path="/models/m",
            server_host="127.0.0.1",
            server_port=0,
            api_key="",  # the Guard's settings (chapter 15): no key, no foreign origins
            allowed_origins=(),
            allowed_hosts=("test",),  # the test client's base_url
            max_body_bytes=1 << 20,
        )
        self.max_seq_len, self.workers, self.queues = 256, [], {}
        self.replies_of: Dict[int, List[UserReply]] = {}
        self.script, self.submitted = replies, []

    def check_alive(self) -> None:
        pass

    async def submit(self, text, params, **options) -> int:  # stop, stop_token_ids, ...
        self.submitted.append((text, params))
        return len(self.submitted)

    async def replies(self, uid: int) -> AsyncGenerator[UserReply, None]:
        for r in self.script:
            await asyncio.sleep(0)
            yield UserReply(
                uid,
                r.incremental_output,
                r.finished,
                r.finish_reason,
                r.num_prompt_tokens,
                r.num_output_tokens,
                r.error,
            )


def client_for(fm: FakeFrontend) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(fm)), base_url="http://test"
    )  # type: ignore[arg-type]
    return openai.AsyncOpenAI(
        base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0
    )


def test_the_openai_client_reads_a_streamed_chat_answer():
    fm = FakeFrontend(script("Par", "", "is", ".", reason="stop", prompt=11))

    async def main():
        client = client_for(fm)
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Capital?"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        return [c async for c in stream]

    chunks = asyncio.run(main())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Paris."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and (
        chunks[-1].usage.prompt_tokens,
        chunks[-1].usage.completion_tokens,
    ) == (11, 4)


def test_the_openai_client_reads_a_streamed_completion():
    fm = FakeFrontend(script("1", ", 2", ", 3", reason="length"))

    async def main():
        client = client_for(fm)
        stream = await client.completions.create(
            model="m", prompt="Count:", max_tokens=3, stream=True
        )
        return [c async for c in stream]

    chunks = asyncio.run(main())
    assert "".join(c.choices[0].text for c in chunks) == "1, 2, 3"
    assert chunks[-1].choices[0].finish_reason == "length" and all(c.usage is None for c in chunks)


def test_the_generate_endpoint_streams_text_then_done():
    fm = FakeFrontend(script("ab", "c", reason="stop", prompt=2))

    async def main():
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(fm)), base_url="http://test"
        )  # type: ignore[arg-type]
        r = await http.post("/generate", json={"prompt": "x", "stream": True})
        return r

    r = asyncio.run(main())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), (
        r.headers
    )
    got = events(r.content)
    assert got[-1] == "[DONE]" and "".join(json.loads(e)["text"] for e in got[:-1]) == "abc", got
    assert json.loads(got[-2])["usage"]["total_tokens"] == 4
