"""Decode attention for a few requests on the split-KV Triton kernel.

One request's decode attention has only ``H_kv`` independent pieces of work, far too few
for a GPU, and FlashInfer splits a context only at page boundaries. The split-KV kernel
(``kernel.fused_ops.decode_attention``, ``triton/decode.py``) splits it into a fixed number
of chunks whatever the page size, so a single request's KV is read by the whole GPU. This
backend sends it the decode batches of at most ``FUSED_DECODE_MAX_BS`` requests, when no
request can be longer than ``SPLIT_KV_MAX_SEQ_LEN`` tokens (the kernel's loop count is fixed
at compile time from the longest possible context, so one CUDA graph serves every length);
every other batch goes to ``fallback`` (FlashInfer on CUDA), the way ``HybridBackend``
sends prefill and decode batches to two backends.

The kernel reads FlashInfer's paged index (``fi.paged_kv_index``) from device tensors,
``SplitKVMetadata``, which also records the batch's decode path for the fused model wrapper
(``models/fused_decode.py``). For a CUDA graph the index is copied into fixed buffers before
each replay, with no planning on the host at all. On the fused decode path ``forward_qkv``
takes the qkv GEMV's raw output and the kernel also does the q/k norms, RoPE and the KV
store. The speed-up ``split_kv`` off (``MINISGL_DISABLE_SPLIT_KV=1``) keeps the engine on
FlashInfer alone. Upstream mini-sglang uses FlashInfer's decode kernel at every batch size;
this backend is the book's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    List,
    Literal,
    Optional,
    Sequence,  # +ch20
)

import torch

from minisgl.core import get_global_ctx
from minisgl.kernel import has_kernel, speedups
from minisgl.kernel.batch_ops import decode_attention_batch, decode_attention_batch_qkv  # +ch20
from minisgl.kernel.fused_ops import decode_attention, decode_attention_qkv
from minisgl.kernel.speedups import FUSED_DECODE_MAX_BS
from minisgl.utils import div_ceil

from . import ATTENTION_BACKENDS, local_heads, register_backend
from .base import BaseAttnBackend, BaseAttnMetadata
from .fi import paged_kv_index
from .fi import serves as flashinfer_serves

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.kvcache import MHAKVCache
    from minisgl.models import ModelConfig

SPLIT_KV_MAX_SEQ_LEN = 4096  # past a few loop iterations the masked ones cost more than they save
# >>> ch20
DECODE_BATCH_MIN_BS = 64  # from here B x H_kv programs fill the GPU; below, FlashInfer's split wins
BATCH_PROGRAMS_PER_SM = 5  # Hopper: 128 threads x 96 registers, 39 KB shared each
# <<< ch20

# a decode batch's path: "split" on the split-KV kernel
# >>> ch19-ch19
# DecodePath = Literal["split"]
# <<< ch19-ch19
DecodePath = Literal["split", "batch"]  # and "batch" on the batch kernel  # +ch20


@dataclass
class SplitKVMetadata(BaseAttnMetadata):
    """A decode batch's paged KV index, on the device, as the kernels read it: request
    ``b``'s pages are ``kv_page_ids[kv_indptr[b]:kv_indptr[b+1]]`` and its last page holds
    ``kv_last_page_len[b]`` tokens; ``path`` says which kernel attends. Under a CUDA graph
    the tensors are views of the graph's fixed buffers."""

    kv_indptr: torch.Tensor  # [B + 1] int32
    kv_page_ids: torch.Tensor  # [pages] int32
    kv_last_page_len: torch.Tensor  # [B] int32, 1..P
    last_indices: torch.Tensor  # [B] int64: a decode batch's row b is request b's token
    path: DecodePath = "split"
    # >>> ch20: [B] int32: the batch kernel starts these rows' programs first to last
    order: Optional[torch.Tensor] = None
    # <<< ch20

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return self.last_indices[:bs]


# >>> ch20
def longest_first(seq_lens: Sequence[int], num_kv_heads: int, resident_programs: int) -> List[int]:
    """The order in which the batch kernel starts a batch's programs, as a list of its rows.

    ``seq_lens`` are the requests' contexts in tokens. With more programs
    (``len(seq_lens) x num_kv_heads``) than the GPU holds at once (``resident_programs``; 0
    sorts every batch), the longest contexts first (ties in the batch's order): they are read
    from the first wave on and the short ones fill the GPU at the end. With fewer, every
    program starts at once, there is no last wave to shorten, and the batch keeps its order:
    there sorting made a layer's attention slower (the performance case study). The
    speed-up ``longest_first`` off keeps the batch's order always."""
    rows = range(len(seq_lens))
    if not speedups.current().longest_first:
        return list(rows)
    if len(seq_lens) * num_kv_heads <= resident_programs:
        return list(rows)
    return sorted(rows, key=lambda b: -seq_lens[b])


# <<< ch20


@dataclass(frozen=True)
class QKNormRope:
    """What the attention layer does to q and k after the qkv GEMV, for ``forward_qkv``:
    Qwen3's per-head RMSNorm (``q_norm, k_norm: [D]`` and ``eps``; None for models without
    it) and RoPE from ``cos_sin_cache: [max_pos, D]`` float32 at the batch's positions."""

    cos_sin_cache: torch.Tensor
    q_norm: Optional[torch.Tensor]
    k_norm: Optional[torch.Tensor]
    eps: float


class SplitKVBackend(BaseAttnBackend):
    """``num_qo_heads``/``num_kv_heads`` are this rank's heads; ``fallback`` runs every batch
    that ``path`` declines, and its CUDA graphs."""

    def __init__(
        self, fallback: BaseAttnBackend, num_qo_heads: int, num_kv_heads: int, head_dim: int
    ) -> None:
        ctx = get_global_ctx()
        self.fallback = fallback
        self.kv_cache: MHAKVCache = ctx.kv_cache  # type: ignore[assignment]
        self.page_size = ctx.page_size
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.device = self.kv_cache.device
        self._graph_index: Optional[SplitKVMetadata] = None
        # >>> ch20: decodes of DECODE_BATCH_MIN_BS or more run here too, unless the speed-up is
        # off; read once, since the CUDA graphs of those sizes are captured on whichever it picks
        self.batch_kernel = speedups.current().decode_batch_kernel
        # how many of the batch kernel's programs run at once (none on the CPU: always sorted)
        self.resident_programs = 0
        if self.device.type == "cuda":
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            self.resident_programs = BATCH_PROGRAMS_PER_SM * sms
        # <<< ch20

    def path(self, batch: Batch) -> Optional[DecodePath]:
        """Which of this backend's decode paths runs ``batch`` (``_path`` decides by its
        padded size), or None: a prefill, or a batch the fallback backend runs."""
        return self._path(batch.padded_size) if batch.is_decode else None

    def _path(self, bs: int) -> Optional[DecodePath]:
        if (
            bs <= FUSED_DECODE_MAX_BS
            and get_global_ctx().page_table.shape[1] <= SPLIT_KV_MAX_SEQ_LEN
        ):
            return "split"
        # >>> ch20: or "batch" for one of at least DECODE_BATCH_MIN_BS
        if self.batch_kernel and bs >= DECODE_BATCH_MIN_BS:
            return "batch"
        # <<< ch20
        return None

    def prepare_metadata(self, batch: Batch) -> None:
        path = self.path(batch)
        if path is None:
            return self.fallback.prepare_metadata(batch)
        pin = self.device.type == "cuda"  # pinned: the copies below do not wait for the host
        reqs = batch.padded_reqs
        index = paged_kv_index(get_global_ctx().page_table, reqs, self.page_size, pin)
        meta = SplitKVMetadata(
            kv_indptr=index.kv_indptr.to(self.device, non_blocking=True),
            kv_page_ids=index.kv_page_ids,
            kv_last_page_len=index.kv_last_page_len.to(self.device, non_blocking=True),
            last_indices=torch.arange(batch.padded_size, device=self.device),
            path=path,
        )
        # >>> ch20
        if path == "batch":
            order = longest_first(
                [r.device_len for r in reqs], self.num_kv_heads, self.resident_programs
            )
            meta.order = torch.tensor(order, dtype=torch.int32, pin_memory=pin).to(
                self.device, non_blocking=True
            )
        # <<< ch20
        batch.attn_metadata = meta

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        meta = batch.attn_metadata
        if not isinstance(meta, SplitKVMetadata):
            return self.fallback.forward(q, k, v, layer_id, batch)
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        slots = (self.kv_cache.k_slots(layer_id), self.kv_cache.v_slots(layer_id))
        index = (meta.kv_indptr, meta.kv_page_ids, meta.kv_last_page_len)
        # >>> ch20
        if meta.path == "batch":
            return decode_attention_batch(
                q.contiguous(), *slots, *index, self.page_size, self.head_dim**-0.5, meta.order
            )
        # <<< ch20
        return decode_attention(
            q.contiguous(),
            *slots,
            *index,
            page_size=self.page_size,
            sm_scale=self.head_dim**-0.5,
            max_seq_len=get_global_ctx().page_table.shape[1],
        )

    def forward_qkv(
        self, qkv: torch.Tensor, rope: QKNormRope, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        """The attention layer from the qkv GEMV's output ``qkv: [B, (H_q + 2 H_kv) D]`` ->
        ``[B, H_q, D]``: q/k norms, RoPE, the KV store and the attention inside the kernels.
        Only for a batch with a ``path``.

        Raises:
            ValueError: for a batch whose metadata is not this backend's.
        """
        meta = batch.attn_metadata
        if not isinstance(meta, SplitKVMetadata):
            raise ValueError("forward_qkv needs a batch prepared by the split-KV backend")
        qk = (batch.positions, rope.cos_sin_cache, rope.q_norm, rope.k_norm, rope.eps)
        slots = (self.kv_cache.k_slots(layer_id), self.kv_cache.v_slots(layer_id), batch.out_loc)
        index = (meta.kv_indptr, meta.kv_page_ids, meta.kv_last_page_len)
        scale = self.head_dim**-0.5
        # >>> ch20
        if meta.path == "batch":
            return decode_attention_batch_qkv(
                qkv, *qk, *slots, *index, self.page_size, scale, self.num_qo_heads, meta.order
            )
        # <<< ch20
        return decode_attention_qkv(
            qkv,
            *qk,
            *slots,
            *index,
            page_size=self.page_size,
            sm_scale=scale,
            max_seq_len=get_global_ctx().page_table.shape[1],
            num_qo_heads=self.num_qo_heads,
        )

    # ---- CUDA graphs: the sizes this backend takes here, the rest the fallback's -----------
    @property
    def supports_cuda_graph(self) -> bool:
        return self.fallback.supports_cuda_graph

    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        self.fallback.init_capture_graph(max_seq_len, bs_list)
        max_bs = max((bs for bs in bs_list if self._path(bs) is not None), default=1)
        self._graph_index = SplitKVMetadata(
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device),
            kv_page_ids=torch.zeros(
                max_bs * div_ceil(max_seq_len, self.page_size),
                dtype=torch.int32,
                device=self.device,
            ),
            kv_last_page_len=torch.ones(max_bs, dtype=torch.int32, device=self.device),
            last_indices=torch.arange(max_bs, device=self.device),
            order=torch.arange(max_bs, dtype=torch.int32, device=self.device),  # +ch20
        )

    def prepare_for_capture(self, batch: Batch) -> None:
        if self.path(batch) is None:
            return self.fallback.prepare_for_capture(batch)
        self.prepare_metadata(batch)
        self.prepare_for_replay(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        meta = batch.attn_metadata
        if not isinstance(meta, SplitKVMetadata):
            return self.fallback.prepare_for_replay(batch)
        assert self._graph_index is not None, "init_capture_graph first"
        bs, graph = batch.padded_size, self._graph_index
        views = SplitKVMetadata(
            graph.kv_indptr[: bs + 1],
            graph.kv_page_ids,
            graph.kv_last_page_len[:bs],
            graph.last_indices[:bs],
            meta.path,
        )
        copies = [
            (views.kv_indptr, meta.kv_indptr),
            (views.kv_page_ids, meta.kv_page_ids),
            (views.kv_last_page_len, meta.kv_last_page_len),
        ]
        # >>> ch20
        if meta.order is not None:
            views.order = graph.order[:bs]  # type: ignore[index]
            copies.append((views.order, meta.order))
        # <<< ch20
        stream = torch.cuda.current_stream(self.device)
        for buffer, values in copies:
            buffer[: values.numel()].copy_(values)
            # made on the scheduler's stream under overlap scheduling, and dropped just below:
            # the allocator must not hand its memory out again before this copy has run
            values.record_stream(stream)
        batch.attn_metadata = views


def serves(device: torch.device, dtype: torch.dtype) -> bool:
    """Where FlashInfer serves (it takes the batches this backend declines) and the Triton
    kernels run, unless the speed-up ``split_kv`` is off."""
    return (
        flashinfer_serves(device, dtype)
        and has_kernel("decode_attention", "triton", device)
        and speedups.current().split_kv
    )


@register_backend("split_kv", rank=10, serves=serves)
def _build(config: ModelConfig) -> BaseAttnBackend:
    """Decodes of a few requests on the split-KV kernel; every other batch on FlashInfer (an
    fp16/bf16 pool on CUDA) or the torch backend."""
    pool = get_global_ctx().kv_cache
    fallback = "fi" if flashinfer_serves(pool.device, pool.dtype) else "torch"
    return SplitKVBackend(
        ATTENTION_BACKENDS[fallback].build(config), *local_heads(config), config.head_dim
    )
