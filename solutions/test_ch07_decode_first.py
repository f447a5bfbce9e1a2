"""Chapter 7, exercise 1: decode-first starves new requests; prefill-first and a cap do not."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ch07_decode_first import decode_first, decode_first_capped, prefill_first, run  # noqa: E402


def short_ttfts(policy):
    ttft, _ = run(policy)
    return [t for uid, t in ttft.items() if uid != 0]


def test_prefill_first_serves_new_requests_at_once():
    assert max(short_ttfts(prefill_first)) <= 1


def test_decode_first_makes_new_requests_wait_for_the_longest_generation():
    ttfts = short_ttfts(decode_first)
    # the first short request arrives at step 2 and waits until uid 0's 400 tokens are done
    assert ttfts[0] >= 390, ttfts
    assert min(ttfts) > 300, ttfts


def test_a_cap_on_decode_streaks_bounds_ttft():
    assert max(short_ttfts(decode_first_capped(8))) <= 8
