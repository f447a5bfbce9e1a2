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

``submit`` refuses before it registers anything: a full queue (429, ``Retry-After``), a
server shutting down (503) and a prompt longer in bytes than the context could hold (400,
without tokenizing it). ``drain`` is the first step of a shutdown: no new request, the open
ones finish within a grace period or end with an error reply. Mirrors
upstream ``minisgl.server.api_server.FrontendManager``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
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
PEER_STOP_TIMEOUT_S = 5.0  # a rank's grace to exit on SIGTERM after its peer died  # +ch16


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
    ) -> None:
        """``max_token_bytes``: the most UTF-8 bytes one token decodes to (0: no prompt
        bound); ``max_open_requests``: requests running or waiting at most (0: no limit);
        ``min_message_tokens``: the fewest tokens the chat template spends on a message (0:
        no bound on their count)."""
        self.args, self.workers, self.max_seq_len = args, workers, max_seq_len
        self.max_prompt_bytes = max_seq_len * (max_token_bytes + 1) if max_token_bytes else 0
        self.max_open_requests = max_open_requests
        self.min_message_tokens = min_message_tokens
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

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # a strong reference, or the task may be collected mid-flight
        task.add_done_callback(self._tasks.discard)

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
        parts = [m["content"] for m in text] if chat else [text]  # type: ignore[index]
        size = sum(len(p.encode("utf-8")) for p in parts)
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
            APIError: 503 (a dead worker, or shutting down), 429 (too many open requests,
            with ``Retry-After``), 400 (``check_prompt``). Nothing is registered when it raises.
        """
        self.check_alive()
        if self.draining:
            raise APIError(503, "the server is shutting down", kind="server_error")
        if self.max_open_requests and len(self.queues) >= self.max_open_requests:
            raise APIError(
                429,
                f"the server is busy: {len(self.queues)} requests are open (at most "
                f"{self.max_open_requests}); retry later",
                kind="rate_limit_error",
                headers={"Retry-After": "1"},
            )
        self.check_prompt(text)
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
        try:
            await self.send.put(msg)
        except BaseException:  # unencodable, or cancelled: leave nothing behind
            self.queues.pop(uid, None)
            raise
        return uid

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
            self.queues.pop(uid, None)
            if not finished:
                self.abort(uid)

    def abort(self, uid: int) -> None:
        """Tell the pipeline to drop ``uid``; safe to call from a ``finally`` of a
        cancelled task (it does not await)."""
        self.queues.pop(uid, None)
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

    async def _listen(self) -> None:
        while True:
            msg = await self.recv.get()
            for reply in msg.data if isinstance(msg, BatchFrontendMsg) else [msg]:
                if isinstance(reply, StatsReply):
                    fut = self.stats_waiters.get(reply.uid)
                    if fut is not None and not fut.done():
                        fut.set_result(reply.stats)
                elif isinstance(reply, UserReply) and reply.uid in self.queues:
                    self.queues[reply.uid].put_nowait(reply)
