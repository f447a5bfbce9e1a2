"""The HTTP API: FastAPI routes on top of the ``FrontendManager``, served by uvicorn.

Endpoints: ``POST /generate`` (upstream's native one), ``POST /v1/completions`` and
``POST /v1/chat/completions`` (OpenAI's, with ``stream`` true or false), ``GET /v1/models``,
``GET /health``, ``GET /stats`` (the scheduler's KV-page and table-row counters) and
``GET /metrics`` (Prometheus). Every request first passes the ``Guard`` (host, origin, API
key, body type and size); the body is then checked by ``check_json`` and the pydantic models
before the pipeline registers anything.

Every request waits for its first reply before answering, so a refused request (a prompt
longer than the context: the scheduler's error reply) still gets a 400 and not a stream
that starts and breaks. Streams are Server-Sent Events (``sse_stream``): ``data: {json}``
per chunk, then ``data: [DONE]``; each endpoint says what its chunks hold
(``generate_chunks``, ``completion_chunks``, ``chat_chunks``). A client that goes away,
while waiting or while streaming, aborts its request. When a worker dies, the server fails the open
requests, stops, and ``run_api_server`` returns the reason (the launcher exits non-zero).
Mirrors upstream ``minisgl.server.api_server``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from contextlib import aclosing, asynccontextmanager
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Dict, List, TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from minisgl.message.frontend import UserReply
from minisgl.utils import init_logger

from .frontend import FrontendManager
from .guard import Guard, is_loopback
from .logprobs import (
    chat_logprobs,
    completion_logprobs,
    with_chat_logprobs,
    with_completion_logprobs,
)
from .metrics import CONTENT_TYPE_LATEST, Metrics
from .protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    check_json,
    describe_validation_errors,
)

logger = init_logger("minisgl.server.api_server")
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Chunker = Callable[[UserReply, bool], List[Dict[str, Any]]]  # (reply, is_first) -> SSE payloads


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


async def _until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """``await work``, unless the client disconnects first (then ``ClientGone``, and
    ``work`` is cancelled, which aborts its request)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            # let the cancellation land: a generator ``work`` steps is closed only once idle
            await asyncio.wait({task})
    if not task.done() or task.cancelled():
        raise ClientGone()
    return task.result()


def _not_json(constant: str) -> None:
    """Python's parser reads ``NaN`` and ``Infinity``; JSON has no such numbers."""
    raise ValueError(f"{constant} is not a JSON number")


async def parse_body(request: Request, model: type[M]) -> M:
    """The JSON body as ``model`` (the ``Guard`` has checked its type and size).

    Raises:
        APIError: 400 naming the problem: not JSON, too deep, a lone surrogate, not an
        object, or invalid fields.
    """
    raw = await request.body()
    try:
        body = json.loads(raw, parse_constant=_not_json)
    except ValueError as e:  # UnicodeDecodeError included: bytes that are not UTF-8
        raise APIError(400, f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise APIError(400, "the body is not valid JSON: nested too deeply") from None
    check_json(body)
    if not isinstance(body, dict):
        raise APIError(400, f"the body must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        message, param = describe_validation_errors(e.errors())
        raise APIError(400, message, param) from None


def _usage(reply: UserReply) -> Dict[str, int]:
    """OpenAI's ``usage`` object from the counts a finished reply carries (tokens)."""
    n_in, n_out = reply.num_prompt_tokens, reply.num_output_tokens
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


def _sse(payload: Dict[str, Any] | str) -> bytes:
    """One Server-Sent Event: ``data: <JSON of payload, or the string as is>`` and a blank line."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


def generate_chunks(reply: UserReply, is_first: bool) -> List[Dict[str, Any]]:
    """``/generate`` stream payloads: ``{"text": delta}``; the last one adds
    ``finish_reason`` and ``usage``. A reply with no new text and not finished sends nothing."""
    extra = {"finish_reason": reply.finish_reason, "usage": _usage(reply)} if reply.finished else {}
    return (
        [{"text": reply.incremental_output, **extra}]
        if reply.incremental_output or reply.finished
        else []
    )


def completion_chunks(
    head: Dict[str, Any], reply: UserReply, is_first: bool
) -> List[Dict[str, Any]]:
    """``/v1/completions`` stream payloads: ``head`` (id, object, created, model) and one
    choice with the new ``text``; ``finish_reason`` is None until the last one."""
    if not (reply.incremental_output or reply.finished):
        return []
    choice = {
        "index": 0,
        "text": reply.incremental_output,
        "logprobs": None,
        "finish_reason": reply.finish_reason,
    }
    return [{**head, "choices": [choice]}]


def chat_chunks(head: Dict[str, Any], reply: UserReply, is_first: bool) -> List[Dict[str, Any]]:
    """``/v1/chat/completions`` stream payloads, as OpenAI sends them: first a delta with
    ``role`` (and empty content), then a delta per new text, then an empty delta with the
    ``finish_reason``."""
    out = []
    if is_first:
        out.append(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                    }
                ],
            }
        )
    if reply.incremental_output:
        out.append(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": reply.incremental_output},
                        "finish_reason": None,
                    }
                ],
            }
        )
    if reply.finished:
        out.append(
            {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]}
        )
    return out


def usage_chunk(head: Dict[str, Any], reply: UserReply) -> Dict[str, Any]:
    """The extra last chunk of ``stream_options={"include_usage": true}``: no choices, the usage."""
    return {**head, "choices": [], "usage": _usage(reply)}


async def sse_stream(
    first: UserReply,
    replies: AsyncGenerator[UserReply, None],
    chunker: Chunker,
    usage: Callable[[UserReply], Dict[str, Any]] | None = None,
) -> AsyncIterator[bytes]:
    """The Server-Sent Events of one streamed answer, from its ``first`` reply (already
    received) and the ``replies`` still to come.

    Each reply becomes the events of ``chunker(reply, is_first)``; after the finished one,
    ``usage(last_reply)`` when the client asked for usage, then ``data: [DONE]``. A reply
    with ``error`` (a worker died mid-stream, or the shutdown's grace ran out) ends the
    stream with an error event, then ``[DONE]``. ``replies`` is closed however the stream
    ends: closing it early (the client left, so the response is cancelled) aborts the request.
    """
    async with aclosing(replies):
        reply, is_first = first, True
        while True:
            if reply.error is not None:
                yield _sse({"error": {"message": reply.error, "type": "server_error", "code": 503}})
                break
            for payload in chunker(reply, is_first):
                yield _sse(payload)
            if reply.finished:
                break
            reply, is_first = await anext(replies), False
        if usage is not None and reply.error is None:
            yield _sse(usage(reply))
        yield _sse("[DONE]")


async def _timed(
    replies: AsyncGenerator[UserReply, None], metrics: Metrics
) -> AsyncGenerator[UserReply, None]:
    """``replies`` as they come, observed for ``/metrics`` (TTFT, TPOT, tokens)."""
    t0, first = time.perf_counter(), None
    async with aclosing(replies):
        async for reply in replies:
            now = time.perf_counter()
            if first is None and reply.error is None:
                first = now
                metrics.first_token(now - t0)
            if reply.finished and reply.error is None and first is not None:
                metrics.request_done(reply.num_output_tokens, now - first, reply.finish_reason)
            yield reply


async def _answer(
    fm: FrontendManager,
    metrics: Metrics,
    request: Request,
    text: str | List[Dict[str, str]],
    req: Any,
    default_max_tokens: int,
    chunker: Chunker,
    final: Callable[[str, UserReply], Dict[str, Any]],
    usage: Callable[[UserReply], Dict[str, Any]] | None,
) -> Response:
    """Submit, wait for the first reply, then stream (``chunker`` per reply) or collect
    (``final(text, last_reply)``, whose ``logprobs`` then hold the whole answer's)."""
    params = req.sampling_params(default_max_tokens, fm.max_seq_len)
    uid = await fm.submit(
        text,
        params,
        stop=req.stop_strings,
        stop_token_ids=req.stop_token_ids,
        strict_max_tokens=req.max_tokens is not None,
    )
    replies = _timed(fm.replies(uid), metrics)
    try:
        first = await _until_disconnect(request, anext(replies))
    except ClientGone:
        await replies.aclose()
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
    if first.error is not None:
        await replies.aclose()
        fm.check_alive()  # a dead worker: 503
        param = next((f for f in ("max_tokens", "prompt") if f in first.error), None)
        raise APIError(400, first.error, param)

    if not req.stream:

        async def collect() -> tuple[str, UserReply]:
            parts, last = [first.incremental_output], first
            entries = list(first.logprobs)
            async with aclosing(replies):
                while not last.finished:
                    last = await anext(replies)
                    parts.append(last.incremental_output)
                    entries.extend(last.logprobs)
            last.logprobs = entries  # the whole answer's, for final()
            return "".join(parts), last

        try:
            text_out, last = await _until_disconnect(request, collect())
        except ClientGone:
            return Response(status_code=499)
        if last.error is not None:
            raise APIError(503, last.error, kind="server_error")
        return JSONResponse(final(text_out, last))

    return StreamingResponse(
        sse_stream(first, replies, chunker, usage), media_type="text/event-stream"
    )


def create_app(fm: FrontendManager) -> Guard:
    """The FastAPI application inside its ``Guard``; ``fm`` is started and stopped with it
    (lifespan)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await fm.start()
        print(
            f"API server ready at http://{fm.args.server_host}:{fm.args.server_port} "
            f"serving '{fm.args.model_name}'",
            flush=True,
        )
        yield
        fm.stop()

    app = FastAPI(title="mini-sglang", lifespan=lifespan)
    name = fm.args.model_name
    metrics = Metrics()

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(ClientDisconnect)
    async def _left(_: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=499)  # it hung up while sending its body: nobody reads this

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error")  # the traceback goes to the log, not the client
        return APIError(500, "internal server error", kind="server_error").response()

    def check_model(model: str) -> None:
        if model not in (name, fm.args.model_path):
            raise APIError(
                404,
                f"model '{model}' not found: this server serves '{name}'",
                "model",
                "not_found_error",
            )

    def head(kind: str, uid_prefix: str) -> Dict[str, Any]:
        return {
            "id": f"{uid_prefix}-{time.time_ns()}",
            "object": kind,
            "created": int(time.time()),
            "model": name,
        }

    @app.get("/health")
    async def health() -> Dict[str, Any]:
        fm.check_alive()  # names and states only: no PIDs or paths for a prober to read
        return {"status": "ok", "workers": {w.name: "alive" for w in fm.workers}}

    @app.get("/stats")
    async def stats() -> Dict[str, Any]:
        return {**await fm.stats(), "open_requests": len(fm.queues)}

    @app.get("/metrics")
    async def prometheus() -> Response:
        figures, age = await fm.scheduler_figures()
        body = metrics.render(fm.counters(), figures, age)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> Dict[str, Any]:
        fm.check_alive()  # a load balancer reads a 200 here as "route to me"
        card = {
            "id": name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "mini-sglang",
            "root": name,
            "max_model_len": fm.max_seq_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        req = await parse_body(request, GenerateRequest)
        return await _answer(
            fm,
            metrics,
            request,
            req.prompt,
            req,
            128,
            generate_chunks,
            lambda text, r: {"text": text, "finish_reason": r.finish_reason, "usage": _usage(r)},
            None,
        )

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = await parse_body(request, CompletionRequest)
        check_model(req.model)
        h = head("text_completion", "cmpl")

        echo = req.prompt if req.echo else ""

        wants_logprobs = req.logprobs is not None

        def final(text: str, r: UserReply) -> Dict[str, Any]:
            choice = {
                "index": 0,
                "text": echo + text,
                "logprobs": completion_logprobs(r.logprobs) if wants_logprobs else None,
                "finish_reason": r.finish_reason,
            }
            return {**h, "choices": [choice], "usage": _usage(r)}

        def chunks(reply: UserReply, is_first: bool) -> List[Dict[str, Any]]:
            if is_first and echo:  # the prompt goes first, as its own chunk
                reply = UserReply(
                    **{**reply.__dict__, "incremental_output": echo + reply.incremental_output}
                )
            payloads = completion_chunks(h, reply, is_first)
            return with_completion_logprobs(payloads, reply) if wants_logprobs else payloads

        usage = functools.partial(usage_chunk, h) if req.include_usage else None
        return await _answer(fm, metrics, request, req.prompt, req, 16, chunks, final, usage)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = await parse_body(request, ChatCompletionRequest)
        check_model(req.model)
        h = head("chat.completion.chunk", "chatcmpl")
        if req.max_tokens is None and req.max_completion_tokens is not None:
            req.max_tokens = req.max_completion_tokens

        wants_logprobs = bool(req.logprobs)

        def final(text: str, r: UserReply) -> Dict[str, Any]:
            message = {"role": "assistant", "content": text}
            choice = {
                "index": 0,
                "message": message,
                "logprobs": chat_logprobs(r.logprobs) if wants_logprobs else None,
                "finish_reason": r.finish_reason,
            }
            return {**h, "object": "chat.completion", "choices": [choice], "usage": _usage(r)}

        def chunks(reply: UserReply, is_first: bool) -> List[Dict[str, Any]]:
            payloads = chat_chunks(h, reply, is_first)
            return with_chat_logprobs(payloads, reply) if wants_logprobs else payloads

        usage = functools.partial(usage_chunk, h) if req.include_usage else None
        return await _answer(
            fm, metrics, request, req.chat(), req, fm.max_seq_len - 1, chunks, final, usage
        )

    a = fm.args
    return Guard(
        app,
        a.server_host,
        api_key=a.api_key,
        allowed_origins=a.allowed_origins,
        allowed_hosts=a.allowed_hosts,
        max_body_bytes=a.max_body_bytes,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain in front of its shutdown: on SIGTERM or Ctrl-C it stops
    accepting connections, lets the open requests finish for up to ``grace_s`` seconds, and
    ends those still open with an error (a stream's last events: the error, ``[DONE]``)."""

    def __init__(self, config: uvicorn.Config, fm: FrontendManager, grace_s: float) -> None:
        super().__init__(config)
        self.fm, self.grace_s = fm, grace_s

    async def shutdown(self, sockets: Any = None) -> None:
        for server in self.servers:  # no new connection while the open requests finish
            server.close()
        await self.fm.drain(self.grace_s, give_up=lambda: self.force_exit)
        await super().shutdown(sockets)


def run_api_server(args: Any, workers: List[Any], info: Dict[str, Any]) -> Any:
    """Serve HTTP on ``args.server_host:args.server_port`` until Ctrl-C, SIGTERM or a
    worker's death. Returns None after a signal, the dead ``Worker`` after a death."""
    if not args.api_key and not is_loopback(args.server_host):
        logger.warning(
            f"serving on {args.server_host} without an API key: anyone who can reach this "
            "port can use the model (set --api-key or MINISGL_API_KEY)"
        )
    open_limit = args.max_running_req + args.max_queued_requests
    token_limit = args.max_outstanding_tokens
    if token_limit is None:  # twice what the KV cache holds: one pool running, one waiting
        token_limit = 2 * int(info["kv_tokens"])
    fm = FrontendManager(
        args,
        workers,
        int(info["max_seq_len"]),
        int(info.get("max_token_bytes", 0)),
        open_limit,
        int(info.get("min_message_tokens", 0)),
        token_limit,
    )
    config = uvicorn.Config(
        create_app(fm),
        host=args.server_host,
        port=args.server_port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=3,  # after the drain: the error events' time to go out
    )
    server = DrainingServer(config, fm, args.shutdown_grace_s)

    def on_dead(reason: str) -> None:
        server.should_exit = True  # the open requests have their error replies queued

    fm.on_dead = on_dead
    server.run()
    return fm.dead_worker
