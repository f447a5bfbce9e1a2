"""Paged attention on the GPU with FlashInfer: plan once per batch, run in every layer.

FlashInfer describes a batch's KV cache the way the page table does, in pages. For B
requests it wants, in CSR form (``indptr`` arrays of ``B + 1`` offsets):

* ``qo_indptr`` — request ``i``'s queries are rows ``qo_indptr[i]:qo_indptr[i+1]`` of q;
* ``kv_indptr`` and ``kv_page_ids`` — its pages are ``kv_page_ids[kv_indptr[i]:kv_indptr[i+1]]``;
* ``kv_last_page_len`` — how many of the last page's ``P`` slots it uses (1..P).

Our page table stores token slots (``page * P + offset``), so the page ids of a request
are the slots of positions ``0, P, 2P, ...`` divided by ``P``: ``paged_kv_index`` below, a
pure function the CPU tests check. A wrapper's ``plan`` turns these into a work schedule
(how to split long sequences over the SMs); ``run`` then executes it for one layer. Planning
costs a host-to-device copy and some CPU work, so it happens once per batch and every
layer reuses it.

Prefill batches use ``BatchPrefillWithPagedKVCacheWrapper`` with a causal mask; FlashInfer
aligns that mask to the end of each request's KV, so a prompt with a cached prefix (queries
at positions ``cached_len ..``) sees the whole prefix. Decode batches use
``BatchDecodeWithPagedKVCacheWrapper``, on tensor cores when 4 or more query heads share
a KV head (the group is then big enough to fill an MMA tile), and for a group of 2
(Qwen3-0.6B) at the batch sizes where that measured faster; the eager path keeps one decode
wrapper per kernel.

Mirrors upstream ``minisgl.attention.fi.FlashInferBackend`` (which supports page size 1
only; this one takes any ``P``).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,  # +ch18
    List,
    Sequence,
)

import torch

from minisgl.core import get_global_ctx
from minisgl.utils import div_ceil, init_logger

from . import local_heads, register_backend
from .base import BaseAttnBackend, BaseAttnMetadata

if TYPE_CHECKING:
    from minisgl.core import Batch, Req
    from minisgl.kvcache import MHAKVCache
    from minisgl.models import ModelConfig

logger = init_logger(__name__)

WORKSPACE_BYTES = 128 * 1024**2  # FlashInfer's recommended float workspace (split-KV partials)
TENSOR_CORE_MIN_GROUP = 4  # query heads per KV head from which decode runs on tensor cores
# smaller groups, measured on an H200 (performance case study): tensor cores up to this batch
TENSOR_CORE_MAX_BATCH = {2: 64}


def use_tensor_cores(num_qo_heads: int, num_kv_heads: int, batch_size: int | None = None) -> bool:
    """Whether decode runs on tensor cores: always when a KV head serves >= 4 query heads
    (Llama-3-8B: 4, yes), and for a group listed in ``TENSOR_CORE_MAX_BATCH`` up to its batch
    size (Qwen3-0.6B: 2, up to 64 requests). ``batch_size=None`` answers for the group
    alone: tensor cores only from a group of 4. SmolLM2's group of 3 is not listed."""
    group = num_qo_heads // num_kv_heads
    if group >= TENSOR_CORE_MIN_GROUP:
        return True
    return batch_size is not None and batch_size <= TENSOR_CORE_MAX_BATCH.get(group, 0)


@dataclass(frozen=True)
class PagedKVIndex:
    """FlashInfer's view of B requests' KV. CPU tensors are what ``plan`` reads on the host."""

    qo_indptr: torch.Tensor  # [B + 1] int32, CPU: query rows of each request
    kv_indptr: torch.Tensor  # [B + 1] int32, CPU: page range of each request in kv_page_ids
    kv_last_page_len: torch.Tensor  # [B] int32, CPU: slots used in the last page, 1..P
    seq_lens: torch.Tensor  # [B] int32, CPU: KV length of each request, in tokens
    kv_page_ids: torch.Tensor  # [kv_indptr[-1]] int32, on the page table's device


def paged_kv_index(
    page_table: torch.Tensor, reqs: Sequence[Req], page_size: int, pin: bool = False
) -> PagedKVIndex:
    """Derive FlashInfer's paged-KV index of ``reqs`` from the page table.

    ``page_table: [rows, align_up(max_seq_len, 32)]`` int32 token slots; each request reads its row
    ``table_idx`` up to ``device_len`` (this step's tokens included: the backend stores
    them before attending). ``pin`` puts the CPU tensors in pinned memory, so the copies
    ``plan`` starts are asynchronous.

    Raises:
        ValueError: for ``page_size < 1`` or an empty batch.
    """
    if page_size < 1 or not reqs:
        raise ValueError(
            f"need page_size >= 1 and at least one request, got {page_size}, {len(reqs)}"
        )
    seq_lens = [r.device_len for r in reqs]
    num_pages = [div_ceil(n, page_size) for n in seq_lens]
    last_page_len = [n - (p - 1) * page_size for n, p in zip(seq_lens, num_pages)]

    def host(values: List[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, pin_memory=pin)

    # position k*P is offset 0 of the request's k-th page: its slot is page * P
    first_slots = torch.cat([page_table[r.table_idx, : r.device_len : page_size] for r in reqs])
    page_ids = first_slots if page_size == 1 else first_slots // page_size
    return PagedKVIndex(
        qo_indptr=host([0, *accumulate(r.extend_len for r in reqs)]),
        kv_indptr=host([0, *accumulate(num_pages)]),
        kv_last_page_len=host(last_page_len),
        seq_lens=host(seq_lens),
        kv_page_ids=page_ids,
    )


@dataclass
class FIMetadata(BaseAttnMetadata):
    index: PagedKVIndex
    last_indices: torch.Tensor  # [B] int64 on the device: each request's last query row
    wrapper: Any  # the FlashInfer wrapper that will run this batch
    planned: bool = False

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return self.last_indices[:bs]


class FlashInferBackend(BaseAttnBackend):
    """``num_qo_heads``/``num_kv_heads`` are this rank's heads; ``kv_cache`` the pool, whose
    layers are ``[num_pages, P, H_kv, D]`` (FlashInfer's "NHD" layout, used as is).

    Raises:
        ImportError: when ``flashinfer`` is not installed (``pip install -e .[gpu]``).
        ValueError: when the pool is not on CUDA or not fp16/bf16.
    """

    def __init__(
        self,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        kv_cache: MHAKVCache,
        page_size: int,
    ) -> None:
        import flashinfer

        if kv_cache.device.type != "cuda" or kv_cache.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(
                f"FlashInfer needs an fp16/bf16 KV cache on CUDA, got {kv_cache.dtype} on {kv_cache.device}"
            )
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.kv_cache, self.page_size = kv_cache, page_size
        self.device, self.dtype = kv_cache.device, kv_cache.dtype
        # one float workspace for every wrapper: they run one after another on one stream
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        # fa2: FlashInfer's fa3 path is slower for these shapes on Hopper (upstream's finding)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, kv_layout="NHD", backend="fa2"
        )
        # eager decode: one wrapper per kernel, so that a batch runs the kernel its graph would
        self.decode_wrappers = {
            tensor_cores: flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, kv_layout="NHD", use_tensor_cores=tensor_cores, backend="fa2"
            )
            for tensor_cores in (False, True)
        }
        # plan() fills a pinned host buffer, then copies it to the GPU asynchronously; the
        # next plan must not overwrite that buffer before the copy has run
        self._plan_done = torch.cuda.Event()
        self._plan_done.record()
        self.graph_wrappers: Dict[int, Any] = {}  # +ch18

    # ---- every batch ---------------------------------------------------------------------
    def prepare_metadata(self, batch: Batch) -> None:
        index = paged_kv_index(
            get_global_ctx().page_table, batch.padded_reqs, self.page_size, pin=True
        )
        last = (index.qo_indptr[1:] - 1).to(torch.int64).pin_memory()
        if batch.is_decode:
            wrapper = self.decode_wrapper_for(batch.padded_size)
        else:
            wrapper = self.prefill_wrapper
        batch.attn_metadata = FIMetadata(
            index=index, last_indices=last.to(self.device, non_blocking=True), wrapper=wrapper
        )

    def decode_wrapper_for(self, bs: int) -> Any:
        """The eager decode wrapper for a batch of ``bs`` requests: on tensor cores or not,
        as ``use_tensor_cores`` decides for that size (and so as the graph of that size)."""
        return self.decode_wrappers[use_tensor_cores(self.num_qo_heads, self.num_kv_heads, bs)]

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        meta: FIMetadata = batch.attn_metadata  # type: ignore[assignment]
        if not meta.planned:
            # Planned here, in the first layer, rather than in prepare_metadata: under overlap
            # scheduling prepare_metadata runs on the scheduler's stream while the previous
            # batch still runs on the engine's, and plan() overwrites the workspace that
            # batch's kernels are reading. Here we are on the engine stream, in order.
            self._plan(meta)
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        paged_kv = (self.kv_cache.k_cache(layer_id), self.kv_cache.v_cache(layer_id))
        return meta.wrapper.run(q, paged_kv)

    def _plan(self, meta: FIMetadata) -> None:
        import flashinfer

        self._plan_done.synchronize()
        idx = meta.index
        common = dict(
            num_qo_heads=self.num_qo_heads,
            num_kv_heads=self.num_kv_heads,
            page_size=self.page_size,
            pos_encoding_mode="NONE",
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
            seq_lens=idx.seq_lens,
            non_blocking=True,
        )
        if isinstance(meta.wrapper, flashinfer.BatchDecodeWithPagedKVCacheWrapper):
            meta.wrapper.plan(
                indptr=idx.kv_indptr,
                indices=idx.kv_page_ids,
                last_page_len=idx.kv_last_page_len,
                head_dim=self.head_dim,
                **common,
            )
        else:
            meta.wrapper.plan(
                qo_indptr=idx.qo_indptr,
                paged_kv_indptr=idx.kv_indptr,
                paged_kv_indices=idx.kv_page_ids,
                paged_kv_last_page_len=idx.kv_last_page_len,
                head_dim_qk=self.head_dim,
                causal=True,
                **common,
            )
        self._plan_done.record()
        meta.planned = True

    # >>> ch18: one decode wrapper per captured batch size, planned into fixed buffers
    @property
    def supports_cuda_graph(self) -> bool:
        return True

    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        # one set of buffers for all sizes: a graph of size bs reads their first bs entries
        max_bs = max(bs_list)
        max_pages = max_bs * div_ceil(max_seq_len, self.page_size)
        self._graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self._graph_kv_page_ids = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self._graph_kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)

    def prepare_for_capture(self, batch: Batch) -> None:
        import flashinfer

        bs = batch.padded_size
        self.graph_wrappers[bs] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            kv_layout="NHD",
            use_cuda_graph=True,
            use_tensor_cores=use_tensor_cores(self.num_qo_heads, self.num_kv_heads, bs),
            paged_kv_indptr_buffer=self._graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self._graph_kv_page_ids,
            paged_kv_last_page_len_buffer=self._graph_kv_last_page_len[:bs],
            backend="fa2",
        )
        self.prepare_metadata(batch)
        self.prepare_for_replay(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        meta: FIMetadata = batch.attn_metadata  # type: ignore[assignment]
        meta.wrapper = self.graph_wrappers[batch.padded_size]
        self._plan(meta)  # copies this batch's index into the graph's fixed buffers

    # <<< ch18


def serves(device: torch.device, dtype: torch.dtype) -> bool:
    """FlashInfer's kernels run on CUDA, for fp16/bf16 only (a float32 run keeps the torch
    backend), where ``flashinfer`` is installed."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        logger.warning("flashinfer is not installed: using the torch attention backend")
        return False
    return True


@register_backend("fi", rank=50, serves=serves)
def _build(config: ModelConfig) -> BaseAttnBackend:
    ctx = get_global_ctx()
    return FlashInferBackend(*local_heads(config), config.head_dim, ctx.kv_cache, ctx.page_size)  # type: ignore[arg-type]
