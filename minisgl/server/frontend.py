"""The API server's side of the pipeline: request ids, replies, aborts, dead workers.

Every HTTP request gets a ``uid`` and an ``asyncio.Queue``. One background task reads the
tokenizer worker's replies and drops each into its request's queue; the handler reading
that queue turns replies into HTTP. A request whose client left is aborted: the tokenizer
worker and the scheduler forget it and free its KV pages and table row.

The workers are watched without polling: a process's ``sentinel`` is a file descriptor
that becomes readable when the process ends, so the event loop calls ``_worker_died`` the
moment one does. From then on every open request gets an error reply, new ones are
refused with 503, the log names the dead process and its exit code, and ``on_dead`` (the
API server's shutdown) is called: a server that cannot serve exits rather than answer 503
forever. Under tensor parallelism the other scheduler ranks are stopped too: they cannot go
on without their peer.

``submit`` refuses before it registers anything, and before any tokenizing: a server
shutting down (503), a prompt longer in bytes than the context could hold (400), and
overload (429, ``Retry-After``): too many open requests, or too many outstanding tokens.
A request's outstanding tokens are the work it may still cost the engine: until its first
reply, its prompt (estimated from its bytes) plus its ``max_tokens``; afterwards, the tokens
it may still generate. Each reply updates them, so the frontend knows the load without asking
the scheduler. ``/metrics`` renders these counters, with the scheduler's KV-page figures as
last heard (``scheduler_figures`` waits ``STATS_WAIT_S`` at most for fresh ones).
``drain`` is the first step of a shutdown: no new request, the open ones finish within a
grace period or end with an error reply. Mirrors upstream
``minisgl.server.api_server.FrontendManager``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncGenerator, Callable, Dict, List, Sequence, Set

from minisgl.core import SamplingParams
from minisgl.message import AbortMsg, StatsQueryMsg, TokenizeMsg
from minisgl.message.frontend import BatchFrontendMsg, StatsReply, UserReply
from minisgl.message.utils import dumps, loads
from minisgl.utils import init_logger
from minisgl.utils.mp import ZmqAsyncPullQueue, ZmqAsyncPushQueue

from .protocol import APIError

if TYPE_CHECKING:
    from .args import ServerArgs
    from .worker import Worker

logger = init_logger("minisgl.server.frontend")
STATS_TIMEOUT_S = 10.0
STATS_REFRESH_S = 1.0  # /metrics asks the scheduler again when its figures are older than this
STATS_WAIT_S = 0.2  # and waits this long at most for the answer
PEER_STOP_TIMEOUT_S = 5.0  # a rank's grace to exit on SIGTERM after its peer died  # +ch16


def prompt_bytes(text: str | List[Dict[str, str]]) -> int:
    """UTF-8 bytes of a prompt, or of a chat's message contents."""
    parts = [text] if isinstance(text, str) else [m["content"] for m in text]
    return sum(len(p.encode("utf-8")) for p in parts)


@dataclass
class Work:
    """What an open request may still cost the engine, in tokens."""

    max_new_tokens: int  # its output budget, the context's limit applied
    outstanding: int  # prompt estimate + output budget until the first reply; then what is left
    prompt_bytes: int = 0  # UTF-8 bytes of its text (its messages' contents, for a chat)
    template_tokens: int = 0  # the chat template's fewest tokens for its messages
    started: bool = False  # a reply came: the scheduler has read its prompt


class FrontendManager:
    """Call ``start()`` inside the running event loop, ``stop()`` before it ends."""

    def __init__(
        self,
        args: ServerArgs,
        workers: List[Worker],
        max_seq_len: int,
        max_token_bytes: int = 0,
        max_open_requests: int = 0,
        min_message_tokens: int = 0,
        max_outstanding_tokens: int = 0,
    ) -> None:
        """``max_token_bytes``: the most UTF-8 bytes one token decodes to (0: no prompt
        bound); ``max_open_requests``: requests running or waiting at most (0: no limit);
        ``min_message_tokens``: the fewest tokens the chat template spends on a message (0:
        no bound on their count); ``max_outstanding_tokens``: the open requests' work at
        most, in tokens (0: no limit)."""
        self.args, self.workers, self.max_seq_len = args, workers, max_seq_len
        self.max_prompt_bytes = max_seq_len * (max_token_bytes + 1) if max_token_bytes else 0
        self.max_open_requests = max_open_requests
        self.min_message_tokens = min_message_tokens
        self.max_outstanding_tokens = max_outstanding_tokens
        self.work: Dict[int, Work] = {}  # per open request
        self.outstanding_tokens = 0  # the sum of ``work[uid].outstanding``
        self.tokens_per_byte = 1.0  # prompts seen so far (a token is at least a byte)
        self._prompts_seen = 0
        self.scheduler_stats: Dict[str, int] = {}  # the last answer to a stats query
        self.scheduler_stats_at = 0.0  # when it came (``time.monotonic()``)
        self._refresh_task: asyncio.Task[None] | None = None
        self.on_dead: Callable[[str], None] | None = None
        self._uids = itertools.count()
        self.queues: Dict[int, asyncio.Queue[UserReply]] = {}
        self.stats_waiters: Dict[int, asyncio.Future[Dict[str, int]]] = {}
        self.dead: str | None = None  # why nothing can be served any more
        self.dead_worker: Worker | None = None  # the worker whose death that was
        self.stopping = False
        self.draining = False  # SIGTERM or Ctrl-C: no new request is admitted
        self._gone: Set[str] = set()  # workers whose end was handled
        self._tasks: Set[asyncio.Task[Any]] = set()

    # ---- life cycle ---------------------------------------------------------------------
    async def start(self) -> None:
        args = self.args
        self.recv: ZmqAsyncPullQueue[Any] = ZmqAsyncPullQueue(
            args.zmq_frontend_addr, create=True, decoder=loads
        )
        self.send: ZmqAsyncPushQueue[Any] = ZmqAsyncPushQueue(
            args.zmq_detokenizer_addr, create=False, encoder=dumps
        )
        self._spawn(self._listen())
        loop = asyncio.get_running_loop()
        for w in self.workers:
            loop.add_reader(w.process.sentinel, self._worker_died, w)
            if w.process.exitcode is not None:  # died between start-up and now
                self._worker_died(w)

    def stop(self) -> None:
        self.stopping = True
        loop = asyncio.get_running_loop()
        for w in self.workers:
            loop.remove_reader(w.process.sentinel)
        for task in list(self._tasks):
            task.cancel()
        self.recv.stop()
        self.send.stop()

    async def drain(self, grace_s: float, give_up: Callable[[], bool] = lambda: False) -> None:
        """Stop admitting, wait up to ``grace_s`` seconds for the open requests to finish,
        then end each one still open with an error reply (``give_up()`` true, a second
        Ctrl-C say, ends the wait early)."""
        self.draining = True
        deadline = time.monotonic() + grace_s
        while self.queues and self.dead is None and not give_up() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.queues and self.dead is None:
            reason = f"the server is shutting down: not finished within {grace_s:g} s"
            logger.warning(f"{reason}: ending {len(self.queues)} open request(s)")
            for uid, q in self.queues.items():
                q.put_nowait(UserReply(uid=uid, incremental_output="", finished=True, error=reason))

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # a strong reference, or the task may be collected mid-flight
        task.add_done_callback(self._tasks.discard)
        return task

    def _worker_died(self, worker: Worker) -> None:
        asyncio.get_running_loop().remove_reader(worker.process.sentinel)
        if self.stopping or worker.name in self._gone:
            return
        self._gone.add(worker.name)
        worker.process.join(timeout=1.0)  # its sentinel fired: the exit code is moments away
        if self.dead is not None:  # already failing; e.g. a rank stopped after its peer died
            logger.info(f"worker {worker.describe()} ended ({worker.exit_text()})")
            return
        reason = f"worker {worker.name} died ({worker.exit_text()})"
        logger.error(
            f"{reason}: failing {len(self.queues)} open request(s) and stopping the server"
        )
        self.dead, self.dead_worker = reason, worker
        for uid, q in self.queues.items():
            q.put_nowait(UserReply(uid=uid, incremental_output="", finished=True, error=reason))
        for fut in self.stats_waiters.values():
            if not fut.done():
                fut.set_exception(APIError(503, reason, kind="server_error"))
        # >>> ch16: the other ranks cannot run a step without this one, and may be blocked in
        # a collective waiting for it. SIGTERM (a clean exit) first; SIGKILL for one stuck
        # inside a collective, where Python's handler never runs.
        ranks = [w for w in self.workers if w.name.startswith("minisgl-scheduler-")]
        if len(ranks) > 1 and worker in ranks:
            for w in ranks:
                if w is not worker and w.process.exitcode is None:
                    logger.error(f"stopping {w.name}: its tensor-parallel peer is gone")
                    w.process.terminate()
                    asyncio.get_running_loop().call_later(
                        PEER_STOP_TIMEOUT_S, lambda p=w.process: p.exitcode is None and p.kill()
                    )
        # <<< ch16
        if self.on_dead is not None:
            self.on_dead(reason)

    # ---- requests -----------------------------------------------------------------------
    def check_alive(self) -> None:
        """Raises ``APIError`` 503 once a worker has died. Asks each process too (a
        non-blocking ``waitpid``), so ``/health`` is right even before the event loop has
        seen a sentinel."""
        if self.dead is None and not self.stopping:
            for w in self.workers:
                if w.process.exitcode is not None:
                    self._worker_died(w)
        if self.dead is not None:
            raise APIError(503, f"the server cannot serve: {self.dead}", kind="server_error")

    def check_prompt(self, text: str | List[Dict[str, str]]) -> None:
        """Refuse, without tokenizing, a prompt that cannot fit the context: more bytes long
        than ``max_seq_len`` tokens of the longest token in the vocabulary (plus one byte)
        can spell, or a chat of more messages than the template's tokens for each leave room
        for.

        Raises:
            APIError: 400 naming the field (``prompt`` or ``messages``).
        """
        chat = not isinstance(text, str)
        k = self.min_message_tokens
        if chat and k and len(text) * k >= self.max_seq_len:
            raise APIError(
                400,
                f"'messages' has {len(text)} messages: the chat template spends at least {k} "
                f"tokens on each, more than the context limit of {self.max_seq_len} tokens",
                "messages",
            )
        if not self.max_prompt_bytes:
            return
        size = prompt_bytes(text)
        if size > self.max_prompt_bytes:
            field = "messages" if chat else "prompt"
            raise APIError(
                400,
                f"'{field}' has {size} bytes: more than the context limit of {self.max_seq_len} "
                f"tokens can hold (at most {self.max_prompt_bytes} bytes)",
                field,
            )

    async def submit(
        self,
        text: str | List[Dict[str, str]],
        params: SamplingParams,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        strict_max_tokens: bool = False,
    ) -> int:
        """Send a new request to the tokenizer worker; returns its uid. With
        ``strict_max_tokens`` (the client chose ``max_tokens``) a prompt that leaves fewer
        tokens of the context is refused rather than answered shorter.

        Raises:
            APIError: 503 (a dead worker, or shutting down), 400 (``check_prompt``), 429
            (``check_load``). Nothing is registered when it raises.
        """
        self.check_alive()
        if self.draining:
            raise APIError(503, "the server is shutting down", kind="server_error")
        self.check_prompt(text)
        work = self.estimate_work(text, params.max_tokens)
        self.check_load(work.outstanding)
        uid = next(self._uids)
        msg = TokenizeMsg(
            uid=uid,
            text=text,
            sampling_params=params,
            stop=list(stop),
            stop_token_ids=list(stop_token_ids),
            context_len=self.max_seq_len if strict_max_tokens else 0,
        )
        self.queues[uid] = asyncio.Queue()
        self.work[uid] = work
        self.outstanding_tokens += work.outstanding
        try:
            await self.send.put(msg)
        except BaseException:  # unencodable, or cancelled: leave nothing behind
            self._forget(uid)
            raise
        return uid

    def estimate_work(self, text: str | List[Dict[str, str]], max_tokens: int) -> Work:
        """A new request's outstanding tokens, before tokenizing: its prompt's UTF-8 bytes
        at the tokens per byte that earlier prompts showed (one before any: a token is at
        least a byte), plus the template's tokens per message, plus its output budget, all
        within the context."""
        size = prompt_bytes(text)
        template = 0 if isinstance(text, str) else len(text) * self.min_message_tokens
        prompt = math.ceil(size * self.tokens_per_byte) + template
        new = min(max_tokens, self.max_seq_len)
        return Work(new, min(prompt + new, self.max_seq_len), size, template)

    def check_load(self, tokens: int) -> None:
        """Refuse a request when the open ones already reach ``max_open_requests``, or when
        its ``tokens`` would take the outstanding work past ``max_outstanding_tokens`` (a
        request alone is always let in, however large).

        Raises:
            APIError: 429 naming the limit, with ``Retry-After: 1``.
        """
        open_now, queued = len(self.queues), self.outstanding_tokens
        if self.max_open_requests and open_now >= self.max_open_requests:
            why = f"{open_now} requests are open (at most {self.max_open_requests})"
        elif (
            self.max_outstanding_tokens and queued and queued + tokens > self.max_outstanding_tokens
        ):
            why = (
                f"{queued} tokens of work are outstanding and this request may add {tokens} "
                f"(at most {self.max_outstanding_tokens})"
            )
        else:
            return
        raise APIError(
            429,
            f"the server is busy: {why}; retry later",
            kind="rate_limit_error",
            headers={"Retry-After": "1"},
        )

    def _forget(self, uid: int) -> None:
        self.queues.pop(uid, None)
        work = self.work.pop(uid, None)
        if work is not None:
            self.outstanding_tokens -= work.outstanding

    def _account(self, reply: UserReply) -> None:
        """A reply's news for the counters: the prompt is read, and so many tokens made."""
        work = self.work.get(reply.uid)
        if work is None:
            return
        if not work.started and reply.num_prompt_tokens and work.prompt_bytes:
            # tokens per byte: the mean of the first 32 prompts, then a moving average
            seen = max(0, reply.num_prompt_tokens - work.template_tokens) / work.prompt_bytes
            self._prompts_seen += 1
            weight = 1 / min(self._prompts_seen, 32)
            self.tokens_per_byte += weight * (min(seen, 1.0) - self.tokens_per_byte)
        budget = min(work.max_new_tokens, self.max_seq_len - reply.num_prompt_tokens)
        left = 0 if reply.finished else max(0, budget - reply.num_output_tokens)
        self.outstanding_tokens += left - work.outstanding
        work.outstanding, work.started = left, True

    def counters(self) -> Dict[str, float]:
        """The frontend's own figures, current without asking any other process."""
        started = sum(1 for w in self.work.values() if w.started)
        return {
            "open_requests": len(self.queues),
            "started_requests": started,
            "waiting_requests": len(self.work) - started,
            "outstanding_tokens": self.outstanding_tokens,
        }

    async def replies(self, uid: int) -> AsyncGenerator[UserReply, None]:
        """The replies of request ``uid`` up to and including the finished one. The request
        is forgotten afterwards; leaving early (client gone) aborts it."""
        finished = False
        try:
            while not finished:
                reply = await self.queues[uid].get()
                finished = reply.finished
                yield reply
        finally:
            self._forget(uid)
            if not finished:
                self.abort(uid)

    def abort(self, uid: int) -> None:
        """Tell the pipeline to drop ``uid``; safe to call from a ``finally`` of a
        cancelled task (it does not await)."""
        self._forget(uid)
        if self.dead is None and not self.stopping:
            logger.info(f"request {uid}: client gone, aborting")
            self._spawn(self.send.put(AbortMsg(uid=uid)))

    async def stats(self) -> Dict[str, int]:
        """The scheduler's counters (``SchedulerIOMixin.collect_stats``).

        Raises:
            APIError: 503 when a worker is dead or the scheduler does not answer in time.
        """
        self.check_alive()
        uid = next(self._uids)
        fut: asyncio.Future[Dict[str, int]] = asyncio.get_running_loop().create_future()
        self.stats_waiters[uid] = fut
        try:
            await self.send.put(StatsQueryMsg(uid=uid))
            return await asyncio.wait_for(fut, STATS_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise APIError(
                503, f"the scheduler did not answer in {STATS_TIMEOUT_S:.0f} s", kind="server_error"
            ) from None
        finally:
            self.stats_waiters.pop(uid, None)

    async def scheduler_figures(self) -> tuple[Dict[str, int], float]:
        """The scheduler's last counters (``stats``) and their age in seconds (infinite
        before the first answer). Older than ``STATS_REFRESH_S``, they are asked for again,
        and the answer awaited for ``STATS_WAIT_S`` at most: a busy scheduler's figures
        arrive for a later call, and this one shows the old ones with their age."""
        if self._stats_age() > STATS_REFRESH_S and self.dead is None:
            if self._refresh_task is None or self._refresh_task.done():
                self._refresh_task = self._spawn(self._refresh())
            try:
                await asyncio.wait_for(asyncio.shield(self._refresh_task), STATS_WAIT_S)
            except asyncio.TimeoutError:
                pass
        return self.scheduler_stats, self._stats_age()

    def _stats_age(self) -> float:
        if not self.scheduler_stats:
            return float("inf")
        return time.monotonic() - self.scheduler_stats_at

    async def _refresh(self) -> None:
        try:
            stats = await self.stats()
            self.scheduler_stats, self.scheduler_stats_at = stats, time.monotonic()
        except APIError:
            pass  # the figures stay as old as their age says

    async def _listen(self) -> None:
        while True:
            msg = await self.recv.get()
            for reply in msg.data if isinstance(msg, BatchFrontendMsg) else [msg]:
                if isinstance(reply, StatsReply):
                    fut = self.stats_waiters.get(reply.uid)
                    if fut is not None and not fut.done():
                        fut.set_result(reply.stats)
                elif isinstance(reply, UserReply) and reply.uid in self.queues:
                    self._account(reply)
                    self.queues[reply.uid].put_nowait(reply)
