"""CUDA graphs for decode: capture the whole forward pass once per batch size, replay it.

A decode step of a small model is hundreds of tiny kernels, and launching each from
Python costs more than running it. A CUDA graph records the launches once and replays
them with one call. A graph is frozen, though: the same kernels, on the same addresses,
for the same shapes. So the runner

* captures one graph per batch size in ``graph_bs`` (largest first, all sharing one
  memory pool, so the pool is as big as the largest graph needs, not the sum);
* pads a decode batch up to the next captured size with the engine's dummy request
  (``pad_batch``, called by the scheduler before it prepares the batch); the dummy's
  KV goes to the dummy page and its logits are dropped;
* before each replay, copies the batch's ``input_ids``, ``positions`` and ``out_loc``
  into the static buffers the graph reads, and lets the attention backend refresh its
  fixed index buffers for this batch (``prepare_for_replay``: FlashInfer re-plans).

Prefill batches, and decode batches bigger than the largest graph, run eagerly.
Mirrors upstream ``minisgl.engine.graph.GraphRunner``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Dict, List, Sequence

import torch

from minisgl.core import Batch, Req, get_global_ctx
from minisgl.utils import init_logger

if TYPE_CHECKING:
    from minisgl.attention import BaseAttnBackend
    from minisgl.models import BaseLLMModel

logger = init_logger(__name__)

DEFAULT_MAX_GRAPH_BS = 256


def determine_graph_bs(
    cuda_graph_bs: Sequence[int] | None, cuda_graph_max_bs: int | None, max_running_req: int
) -> List[int]:
    """The batch sizes to capture, ascending; ``[]`` disables CUDA graphs.

    An explicit ``cuda_graph_bs`` wins (sizes above ``max_running_req`` are dropped: no
    batch can be that big). Otherwise ``1, 2, 4, 8, 16, 24, ...`` in steps of 8 up to
    ``cuda_graph_max_bs`` (default 256, at most ``max_running_req``), and the maximum
    itself, so every batch up to it pads to a captured size; ``cuda_graph_max_bs=0``
    disables graphs.

    Raises:
        ValueError: for a size below 1 in ``cuda_graph_bs``.
    """
    if cuda_graph_bs is not None:
        if any(bs < 1 for bs in cuda_graph_bs):
            raise ValueError(f"CUDA graph batch sizes must be >= 1, got {list(cuda_graph_bs)}")
        return sorted({bs for bs in cuda_graph_bs if bs <= max_running_req})
    max_bs = min(
        DEFAULT_MAX_GRAPH_BS if cuda_graph_max_bs is None else cuda_graph_max_bs, max_running_req
    )
    if max_bs < 1:
        return []
    sizes = {bs for bs in (1, 2, 4) if bs <= max_bs} | set(range(8, max_bs + 1, 8)) | {max_bs}
    return sorted(sizes)


def padded_batch_size(size: int, graph_bs: Sequence[int]) -> int:
    """The smallest captured size >= ``size``; ``size`` itself when none is (run eagerly)."""
    return next((bs for bs in graph_bs if bs >= size), size)


class GraphRunner:
    """Captures decode graphs at start-up and replays them. With ``graph_bs`` empty (the
    CPU, a backend without graph support, or ``cuda_graph_max_bs=0``) it captures nothing,
    ``pad_batch`` leaves batches alone and ``can_use_cuda_graph`` is always False.

    ``capture_seconds`` is the start-up time spent capturing, ``warmup_seconds`` the part
    of it spent in the first eager forward pass (where FlashInfer and Triton compile).
    """

    def __init__(
        self,
        model: BaseLLMModel,
        attn_backend: BaseAttnBackend,
        stream: torch.cuda.Stream | None,
        device: torch.device,
        dummy_req: Req,
        graph_bs: List[int],
        max_seq_len: int,
    ) -> None:
        self.model, self.attn_backend, self.stream = model, attn_backend, stream
        self.device, self.dummy_req = device, dummy_req
        self.graph_bs = sorted(graph_bs)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}  # bs -> [bs, V] logits written by replay
        self.capture_seconds = self.warmup_seconds = 0.0
        if self.graph_bs:
            self._capture(max_seq_len)

    @property
    def max_graph_bs(self) -> int:
        return self.graph_bs[-1] if self.graph_bs else 0

    def _capture(self, max_seq_len: int) -> None:
        from tqdm import tqdm

        start = time.perf_counter()
        max_bs = self.max_graph_bs
        self.attn_backend.init_capture_graph(max_seq_len, self.graph_bs)
        # the dummy request's token, position and KV slot: what padded rows read and write
        dummy_slot = int(get_global_ctx().page_table[self.dummy_req.table_idx, 0])
        self.input_ids = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.positions = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.out_loc = torch.full((max_bs,), dummy_slot, dtype=torch.int32, device=self.device)
        free_before = torch.cuda.mem_get_info(self.device)[0]
        pool = None
        with torch.inference_mode():
            for bs in tqdm(
                sorted(self.graph_bs, reverse=True), desc="capturing CUDA graphs", unit="graph"
            ):
                batch = Batch(reqs=[self.dummy_req] * bs, phase="decode")
                batch.input_ids, batch.positions, batch.out_loc = (
                    self.input_ids[:bs],
                    self.positions[:bs],
                    self.out_loc[:bs],
                )
                self.attn_backend.prepare_for_capture(batch)
                graph = torch.cuda.CUDAGraph()
                with get_global_ctx().forward_batch(batch):
                    t0 = time.perf_counter()
                    self.model.forward()  # eager warm-up: kernels compile and allocate here, not in the graph
                    torch.cuda.synchronize(self.device)
                    if bs == max_bs:
                        self.warmup_seconds = time.perf_counter() - t0
                    with torch.cuda.graph(graph, pool=pool, stream=self.stream):
                        self.outputs[bs] = self.model.forward()
                pool = graph.pool() if pool is None else pool
                self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)
        used = free_before - torch.cuda.mem_get_info(self.device)[0]
        self.capture_seconds = time.perf_counter() - start
        logger.info(
            f"captured {len(self.graphs)} CUDA graphs (batch sizes {self.graph_bs[0]}..{max_bs}) in "
            f"{self.capture_seconds:.1f} s ({self.warmup_seconds:.1f} s of it the first eager pass), "
            f"{used / 2**20:.0f} MiB"
        )

    def pad_batch(self, batch: Batch) -> None:
        """Pad a decode batch with dummy requests up to the next captured size
        (``batch.padded_reqs``); other batches are left as they are."""
        if batch.is_decode and 0 < batch.size <= self.max_graph_bs:
            size = padded_batch_size(batch.size, self.graph_bs)
            batch.padded_reqs = batch.reqs + [self.dummy_req] * (size - batch.size)

    def can_use_cuda_graph(self, batch: Batch) -> bool:
        """A decode batch whose (padded) size was captured."""
        return batch.is_decode and batch.padded_size in self.graphs

    def replay(self, batch: Batch) -> torch.Tensor:
        """Run ``batch`` (inside ``ctx.forward_batch``) through its graph -> logits ``[B, V]``.

        The returned tensor is the graph's own output: read it before the next replay.
        """
        bs = batch.padded_size
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_loc[:bs].copy_(batch.out_loc)
        self.attn_backend.prepare_for_replay(batch)
        self.graphs[bs].replay()
        return self.outputs[bs][: batch.size]

    def destroy(self) -> None:
        """Free the graphs and their memory pool (before the engine shuts down)."""
        self.graphs.clear()
        self.outputs.clear()
