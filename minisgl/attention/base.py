"""The attention backend interface: plan once per batch, then run every layer.

A backend is asked twice per forward pass. ``prepare_metadata(batch)`` runs once, before
the model: it turns the batch's requests into whatever index tensors its kernels need
(sequence lengths, where each request's KV lives) and stores them in
``batch.attn_metadata``. ``forward(q, k, v, layer_id, batch)`` runs in every layer: it
stores this step's K/V into the pool and attends over each request's whole context.

Chapter 19's fused decode path calls ``forward_qkv(qkv, qk, layer_id, batch)`` instead,
with the qkv GEMV's raw output: by default one kernel normalises and rotates q and k and
stores K/V, then ``forward`` runs with ``k = v = None`` (already stored), which the model
does only with a backend whose ``accepts_stored_kv`` is True; a backend may do it all in
one kernel (FlashInfer's, for one or two requests).

A backend that can be replayed inside a CUDA graph (chapter 18) also says so with
``supports_cuda_graph`` and implements three more methods: ``init_capture_graph`` once,
``prepare_for_capture`` before capturing each batch size, ``prepare_for_replay`` before
every replay. The torch backend cannot (its Python loop over requests is not a fixed
sequence of kernels), so with it the engine simply runs every step eagerly.
Mirrors upstream ``minisgl.attention.base``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, List, NamedTuple, Optional

if TYPE_CHECKING:
    import torch

    from minisgl.core import Batch


class QKNormRope(NamedTuple):
    """What still has to happen to q and k between the qkv GEMV and the attention on the
    fused decode path: Qwen3's per-head RMSNorm (``q_norm, k_norm: [D]`` and ``eps``; None
    for models without it) and RoPE from ``cos_sin_cache: [max_pos, D]`` float32 at the
    batch's positions; with this rank's head counts."""

    cos_sin_cache: torch.Tensor
    q_norm: Optional[torch.Tensor]
    k_norm: Optional[torch.Tensor]
    eps: float
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int


class BaseAttnMetadata(ABC):
    @abstractmethod
    def get_last_indices(self, bs: int) -> torch.Tensor:
        """Row of each request's last token in the packed ``[T, ...]`` batch, ``[bs]`` int64."""


class BaseAttnBackend(ABC):
    # Whether ``forward`` takes ``k = v = None``, meaning this step's K/V are already in the
    # pool (chapter 19's fused decode path stores them); a backend that cannot keeps False.
    accepts_stored_kv = False

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Fill ``batch.attn_metadata``; called after the page table holds this step's slots."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: Optional[torch.Tensor],
        v: Optional[torch.Tensor],
        layer_id: int,
        batch: Batch,
    ) -> torch.Tensor:
        """``q: [T, H_q, D]``, ``k, v: [T, H_kv, D]`` -> ``[T, H_q, D]``; stores k, v first
        unless they are None (already stored at ``batch.out_loc`` by the fused decode path)."""

    def forward_qkv(
        self, qkv: torch.Tensor, qk: QKNormRope, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        """The fused decode path's attention (chapter 19), from ``qkv: [T, (H_q + 2 H_kv) D]``
        -> ``[T, H_q, D]``: q/k norms, RoPE and the KV store in one kernel
        (``kernel.qk_norm_rope_store``), then ``forward`` with the K/V already stored.
        Only called on a backend whose ``accepts_stored_kv`` is True."""
        from minisgl.core import get_global_ctx
        from minisgl.kernel import qk_norm_rope_store

        pool = get_global_ctx().kv_cache
        q = qk_norm_rope_store(
            qkv,
            batch.positions,
            qk.cos_sin_cache,
            qk.q_norm,
            qk.k_norm,
            qk.eps,
            pool.k_slots(layer_id),
            pool.v_slots(layer_id),
            batch.out_loc,
            qk.num_qo_heads,
            qk.num_kv_heads,
            qk.head_dim,
        )
        return self.forward(q, None, None, layer_id, batch)

    # ---- CUDA graphs (chapter 18); only backends with supports_cuda_graph implement these
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


class HybridBackend(BaseAttnBackend):
    """One backend for prefill batches and another for decode batches (``"fa,fi"``)."""

    def __init__(self, prefill_backend: BaseAttnBackend, decode_backend: BaseAttnBackend) -> None:
        self.prefill_backend = prefill_backend
        self.decode_backend = decode_backend

    @property
    def accepts_stored_kv(self) -> bool:  # type: ignore[override]
        return self.prefill_backend.accepts_stored_kv and self.decode_backend.accepts_stored_kv

    def _pick(self, batch: Batch) -> BaseAttnBackend:
        return self.prefill_backend if batch.is_prefill else self.decode_backend

    def prepare_metadata(self, batch: Batch) -> None:
        self._pick(batch).prepare_metadata(batch)

    def forward(
        self,
        q: torch.Tensor,
        k: Optional[torch.Tensor],
        v: Optional[torch.Tensor],
        layer_id: int,
        batch: Batch,
    ) -> torch.Tensor:
        return self._pick(batch).forward(q, k, v, layer_id, batch)

    def forward_qkv(
        self, qkv: torch.Tensor, qk: QKNormRope, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        return self._pick(batch).forward_qkv(qkv, qk, layer_id, batch)

    # graphs replay decode batches only, so the decode backend decides
    @property
    def supports_cuda_graph(self) -> bool:
        return self.decode_backend.supports_cuda_graph

    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        self.decode_backend.init_capture_graph(max_seq_len, bs_list)

    def prepare_for_capture(self, batch: Batch) -> None:
        self.decode_backend.prepare_for_capture(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        self.decode_backend.prepare_for_replay(batch)
