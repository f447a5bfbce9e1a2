"""The set of requests currently decoding. Mirrors upstream ``minisgl.scheduler.decode``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Set

from minisgl.core import Batch, Req


@dataclass
class DecodeManager:
    page_size: int
    running_reqs: Set[Req] = field(default_factory=set)

    def filter_reqs(self, reqs: Iterable[Req]) -> None:
        """After a forward pass: merge this step's requests in, keep those that can still
        generate (a just-prefilled request joins here; a chunk never does)."""
        raise NotImplementedError("Exercise 171: implement DecodeManager.filter_reqs")

    def remove_req(self, req: Req) -> None:
        raise NotImplementedError("Exercise 171: implement DecodeManager.remove_req")

    def abort_req(self, uid: int) -> Req | None:
        raise NotImplementedError("Exercise 171: implement DecodeManager.abort_req")

    @property
    def inflight_tokens(self) -> int:
        """KV tokens the running requests may still claim: what each has left to generate,
        plus up to one page of slack each (a new page is taken whole)."""
        raise NotImplementedError("Exercise 171: implement DecodeManager.inflight_tokens")

    def schedule_next_batch(self) -> Batch | None:
        raise NotImplementedError("Exercise 171: implement DecodeManager.schedule_next_batch")

    @property
    def runnable(self) -> bool:
        raise NotImplementedError("Exercise 171: implement DecodeManager.runnable")
