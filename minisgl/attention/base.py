"""The attention backend interface: plan once per batch, then run every layer.

A backend is asked twice per forward pass. ``prepare_metadata(batch)`` runs once, before
the model: it turns the batch's requests into whatever index tensors its kernels need
(sequence lengths, where each request's KV lives) and stores them in
``batch.attn_metadata``. ``forward(q, k, v, layer_id, batch)`` runs in every layer: it
stores this step's K/V into the pool and attends over each request's whole context.
Mirrors upstream ``minisgl.attention.base``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import (
    TYPE_CHECKING,
    List,  # +ch18
)

if TYPE_CHECKING:
    import torch

    from minisgl.core import Batch


class BaseAttnMetadata(ABC):
    @abstractmethod
    def get_last_indices(self, bs: int) -> torch.Tensor:
        """Row of each request's last token in the packed ``[T, ...]`` batch, ``[bs]`` int64."""


class BaseAttnBackend(ABC):
    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Fill ``batch.attn_metadata``; called after the page table holds this step's slots."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        """``q: [T, H_q, D]``, ``k, v: [T, H_kv, D]`` -> ``[T, H_q, D]``; stores k and v at
        ``batch.out_loc`` of layer ``layer_id``'s pool first, then attends."""

    # >>> ch18: a backend that can be replayed inside a CUDA graph says so, and implements
    # three more methods: init_capture_graph once, prepare_for_capture before capturing each
    # batch size, prepare_for_replay before every replay. One whose Python loop over
    # requests is not a fixed sequence of kernels cannot; the engine then runs every step
    # eagerly.
    @property
    def supports_cuda_graph(self) -> bool:
        return False

    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        """Allocate the fixed index buffers that every captured decode batch size shares.

        ``max_seq_len``: tokens per request at most; ``bs_list``: the batch sizes to capture.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def prepare_for_capture(self, batch: Batch) -> None:
        """Plan a decode ``batch`` of a captured size into the fixed buffers, before capture."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def prepare_for_replay(self, batch: Batch) -> None:
        """Re-plan the fixed buffers for ``batch`` (metadata already prepared), before replay."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    # <<< ch18


# >>> ch05
class HybridBackend(BaseAttnBackend):
    """One backend for prefill batches and another for decode batches (``"fa,fi"``)."""

    def __init__(self, prefill_backend: BaseAttnBackend, decode_backend: BaseAttnBackend) -> None:
        self.prefill_backend = prefill_backend
        self.decode_backend = decode_backend

    def _pick(self, batch: Batch) -> BaseAttnBackend:
        return self.prefill_backend if batch.is_prefill else self.decode_backend

    def prepare_metadata(self, batch: Batch) -> None:
        self._pick(batch).prepare_metadata(batch)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        return self._pick(batch).forward(q, k, v, layer_id, batch)

    # >>> ch18: graphs replay decode batches only, so the decode backend decides
    @property
    def supports_cuda_graph(self) -> bool:
        return self.decode_backend.supports_cuda_graph

    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        self.decode_backend.init_capture_graph(max_seq_len, bs_list)

    def prepare_for_capture(self, batch: Batch) -> None:
        self.decode_backend.prepare_for_capture(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        self.decode_backend.prepare_for_replay(batch)

    # <<< ch18


# <<< ch05
