"""Optimistic admission and retraction: reserve a guess of each request's future tokens, and
take running requests back out when the guess runs out of KV pages (chapter 23).

Chapter 7's admission reserves every output token a request may produce (``max_tokens``),
so a request that never uses its budget still blocks the queue. With retraction on, the
``PrefillAdder`` reserves ``ceil(remaining output * new_token_ratio)`` instead; the ratio
starts conservative, decays a little with every decode step, and is pushed back up when a
decode step finds too few pages and ``RetractManager.retract_decode`` frees some by retracting
running requests. A retracted request keeps the tokens it generated and waits at the head
of the queue; its next prefill recomputes the KV of prompt + output (much of it found in
the prefix cache, where the cache keeps it) and decoding continues where it stopped.

Mirrors SGLang's ``new_token_ratio`` (``Scheduler.update_running_batch``) and
``ScheduleBatch.retract_decode``; upstream mini-sglang always reserves ``max_tokens``.
This module is loaded only when ``SchedulerConfig.enable_retraction`` is on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, List

from minisgl.core import Req
from minisgl.utils import div_ceil, init_logger

from .utils import PendingReq

if TYPE_CHECKING:
    from .scheduler import Scheduler

logger = init_logger(__name__)

# SGLang's defaults: start at 0.7, floor at 0.7 * 0.14, reach the floor in 600 decode steps
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
# after a retraction, assume each kept request decodes this many more tokens (SGLang's
# ``retract_decode_steps``), so the new ratio leaves them room for a while
RETRACT_DECODE_STEPS = 20


@dataclass
class NewTokenRatio:
    """The share of its remaining output tokens that admission reserves for each request.

    ``value`` starts at ``init``, loses ``decay`` per decode step down to ``floor``, and after
    a retraction jumps back to at least ``init`` (see ``reset_after_retraction``). Without
    retraction the scheduler admits with the ratio 1, chapter 7's rule: every ``max_tokens``
    reserved, so a decode step always finds its pages.

    Mirrors SGLang's ``new_token_ratio``, ``init_new_token_ratio``, ``min_new_token_ratio``
    and ``new_token_ratio_decay``.
    """

    init: float = INIT_NEW_TOKEN_RATIO
    floor: float = MIN_NEW_TOKEN_RATIO
    decay: float = NEW_TOKEN_RATIO_DECAY
    value: float = field(init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.floor <= self.init <= 1.0 or self.decay < 0:
            raise ValueError(
                f"need 0 < floor <= init <= 1 and decay >= 0, got floor={self.floor}, "
                f"init={self.init}, decay={self.decay}"
            )
        self.value = self.init

    def decay_one_step(self) -> None:
        """A decode step found its pages: the guess was good enough, guess a little lower."""
        self.value = max(self.floor, self.value - self.decay)

    def reset_after_retraction(self, kept: Iterable[Req]) -> None:
        """A decode step ran out of pages: reserve, from now on, at least what the requests
        still running have used of their budgets so far, plus ``RETRACT_DECODE_STEPS`` more
        tokens each (SGLang's estimate), and never less than ``init``."""
        kept = list(kept)
        budget = sum(r.output_len for r in kept)  # max_tokens (what was left at admission)
        used = sum(r.output_len - r.remain_len for r in kept)
        observed = (used + RETRACT_DECODE_STEPS * len(kept)) / budget if budget > 0 else 1.0
        self.value = min(1.0, max(self.init, observed))


@dataclass
class RetractedReq(PendingReq):
    """A retracted request back in the queue: ``input_ids`` is its prompt plus every token
    it has generated, and ``output_len`` what is left of its ``max_tokens``. Admission
    treats it as a new request whose prompt is that longer sequence."""

    remain_output_len: int = 0

    @property
    def output_len(self) -> int:
        return self.remain_output_len


def pages_for_next_decode(reqs: Iterable[Req], page_size: int) -> int:
    """Pages that ``allocate_paged`` will take for one decode step of ``reqs``: one for
    every request whose next position starts a page."""
    return sum(div_ceil(r.device_len, page_size) - div_ceil(r.cached_len, page_size) for r in reqs)


def retract_order(reqs: Iterable[Req]) -> List[Req]:
    """The running requests, the first to retract first: the longest remaining output
    (``remain_len``), ties broken by the latest arrival (largest uid).

    Why longest-remaining first: the request with the least left to generate is always the
    last one kept, so it always advances and soon finishes, freeing its pages, and retracting
    cannot cycle forever. Under the default ``max_tokens`` (up to the context) the longest
    remaining is also the shortest sequence so far, whose recompute costs least. SGLang's
    order, fewest generated tokens first, protects the same requests when all budgets are
    equal, but may retract a short request that is about to finish.
    """
    return sorted(reqs, key=lambda r: (r.remain_len, r.uid), reverse=True)


@dataclass
class RetractManager:
    """Owns the new-token ratio and decides, before each decode step, whom to retract.

    The scheduler holds one when ``SchedulerConfig.enable_retraction`` is on, reads
    ``new_token_ratio.value`` for admission, and calls ``retract_decode`` before building a
    decode batch. Mirrors SGLang's ``Scheduler.update_running_batch``, which checks the
    decode memory (``check_decode_mem``) and calls ``ScheduleBatch.retract_decode``.
    """

    new_token_ratio: NewTokenRatio = field(default_factory=NewTokenRatio)

    def retract_decode(self, scheduler: Scheduler) -> List[RetractedReq]:
        """Before a decode step: make sure every running request can get its next page.

        Retracts running requests in ``retract_order`` until the rest fit in the free and
        evictable pages. Each retracted one leaves the decode set, gives back its table row
        and its KV (``Scheduler._free_req_resources``: the radix cache keeps the computed
        prefix as evictable, the naive cache frees all), is marked finished so that, under
        overlap, the batch in flight does not deliver its token (the token is recomputed),
        and waits at the head of the queue as a ``RetractedReq``. A retraction resets the
        ratio upward, a step without one decays it. Returns the retracted, in queue order.

        Raises:
            RuntimeError: when one request alone cannot get a page and no batch in flight
                will free any (the pool is smaller than one request's context, which the
                context clamp of ``Scheduler._process_one_msg`` rules out).
        """
        decode, cache = scheduler.decode_manager, scheduler.cache_manager
        if not decode.running_reqs:
            return []
        P = cache.page_size
        need = pages_for_next_decode(decode.running_reqs, P)
        if need <= cache.available_size // P:  # the common case: no sorting, one pass
            self.new_token_ratio.decay_one_step()
            return []
        order = retract_order(decode.running_reqs)
        retracted: List[RetractedReq] = []
        # keep the last request, unless a batch in flight holds pages it will give back
        keep_at_least = 1 if scheduler._in_flight is None else 0
        while need > cache.available_size // P and len(order) > keep_at_least:
            req = order.pop(0)
            need -= pages_for_next_decode([req], P)
            decode.remove_req(req)
            scheduler._free_req_resources(req)
            scheduler.finished_reqs.add(req)
            retracted.append(
                RetractedReq(
                    uid=req.uid,
                    input_ids=req.input_ids,  # what the CPU has: a token in flight is redone
                    sampling_params=req.sampling_params,
                    remain_output_len=req.max_device_len - len(req.input_ids),
                )
            )
        if need > cache.available_size // P:
            raise RuntimeError(
                f"out of KV pages: request {order[0].uid} alone needs {need} page(s) for its "
                f"next token and {cache.available_size // P} are free or evictable"
            )
        retracted.sort(key=lambda p: p.uid)  # the earliest arrival first
        scheduler.prefill_manager.pending_list[:0] = retracted
        self.new_token_ratio.reset_after_retraction(order)
        logger.debug(
            "retracted %s; new_token_ratio %.3f",
            [p.uid for p in retracted],
            self.new_token_ratio.value,
        )
        return retracted
