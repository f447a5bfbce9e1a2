"""Chapter 1: the request, batch and context dataclasses."""

import pytest
import torch

from minisgl.core import Batch, Context, Req, SamplingParams, get_global_ctx, set_global_ctx


def make_req(prompt_len=5, max_tokens=4, cached_len=0, uid=0):
    ids = torch.arange(prompt_len, dtype=torch.int32)
    return Req(
        ids,
        table_idx=0,
        cached_len=cached_len,
        output_len=max_tokens,
        uid=uid,
        sampling_params=SamplingParams(max_tokens=max_tokens),
    )


def test_new_request_lengths():
    req = make_req(prompt_len=5, max_tokens=4)
    assert (req.cached_len, req.device_len, req.max_device_len) == (0, 5, 9)
    assert req.extend_len == 5 and req.remain_len == 4 and req.can_decode


def test_prefix_hit_shortens_the_extend():
    req = make_req(prompt_len=10, cached_len=6)
    assert req.extend_len == 4


def test_complete_one_moves_the_window_by_one_token():
    req = make_req(prompt_len=5, max_tokens=2)
    req.complete_one()
    assert (req.cached_len, req.device_len, req.extend_len, req.remain_len) == (5, 6, 1, 1)
    req.complete_one()
    assert req.remain_len == 0 and not req.can_decode


def test_append_host_grows_the_cpu_copy_only():
    req = make_req(prompt_len=3)
    req.append_host(torch.tensor([42], dtype=torch.int32))
    assert req.input_ids.tolist() == [0, 1, 2, 42]
    assert req.device_len == 3  # the device side moves in complete_one, not here


def test_requests_hash_by_identity():
    a, b = make_req(uid=1), make_req(uid=1)
    assert len({a, b}) == 2


def test_bad_lengths_are_rejected():
    with pytest.raises(AssertionError):
        make_req(prompt_len=4, cached_len=4)  # nothing left to compute


@pytest.mark.parametrize(
    "field,value",
    [("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("max_tokens", 0), ("top_k", 0)],
)
def test_invalid_sampling_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_greedy_detection():
    assert SamplingParams().is_greedy
    assert SamplingParams(temperature=0.7, top_k=1).is_greedy
    assert not SamplingParams(temperature=0.7).is_greedy
    assert SamplingParams(temperature=0.0, top_p=0.9).is_greedy  # temperature 0 wins
    assert not SamplingParams(temperature=0.5, top_p=0.9).is_greedy


def test_batch_phase_and_size():
    batch = Batch(reqs=[make_req(uid=0), make_req(uid=1)], phase="decode")
    assert batch.is_decode and not batch.is_prefill
    assert batch.size == 2 and batch.padded_size == 2


def test_context_holds_one_batch_at_a_time():
    ctx = Context()
    set_global_ctx(ctx)
    batch = Batch(reqs=[make_req()], phase="prefill")
    with ctx.forward_batch(batch):
        assert get_global_ctx().batch is batch
        with pytest.raises(AssertionError):
            with ctx.forward_batch(batch):
                pass
    with pytest.raises(AssertionError):
        ctx.batch
    set_global_ctx(None)
