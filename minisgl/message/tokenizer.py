"""Messages the scheduler sends to the detokenizer (explained in chapter 12).

Mirrors upstream ``minisgl.message.tokenizer``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DetokenizeMsg:
    """One new token of request ``uid``; ``finished`` marks its last message.

    ``error`` is set (and ``next_token`` is -1) when the request was refused, e.g. a
    prompt longer than the model's context: the client gets an answer, not silence.
    """

    uid: int
    next_token: int
    finished: bool
    error: str | None = None
