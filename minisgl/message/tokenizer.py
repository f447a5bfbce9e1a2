"""Messages bound for the tokenizer worker: from the scheduler, ``DetokenizeMsg`` (one new
token); the offline ``LLM`` collects them in memory. Mirrors upstream
``minisgl.message.tokenizer``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import (
    Dict,  # +ch12
    List,
)

from minisgl.core import SamplingParams  # +ch12


@dataclass
class BaseTokenizerMsg:
    """Anything the tokenizer worker receives."""


# >>> ch12
@dataclass
class BatchTokenizerMsg(BaseTokenizerMsg):
    """Several messages sent together (one scheduler step's tokens), handled in order."""

    data: List[BaseTokenizerMsg] = field(default_factory=list)


# <<< ch12


@dataclass
class SampledLogprobs:
    """One sampled token's ``logprob`` (natural log of the model's raw distribution) and its
    most likely alternatives, most likely first: ``top_ids`` and their ``top_logprobs``."""

    logprob: float
    top_ids: List[int] = field(default_factory=list)
    top_logprobs: List[float] = field(default_factory=list)


@dataclass
class DetokenizeMsg(BaseTokenizerMsg):
    """One new token of request ``uid``; ``finished`` marks its last message.

    ``error`` is set (and ``next_token`` is -1) when the request was refused, e.g. a
    prompt longer than the model's context: the client gets an answer, not silence.
    ``logprobs`` is set only for a request that asked for them (one field, so the other
    messages grow by a single ``None``).
    """

    uid: int
    next_token: int
    finished: bool
    error: str | None = None
    logprobs: SampledLogprobs | None = None


# >>> ch12: from the API server
@dataclass
class TokenizeMsg(BaseTokenizerMsg):
    """A new request: ``text`` is a prompt, or chat messages (``[{"role": "user",
    "content": "..."}]``) to which the model's chat template is applied."""

    uid: int
    text: str | List[Dict[str, str]]
    sampling_params: SamplingParams
    stop: List[str] = field(default_factory=list)  # stop strings, checked as text is decoded
    stop_token_ids: List[int] = field(default_factory=list)  # tokens that end the answer
    context_len: int = 0  # > 0: refuse a prompt leaving fewer than max_tokens of this many


@dataclass
class AbortMsg(BaseTokenizerMsg):
    """The client of request ``uid`` went away: forget it and tell the scheduler."""

    uid: int


# <<< ch12
