"""Messages that reach the scheduler (the "backend"); the offline ``LLM`` hands them to it
in memory. Mirrors upstream ``minisgl.message.backend``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import torch

from minisgl.core import SamplingParams


@dataclass
class BaseBackendMsg:
    """Anything the scheduler's ``receive_msg`` may return."""


@dataclass
class UserMsg(BaseBackendMsg):
    """A new request: ``input_ids`` ``[N]`` int32 CPU token ids of the prompt."""

    uid: int
    input_ids: torch.Tensor
    sampling_params: SamplingParams


@dataclass
class AbortBackendMsg(BaseBackendMsg):
    """Stop request ``uid`` (its client went away, or a stop string ended its answer) and
    release what it holds."""

    uid: int


@dataclass
class ExitMsg(BaseBackendMsg):
    """Shut the scheduler down."""


@dataclass
class BatchBackendMsg(BaseBackendMsg):
    """Several messages sent together, handled in order."""

    data: List[BaseBackendMsg] = field(default_factory=list)


# >>> ch12
@dataclass
class StatsQueryMsg(BaseBackendMsg):
    """Ask the scheduler for its counters (free KV pages, free table rows, ...). It answers
    with a ``StatsReply`` carrying the same ``uid``; not in upstream (the book's server
    exposes the counters at ``GET /stats``)."""

    uid: int


# <<< ch12
