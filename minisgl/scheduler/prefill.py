"""The prefill queue and admission control. Mirrors upstream ``minisgl.scheduler.prefill``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Tuple

import torch

from minisgl.core import Batch, Req
from minisgl.utils.device import pin

from .utils import PendingReq

if TYPE_CHECKING:
    from minisgl.kvcache import BaseCacheHandle
    from minisgl.message import UserMsg

    from .cache import CacheManager
    from .decode import DecodeManager
    from .table import TableManager


class ChunkedReq(Req):
    """One chunk of a prompt too long for this step's token budget (chapter 10).

    It is prefilled like any request but samples nothing: its output is dropped, and it
    never joins the decode set. The rest of the prompt comes in later steps.
    """

    def append_host(self, next_token: torch.Tensor) -> None:
        raise RuntimeError("a chunk of a prompt produces no token to append")

    @property
    def can_decode(self) -> bool:
        return False


@dataclass
class PrefillAdder:
    """Admits waiting requests into one prefill batch, one at a time, while they fit.

    ``token_budget``: prompt tokens this step may still compute. ``reserved_size``: KV
    tokens already promised, starting with what the decoding requests may still need;
    each admitted request adds its own remaining prompt and output, plus ``P - 1``.
    ``new_token_ratio``: the share of each output budget reserved; 1 reserves all of it,
    below 1 is chapter 23's optimistic admission (``minisgl.scheduler.retract``).
    """

    token_budget: int
    reserved_size: int
    cache_manager: CacheManager
    table_manager: TableManager
    new_token_ratio: float = 1.0

    def _output_estimate(self, req: PendingReq) -> int:
        """Output tokens to reserve for ``req``: ``ceil(output_len * new_token_ratio)``."""
        return math.ceil(req.output_len * self.new_token_ratio)

    def _try_allocate_one(self, req: PendingReq) -> Tuple[BaseCacheHandle, int] | None:
        """Claim a table row and the cached prefix for a new request, if its KV fits.

        The estimate is the whole uncached prompt plus every output token (scaled by
        ``new_token_ratio``), so with the ratio 1 an admitted request can always run to
        completion. Returns ``(handle, table_idx)`` or ``None``.
        """
        if self.table_manager.available_size == 0:
            return None
        handle = self.cache_manager.match_req(req).cuda_handle
        needed = (req.input_len - handle.cached_len) + self._output_estimate(req)
        if needed + self.reserved_size > self.cache_manager.available_size:
            return None
        # Locking moves the matched prefix out of the evictable count, so check again.
        self.cache_manager.lock(handle)
        if needed + self.reserved_size > self.cache_manager.available_size:
            self.cache_manager.unlock(handle)
            return None
        table_idx = self.table_manager.allocate()
        if handle.cached_len > 0:  # the matched prefix needs no compute: point the row at it
            device = self.table_manager.token_pool.device
            prefix = req.input_ids[: handle.cached_len].to(torch.int32)
            self.table_manager.token_pool[table_idx, : handle.cached_len].copy_(
                prefix.pin_memory() if pin(device) else prefix, non_blocking=True
            )
            self.table_manager.page_table[table_idx, : handle.cached_len].copy_(
                handle.get_matched_indices()
            )
        return handle, table_idx

    def _add_one_req(
        self,
        pending_req: PendingReq,
        cache_handle: BaseCacheHandle,
        table_idx: int,
        cached_len: int,
    ) -> Req:
        """Take the next chunk of the prompt (all of it if the budget allows) into the batch
        and write its token ids into the token pool."""
        remain_len = pending_req.input_len - cached_len
        chunk_size = min(self.token_budget, remain_len)
        cls = ChunkedReq if chunk_size < remain_len else Req
        self.token_budget -= chunk_size
        # plus up to one page of slack, as DecodeManager.inflight_tokens keeps for each
        # decoding request: every request rounds up to whole pages, so several admitted in
        # one step could otherwise need more pages than their token counts add up to
        self.reserved_size += (
            remain_len + self._output_estimate(pending_req) + self.cache_manager.page_size - 1
        )
        end = cached_len + chunk_size
        device = self.table_manager.token_pool.device
        ids = pending_req.input_ids[cached_len:end].to(torch.int32)
        self.table_manager.token_pool[table_idx, cached_len:end].copy_(
            ids.pin_memory() if pin(device) else ids, non_blocking=True
        )
        return cls(
            input_ids=pending_req.input_ids[:end],
            table_idx=table_idx,
            cached_len=cached_len,
            output_len=pending_req.output_len,
            uid=pending_req.uid,
            sampling_params=pending_req.sampling_params,
            cache_handle=cache_handle,
        )

    def try_add_one(self, pending_req: PendingReq) -> Req | None:
        """The request to run for ``pending_req`` this step, or ``None`` if it does not fit.

        A request already part-way through a chunked prefill keeps its row and KV and
        just continues.
        """
        if self.token_budget <= 0:
            return None
        if (chunked := pending_req.chunked_req) is not None:
            return self._add_one_req(
                pending_req, chunked.cache_handle, chunked.table_idx, chunked.cached_len
            )
        if (resource := self._try_allocate_one(pending_req)) is None:
            return None
        handle, table_idx = resource
        return self._add_one_req(pending_req, handle, table_idx, handle.cached_len)


@dataclass
class PrefillManager:
    cache_manager: CacheManager
    table_manager: TableManager
    decode_manager: DecodeManager
    pending_list: List[PendingReq] = field(default_factory=list)

    def add_one_req(self, msg: UserMsg) -> None:
        self.pending_list.append(PendingReq(msg.uid, msg.input_ids, msg.sampling_params))

    def schedule_next_batch(
        self, prefill_budget: int, new_token_ratio: float = 1.0
    ) -> Batch | None:
        """First come, first served: admit from the head of the queue and stop at the first
        request that does not fit, so no request can be overtaken forever.
        ``new_token_ratio`` scales every output reservation (chapter 23; 1: all of it)."""
        if not self.pending_list:
            return None
        adder = PrefillAdder(
            token_budget=prefill_budget,
            reserved_size=self.decode_manager.estimated_tokens(new_token_ratio),
            cache_manager=self.cache_manager,
            table_manager=self.table_manager,
            new_token_ratio=new_token_ratio,
        )
        reqs: List[Req] = []
        chunked: List[PendingReq] = []
        for pending_req in self.pending_list:
            req = adder.try_add_one(pending_req)
            if req is None:
                break
            pending_req.chunked_req = req if isinstance(req, ChunkedReq) else None
            if isinstance(req, ChunkedReq):
                chunked.append(pending_req)
            reqs.append(req)
        if not reqs:
            return None
        # an unfinished prompt goes back to the head of the queue and continues first
        self.pending_list = chunked + self.pending_list[len(reqs) :]
        return Batch(reqs=reqs, phase="prefill")

    def abort_req(self, uid: int) -> Req | None:
        """Drop ``uid`` from the queue; returns its chunk if it already holds resources."""
        for i, pending_req in enumerate(self.pending_list):
            if pending_req.uid == uid:
                del self.pending_list[i]
                return pending_req.chunked_req
        return None

    @property
    def runnable(self) -> bool:
        return len(self.pending_list) > 0
