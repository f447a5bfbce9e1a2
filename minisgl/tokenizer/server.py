"""The tokenizer worker: one process that tokenizes new requests and detokenizes tokens.

It sits between the API server and the scheduler and listens on one address for both:

* from the API server: ``TokenizeMsg`` -> ``UserMsg`` (to the scheduler); ``AbortMsg`` ->
  ``AbortBackendMsg``; any backend message (a stats query) is passed on unchanged;
* from the scheduler: ``DetokenizeMsg`` -> ``UserReply`` (to the API server); any
  frontend message (a stats reply) is passed on unchanged.

Whatever is waiting is taken in one go, so one scheduler step's tokens (a
``BatchTokenizerMsg``) are detokenized together and answered in one ``BatchFrontendMsg``.
One worker doing both jobs is upstream's default (``--num-tokenizer 0``); it also lets the
detokenizer know each request's prompt length and ``ignore_eos``, which ``usage`` and
the final-EOS rule need, and owns each request's stop strings: a request a stop ended is
aborted in the scheduler (``AbortBackendMsg``) so it stops generating. A prompt that leaves
fewer tokens of the context than an explicit ``max_tokens`` (``TokenizeMsg.context_len``)
is refused with both numbers. Mirrors upstream ``minisgl.tokenizer.server.tokenize_worker``.
"""

from __future__ import annotations

from typing import Callable, List

from minisgl.message import (
    AbortBackendMsg,
    AbortMsg,
    BaseBackendMsg,
    BatchBackendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    TokenizeMsg,
    UserMsg,
)
from minisgl.message.frontend import BaseFrontendMsg, BatchFrontendMsg, UserReply
from minisgl.message.utils import dumps, loads
from minisgl.utils import init_logger, load_eos_token_ids, load_tokenizer
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue

from .detokenize import DetokenizeManager
from .tokenize import TokenizeManager

logger = init_logger(__name__)
MAX_DRAIN = 1024  # messages taken per iteration at most, so replies keep flowing


def _unwrap(msg: object) -> List[object]:
    if isinstance(msg, (BatchTokenizerMsg, BatchFrontendMsg, BatchBackendMsg)):
        return [m for inner in msg.data for m in _unwrap(inner)]
    return [msg]


def _batch(msgs: List, wrap: Callable[[List], object]) -> object:
    return msgs[0] if len(msgs) == 1 else wrap(msgs)


class TokenizerWorker:
    """The worker's state; ``run`` is its loop. Binds ``addr`` (pull), connects to
    ``backend_addr`` and ``frontend_addr`` (push)."""

    def __init__(self, model_path: str, addr: str, backend_addr: str, frontend_addr: str) -> None:
        tokenizer = load_tokenizer(model_path)
        # the longest text one token decodes to: bounds a prompt's bytes by the context
        vocab = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        self.max_token_bytes = max(len(t.encode("utf-8", "surrogatepass")) for t in vocab)
        self.tokenize_manager = TokenizeManager(tokenizer)
        self.min_message_tokens = self.tokenize_manager.min_tokens_per_message()  # +ch15
        self.detokenize_manager = DetokenizeManager(
            tokenizer, load_eos_token_ids(model_path, tokenizer)
        )
        self.recv: ZmqPullQueue[object] = ZmqPullQueue(addr, create=True, decoder=loads)
        self.send_backend: ZmqPushQueue[object] = ZmqPushQueue(
            backend_addr, create=False, encoder=dumps
        )
        self.send_frontend: ZmqPushQueue[object] = ZmqPushQueue(
            frontend_addr, create=False, encoder=dumps
        )

    def run(self) -> None:
        """Serve until an ``ExitMsg`` arrives (or the process is interrupted)."""
        while True:
            pending = _unwrap(self.recv.get())
            while len(pending) < MAX_DRAIN and not self.recv.empty():
                pending.extend(_unwrap(self.recv.get()))
            if any(isinstance(m, ExitMsg) for m in pending):
                return
            self.handle(pending)

    def handle(self, msgs: List[object]) -> None:
        """One iteration: everything for the scheduler goes in one message, everything for
        the API server in another. Per request, order is kept (a request's abort always
        follows its tokenize message)."""
        to_frontend: List[BaseFrontendMsg] = []
        to_backend: List[BaseBackendMsg] = []
        detok = [m for m in msgs if isinstance(m, DetokenizeMsg)]
        for delta in self.detokenize_manager.detokenize(detok):
            to_frontend.append(
                UserReply(
                    uid=delta.uid,
                    incremental_output=delta.text,
                    finished=delta.finished,
                    finish_reason=delta.finish_reason,
                    num_prompt_tokens=delta.num_prompt_tokens,
                    num_output_tokens=delta.num_output_tokens,
                    error=delta.error,
                    logprobs=delta.logprobs,
                )
            )
            if delta.abort:
                to_backend.append(AbortBackendMsg(uid=delta.uid))
        for msg in msgs:
            if isinstance(msg, TokenizeMsg):
                reply = self._tokenize_one(msg)
                if isinstance(reply, UserMsg):
                    to_backend.append(reply)
                else:
                    to_frontend.append(reply)
            elif isinstance(msg, AbortMsg):
                self.detokenize_manager.forget(msg.uid)
                to_backend.append(AbortBackendMsg(uid=msg.uid))
            elif isinstance(msg, BaseBackendMsg):
                to_backend.append(msg)
            elif isinstance(msg, BaseFrontendMsg):
                to_frontend.append(msg)
            elif not isinstance(msg, DetokenizeMsg):
                logger.warning(f"tokenizer worker: ignoring a {type(msg).__name__}")
        if to_backend:
            self.send_backend.put(_batch(to_backend, BatchBackendMsg))
        if to_frontend:
            self.send_frontend.put(_batch(to_frontend, BatchFrontendMsg))

    def _tokenize_one(self, msg: TokenizeMsg) -> UserMsg | UserReply:
        try:
            ids = self.tokenize_manager.tokenize([msg])[0]
        except Exception as e:  # a bad chat message must not take the worker down
            logger.warning(f"request {msg.uid}: cannot tokenize: {e}")
            return UserReply(
                uid=msg.uid, incremental_output="", finished=True, error=f"cannot tokenize: {e}"
            )
        n, max_tokens, limit = len(ids), msg.sampling_params.max_tokens, msg.context_len
        if limit and n < limit and n + max_tokens > limit:
            return UserReply(
                uid=msg.uid,
                incremental_output="",
                finished=True,
                error=f"max_tokens is {max_tokens}, but the prompt has {n} tokens and the "
                f"context limit is {limit} tokens: at most {limit - n} remain",
            )
        self.detokenize_manager.add(
            msg.uid,
            n,
            msg.sampling_params.ignore_eos,
            msg.stop,
            msg.stop_token_ids,
            logprobs=msg.sampling_params.logprobs is not None,
        )
        return UserMsg(uid=msg.uid, input_ids=ids, sampling_params=msg.sampling_params)

    def stop(self) -> None:
        for queue in (self.recv, self.send_backend, self.send_frontend):
            queue.stop()
