"""``GET /metrics``: the server's counters in Prometheus' text format (``prometheus-client``).

Three kinds of figures. Measured by the API server as replies pass: time to first token
(TTFT, request received -> first text) and time per output token (TPOT, the mean gap
between tokens after the first, per request) as histograms, and the output tokens counted
(Prometheus derives tokens/s with ``rate(minisgl_generation_tokens_total[1m])``; the gauge
``minisgl_generation_tokens_per_second`` is the same over the last ``WINDOW_S`` seconds,
for a glance without a Prometheus server). Kept by the frontend (``FrontendManager.counters``):
open requests, those started (a reply came) and those still waiting, and the outstanding
tokens that ``--max-outstanding-tokens`` bounds. Last heard from the scheduler, with their age
as a gauge: KV pages used and in total (``FrontendManager.scheduler_figures`` asks again
when they are over a second old and waits 0.2 s at most). So a scrape is answered within
0.2 s however busy the workers are. Each app has its own
registry, so two servers in one process (tests) do not share figures. SGLang exports the
same under ``sglang:`` names.
"""

from __future__ import annotations

import collections
import time
from typing import Deque, Mapping, Tuple

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

WINDOW_S = 10.0
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    """``request_done(...)`` per finished request; ``render(stats)`` per scrape."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.ttft = Histogram(
            "minisgl_time_to_first_token_seconds", "TTFT", buckets=TTFT_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "minisgl_time_per_output_token_seconds", "TPOT", buckets=TPOT_BUCKETS, registry=r
        )
        self.tokens = Counter("minisgl_generation_tokens", "output tokens", registry=r)
        self.requests = Counter(
            "minisgl_requests", "finished requests", ["finish_reason"], registry=r
        )
        self.tokens_per_s = Gauge(
            "minisgl_generation_tokens_per_second", f"over the last {WINDOW_S:.0f} s", registry=r
        )
        self.running = Gauge("minisgl_num_running_reqs", "requests with output", registry=r)
        self.queued = Gauge("minisgl_num_queued_reqs", "requests without output", registry=r)
        self.open = Gauge("minisgl_num_open_reqs", "requests the API holds", registry=r)
        self.outstanding = Gauge(
            "minisgl_outstanding_tokens", "tokens the open requests may still cost", registry=r
        )
        self.pages_used = Gauge("minisgl_kv_pages_used", "KV pages in use", registry=r)
        self.pages_total = Gauge("minisgl_kv_pages_total", "KV pages", registry=r)
        self.stats_age = Gauge(
            "minisgl_scheduler_stats_age_seconds", "age of the KV page figures", registry=r
        )
        self._recent: Deque[Tuple[float, int]] = collections.deque()  # (finish time, tokens)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def request_done(self, tokens: int, decode_seconds: float, finish_reason: str) -> None:
        """A finished request: its output tokens and the time from its first to its last."""
        self.tokens.inc(tokens)
        self.requests.labels(finish_reason).inc()
        if tokens > 1:
            self.tpot.observe(decode_seconds / (tokens - 1))
        self._recent.append((time.monotonic(), tokens))

    def render(
        self, counters: Mapping[str, float], scheduler: Mapping[str, int], age_s: float
    ) -> bytes:
        """The text of a scrape: ``counters`` the frontend's (``FrontendManager.counters``),
        ``scheduler`` its last stats answer, ``age_s`` seconds old (empty: not yet known)."""
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - WINDOW_S:
            self._recent.popleft()
        self.tokens_per_s.set(sum(n for _, n in self._recent) / WINDOW_S)
        self.running.set(counters["started_requests"])
        self.queued.set(counters["waiting_requests"])
        self.open.set(counters["open_requests"])
        self.outstanding.set(counters["outstanding_tokens"])
        self.pages_used.set(scheduler.get("kv_pages_in_use", 0))
        self.pages_total.set(scheduler.get("kv_pages_total", 0))
        self.stats_age.set(age_s)
        return generate_latest(self.registry)
