"""The prefill queue and admission control. Mirrors upstream ``minisgl.scheduler.prefill``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Tuple

import torch

from minisgl.core import Batch, Req

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
    """

    token_budget: int
    reserved_size: int
    cache_manager: CacheManager
    table_manager: TableManager

    def _try_allocate_one(self, req: PendingReq) -> Tuple[BaseCacheHandle, int] | None:
        """Claim a table row and the cached prefix for a new request, if its KV fits.

        The estimate is the whole uncached prompt plus every output token, so an admitted
        request can always run to completion. Returns ``(handle, table_idx)`` or ``None``.
        """
        raise NotImplementedError("Exercise 191: implement PrefillAdder._try_allocate_one")

    def _add_one_req(
        self,
        pending_req: PendingReq,
        cache_handle: BaseCacheHandle,
        table_idx: int,
        cached_len: int,
    ) -> Req:
        """Take the next chunk of the prompt (all of it if the budget allows) into the batch
        and write its token ids into the token pool."""
        raise NotImplementedError("Exercise 191: implement PrefillAdder._add_one_req")

    def try_add_one(self, pending_req: PendingReq) -> Req | None:
        """The request to run for ``pending_req`` this step, or ``None`` if it does not fit.

        A request already part-way through a chunked prefill keeps its row and KV and
        just continues.
        """
        raise NotImplementedError("Exercise 191: implement PrefillAdder.try_add_one")


@dataclass
class PrefillManager:
    cache_manager: CacheManager
    table_manager: TableManager
    decode_manager: DecodeManager
    pending_list: List[PendingReq] = field(default_factory=list)

    def add_one_req(self, msg: UserMsg) -> None:
        self.pending_list.append(PendingReq(msg.uid, msg.input_ids, msg.sampling_params))

    def schedule_next_batch(self, prefill_budget: int) -> Batch | None:
        """First come, first served: admit from the head of the queue and stop at the first
        request that does not fit, so no request can be overtaken forever."""
        raise NotImplementedError("Exercise 191: implement PrefillManager.schedule_next_batch")

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
