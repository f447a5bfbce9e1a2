"""Chapter 15: the server under attack and under failure, over real HTTP.

Each case asserts the status, the message, and that nothing leaked: after it, ``/stats``
is back to its baseline (no open request, no KV page in use, every table row free). The
cases on input share the SmolLM2 server of ``tests/conftest.py``; the ones on keys, origins
and a small queue use one guarded tiny-model server; each kill and signal case starts its
own tiny server. The table of (case, expected, got) is printed at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time

import httpx
import psutil
import pytest

from tests.helpers.server import MAX_SEQ_LEN, Server, wait_until_idle

# every test drives real server processes: over a minute and a half in all on a 2-core CPU
pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
ROWS: list[tuple[str, str, str]] = []


@pytest.fixture(scope="module", autouse=True)
def table(request):
    yield
    if not ROWS:
        return
    width = max(len(r[0]) for r in ROWS)
    lines = [f"{'case':<{width}}  {'expected':<30}  got"]
    lines += [f"{c:<{width}}  {e:<30}  {g}" for c, e, g in ROWS]
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():  # the table is the point: show it under -q
        print("\n" + "\n".join(lines))


def record(case: str, expected: str, got: str, ok: bool) -> None:
    ROWS.append((case, expected, got))
    assert ok, f"{case}: expected {expected}, got {got}"


def no_leak(server: Server) -> dict:
    stats = wait_until_idle(server)
    assert stats["kv_pages_in_use"] == 0 and stats["table_rows_free"] == stats["table_rows_total"]
    return stats


def post(server: Server, path: str, body, headers=None, timeout=60) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    h = {"content-type": "application/json", **(headers or {})}
    return httpx.post(f"{server.url}{path}", content=content, headers=h, timeout=timeout)


# ---- bad input on the shared server: a 4xx naming the field, nothing registered ------------

DEEP = "[" * 100_000
BAD_INPUT = [
    (
        "lone surrogate in prompt",
        "/v1/completions",
        '{"model": "%s", "prompt": "\\ud800 hi"}' % MODEL,
        400,
        "'prompt': not valid Unicode",
    ),
    (
        "lone surrogate in a chat message",
        "/v1/chat/completions",
        '{"model": "%s", "messages": [{"role": "user", "content": "a\\udfff"}]}' % MODEL,
        400,
        "'messages.0.content': not valid Unicode",
    ),
    ("100,000 nested [", "/v1/completions", DEEP, 400, "nested too deeply"),
    (
        "nesting 40 deep in a field",
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "stop": json.loads("[" * 40 + "]" * 40)},
        400,
        "nested deeper than 32",
    ),
    (
        "explicit max_tokens over the rest",
        "/v1/completions",
        {"model": MODEL, "prompt": "hello " * 300, "max_tokens": 400},
        400,
        "max_tokens is 400, but the prompt has",
    ),
    ("n=2", "/v1/completions", {"model": MODEL, "prompt": "hi", "n": 2}, 400, "only n=1"),
    (
        "best_of=3",
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "best_of": 3},
        400,
        "only best_of=1",
    ),
    (
        "prompt longer than the context can hold",
        "/v1/completions",
        {"model": MODEL, "prompt": "x" * 100_000},
        400,
        "'prompt' has 100000 bytes: more than the context limit",
    ),
    ("5 MB body", "/v1/completions", {"model": MODEL, "prompt": "x" * 5_000_000}, 413, "larger"),
    (
        "110,000 empty chat messages (3.6 MB)",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": ""}] * 110_000},
        400,
        "'messages' has 110000 messages: the chat template spends at least",
    ),
    (
        "top_k of 2^70",
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "top_k": 2**70},
        400,
        "'top_k': Input should be less than or equal to 2147483647",
    ),
    (
        "stop_token_ids of [10^30]",
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "stop_token_ids": [10**30]},
        400,
        "'stop_token_ids': at most 16 token ids, each from 0 to 2147483647",
    ),
    (
        "lone surrogate in a key",
        "/v1/completions",
        '{"model": "%s", "prompt": "hi", "\\ud800": 1}' % MODEL,
        400,
        "'\\ud800': not valid Unicode",
    ),
    (
        "temperature Infinity (not JSON)",
        "/v1/completions",
        '{"model": "%s", "prompt": "hi", "temperature": Infinity}' % MODEL,
        400,
        "Infinity is not a JSON number",
    ),
    (
        "a participant's name",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi", "name": "ann"}]},
        400,
        "'messages.0.name': participant names are not supported",
    ),
    (
        "an unknown stream_options key",
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
        400,
        "unsupported field 'stream_options.continuous_usage_stats'",
    ),
]


@pytest.mark.parametrize("case,path,body,status,message", BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
def test_bad_input_is_refused_before_anything_is_registered(
    server, case, path, body, status, message
):
    r = post(server, path, body)
    got = f"{r.status_code} {r.json()['error']['message'][:60]!r}"
    record(case, f"{status} {message[:24]!r}", got, r.status_code == status)
    # the message names the check that refused it, each made before any tokenizing (a time
    # limit here would only measure how busy the machine is)
    assert message in r.json()["error"]["message"]
    assert no_leak(server)["open_requests"] == 0


def test_the_fewest_tokens_a_message_costs_is_one_chatml_turn(tok):
    """SmolLM2's template is ChatML: an empty turn is ``<|im_start|>role\\n<|im_end|>\\n``."""
    from minisgl.tokenizer.tokenize import TokenizeManager

    turn = tok.encode("<|im_start|>user\n<|im_end|>\n", add_special_tokens=False)
    assert TokenizeManager(tok).min_tokens_per_message() == len(turn)


def test_a_client_gone_before_the_first_reply_closes_its_replies_cleanly():
    """The client hangs up while its request is queued: waiting for the first reply is
    cancelled, and closing the replies then neither raises nor leaves them open."""
    from minisgl.server.api_server import ClientGone, _until_disconnect

    closed = []

    async def replies():
        try:
            await asyncio.sleep(3600)  # queued: no reply yet
            yield None
        finally:
            closed.append(True)

    class HungUp:
        async def receive(self):
            return {"type": "http.disconnect"}

    async def main():
        queued = replies()
        with pytest.raises(ClientGone):
            await _until_disconnect(HungUp(), anext(queued))
        await queued.aclose()

    asyncio.run(main())
    assert closed == [True]


@pytest.fixture(scope="module")
def tok(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def test_an_explicit_max_tokens_over_the_rest_names_both_numbers(server, tok):
    prompt = "hello " * 300
    n = len(tok.encode(prompt))
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 400})
    want = f"max_tokens is 400, but the prompt has {n} tokens and the context limit is "
    want += f"{MAX_SEQ_LEN} tokens: at most {MAX_SEQ_LEN - n} remain"
    error = r.json()["error"]
    record("max_tokens 400, prompt " + str(n), "400 both numbers", error["message"][:60], True)
    assert r.status_code == 400 and error["message"] == want and error["param"] == "max_tokens"
    ok = post(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 2})
    assert ok.status_code == 200  # within the rest: served


def test_a_huge_prompt_does_not_delay_a_small_request(server):
    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            big = http.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": "word " * 400_000},  # 2 MB: under the body limit
            )
            small = http.post(
                "/v1/completions", json={"model": MODEL, "prompt": "1 + 1 =", "max_tokens": 2}
            )
            t0 = time.monotonic()
            r_big, r_small = await asyncio.gather(big, small)
            return r_big, r_small, time.monotonic() - t0

    r_big, r_small, took = asyncio.run(main())
    record(
        "2 MB prompt beside a 2-token one",
        "400 + 200, < 5 s",
        f"{r_big.status_code} + {r_small.status_code}, {took:.2f} s",
        r_big.status_code == 400 and r_small.status_code == 200 and took < 5,
    )
    no_leak(server)


@pytest.mark.parametrize(
    "case,headers,status,message",
    [
        ("text/plain POST", {"content-type": "text/plain"}, 415, "must be JSON"),
        ("no Content-Type", {"content-type": ""}, 415, "must be JSON"),
        ("foreign Origin", {"origin": "http://evil.example"}, 403, "cross-origin request"),
        ("foreign Host (rebinding)", {"host": "evil.example:80"}, 403, "does not name"),
    ],
)
def test_cross_site_and_non_json_requests_are_refused(server, case, headers, status, message):
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "hi"}, headers)
    got = f"{r.status_code} {r.json()['error']['message'][:40]!r}"
    record(case, f"{status} {message!r}", got, r.status_code == status)
    assert message in r.json()["error"]["message"]
    assert no_leak(server)["open_requests"] == 0


def test_same_origin_and_plain_clients_are_served(server):
    origin = {"origin": server.url}  # a page served by this host: same-origin
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}, origin)
    record("same-origin POST", "200", str(r.status_code), r.status_code == 200)


def test_health_and_models_carry_no_pid_or_path(server):
    health = httpx.get(f"{server.url}/health").text
    models = httpx.get(f"{server.url}/v1/models").text
    pids = [str(w.pid) for w in server.workers.values()]
    leaked = [p for p in pids if p in health] + (["/"] if "/work" in health + models else [])
    record("/health, /v1/models content", "no PID, no path", f"leaked {leaked}", not leaked)


def test_echo_puts_the_prompt_first(server):
    body = {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 4, "temperature": 0}
    plain = post(server, "/v1/completions", body).json()["choices"][0]["text"]
    echoed = post(server, "/v1/completions", {**body, "echo": True}).json()["choices"][0]["text"]
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json={**body, "echo": True, "stream": True}
    ) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    streamed = "".join(e["choices"][0]["text"] for e in events)
    record("echo: true", "prompt + answer", repr(echoed), echoed == "1, 2, 3," + plain)
    assert streamed == echoed


def stream_text(server, body):
    """(every text chunk, finish_reason, usage) of a streamed /v1/completions."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    chunks = [e["choices"][0]["text"] for e in events if e["choices"]]
    reasons = [e["choices"][0]["finish_reason"] for e in events if e["choices"]]
    return chunks, reasons[-1], events[-1]["usage"]


def test_stop_strings_split_over_tokens_are_never_streamed(server):
    body = {"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 24, "temperature": 0}
    full = post(server, "/v1/completions", body).json()["choices"][0]["text"]
    stop = full[full.index("5") - 1 : full.index("5") + 2]  # " 5," spans " ", "5", ","
    chunks, reason, usage = stream_text(server, {**body, "stop": [stop, "never"]})
    text = "".join(chunks)
    record(
        f"stop {stop!r} while streaming",
        "text before it, 'stop'",
        f"{text!r}, {reason!r}",
        text == full[: full.index(stop)] and reason == "stop",
    )
    assert not any(stop[:2] in c for c in chunks[-2:]) and usage["completion_tokens"] < 24
    out = post(server, "/v1/completions", {**body, "stop": stop}).json()  # a string, unstreamed
    assert out["choices"][0]["text"] == text and out["choices"][0]["finish_reason"] == "stop"
    no_leak(server)  # the scheduler was told to stop: nothing runs on


def test_stop_token_ids_end_the_answer(server, tok):
    body = {"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 12, "temperature": 0}
    gen = post(server, "/generate", {k: v for k, v in body.items() if k != "model"}).json()
    [comma] = tok.encode(",")
    chunks, reason, usage = stream_text(server, {**body, "stop_token_ids": [comma]})
    record(
        "stop_token_ids [',']",
        "text before the first ','",
        f"{''.join(chunks)!r}, {reason!r}",
        "".join(chunks) == gen["text"][: gen["text"].index(",")] and reason == "stop",
    )
    no_leak(server)


def test_a_client_that_leaves_while_sending_its_body_is_not_an_internal_error(server):
    before = server.output().count("Traceback")
    head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
    head += "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(head.encode() + b'{"model":')  # 9 of the 100 bytes promised
        time.sleep(0.3)
    time.sleep(0.5)
    assert httpx.get(f"{server.url}/health").status_code == 200
    log = server.output()
    got = f"{log.count('Traceback') - before} new tracebacks, 'internal error' {'internal error' in log}"
    record("client leaves mid-body", "no traceback, no 500", got, got.startswith("0 new"))
    assert "internal error" not in log
    no_leak(server)


def test_chat_without_max_tokens_runs_up_to_the_context(server):
    r = post(
        server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "temperature": 0},
    )
    record("chat without max_tokens", "200", str(r.status_code), r.status_code == 200)


def test_metrics_count_what_was_served(server):
    text = httpx.get(f"{server.url}/metrics").text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    names = [
        "minisgl_num_running_reqs",
        "minisgl_num_queued_reqs",
        "minisgl_kv_pages_used",
        "minisgl_generation_tokens_per_second",
        "minisgl_time_to_first_token_seconds_count",
        "minisgl_time_per_output_token_seconds_count",
    ]
    missing = [n for n in names if n not in samples]
    got = f"missing {missing}, tokens {samples.get('minisgl_generation_tokens_total')}"
    record("/metrics", "all six, tokens > 0", got, not missing)
    assert samples["minisgl_generation_tokens_total"] > 0
    assert samples["minisgl_time_to_first_token_seconds_count"] > 0
    # the frontend's counters when idle, and the scheduler's figures fetched for the scrape
    assert samples["minisgl_outstanding_tokens"] == samples["minisgl_num_open_reqs"] == 0
    assert samples["minisgl_kv_pages_total"] > 0
    assert 0 <= samples["minisgl_scheduler_stats_age_seconds"] < 60


# ---- a guarded server: API key, allowed origins, small body, small queue -------------------

KEY = "sekret-key"
OK_ORIGIN = "http://app.example"


@pytest.fixture(scope="module")
def guarded(qwen3_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("guarded") / "server.log"
    s = Server(
        qwen3_path,
        log,
        "--api-key",
        KEY,
        "--allowed-origins",
        OK_ORIGIN,
        "--max-body-bytes",
        "2048",
        "--max-running-requests",
        "2",
        "--max-queued-requests",
        "2",
    ).wait_ready()
    yield s
    assert s.stop(signal.SIGTERM) == 0, s.output()[-2000:]


def tiny(body=None):
    return {"model": "tiny-qwen3", "prompt": "Hello", "max_tokens": 2, **(body or {})}


@pytest.mark.parametrize(
    "case,headers,body,status,message",
    [
        ("no API key", {}, tiny(), 401, "missing or wrong API key"),
        ("wrong API key", {"authorization": "Bearer nope"}, tiny(), 401, "wrong API key"),
        ("right API key", {"authorization": f"Bearer {KEY}"}, tiny(), 200, ""),
        (
            "allowed Origin",
            {"authorization": f"Bearer {KEY}", "origin": OK_ORIGIN},
            tiny(),
            200,
            "",
        ),
        (
            "body over --max-body-bytes",
            {"authorization": f"Bearer {KEY}"},
            tiny({"prompt": "x" * 3000}),
            413,
            "larger than 2048 bytes",
        ),
    ],
)
def test_the_key_origins_and_body_limit(guarded, case, headers, body, status, message):
    r = post(guarded, "/v1/completions", body, headers)
    got = f"{r.status_code} {r.text[:50]!r}"
    record(case, f"{status} {message[:24]!r}", got, r.status_code == status)
    if status != 200:
        assert message in r.json()["error"]["message"]
    if status == 401:
        assert r.headers["www-authenticate"] == "Bearer"
    if "origin" in headers:
        assert r.headers["access-control-allow-origin"] == OK_ORIGIN


def test_health_needs_no_key_and_the_rest_does(guarded):
    health = httpx.get(f"{guarded.url}/health").status_code
    models = httpx.get(f"{guarded.url}/v1/models").status_code
    stats = httpx.get(f"{guarded.url}/stats").status_code
    preflight = httpx.options(
        f"{guarded.url}/v1/completions",
        headers={"origin": OK_ORIGIN, "access-control-request-method": "POST"},
    )
    got = (
        f"/health {health}, /v1/models {models}, /stats {stats}, preflight {preflight.status_code}"
    )
    record("no key: /health vs others", "200, 401, 401, 204", got, got.endswith("204"))
    assert (health, models, stats) == (200, 401, 401)


def test_many_clients_against_a_small_queue_get_429_with_retry_after(guarded):
    n = 1000
    auth = {"authorization": f"Bearer {KEY}"}

    async def main():
        limits = httpx.Limits(max_connections=n + 8)
        async with httpx.AsyncClient(base_url=guarded.url, limits=limits, timeout=120) as http:
            body = tiny({"max_tokens": 40, "ignore_eos": True})
            return await asyncio.gather(
                *[http.post("/v1/completions", json=body, headers=auth) for _ in range(n)]
            )

    t0 = time.monotonic()
    replies = asyncio.run(main())
    took = time.monotonic() - t0
    codes = [r.status_code for r in replies]
    busy = [r for r in replies if r.status_code == 429]
    got = f"{codes.count(200)} x 200, {len(busy)} x 429 in {took:.1f} s"
    ok = codes.count(200) >= 4 and len(busy) > n // 2 and codes.count(200) + len(busy) == n
    record(f"{n} clients, queue of 2 + 2", "200s and 429s, nothing else", got, ok)
    assert all(r.headers["retry-after"] == "1" and "busy" in r.text for r in busy)
    stats = httpx.get(f"{guarded.url}/stats", headers=auth).json()
    assert stats["open_requests"] == 0 and stats["kv_pages_in_use"] == 0


# ---- overload: a bound on outstanding tokens, refused before tokenizing ---------------------

TOKEN_BOUND = 450  # ten requests of "Hello" (5 bytes) + 40 tokens


@pytest.fixture(scope="module")
def bounded(qwen3_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("bounded") / "server.log"
    s = Server(qwen3_path, log, "--max-outstanding-tokens", str(TOKEN_BOUND)).wait_ready()
    yield s
    assert s.stop(signal.SIGTERM) == 0, s.output()[-2000:]


async def stream_to_the_end(http: httpx.AsyncClient, body: dict) -> tuple[int, str, dict]:
    """(status, Retry-After, last usage) of one streamed completion; raises if a 200 stream
    does not end with its usage and ``[DONE]``."""
    async with http.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, r.headers.get("retry-after", ""), r.json()
        lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    return 200, "", json.loads(lines[-2][6:])["usage"]


@pytest.mark.parametrize("n", [200, 1000])
def test_an_overload_is_refused_up_front_and_every_accepted_request_finishes(bounded, n):
    body = {**tiny({"max_tokens": 40, "ignore_eos": True}), "stream": True}
    body["stream_options"] = {"include_usage": True}
    scrapes: list[tuple[int, float]] = []  # (status, seconds) of /metrics and /health
    done = threading.Event()

    def scrape() -> None:  # a monitor of its own, as Prometheus is: not the clients' loop
        with httpx.Client(base_url=bounded.url, timeout=30) as http:
            while not done.is_set():
                for path in ("/metrics", "/health"):
                    t0 = time.monotonic()
                    status = http.get(path).status_code
                    scrapes.append((status, time.monotonic() - t0))
                time.sleep(0.1)

    async def main():
        limits = httpx.Limits(max_connections=n + 8)
        async with httpx.AsyncClient(base_url=bounded.url, limits=limits, timeout=300) as http:
            return await asyncio.gather(*[stream_to_the_end(http, body) for _ in range(n)])

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        results = asyncio.run(main())
    finally:
        done.set()
        scraper.join()
    results = asyncio.run(main())
    accepted = [usage for status, _, usage in results if status == 200]
    refused = [(ra, err) for status, ra, err in results if status == 429]
    times = sorted(t for _, t in scrapes)
    got = (
        f"{len(accepted)} accepted, all {len(accepted)} finished, {len(refused)} x 429; "
        f"{len(scrapes)} scrapes, p99 {times[int(0.99 * (len(times) - 1))]:.2f} s"
    )
    ok = len(accepted) >= TOKEN_BOUND // 45 and len(refused) > 0
    record(f"{n} streams, {TOKEN_BOUND} outstanding tokens", "some in, rest 429, scraped", got, ok)
    assert len(accepted) + len(refused) == n
    assert all(u["completion_tokens"] == 40 for u in accepted)
    assert all(ra == "1" and "outstanding" in e["error"]["message"] for ra, e in refused)
    assert all(status == 200 for status, _ in scrapes) and len(scrapes) >= 2
    stats = wait_until_idle(bounded)
    assert stats["kv_pages_in_use"] == 0 and stats["table_rows_free"] == stats["table_rows_total"]
    metrics = httpx.get(f"{bounded.url}/metrics").text
    assert "minisgl_outstanding_tokens 0.0" in metrics and "minisgl_num_open_reqs 0.0" in metrics


# ---- dead workers and signals: each on its own tiny server ----------------------------------


def start(qwen3_path, tmp_path, *extra) -> Server:
    return Server(qwen3_path, tmp_path / "server.log", *extra).wait_ready()


def open_stream(server: Server, **headers) -> httpx.Response:
    body = {**tiny({"max_tokens": 400, "ignore_eos": True}), "stream": True}
    client = httpx.Client(base_url=server.url, timeout=30)
    r = client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
    lines = r.iter_lines()
    next(lines)  # it is running
    return lines


def rest_of(lines) -> str:
    try:
        return "\n".join(lines)
    except httpx.HTTPError as e:
        return f"{type(e).__name__}"


def test_kill_9_of_the_tokenizer_fails_loudly_and_reaps_the_scheduler(qwen3_path, tmp_path):
    server = start(qwen3_path, tmp_path, "--host", "0.0.0.0")
    assert "without an API key" in server.output()  # beyond loopback, no key: warned
    lines = open_stream(server)
    victim = server.workers["minisgl-tokenizer"]
    victim.kill()
    # once the kernel lets its parent reap it (its threads take a moment to die): from then
    # on the server knows, and must never answer as healthy
    victim.wait(10)
    answers = []
    while server.proc.poll() is None:  # until it exits, never a healthy answer
        try:
            answers.append(httpx.get(f"{server.url}/health", timeout=2).status_code)
            answers.append(httpx.get(f"{server.url}/v1/models", timeout=2).status_code)
        except httpx.HTTPError:
            break
    rc = server.proc.wait(30)
    tail = rest_of(lines)
    line = "error: worker minisgl-tokenizer died (exit code -9); the server stopped"
    record(
        "kill -9 tokenizer",
        "exit 1, one line, error event",
        f"exit {rc}, line {line in server.output()}, /health+/v1/models {answers or 'closed'}",
        rc == 1 and line in server.output() and 200 not in answers,
    )
    assert "worker minisgl-tokenizer died" in tail or tail in ("RemoteProtocolError", "")
    assert "tensor-parallel" not in server.output() and "Traceback" not in server.output()
    assert not server.workers["minisgl-scheduler-0"].is_running()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_lets_open_streams_finish_and_admits_no_new_request(qwen3_path, tmp_path, sig):
    server = start(qwen3_path, tmp_path)
    workers = list(server.workers.values())
    streams = [open_stream(server) for _ in range(3)]
    t0 = time.monotonic()
    if sig == signal.SIGINT:  # Ctrl-C reaches the whole group; the workers ignore it
        os.killpg(server.proc.pid, sig)
    else:
        server.proc.send_signal(sig)
    time.sleep(0.5)  # the drain has begun: the listening socket is closed
    try:
        late = str(post(server, "/v1/completions", tiny(), timeout=5).status_code)
    except httpx.HTTPError as e:
        late = type(e).__name__
    tails = [rest_of(s) for s in streams]  # each ends: closed, not hung
    rc = server.stop(sig)
    took = time.monotonic() - t0
    alive = [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    finished = sum(
        '"finish_reason": "length"' in t and t.rstrip().endswith("data: [DONE]") for t in tails
    )
    record(
        f"{signal.Signals(sig).name} with 3 streams open",
        "3 finish, new refused, exit 0, < 20 s",
        f"{finished} finished, new: {late}, exit {rc}, alive {alive}, {took:.1f} s",
        finished == 3 and late in ("ConnectError", "503") and rc == 0 and not alive and took < 20,
    )
    assert "died" not in server.output()


def test_past_the_shutdown_grace_each_open_stream_ends_with_an_error_and_done(qwen3_path, tmp_path):
    server = start(qwen3_path, tmp_path, "--shutdown-grace", "0")
    streams = [open_stream(server) for _ in range(3)]
    rc = server.stop(signal.SIGTERM)
    tails = [rest_of(s) for s in streams]
    cut = sum(
        "the server is shutting down" in t and t.rstrip().endswith("data: [DONE]") for t in tails
    )
    record(
        "SIGTERM, grace 0, 3 streams open",
        "3 × error event + [DONE], exit 0",
        f"{cut} × error event + [DONE], exit {rc}",
        cut == 3 and rc == 0,
    )
