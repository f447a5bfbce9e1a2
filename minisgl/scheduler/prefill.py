"""The prefill queue and admission control. Mirrors upstream ``minisgl.scheduler.prefill``."""

from __future__ import annotations

import math  # +ch23
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


# >>> ch10
class ChunkedReq(Req):
    """One chunk of a prompt too long for this step's token budget.

    It is prefilled like any request but samples nothing: its output is dropped, and it
    never joins the decode set. The rest of the prompt comes in later steps.
    """

    def append_host(self, next_token: torch.Tensor) -> None:
        raise RuntimeError("a chunk of a prompt produces no token to append")

    @property
    def can_decode(self) -> bool:
        return False


# <<< ch10


@dataclass
class PrefillAdder:
    """Admits waiting requests into one prefill batch, one at a time, while they fit.

    ``token_budget``: prompt tokens this step may still compute. ``reserved_size``: KV
    tokens already promised, starting with what the decoding requests may still need;
    each admitted request adds its own remaining prompt and output, plus ``P - 1``.
    """

    token_budget: int
    reserved_size: int
    cache_manager: CacheManager
    table_manager: TableManager
    # >>> ch23: the share of each output budget reserved; 1 reserves all of it, below 1 is
    # optimistic admission (minisgl.scheduler.retract)
    new_token_ratio: float = 1.0
    # <<< ch23

    def _output_estimate(self, req: PendingReq) -> int:
        """Output tokens to reserve for ``req``."""
        # >>> ch07-ch22
        # return req.output_len
        # <<< ch07-ch22
        return math.ceil(req.output_len * self.new_token_ratio)  # scaled by the ratio  # +ch23

    def _try_allocate_one(self, req: PendingReq) -> Tuple[BaseCacheHandle, int] | None:
        """Claim a table row and the cached prefix for a new request, if its KV fits.

        The estimate is the whole uncached prompt plus every output token it may produce
        (``_output_estimate``), so an admitted request can always run to completion.
        Returns ``(handle, table_idx)`` or ``None``.
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
        """Take the prompt's uncached rest into the batch and write its token ids into the
        token pool."""
        remain_len = pending_req.input_len - cached_len
        # >>> ch07-ch09
        # chunk_size, cls = remain_len, Req
        # <<< ch07-ch09
        # >>> ch10: only as much as the budget allows: a chunk
        chunk_size = min(self.token_budget, remain_len)
        cls = ChunkedReq if chunk_size < remain_len else Req
        # <<< ch10
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
        """The request to run for ``pending_req`` this step, or ``None`` if it does not fit."""
        if self.token_budget <= 0:
            return None
        # >>> ch10: part-way through a chunked prefill, it keeps its row and KV and continues
        if (chunked := pending_req.chunked_req) is not None:
            return self._add_one_req(
                pending_req, chunked.cache_handle, chunked.table_idx, chunked.cached_len
            )
        # <<< ch10
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
    new_token_ratio: float = 1.0  # the share of output budgets admission reserves  # +ch23

    def add_one_req(self, msg: UserMsg) -> None:
        self.pending_list.append(PendingReq(msg.uid, msg.input_ids, msg.sampling_params))

    def schedule_next_batch(self, prefill_budget: int) -> Batch | None:
        """First come, first served: admit from the head of the queue and stop at the first
        request that does not fit, so no request can be overtaken forever."""
        if not self.pending_list:
            return None
        adder = PrefillAdder(
            token_budget=prefill_budget,
            # >>> ch07-ch22
            # reserved_size=self.decode_manager.inflight_tokens,
            # <<< ch07-ch22
            reserved_size=self.decode_manager.estimated_tokens(self.new_token_ratio),  # +ch23
            cache_manager=self.cache_manager,
            table_manager=self.table_manager,
            new_token_ratio=self.new_token_ratio,  # +ch23
        )
        reqs: List[Req] = []
        chunked: List[PendingReq] = []  # +ch10
        for pending_req in self.pending_list:
            req = adder.try_add_one(pending_req)
            if req is None:
                break
            # >>> ch10
            pending_req.chunked_req = req if isinstance(req, ChunkedReq) else None
            if isinstance(req, ChunkedReq):
                chunked.append(pending_req)
            # <<< ch10
            reqs.append(req)
        if not reqs:
            return None
        # >>> ch07-ch09
        # self.pending_list = self.pending_list[len(reqs) :]
        # <<< ch07-ch09
        # >>> ch10: an unfinished prompt goes back to the head of the queue and continues first
        self.pending_list = chunked + self.pending_list[len(reqs) :]
        # <<< ch10
        return Batch(reqs=reqs, phase="prefill")

    def abort_req(self, uid: int) -> Req | None:
        """Drop ``uid`` from the queue; returns what it holds already (its chunk), if anything."""
        for i, pending_req in enumerate(self.pending_list):
            if pending_req.uid == uid:
                del self.pending_list[i]
                # >>> ch07-ch09
                # return None
                # <<< ch07-ch09
                return pending_req.chunked_req  # +ch10
        return None

    @property
    def runnable(self) -> bool:
        return len(self.pending_list) > 0
