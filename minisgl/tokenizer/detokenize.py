"""Token ids back to text, one token at a time, for streaming.

Decoding each new token on its own is wrong: byte-level BPE splits an emoji or a CJK
character into several tokens, each of which decodes to U+FFFD ("\ufffd") alone, and
some tokenizers drop or add a space depending on the tokens before. So each request keeps
a small window: ``prefix_offset..read_offset`` are the ids of the text already sent last
time (context), ``read_offset..`` the ids not sent yet. Each step decodes the window with
and without the new ids; the difference is the new text, sent only when it does not end in
U+FFFD (a character still incomplete). When the request finishes, the whole output is
decoded once and whatever the stream has not sent yet is sent, so the concatenation of
everything sent equals ``tokenizer.decode(all ids)``.

Stop conditions the client chose are checked here, on the decoded text: a token of
``stop_token_ids`` ends the answer like an end-of-sequence token, and the text passes
through the request's ``StopChecker`` (``stop.py``), which holds back a possible beginning
of a stop string. A stop ends the request before the scheduler's ``max_tokens`` does: the
``Delta`` says ``abort`` so the worker tells the scheduler to stop generating. A request
that asked for logprobs gets each token's entry in the ``Delta`` that completes its text
(``logprobs.py``), so hold-back and multi-byte characters neither lose nor repeat one.

This is the scheme of vLLM's ``detokenize_incrementally``; upstream
``minisgl.tokenizer.detokenize.DetokenizeManager`` uses the same offsets and, while the
decoded text ends in an incomplete character, sends it only up to the last space.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Dict, List, Sequence, Tuple

from transformers import PreTrainedTokenizerBase

from minisgl.message import DetokenizeMsg
from minisgl.message.frontend import TokenLogprob
from minisgl.utils import init_logger

from .logprobs import LogprobQueue, TokenTexts
from .stop import StopChecker

logger = init_logger(__name__)
INCOMPLETE = "\ufffd"


@dataclass
class DecodeStatus:
    """One request's progress. ``sent`` is the text streamed so far."""

    num_prompt_tokens: int
    ignore_eos: bool
    ids: List[int] = field(default_factory=list)
    num_output_tokens: int = 0  # tokens generated, a final EOS included
    sent: str = ""  # decoded so far (the stop checker may still hold the end of it back)
    prefix_offset: int = 0
    read_offset: int = 0
    stop: StopChecker | None = None
    stop_token_ids: AbstractSet[int] = frozenset()
    logprobs: LogprobQueue | None = None  # for a request that asked for logprobs
    released: int = 0  # characters of the answer sent to the client


@dataclass
class Delta:
    """What ``detokenize`` returns for one message: new text, and on the last message why
    it finished and the output length (tokens)."""

    uid: int
    text: str
    finished: bool
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    error: str | None = None
    abort: bool = False  # a stop ended it before the scheduler did: stop generating
    logprobs: List[TokenLogprob] = field(default_factory=list)


class DetokenizeManager:
    """``add(uid, ...)`` when a request is tokenized, ``detokenize(msgs)`` for each step's
    tokens, ``forget(uid)`` when its client goes away. Messages of unknown (forgotten)
    requests are skipped."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_token_ids: AbstractSet[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.status: Dict[int, DecodeStatus] = {}
        self.token_texts = TokenTexts(tokenizer)

    def add(
        self,
        uid: int,
        num_prompt_tokens: int,
        ignore_eos: bool,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        logprobs: bool = False,
    ) -> None:
        self.status[uid] = DecodeStatus(
            num_prompt_tokens,
            ignore_eos,
            stop=StopChecker(list(stop)) if stop else None,
            stop_token_ids=frozenset(stop_token_ids),
            logprobs=LogprobQueue() if logprobs else None,
        )

    def forget(self, uid: int) -> None:
        self.status.pop(uid, None)

    def detokenize(self, msgs: List[DetokenizeMsg]) -> List[Delta]:
        """The new text of each message of a known request, in order. A finished request
        is forgotten afterwards.

        Several steps' tokens may come at once (the worker drains its queue): the k-th
        token of every request goes in round k, and each round decodes all of its
        windows in two ``batch_decode`` calls.
        """
        rounds: List[List[Tuple[int, DetokenizeMsg]]] = []
        seen: Dict[int, int] = {}
        for i, msg in enumerate(msgs):
            k = seen[msg.uid] = seen.get(msg.uid, -1) + 1
            if k == len(rounds):
                rounds.append([])
            rounds[k].append((i, msg))
        out: Dict[int, Delta] = {}
        for round_ in rounds:
            for i, delta in zip(
                [i for i, _ in round_], self._detokenize_round([m for _, m in round_])
            ):
                if delta is not None:
                    out[i] = delta
        return [out[i] for i in sorted(out)]

    def _detokenize_round(self, msgs: List[DetokenizeMsg]) -> List[Delta | None]:
        """One token per request at most; ``None`` for an unknown request."""
        known: List[Tuple[DetokenizeMsg, DecodeStatus, bool]] = []  # (msg, status, stop id)
        for msg in msgs:
            s = self.status.get(msg.uid)
            if s is None:
                continue
            stop_id = msg.error is None and msg.next_token in s.stop_token_ids
            if msg.error is None:
                s.num_output_tokens += 1
                # like the offline LLM: a final EOS ends the text and is not part of it
                eos = msg.finished and msg.next_token in self.eos_token_ids and not s.ignore_eos
                if not (eos or stop_id):
                    s.ids.append(msg.next_token)
                    if s.logprobs is not None and msg.logprobs is not None:
                        s.logprobs.add(self.token_texts.entry(msg))
            known.append((msg, s, stop_id))
        context = self.tokenizer.batch_decode(
            [s.ids[s.prefix_offset : s.read_offset] for _, s, _ in known]
        )
        window = self.tokenizer.batch_decode([s.ids[s.prefix_offset :] for _, s, _ in known])
        deltas: Dict[int, Delta] = {}
        for (msg, s, stop_id), before, now in zip(known, context, window):
            text = ""
            if len(now) > len(before) and not now.endswith(INCOMPLETE):
                text = now[len(before) :]
                s.prefix_offset, s.read_offset = s.read_offset, len(s.ids)
            finished = msg.finished or stop_id
            if finished:
                text += self._flush(s, text)
            start = len(s.sent)
            s.sent += text
            if s.logprobs is not None and (text or finished):
                s.logprobs.place(start, len(s.sent))
            stopped = False
            if s.stop is not None:
                text, stopped = s.stop.feed(text)
                if finished and not stopped:
                    text += s.stop.flush()
            s.released += len(text)
            logprobs = []
            if s.logprobs is not None:
                logprobs = s.logprobs.release(s.released, stopped, finished or stopped)
            reason = None
            if stopped or stop_id:
                reason = "stop"
            elif msg.finished and msg.error is None:
                eos = msg.next_token in self.eos_token_ids and not s.ignore_eos
                reason = "stop" if eos else "length"
            if finished or stopped:
                del self.status[msg.uid]
            deltas[id(msg)] = Delta(
                msg.uid,
                text,
                finished or stopped,
                reason,
                s.num_prompt_tokens,
                s.num_output_tokens,
                msg.error,
                abort=(stopped or stop_id) and not msg.finished,
                logprobs=logprobs,
            )
        return [deltas.get(id(m)) for m in msgs]

    def _flush(self, s: DecodeStatus, pending: str) -> str:
        """The rest of the full decode once ``s.sent + pending`` has gone out."""
        full, sent = str(self.tokenizer.decode(s.ids)), s.sent + pending
        if full.startswith(sent):
            return full[len(sent) :]
        # a tokenizer whose decode is not prefix-stable: the stream cannot take text back
        logger.warning("incremental text diverged from the full decode; sending the unsent tail")
        return str(self.tokenizer.decode(s.ids[s.read_offset :]))
