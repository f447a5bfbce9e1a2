"""Messages that reach the API server from the tokenizer worker (chapter 12).

Mirrors upstream ``minisgl.message.frontend`` (``UserReply``), with the fields an
OpenAI-style answer needs added: why the request finished, token counts for ``usage``,
and an error for a refused request. ``StatsReply`` is the book's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List


@dataclass
class BaseFrontendMsg:
    """Anything the API server receives."""


@dataclass
class BatchFrontendMsg(BaseFrontendMsg):
    """Several replies sent together, handled in order."""

    data: List[BaseFrontendMsg] = field(default_factory=list)


@dataclass
class TopLogprob:
    """One alternative for a position: its text, UTF-8 ``bytes`` and ``logprob`` (natural log)."""

    token: str
    bytes: List[int]
    logprob: float


@dataclass
class TokenLogprob:
    """One output token's log-probability, for a request that asked for ``logprobs``:
    its text and UTF-8 ``bytes`` (a token may hold part of a character), ``logprob`` (natural
    log of the model's raw distribution), ``text_offset`` (characters into the answer where
    its text starts) and ``top_logprobs``, the most likely tokens at that position."""

    token: str
    bytes: List[int]
    logprob: float
    text_offset: int
    top_logprobs: List[TopLogprob] = field(default_factory=list)


@dataclass
class UserReply(BaseFrontendMsg):
    """New text of request ``uid``.

    ``incremental_output`` is what to append to what was sent before (possibly ``""``
    while a multi-byte character is incomplete). On the last reply ``finished`` is set and
    ``finish_reason`` is ``"stop"`` (an end-of-sequence token, a stop string or a stop token
    id) or ``"length"`` (``max_tokens`` or the context ran out). Token counts are in
    tokens; the output count includes a final end-of-sequence token. ``error`` is set when
    the request was refused.
    ``logprobs`` holds one entry per token whose text this reply completes, for a request
    that asked.
    """

    uid: int
    incremental_output: str
    finished: bool
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    error: str | None = None
    logprobs: List[TokenLogprob] = field(default_factory=list)


@dataclass
class StatsReply(BaseFrontendMsg):
    """The scheduler's counters, in answer to ``StatsQueryMsg`` ``uid`` (pages, rows and
    requests)."""

    uid: int
    stats: Dict[str, int] = field(default_factory=dict)
