"""Token embedding and LM head, both split over the vocabulary under tensor parallelism.

Mirrors upstream ``minisgl.layers.embedding``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.core import get_global_ctx
from minisgl.distributed import DistributedCommunicator, get_tp_info
from minisgl.kernel import embedding_gather, linear

from .base import BaseOP
from .shard import vocab_range


class VocabParallelEmbedding(BaseOP):
    """``ids: [T]`` -> ``[T, hidden]``. Each rank holds ``ceil(V / tp)`` rows of the table.

    A rank looks up the ids that fall in its slice, writes zeros for the others, and an
    all-reduce adds the slices up: exactly one rank contributes each row. When ``tp`` does
    not divide ``V`` the last rank's block ends in zero rows that no id reaches (upstream
    pads the same way). On one rank the lookup is the kernel op ``embedding_gather``.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        tp = get_tp_info()
        self.num_embeddings = num_embeddings
        self._vocab_start, self._vocab_end, self.num_embeddings_tp = vocab_range(
            num_embeddings, tp.rank, tp.size
        )
        self._tp_size = tp.size
        self._comm = DistributedCommunicator()
        self.weight = torch.empty(self.num_embeddings_tp, embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._tp_size == 1:
            return embedding_gather(x, self.weight)
        in_slice = (x >= self._vocab_start) & (x < self._vocab_end)
        y = F.embedding(torch.where(in_slice, x - self._vocab_start, 0), self.weight)
        y = y * in_slice.unsqueeze(-1).to(y.dtype)
        return self._comm.all_reduce(y)


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
        if self._tp_size > 1:
            # gather along dim 0 (the collective's), then cut the padding rows' logits off;
            # contiguous again, since FlashInfer's sampling kernels take only contiguous logits
            logits = (
                self._comm.all_gather(logits.T.contiguous())
                .T[:, : self.num_embeddings]
                .contiguous()
            )
        return logits
