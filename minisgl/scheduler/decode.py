"""The set of requests currently decoding. Mirrors upstream ``minisgl.scheduler.decode``."""

from __future__ import annotations

import math  # +ch23
from dataclasses import dataclass, field
from typing import Iterable, Set

from minisgl.core import Batch, Req


@dataclass
class DecodeManager:
    page_size: int
    running_reqs: Set[Req] = field(default_factory=set)

    def filter_reqs(self, reqs: Iterable[Req]) -> None:
        """After a forward pass: merge this step's requests in, keep those that can still
        generate (``can_decode``; a just-prefilled request joins here)."""
        self.running_reqs = {req for req in self.running_reqs.union(reqs) if req.can_decode}

    def remove_req(self, req: Req) -> None:
        self.running_reqs.discard(req)

    def abort_req(self, uid: int) -> Req | None:
        for req in self.running_reqs:
            if req.uid == uid:
                self.running_reqs.remove(req)
                return req
        return None

    @property
    def inflight_tokens(self) -> int:
        """KV tokens the running requests may still claim: what each has left to generate,
        plus up to one page of slack each (a new page is taken whole)."""
        slack = (self.page_size - 1) * len(self.running_reqs)
        return sum(req.remain_len for req in self.running_reqs) + slack

    # >>> ch23
    def estimated_tokens(self, new_token_ratio: float) -> int:
        """``inflight_tokens`` with what each has left scaled by ``new_token_ratio`` and
        rounded up; equal to ``inflight_tokens`` at 1."""
        if new_token_ratio == 1.0:
            return self.inflight_tokens
        slack = (self.page_size - 1) * len(self.running_reqs)
        return sum(math.ceil(r.remain_len * new_token_ratio) for r in self.running_reqs) + slack

    # <<< ch23

    def schedule_next_batch(self) -> Batch | None:
        if not self.runnable:
            return None
        # A set's order depends on object addresses, which differ between processes; under
        # tensor parallelism every rank must build the same batch in the same order.
        return Batch(reqs=sorted(self.running_reqs, key=lambda r: r.uid), phase="decode")

    @property
    def runnable(self) -> bool:
        return len(self.running_reqs) > 0
