"""The scheduler's grammars: compiled off its thread, a matcher per request, a mask per step.

A request with a grammar waits here, not in the prefill queue, until its grammar is compiled
(on a small thread pool, cached by ``(kind, text)``, each request getting a copy of the
compiled matcher); the batch keeps running meanwhile. A compile that takes longer than
``COMPILE_TIMEOUT_S`` fails the request with an error reply. Once admitted, a request's
matcher lives here under its uid (a retracted request keeps it: its tokens are kept too),
until the request finishes or is aborted (``release``). Each step, ``fill_mask`` writes the
batch's ``[B, ceil(V / 32)]`` bitmask (all ones for a row without a grammar) with one call
into the library, and ``advance`` moves a matcher by the token the step sampled.

SGLang's counterpart is ``GrammarManager`` with ``SamplingBatchInfo.vocab_mask``; upstream
mini-sglang has no structured output.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from threading import Lock
from typing import TYPE_CHECKING, Callable, Dict, List, Sequence, Tuple

import torch

from minisgl.utils import init_logger

from .grammar import GrammarBackend, GrammarError, Matcher

if TYPE_CHECKING:
    from minisgl.core import Req
    from minisgl.message import UserMsg

logger = init_logger(__name__)

COMPILE_TIMEOUT_S = 10.0  # a grammar not compiled by then fails its request
COMPILE_THREADS = 2
CACHED_GRAMMARS = 256  # compiled grammars kept, the least recently asked for dropped first


@dataclass
class _Waiting:
    msg: UserMsg
    compiled: Future  # of the grammar's Matcher at its start
    deadline: float  # time.monotonic() past which the request fails


class GrammarManager:
    """``make_backend`` builds the ``GrammarBackend`` on first use (on a compile thread: it
    reads the whole vocabulary), so a server whose clients never ask pays nothing.

    ``lockstep``: several tensor-parallel ranks each run this manager and must admit every
    request in the same step, so ``poll`` waits for every compile and no time limit applies
    (a compile's duration differs between ranks; its outcome does not).
    """

    def __init__(
        self,
        make_backend: Callable[[], GrammarBackend],
        device: torch.device,
        compile_timeout_s: float = COMPILE_TIMEOUT_S,
        lockstep: bool = False,
    ) -> None:
        self._make_backend = make_backend
        self._backend: GrammarBackend | None = None
        self._backend_lock = Lock()
        self.device = device
        self.compile_timeout_s = compile_timeout_s
        self.lockstep = lockstep
        self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar")
        self._compiled: Dict[Tuple[str, str], Future] = {}
        self.waiting: List[_Waiting] = []
        self.matchers: Dict[int, Matcher] = {}  # uid -> its matcher, while it runs
        self._ahead: Dict[int, int] = {}  # uid -> the token its matcher took before its results

    @property
    def backend(self) -> GrammarBackend:
        with self._backend_lock:
            if self._backend is None:
                self._backend = self._make_backend()
            return self._backend

    # ---- admission ------------------------------------------------------------------
    def add(self, msg: UserMsg) -> None:
        """Queue a request with a grammar; its compile starts now (or is already cached)."""
        key = msg.sampling_params.grammar
        assert key is not None
        compiled = self._compiled.pop(key, None)
        if compiled is None:
            compiled = self._pool.submit(lambda: self.backend.compile(*key))
        self._compiled[key] = compiled  # the most recent last
        if len(self._compiled) > CACHED_GRAMMARS:
            del self._compiled[next(iter(self._compiled))]
        self.waiting.append(_Waiting(msg, compiled, time.monotonic() + self.compile_timeout_s))

    def poll(self, wait_s: float = 0.0) -> Tuple[List[UserMsg], List[Tuple[UserMsg, str]]]:
        """The waiting requests whose grammar is ready (each with its matcher registered), and
        those that failed, each with the error for its client. Waits at most ``wait_s`` for a
        compile to finish when none has (an idle scheduler would otherwise spin)."""
        if self.lockstep:
            wait([w.compiled for w in self.waiting])
        elif wait_s > 0 and self.waiting and not any(w.compiled.done() for w in self.waiting):
            wait([w.compiled for w in self.waiting], timeout=wait_s, return_when=FIRST_COMPLETED)
        ready: List[UserMsg] = []
        failed: List[Tuple[UserMsg, str]] = []
        still: List[_Waiting] = []
        now = time.monotonic()
        for w in self.waiting:
            if w.compiled.done():
                error = w.compiled.exception()
                if error is None:
                    self.matchers[w.msg.uid] = w.compiled.result().copy()
                    ready.append(w.msg)
                else:
                    if not isinstance(error, GrammarError):  # not the grammar's fault: retry later
                        key = w.msg.sampling_params.grammar
                        if self._compiled.get(key) is w.compiled:
                            del self._compiled[key]
                        error = f"the grammar could not be compiled: {error}"
                    failed.append((w.msg, str(error)))
            elif now > w.deadline:
                kind = w.msg.sampling_params.grammar[0]  # type: ignore[index]
                failed.append(
                    (w.msg, f"the {kind} took longer than {self.compile_timeout_s:g} s to compile")
                )
            else:
                still.append(w)
        self.waiting = still
        return ready, failed

    def drop_waiting(self, uid: int) -> bool:
        """Forget a waiting request (aborted before its grammar was ready)."""
        before = len(self.waiting)
        self.waiting = [w for w in self.waiting if w.msg.uid != uid]
        return len(self.waiting) < before

    # ---- each step ------------------------------------------------------------------
    def fill_mask(self, reqs: Sequence[Req]) -> torch.Tensor | None:
        """The batch's bitmask ``[B, ceil(V / 32)]`` int32 on the device (all ones for a row
        without a grammar), or None when no request of the batch has one."""
        rows = [
            (m, i)
            for i, r in enumerate(reqs)
            if (m := self.matchers.get(r.uid)) is not None and not m.is_terminated()
        ]  # a terminated matcher's request is finished: its row stays open, nobody reads it
        if not rows:
            return None
        backend = self.backend
        bitmask = torch.full((len(reqs), (backend.vocab_size + 31) // 32), -1, dtype=torch.int32)
        backend.fill_bitmask(rows, bitmask)
        return bitmask.to(self.device, non_blocking=True)

    def has_grammar(self, reqs: Sequence[Req]) -> bool:
        """Whether any of ``reqs`` has a matcher here."""
        return any(r.uid in self.matchers for r in reqs)

    def advance(self, uid: int, token: int, ahead: bool = False) -> bool:
        """Move request ``uid``'s matcher by its sampled ``token``; True when the grammar has
        ended there (the request must finish). A request without a grammar: False.
        ``ahead``: the token is taken before its step's results are handled (for the next
        step's mask, under overlap); the call that handles them then moves nothing."""
        matcher = self.matchers.get(uid)
        if matcher is None:
            return False
        if ahead:
            self._ahead[uid] = token
        elif self._ahead.pop(uid, None) == token:
            return matcher.is_terminated()
        if not matcher.accept(token):  # the mask forbade it: only a bug gets here
            logger.error(f"request {uid}: token {token} broke its grammar: {matcher.error}")
            return True
        return matcher.is_terminated()

    def release(self, uid: int) -> None:
        """The request finished or was aborted: its matcher goes."""
        self.matchers.pop(uid, None)
        self._ahead.pop(uid, None)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
