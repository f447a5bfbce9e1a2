"""Exercise 491: the online benchmark's metrics from each request's events (seconds)."""

from __future__ import annotations

import math
import random

import pytest

from minisgl.benchmark.online import RequestResult, percentile, summarize


def done(sent: float, first: float, last: float, tokens: int) -> RequestResult:
    return RequestResult(sent=sent, first=first, last=last, prompt_tokens=8, output_tokens=tokens)


def test_ttft_is_first_token_minus_sent():
    r = done(sent=2.0, first=2.25, last=3.0, tokens=4)
    assert r.ttft == pytest.approx(0.25), f"sent 2.0, first 2.25: TTFT should be 0.25, got {r.ttft}"


def test_ttft_needs_a_first_token():
    with pytest.raises(AssertionError):
        RequestResult(sent=0.0, error="HTTP 400").ttft  # noqa: B018


def test_tpot_is_the_gap_between_tokens():
    r = done(sent=0.0, first=0.5, last=1.5, tokens=5)  # 4 gaps of 0.25 s after the first
    assert r.tpot == pytest.approx(0.25), f"5 tokens from 0.5 to 1.5 s: TPOT 0.25, got {r.tpot}"
    two = done(sent=0.0, first=1.0, last=1.1, tokens=2)
    assert two.tpot == pytest.approx(0.1), f"2 tokens 0.1 s apart: TPOT 0.1, got {two.tpot}"


def test_tpot_is_none_without_a_gap():
    assert done(0.0, 0.3, 0.3, tokens=1).tpot is None, "one token: no gap, TPOT None"
    assert RequestResult(sent=0.0, error="x").tpot is None, "no first token: TPOT None"
    assert RequestResult(sent=0.0, first=0.2, output_tokens=3).tpot is None, "no last: None"


def test_percentile_is_the_nearest_rank(drawn_seed):
    values = [float(v) for v in range(1, 11)]  # 1..10
    got = {q: percentile(values, q) for q in (0, 50, 90, 99, 100)}
    want = {0: 1.0, 50: 5.0, 90: 9.0, 99: 10.0, 100: 10.0}  # round(q / 100 * 9); round(4.5) = 4
    assert got == want, f"percentiles of 1..10: want {want}, got {got}"
    shuffled = values[:]
    random.Random(drawn_seed).shuffle(shuffled)  # a new order in every judged run
    got = {q: percentile(shuffled, q) for q in (0, 50, 99)}
    assert got == {0: 1.0, 50: 5.0, 99: 10.0}, f"the same values shuffled: got {got}"
    assert percentile([7.5], 99) == 7.5
    assert math.isnan(percentile([], 50)), "no values: NaN"


def test_percentile_leaves_the_input_alone():
    values = [3.0, 1.0, 2.0]
    assert percentile(values, 50) == 2.0
    assert values == [3.0, 1.0, 2.0], f"percentile reordered the caller's list: {values}"


def test_summary_row_of_a_run():
    fast = [done(0.0, 0.1, 0.1 + 0.01 * 9, tokens=10) for _ in range(9)]  # TTFT 100 ms
    slow = done(0.0, 2.0, 2.0 + 0.05 * 9, tokens=10)  # TTFT 2,000 ms, TPOT 50 ms
    row = summarize(8.0, fast + [slow], seconds=4.0)
    assert row[:5] == ["8", "10/10", "4.0", "25", "2.50"], f"rate, ok, s, tok/s, req/s: {row[:5]}"
    assert row[5] == "100 / 100 / 2,000", f"TTFT p50/p90/p99 ms: {row[5]}"
    assert row[6] == "10.0 / 10.0 / 50.0", f"TPOT p50/p90/p99 ms: {row[6]}"
    assert row[7] == "0.2 / 0.2 / 2.5", f"end-to-end p50/p90/p99 s: {row[7]}"


def test_failed_requests_do_not_count():
    ok = done(0.0, 0.2, 0.2 + 0.1 * 4, tokens=5)
    failed = RequestResult(sent=0.0, output_tokens=40, error="HTTP 500")
    row = summarize(1.0, [ok, failed], seconds=2.0)
    assert row[1] == "1/2", f"one of two succeeded: {row[1]}"
    assert row[3] == "2", (
        f"5 tokens in 2 s is 2 tok/s (the failed request's 40 do not count): {row[3]}"
    )
    assert row[5] == "200 / 200 / 200", f"TTFT of the one that succeeded: {row[5]}"


def test_no_values_are_dashes():
    one_token = done(0.0, 0.3, 0.3, tokens=1)
    row = summarize(2.0, [one_token], seconds=1.0)
    assert row[6] == "- / - / -", f"no request has a TPOT: '- / - / -', got {row[6]!r}"
    row = summarize(2.0, [RequestResult(sent=0.0, error="x")], seconds=1.0)
    assert row[1] == "0/1" and row[5] == row[7] == "- / - / -", f"nothing succeeded: {row}"
