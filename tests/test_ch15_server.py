"""Chapter 15: the OpenAI-compatible server, started for real (`python -m minisgl`) on a free
loopback port and used through the official `openai` client.

One SmolLM2 server (CPU, float32) is shared by the module: starting one costs the model
load plus three interpreters. A second, tiny-model server is started only for the test
that kills one of its workers.
"""

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import psutil
import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.server.args import parse_args
from tests.helpers.server import MAX_SEQ_LEN, Server, free_port, offline_llm, wait_until_idle

# every test drives a real server process: over a minute in all on a 2-core CPU
pytestmark = pytest.mark.slow
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "List three prime numbers:",
    "Once upon a time,",
]
CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def offline(smollm2_path):
    """The offline LLM with the server's settings: the oracle for the server's texts."""
    llm = offline_llm(smollm2_path)
    tokenizer = llm.tokenizer

    def generate(prompt, max_tokens):
        """(text, finish_reason, completion_tokens, prompt_tokens); an EOS counts in usage."""
        out = llm.generate([prompt], SamplingParams(max_tokens=max_tokens))[0]
        stopped = len(out["token_ids"]) < max_tokens
        n_in = len(tokenizer.encode(prompt, add_special_tokens=False))  # the template has them
        return out["text"], ("stop" if stopped else "length"), len(out["token_ids"]) + stopped, n_in

    generate.chat_text = lambda msgs: tokenizer.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )
    yield generate
    llm.shutdown()


# ---- answers equal the offline LLM's --------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_completions_equal_offline_generate(server, offline, stream):
    client = server.client()
    for prompt in PROMPTS[:2]:
        text, reason, n_out, n_in = offline(prompt, 12)
        if stream:
            chunks = list(
                client.completions.create(
                    model="SmolLM2-135M-Instruct",
                    prompt=prompt,
                    max_tokens=12,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            got = "".join(c.choices[0].text for c in chunks if c.choices)
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reason
            usage = chunks[-1].usage
        else:
            out = client.completions.create(
                model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=12, temperature=0
            )
            got, usage = out.choices[0].text, out.usage
            assert out.choices[0].finish_reason == reason
        assert got == text
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
            n_in,
            n_out,
            n_in + n_out,
        )


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions_apply_the_template_and_equal_offline_generate(server, offline, stream):
    text, reason, n_out, n_in = offline(offline.chat_text(CHAT), 24)
    client = server.client()
    if stream:
        chunks = list(
            client.chat.completions.create(
                model="SmolLM2-135M-Instruct",
                messages=CHAT,
                max_tokens=24,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[0].choices[0].delta.role == "assistant"
        got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reason
        assert (chunks[-1].usage.completion_tokens, chunks[-1].usage.prompt_tokens) == (n_out, n_in)
    else:
        out = client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=CHAT, max_tokens=24, temperature=0
        )
        got = out.choices[0].message.content
        assert out.choices[0].message.role == "assistant" and out.choices[0].finish_reason == reason
        assert (out.usage.completion_tokens, out.usage.prompt_tokens) == (n_out, n_in)
    assert got == text and got.strip()


def test_concurrent_streams_each_get_their_own_text(server, offline):
    client = openai.AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120
    )
    lengths = [3, 9, 6, 12]

    async def one(prompt, n):
        stream = await client.completions.create(
            model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=n, temperature=0, stream=True
        )
        return "".join([c.choices[0].text async for c in stream])

    async def main():
        return await asyncio.gather(*[one(p, n) for p, n in zip(PROMPTS, lengths)])

    assert asyncio.run(main()) == [offline(p, n)[0] for p, n in zip(PROMPTS, lengths)]


def test_generate_endpoint_streams_and_answers(server, offline):
    text, reason, *_ = offline(PROMPTS[0], 8)
    body = {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0}
    out = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
    assert (out["text"], out["finish_reason"]) == (text, reason)
    with httpx.stream(
        "POST", f"{server.url}/generate", json={**body, "stream": True}, timeout=60
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert "".join(json.loads(line[6:])["text"] for line in lines[:-1]) == text


def test_models_health_and_stats(server):
    [card] = server.get("/v1/models")["data"]
    assert card["id"] == "SmolLM2-135M-Instruct" and card["max_model_len"] == MAX_SEQ_LEN
    assert [m.id for m in server.client().models.list()] == ["SmolLM2-135M-Instruct"]
    health = server.get("/health")
    assert health["workers"] == {"minisgl-scheduler-0": "alive", "minisgl-tokenizer": "alive"}
    stats = wait_until_idle(server)
    assert stats["kv_pages_in_use"] == 0 and stats["table_rows_free"] == stats["table_rows_total"]


BAD_LAUNCHES = [
    (["--model", "models/nope"], "no model at 'models/nope'"),
    (["--device", "tpu"], "--device must be cpu or cuda"),
    (["--port", "<busy>"], "is in use: pick another with --port"),
] + ([] if torch.cuda.is_available() else [(["--device", "cuda"], "torch sees no CUDA GPU")])


@pytest.mark.parametrize("extra, message", BAD_LAUNCHES)
def test_bad_launch_arguments_get_one_line_before_any_worker_starts(qwen3_path, extra, message):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        argv = ["--model", str(qwen3_path), "--device", "cpu", "--port", str(free_port())]
        argv += [str(busy.getsockname()[1]) if a == "<busy>" else a for a in extra]
        t0 = time.monotonic()
        res = subprocess.run(
            [sys.executable, "-m", "minisgl", *argv], capture_output=True, text=True, timeout=120
        )
    assert res.returncode != 0 and message in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "starting the workers" not in res.stdout
    assert time.monotonic() - t0 < 60


def test_the_server_listens_on_loopback_only_by_default(server):
    assert parse_args(["--model", "m"], "/tmp").server_host == "127.0.0.1"
    listening = [
        c.laddr for c in psutil.Process(server.proc.pid).net_connections() if c.status == "LISTEN"
    ]
    assert listening == [("127.0.0.1", server.port)]


# ---- bad input: a 4xx with a message, and the server keeps serving ------------------------

LONG_PROMPT = "hello " * (MAX_SEQ_LEN + 10)
BAD = [
    ("completions", '{"model": ', 400, "not valid JSON"),
    ("completions", "[1, 2]", 400, "JSON object"),
    ("completions", {"model": "SmolLM2-135M-Instruct"}, 400, "'prompt' is required"),
    ("chat/completions", {"model": "SmolLM2-135M-Instruct"}, 400, "'messages' is required"),
    ("chat/completions", {"model": "SmolLM2-135M-Instruct", "messages": []}, 400, "messages"),
    ("completions", {"prompt": "hi", "max_tokens": 0}, 400, "greater than or equal to 1"),
    ("completions", {"prompt": "hi", "max_tokens": 100000}, 400, f"at most {MAX_SEQ_LEN - 1}"),
    ("completions", {"prompt": "hi", "temperature": -0.5}, 400, "temperature"),
    ("completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model 'gpt-4' not found"),
    ("completions", {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "max_tokens": 5.0}, 400, "max_tokens"),
    ("completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("completions", {"prompt": 123}, 400, "prompt"),
    ("chat/completions", {"messages": "hi"}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content"),
    (
        "chat/completions",
        {"messages": [{"role": "robot", "content": "hi"}]},
        400,
        "messages.0.role",
    ),
    ("completions", {"prompt": "hi", "n": 2}, 400, "only n=1"),
    ("completions", {"prompt": "hi", "logprobs": 6}, 400, "'logprobs': must be between 0 and 5"),
    ("completions", {"prompt": "hi", "logprobs": True}, 400, "'logprobs'"),
    ("completions", {"prompt": "hi", "logprobs": 1, "echo": True}, 400, "'echo': echo with"),
    ("chat/completions", {"messages": CHAT, "logprobs": 1}, 400, "'logprobs'"),
    (
        "chat/completions",
        {"messages": CHAT, "logprobs": True, "top_logprobs": 21},
        400,
        "'top_logprobs': must be between 0 and 20",
    ),
    ("chat/completions", {"messages": CHAT, "top_logprobs": 2}, 400, "needs logprobs"),
    ("completions", {"prompt": "hi", "seed": True}, 400, "'seed'"),
    ("completions", {"prompt": "hi", "seed": "7"}, 400, "'seed'"),
    ("chat/completions", {"messages": CHAT, "seed": 1.5}, 400, "'seed'"),
    ("completions", {"prompt": "hi", "seed": 2**64}, 400, "'seed': must be an integer that fits"),
    ("completions", {"prompt": "hi", "stop": [""]}, 400, "each stop sequence must have"),
    ("completions", {"prompt": "hi", "frobnicate": 1}, 400, "unsupported field 'frobnicate'"),
    ("completions", {"prompt": LONG_PROMPT}, 400, f"the context limit is {MAX_SEQ_LEN} tokens"),
    (
        "completions",
        {"prompt": LONG_PROMPT, "stream": True},
        400,
        f"the context limit is {MAX_SEQ_LEN} tokens",
    ),
]


@pytest.mark.parametrize(
    "endpoint,body,status,message", BAD, ids=[f"{i}-{b[3][:24]}" for i, b in enumerate(BAD)]
)
def test_bad_input_gets_a_4xx_json_error(server, endpoint, body, status, message):
    if isinstance(body, dict):
        body = json.dumps({"model": "SmolLM2-135M-Instruct", **body})
    r = httpx.post(
        f"{server.url}/v1/{endpoint}",
        content=body,
        timeout=60,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"], r.json()
    for field in ("seed", "logprobs", "top_logprobs"):  # the field is named in param too
        if f"'{field}'" in message:
            assert r.json()["error"]["param"] == field


def test_the_openai_client_raises_the_message_and_the_server_keeps_serving(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="only n=1"):
        client.completions.create(model="SmolLM2-135M-Instruct", prompt="hi", n=2)
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.chat.completions.create(model="nope", messages=CHAT)
    with pytest.raises(openai.BadRequestError, match="context limit"):
        client.completions.create(model="SmolLM2-135M-Instruct", prompt=LONG_PROMPT, max_tokens=2)
    out = client.completions.create(
        model="SmolLM2-135M-Instruct", prompt="1 + 1 =", max_tokens=2, temperature=0
    )
    assert out.usage.completion_tokens == 2


def test_a_client_that_disconnects_aborts_its_request(server):
    body = {
        "model": "SmolLM2-135M-Instruct",
        "prompt": "Count: 1, 2, 3,",
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 6:
                break  # leave mid-stream: closing the connection
    stats = wait_until_idle(server, timeout=20)  # far sooner than 400 tokens would take
    assert stats["kv_pages_in_use"] == 0 and stats["table_rows_free"] == stats["table_rows_total"]


# ---- a dead worker: fail fast, say which ----------------------------------------------------


def test_a_worker_not_reaped_yet_is_not_given_exit_code_none():
    """A GPU worker's pipes close seconds before it can be reaped (releasing the device), so
    the first log line may come before its exit code exists; the final line is written
    after reaping."""
    from types import SimpleNamespace

    from minisgl.server.worker import Worker

    exiting = Worker("minisgl-scheduler-0", SimpleNamespace(exitcode=None, pid=7))
    assert exiting.exit_text() == "exit code not known yet"
    assert Worker("minisgl-tokenizer", SimpleNamespace(exitcode=-9, pid=8)).exit_text() == (
        "exit code -9"
    )


def test_a_killed_worker_makes_the_server_fail_fast_and_exit(qwen3_path, tmp_path):
    server = Server(qwen3_path, tmp_path / "server.log").wait_ready()
    try:
        client = server.client()
        stream = client.completions.create(
            model="tiny-qwen3",
            prompt="Hello",
            max_tokens=400,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        next(iter(stream))  # it is running
        victim = server.workers["minisgl-scheduler-0"]
        t0 = time.monotonic()
        victim.kill()
        with pytest.raises(openai.APIError, match="worker minisgl-scheduler-0 died"):
            for _ in stream:
                pass
        rc = server.proc.wait(30)  # it stops by itself: no zombie answering 503 forever
        assert time.monotonic() - t0 < 10  # fail fast, do not hang
    finally:
        server.stop(signal.SIGINT, group=True)
    line = "error: worker minisgl-scheduler-0 died (exit code -9); the server stopped"
    assert rc == 1 and line in server.output(), server.output()[-2000:]
    assert "Traceback" not in server.output()
    assert not server.workers["minisgl-tokenizer"].is_running()  # reaped, not a zombie


def test_ctrl_c_stops_every_process_without_reporting_a_crash(qwen3_path, tmp_path):
    """Regression: Ctrl-C reached the workers first, and the API server logged each one's
    clean exit as a dead worker. Workers ignore SIGINT; the launcher stops them in order."""
    server = Server(qwen3_path, tmp_path / "server.log").wait_ready()
    workers = list(server.workers.values())
    assert server.stop(signal.SIGINT, group=True) == 0
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    assert "died" not in server.log.read_text(), server.log.read_text()[-2000:]


# ---- the shell, without processes ----------------------------------------------------------


def test_the_shell_keeps_the_conversation_and_resets_it(monkeypatch, capsys):
    from minisgl import shell
    from minisgl.message.frontend import UserReply

    lines = iter(["Hi", "And?", "/reset", "Bye", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))

    class FakeFrontend:  # what FrontendManager offers the shell: submit and replies
        max_seq_len = 64

        def __init__(self):
            self.chats = []

        async def submit(self, chat, params):
            assert params.temperature == 0.0  # greedy
            self.chats.append(chat)
            return len(self.chats)

        async def replies(self, uid):
            yield UserReply(uid, f"answer {uid}", finished=False)
            yield UserReply(uid, "!", finished=True, finish_reason="stop")

    fm = FakeFrontend()
    asyncio.run(shell._chat(fm))
    assert fm.chats[1] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "answer 1!"},
        {"role": "user", "content": "And?"},
    ]
    assert fm.chats[2] == [{"role": "user", "content": "Bye"}]  # after /reset
    assert "answer 2!" in capsys.readouterr().out


def test_a_traced_server_records_eight_concurrent_clients(qwen3_path, tmp_path):
    """`--trace FILE`: rank 0's scheduler is recorded (chapter 7's recorder) and the trace is
    written when the server stops; requests that arrive while others run join the batch."""
    import jsonschema

    from minisgl.scheduler.trace import SCHEMA_PATH

    path = tmp_path / "server-trace.json"
    server = Server(qwen3_path, tmp_path / "server.log", "--trace", str(path)).wait_ready()
    lengths = [24, 6, 18, 3, 12, 9, 20, 4]
    try:
        client = openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120
        )

        async def one(i, n):
            await asyncio.sleep(0.05 * i)  # they arrive one after another, as clients do
            r = await client.completions.create(
                model="tiny-qwen3",
                prompt=PROMPTS[i % len(PROMPTS)],
                max_tokens=n,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            return r.usage.completion_tokens

        async def main():
            return await asyncio.gather(*[one(i, n) for i, n in enumerate(lengths)])

        assert asyncio.run(main()) == lengths
        wait_until_idle(server)
    finally:
        assert server.stop(signal.SIGTERM) == 0, server.log.read_text()[-3000:]
    doc = json.loads(path.read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(doc)
    assert doc["meta"] == {"run": "this server's whole run", "source": "python -m minisgl"}
    assert doc["config"]["overlap"] is True
    by_uid = {r["uid"]: r["max_tokens"] for r in doc["requests"]}
    assert sorted(by_uid.values()) == sorted(lengths)
    sampled = {}
    for step in doc["steps"]:
        for r in step["reqs"]:
            sampled[r["uid"]] = sampled.get(r["uid"], 0) + (r["sampled"] is not None)
    assert sampled == by_uid  # every token each client received, and no more
    assert max(len(s["reqs"]) for s in doc["steps"]) > 1
    # at least one request was prefilled while others held their rows: it joined them
    assert any(
        s["kind"] == "prefill" and {r["uid"] for r in s["rows"]} - {r["uid"] for r in s["reqs"]}
        for s in doc["steps"]
    )
    finished = [r["uid"] for s in doc["steps"] for r in s["reqs"] if r["finished"]]
    assert sorted(finished) == sorted(by_uid)


def test_outstanding_tokens_follow_each_request_from_estimate_to_zero():
    from minisgl.message.frontend import UserReply
    from minisgl.server.frontend import FrontendManager
    from minisgl.server.protocol import APIError

    fm = FrontendManager(None, [], 512, max_outstanding_tokens=600)
    first = fm.estimate_work("x" * 100, 50)  # no prompt seen yet: a token per byte
    assert (first.outstanding, first.max_new_tokens) == (150, 50)
    fm.work[0], fm.outstanding_tokens = first, first.outstanding
    fm._account(UserReply(0, "a", False, num_prompt_tokens=25, num_output_tokens=1))
    assert fm.outstanding_tokens == 49  # the prompt is read: only the output is left
    assert fm.tokens_per_byte == 0.25  # and it showed a token per four bytes
    assert fm.estimate_work("y" * 100, 50).outstanding == 75
    fm.check_load(551)  # 49 + 551 = 600: the bound itself is allowed
    with pytest.raises(APIError) as e:
        fm.check_load(552)
    assert e.value.status == 429 and "49 tokens of work are outstanding" in str(e.value)
    fm._account(UserReply(0, "b", True, "stop", num_prompt_tokens=25, num_output_tokens=2))
    assert fm.outstanding_tokens == 0
    fm._forget(0)
    assert fm.outstanding_tokens == 0 and not fm.work
    fm.check_load(10_000)  # a request alone is always let in
