"""A request waiting for prefill. Mirrors upstream ``minisgl.scheduler.utils``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minisgl.core import SamplingParams

    from .prefill import ChunkedReq


@dataclass
class PendingReq:
    """A request in the prefill queue: its prompt ``input_ids`` ``[N]`` (CPU) and, once part
    of a long prompt has been prefilled, the ``ChunkedReq`` that holds its progress."""

    uid: int
    input_ids: torch.Tensor
    sampling_params: SamplingParams
    chunked_req: ChunkedReq | None = None

    @property
    def input_len(self) -> int:
        return len(self.input_ids)

    @property
    def output_len(self) -> int:
        return self.sampling_params.max_tokens
