"""Chapter 5: the paged torch attention backend against plain dense attention."""

import pytest
import torch
import torch.nn.functional as F

from minisgl.attention import HybridBackend, create_attention_backend
from minisgl.attention.torch_backend import TorchAttnBackend
from minisgl.core import Batch, Context, Req, SamplingParams, set_global_ctx
from minisgl.kvcache import MHAKVCache

HQ, HKV, D = 4, 2, 16


def dense_causal(q, k, v):
    """Reference: q, k, v [S, H, D] of one whole sequence -> [S, H_q, D]."""
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    )
    return o.transpose(0, 1)


def setup(page_size, num_pages=16):
    ctx = Context(page_size)
    ctx.kv_cache = MHAKVCache(HKV, 1, D, num_pages, page_size, torch.float32, torch.device("cpu"))
    ctx.page_table = torch.zeros((3, 64), dtype=torch.int32)
    ctx.attn_backend = TorchAttnBackend(HQ, HKV, D)
    set_global_ctx(ctx)
    return ctx


def scattered_slots(pages, page_size, length):
    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages])[:length].to(
        torch.int32
    )


@pytest.mark.parametrize("page_size", [1, 4])
def test_prefill_with_a_cached_prefix_equals_dense_attention(page_size):
    torch.manual_seed(0)
    ctx = setup(page_size)
    lens, cached = [7, 4], [3, 0]  # request 0 has 3 tokens cached already
    q_full = [torch.randn(n, HQ, D) for n in lens]
    k_full = [torch.randn(n, HKV, D) for n in lens]
    v_full = [torch.randn(n, HKV, D) for n in lens]
    pages = [
        [11, 2, 7, 5, 3, 9, 14][: (7 + page_size - 1) // page_size],
        [4, 0, 6, 1][: (4 + page_size - 1) // page_size],
    ]
    reqs = []
    for row in range(2):
        ctx.page_table[row, : lens[row]] = scattered_slots(pages[row], page_size, lens[row])
        # the cached prefix was stored by an earlier step
        pre = ctx.page_table[row, : cached[row]]
        ctx.kv_cache.store_kv(k_full[row][: cached[row]], v_full[row][: cached[row]], pre, 0)
        ids = torch.zeros(lens[row], dtype=torch.int32)
        reqs.append(Req(ids, row, cached[row], 1, row, SamplingParams(), None))
    batch = Batch(reqs, "prefill")
    batch.out_loc = torch.cat(
        [ctx.page_table[r, c:n] for r, (c, n) in enumerate(zip(cached, lens))]
    )
    ctx.attn_backend.prepare_metadata(batch)
    q = torch.cat([q_full[r][cached[r] :] for r in range(2)])
    k = torch.cat([k_full[r][cached[r] :] for r in range(2)])
    v = torch.cat([v_full[r][cached[r] :] for r in range(2)])
    out = ctx.attn_backend.forward(q, k, v, 0, batch)
    ref = torch.cat([dense_causal(q_full[r], k_full[r], v_full[r])[cached[r] :] for r in range(2)])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert batch.attn_metadata.get_last_indices(2).tolist() == [3, 7]
    set_global_ctx(None)


def test_decode_step_sees_the_whole_context():
    torch.manual_seed(1)
    ctx = setup(page_size=1)
    n = 6
    q_full, k_full, v_full = torch.randn(n, HQ, D), torch.randn(n, HKV, D), torch.randn(n, HKV, D)
    slots = torch.tensor([9, 3, 12, 0, 5, 7], dtype=torch.int32)
    ctx.page_table[0, :n] = slots
    ctx.kv_cache.store_kv(k_full[:-1], v_full[:-1], slots[:-1], 0)
    req = Req(torch.zeros(n, dtype=torch.int32), 0, n - 1, 1, 0, SamplingParams(), None)
    batch = Batch([req], "decode")
    batch.out_loc = slots[-1:]
    ctx.attn_backend.prepare_metadata(batch)
    out = ctx.attn_backend.forward(q_full[-1:], k_full[-1:], v_full[-1:], 0, batch)
    torch.testing.assert_close(out, dense_causal(q_full, k_full, v_full)[-1:], rtol=1e-5, atol=1e-5)
    set_global_ctx(None)


def test_backends_are_chosen_by_name():
    class Cfg:
        num_qo_heads, num_kv_heads, head_dim = HQ, HKV, D

    assert isinstance(create_attention_backend("torch", Cfg), TorchAttnBackend)
    assert isinstance(create_attention_backend("torch,torch", Cfg), TorchAttnBackend)
    with pytest.raises(ValueError, match="unknown attention backend 'xformers'"):
        create_attention_backend("xformers", Cfg)
    with pytest.raises(ValueError, match="prefill,decode"):
        create_attention_backend("torch,torch,torch", Cfg)


def test_hybrid_dispatches_by_phase():
    calls = []

    class Recorder(TorchAttnBackend):
        def __init__(self, name):
            super().__init__(HQ, HKV, D)
            self.name = name

        def prepare_metadata(self, batch):
            calls.append(self.name)

    hybrid = HybridBackend(Recorder("p"), Recorder("d"))
    hybrid.prepare_metadata(Batch([], "prefill"))
    hybrid.prepare_metadata(Batch([], "decode"))
    assert calls == ["p", "d"]
