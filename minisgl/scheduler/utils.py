"""A request waiting for prefill. Mirrors upstream ``minisgl.scheduler.utils``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minisgl.core import SamplingParams

    from .prefill import ChunkedReq  # +ch10


@dataclass
class PendingReq:
    """A request in the prefill queue: its prompt ``input_ids`` ``[N]`` (CPU)."""

    uid: int
    input_ids: torch.Tensor
    sampling_params: SamplingParams
    # >>> ch10: once part of a long prompt has been prefilled, the chunk that holds its progress
    chunked_req: ChunkedReq | None = None
    # <<< ch10

    @property
    def input_len(self) -> int:
        return len(self.input_ids)

    @property
    def output_len(self) -> int:
        return self.sampling_params.max_tokens
