"""Exercise 111: Req length bookkeeping (positions are token counts)."""

from __future__ import annotations

import random

import pytest
import torch

from minisgl.core import Req, SamplingParams


def make_req(prompt_len: int = 5, cached_len: int = 0, max_tokens: int = 3, uid: int = 0) -> Req:
    return Req(
        input_ids=torch.arange(prompt_len, dtype=torch.int32),
        table_idx=0,
        cached_len=cached_len,
        output_len=max_tokens,
        uid=uid,
        sampling_params=SamplingParams(max_tokens=max_tokens),
    )


def test_lengths_after_construction():
    r = make_req(prompt_len=5, max_tokens=3)
    got = (r.cached_len, r.device_len, r.max_device_len)
    assert got == (0, 5, 8), (
        f"(cached_len, device_len, max_device_len) should be (0, 5, 8), got {got}"
    )
    assert (r.extend_len, r.remain_len) == (5, 3), (
        f"(extend_len, remain_len) = {(r.extend_len, r.remain_len)}"
    )
    assert r.can_decode


def test_a_cached_prefix_shortens_the_extend():
    r = make_req(prompt_len=10, cached_len=6, max_tokens=4)
    assert r.extend_len == 4, (
        f"6 of 10 prompt tokens are cached: extend_len should be 4, got {r.extend_len}"
    )
    assert r.remain_len == 4


@pytest.mark.parametrize("cached_len", [5, 7, -1])
def test_bad_lengths_are_rejected(cached_len):
    with pytest.raises(AssertionError):
        make_req(prompt_len=5, cached_len=cached_len)


def test_input_ids_must_be_on_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a second device to put input_ids on")
    with pytest.raises(AssertionError):
        Req(
            input_ids=torch.arange(3, dtype=torch.int32, device="cuda"),
            table_idx=0,
            cached_len=0,
            output_len=1,
            uid=0,
            sampling_params=SamplingParams(max_tokens=1),
        )


def test_complete_one_moves_the_window():
    r = make_req(prompt_len=5, max_tokens=3)
    r.complete_one()
    got = (r.cached_len, r.device_len, r.extend_len)
    assert got == (5, 6, 1), (
        f"after the prefill step (cached_len, device_len, extend_len) should be (5, 6, 1), got {got}"
    )


def test_append_host_grows_input_ids():
    r = make_req(prompt_len=3)
    r.append_host(torch.tensor([42], dtype=torch.int32))
    assert r.input_ids.tolist() == [0, 1, 2, 42], f"input_ids = {r.input_ids.tolist()}"
    assert r.input_ids.is_cpu


def test_decode_until_max_tokens():
    r = make_req(prompt_len=4, max_tokens=3)
    seen = []
    while r.can_decode:
        r.complete_one()
        r.append_host(torch.tensor([9], dtype=torch.int32))
        seen.append((r.cached_len, r.device_len, r.remain_len))
        assert len(seen) <= 3, f"a request with max_tokens=3 must stop after 3 steps: {seen}"
    assert seen == [(4, 5, 2), (5, 6, 1), (6, 7, 0)], (
        f"(cached_len, device_len, remain_len) per step: {seen}"
    )
    assert len(r.input_ids) == 7


def test_requests_compare_by_identity():
    a, b = make_req(uid=1), make_req(uid=1)
    assert a != b and len({a, b}) == 2, "two requests with equal fields are still two requests"


def test_drawn_requests_decode_to_their_budget(drawn_seed):
    """Requests of drawn lengths (each judged run draws new ones) decode exactly
    ``max_tokens`` steps, the window moving one token a step."""
    rng = random.Random(drawn_seed)
    for uid in range(16):
        prompt_len = rng.randint(1, 48)
        cached_len = rng.randint(0, prompt_len - 1)
        max_tokens = rng.randint(1, 24)
        r = make_req(prompt_len, cached_len, max_tokens, uid)
        assert (r.extend_len, r.remain_len) == (prompt_len - cached_len, max_tokens), r
        steps = 0
        while r.can_decode:
            r.complete_one()
            r.append_host(torch.tensor([uid], dtype=torch.int32))
            steps += 1
            assert (r.extend_len, r.remain_len) == (1, max_tokens - steps), r
            assert steps <= max_tokens, f"{r} decodes past its max_tokens={max_tokens}"
        assert len(r.input_ids) == prompt_len + max_tokens
