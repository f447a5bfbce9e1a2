"""Token embedding and LM head, named for how they split over several GPUs: by rows of the
vocabulary (one process holds them all).

Mirrors upstream ``minisgl.layers.embedding``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # +ch16

from minisgl.core import get_global_ctx
from minisgl.distributed import (
    DistributedCommunicator,  # +ch16
    get_tp_info,
)
from minisgl.kernel import embedding_gather, linear
from minisgl.utils import div_ceil

from .base import BaseOP
from .shard import vocab_range  # +ch16


class VocabParallelEmbedding(BaseOP):
    """``ids: [T]`` -> ``[T, hidden]``: the rows of the table, the kernel op
    ``embedding_gather``. Each rank holds ``ceil(V / tp)`` rows of the table."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        tp = get_tp_info()
        self.num_embeddings = num_embeddings
        self._tp_size = tp.size
        # >>> ch16: rank r looks up rows [start, end); the last rank's block ends in zero rows
        # that no id reaches when tp does not divide V (upstream pads the same way)
        self._vocab_start, self._vocab_end, _ = vocab_range(num_embeddings, tp.rank, tp.size)
        self._comm = DistributedCommunicator()
        # <<< ch16
        self.weight = torch.empty(div_ceil(num_embeddings, tp.size), embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # >>> ch16: a rank writes zeros for the ids outside its slice, and an all-reduce adds
        # the slices up: exactly one rank contributes each row
        if self._tp_size > 1:
            in_slice = (x >= self._vocab_start) & (x < self._vocab_end)
            y = F.embedding(torch.where(in_slice, x - self._vocab_start, 0), self.weight)
            y = y * in_slice.unsqueeze(-1).to(y.dtype)
            return self._comm.all_reduce(y)
        # <<< ch16
        return embedding_gather(x, self.weight)


class ParallelLMHead(VocabParallelEmbedding):
    """Hidden states -> logits ``[B, V]``, one row per request.

    In prefill only each request's last position predicts a token that will be kept, so
    the head projects only those rows (``attn_metadata.get_last_indices``): a prefill of
    1,000 tokens computes 1 row of ``V`` logits per request, not 1,000. With tied
    embeddings (SmolLM2, Qwen3-0.6B) the loader gives this head the embedding's weight.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = get_global_ctx().batch
        if batch.is_prefill:
            x = x[batch.attn_metadata.get_last_indices(batch.padded_size)]
        logits = linear(x, self.weight)  # [B, ceil(V / tp)]: equal on every rank
        # >>> ch16
        if self._tp_size > 1:
            # gather along dim 0 (the collective's), then cut the padding rows' logits off;
            # contiguous again, as a sampler's kernels expect
            logits = (
                self._comm.all_gather(logits.T.contiguous())
                .T[:, : self.num_embeddings]
                .contiguous()
            )
        # <<< ch16
        return logits
