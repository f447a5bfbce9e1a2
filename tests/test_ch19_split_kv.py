"""Chapter 19: the split-KV decode attention, as kernels and as an attention backend.

The kernels are compared with softmax attention computed directly (float32), on the CPU
under ``TRITON_INTERPRET=1`` and on a GPU at Qwen3-0.6B's shapes; the backend's routing and
its CUDA-graph buffers are checked on the engine. From ``qkv``, the reference is the
attention layer's own norms, RoPE and store (``torch_ops``) followed by the same kernel.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from minisgl.kernel import torch_ops
from tests.helpers.interpreter import interpret

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(
    not HAS_TRITON, reason="triton is not installed (pip install triton)"
)


def paged_decode_case(page: int, lens, hq: int, hkv: int, dim: int, dtype, device):
    """A pool of random K/V, requests on shuffled pages, FlashInfer's index of them, and the
    attention of one random query per request computed directly (float32)."""
    gen = torch.Generator().manual_seed(page)
    num_pages = sum(-(-n // page) for n in lens) + 3
    k_slots, v_slots = (torch.randn(num_pages * page, hkv, dim, generator=gen) for _ in range(2))
    order = torch.randperm(num_pages, generator=gen).tolist()
    indptr, page_ids, last, want = [0], [], [], []
    q = torch.randn(len(lens), hq, dim, generator=gen)
    for b, n in enumerate(lens):
        pages = order[indptr[-1] : indptr[-1] + -(-n // page)]
        page_ids += pages
        indptr.append(len(page_ids))
        last.append(n - (len(pages) - 1) * page)
        slots = torch.tensor([pages[t // page] * page + t % page for t in range(n)])
        k = k_slots[slots].to(dtype).float().repeat_interleave(hq // hkv, 1)
        v = v_slots[slots].to(dtype).float().repeat_interleave(hq // hkv, 1)
        scores = torch.einsum("hd,thd->ht", q[b].to(dtype).float(), k) / math.sqrt(dim)
        want.append(torch.einsum("ht,thd->hd", scores.softmax(-1), v))
    index = [torch.tensor(x, dtype=torch.int32, device=device) for x in (indptr, page_ids, last)]
    to = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    return to(q), to(k_slots), to(v_slots), index, torch.stack(want).to(device)


def reference_qk(qkv, pos, cos_sin, q_norm, k_norm, eps, k_slots, v_slots, loc, hq, hkv, dim):
    """The attention layer's work between the qkv GEMV and the attention, op by op:
    split, per-head norms, RoPE, the KV store. Returns the queries ``[T, H_q, D]``."""
    q, k, v = qkv.split([hq * dim, hkv * dim, hkv * dim], dim=-1)
    q, k, v = q.reshape(-1, hq, dim), k.reshape(-1, hkv, dim), v.reshape(-1, hkv, dim)
    if q_norm is not None:
        q, k = torch_ops.rms_norm(q, q_norm, eps), torch_ops.rms_norm(k, k_norm, eps)
    q, k = torch_ops.apply_rotary(pos, q, k, cos_sin)
    torch_ops.store_cache(k_slots, v_slots, loc, k, v)
    return q


def qkv_decode_case(
    page: int, lens, hq: int, hkv: int, dim: int, norm: bool, k_slots, v_slots, index
):
    """Random ``qkv`` rows for the last token of each request of ``paged_decode_case`` (its
    slot in the index): ``decode_attention_qkv``'s arguments up to the index (on copies of
    the pool), and the reference: ``reference_qk``'s queries and pool, in float32."""
    from minisgl.layers.rotary import _cos_sin_cache

    gen = torch.Generator().manual_seed(len(lens) + page)
    dev, dtype = k_slots.device, k_slots.dtype
    qkv = torch.randn(len(lens), (hq + 2 * hkv) * dim, generator=gen).to(dev, dtype)
    norms = (None, None)
    if norm:
        norms = tuple((1 + 0.1 * torch.randn(dim, generator=gen)).to(dev, dtype) for _ in range(2))
    cos_sin = _cos_sin_cache(dim, 2048, 1e4, None, torch.device(dev))
    indptr, page_ids, _ = (t.tolist() for t in index)
    pos = torch.tensor([n - 1 for n in lens], device=dev, dtype=torch.int32)
    last_slots = [
        page_ids[indptr[b] + (n - 1) // page] * page + (n - 1) % page for b, n in enumerate(lens)
    ]
    loc = torch.tensor(last_slots, device=dev, dtype=torch.int32)
    k_ref, v_ref = k_slots.float().clone(), v_slots.float().clone()
    q_norm, k_norm = (n.float() if n is not None else None for n in norms)
    q_ref = reference_qk(
        qkv.float(), pos, cos_sin, q_norm, k_norm, 1e-6, k_ref, v_ref, loc.long(), hq, hkv, dim
    )
    args = (qkv, pos, cos_sin, *norms, 1e-6, k_slots.clone(), v_slots.clone(), loc)
    return args, (q_ref.to(dtype).contiguous(), k_ref.to(dtype), v_ref.to(dtype))


DECODE_SCRIPT = """
import torch
from tests.test_ch19_split_kv import paged_decode_case, qkv_decode_case
from minisgl.kernel.triton.decode import decode_attention, decode_attention_qkv
for page, lens, hq, hkv in ((1, [37, 100], 4, 2), (4, [5], 8, 2), (16, [130, 1], 2, 2)):
    # 4 splits: 5 tokens leave three chunks empty; 130 tokens span several pages per chunk
    q, k_slots, v_slots, index, want = paged_decode_case(page, lens, hq, hkv, 16, torch.float32, "cpu")
    got = decode_attention(q, k_slots, v_slots, *index, page, 16 ** -0.5, max_seq_len=200, num_splits=4)
    err = float((got - want).abs().max())
    assert err < 1e-5, (page, lens, err)
    for norm in (False, True) if page == 1 else (True,):  # from qkv: norms, RoPE and the store in the kernel
        args, (q_ref, k_ref, v_ref) = qkv_decode_case(page, lens, hq, hkv, 16, norm, k_slots, v_slots, index)
        want = decode_attention(q_ref, k_ref, v_ref, *index, page, 16 ** -0.5, max_seq_len=200, num_splits=4)
        got = decode_attention_qkv(*args, *index, page, 16 ** -0.5, 200, hq, num_splits=4)
        err = float((got - want).abs().max())
        assert err < 1e-5, (page, lens, norm, err)
        assert torch.allclose(args[6], k_ref, atol=1e-6) and torch.equal(args[7], v_ref), "the stored K/V"
# 64 dims: two merge programs per head, each over 32 of them
q, k_slots, v_slots, index, want = paged_decode_case(4, [70], 4, 2, 64, torch.float32, "cpu")
got = decode_attention(q, k_slots, v_slots, *index, 4, 64 ** -0.5, max_seq_len=200, num_splits=4)
assert float((got - want).abs().max()) < 1e-5, "64 dims"
# an empty chunk's program writes no partial and the merge reads none: poisoned with NaN, they change nothing
real_empty = torch.empty
torch.empty = lambda *shape, **kw: real_empty(*shape, **kw).fill_(float("nan"))
try:
    for lens in ([5], [1], [3, 70]):
        q, k_slots, v_slots, index, want = paged_decode_case(4, lens, 4, 2, 16, torch.float32, "cpu")
        got = decode_attention(q, k_slots, v_slots, *index, 4, 16 ** -0.5, max_seq_len=200, num_splits=8)
        assert float((got - want).abs().max()) < 1e-5, ("empty chunks read", lens)
finally:
    torch.empty = real_empty
print("decode ok")
"""


@needs_triton
@pytest.mark.slow
def test_split_kv_attention_matches_softmax_attention_in_the_interpreter():
    res = interpret(DECODE_SCRIPT)
    assert res.returncode == 0 and "decode ok" in res.stdout, res.stderr[-3000:]


@needs_triton
def test_the_kernels_refuse_bad_input_before_launching():
    """Checked on the host, so a wrong call is a ValueError, never an out-of-bounds kernel."""
    from minisgl.kernel.triton import decode

    def refused(fn, **kwargs):
        with pytest.raises(ValueError):
            fn(**kwargs)

    slots = torch.zeros(10, 2, 16)
    i32 = dict(dtype=torch.int32)
    index = [
        torch.tensor([0, 1, 2], **i32),
        torch.tensor([0, 1], **i32),
        torch.tensor([1, 1], **i32),
    ]
    good = dict(q=torch.randn(2, 4, 16), k_slots=slots, v_slots=slots.clone(), kv_indptr=index[0],
                kv_page_ids=index[1], kv_last_page_len=index[2], page_size=1, sm_scale=0.25,
                max_seq_len=8)  # fmt: skip
    for bad in (
        dict(kv_indptr=index[0][:2]),
        dict(kv_last_page_len=index[2][:1]),
        dict(v_slots=slots[:, :1]),
        dict(q=good["q"].bfloat16()),
        dict(num_splits=0),
        dict(page_size=0),
        dict(max_seq_len=0),
        dict(k_slots=slots[:, 0], v_slots=slots[:, 0]),
    ):
        refused(decode.decode_attention, **{**good, **bad})
    qkv = torch.randn(2, (4 + 2 * 2) * 16)
    good = dict(qkv=qkv, positions=torch.tensor([0, 1]), cos_sin_cache=torch.zeros(8, 16),
                q_norm=None, k_norm=None, eps=1e-6, k_slots=slots, v_slots=slots.clone(),
                out_loc=torch.tensor([3, 4]), kv_indptr=index[0], kv_page_ids=index[1],
                kv_last_page_len=index[2], page_size=1, sm_scale=0.25, max_seq_len=8,
                num_qo_heads=4)  # fmt: skip
    strided = torch.tensor([0, 9, 1, 9, 2, 9], **i32)[::2]  # kv_indptr's values, every other one
    for bad in (
        dict(num_qo_heads=3),
        dict(qkv=qkv[:, :-16]),
        dict(out_loc=torch.tensor([3])),
        dict(q_norm=torch.ones(8), k_norm=torch.ones(8)),
        dict(cos_sin_cache=torch.zeros(8, 16).double()),
        dict(kv_last_page_len=index[2][:1]),
        dict(kv_indptr=strided),
        dict(kv_page_ids=index[1].float()),
        dict(q_norm=torch.ones(16)),
        dict(cos_sin_cache=torch.zeros(16)),
        dict(out_loc=torch.tensor([3.0, 4.0])),
        dict(qkv=qkv.int(), k_slots=slots.int(), v_slots=slots.int()),
        dict(
            stamps=(torch.zeros(3, 4, dtype=torch.int64), torch.zeros(4096, 4, dtype=torch.int64))
        ),
    ):
        refused(decode.decode_attention_qkv, **{**good, **bad})


def split_kv_engine(qwen3_path, requests: int, num_pages: int):
    """A CPU float32 engine on the split-KV backend (its fallback the torch backend), pages of
    4, and ``requests`` decoding requests of 4 tokens placed by hand."""
    from minisgl.benchmark import manual
    from minisgl.engine import Engine, EngineConfig

    engine = Engine(
        EngineConfig(str(qwen3_path), dtype=torch.float32, device="cpu", max_running_req=requests,
                     num_page_override=num_pages, max_seq_len_override=32,
                     attention_backend="split_kv", page_size=4)
    )  # fmt: skip
    reqs = manual.place(engine, [[1, 2, 3]] * requests, 4)
    return engine, reqs


def decode_all(reqs):
    for req in reqs:
        req.complete_one()
        req.append_host(torch.tensor([7], dtype=torch.int32))


def test_the_backend_takes_small_decodes_and_routes_the_rest(qwen3_path):
    """``SplitKVBackend.path``: "split" for decode batches of at most ``FUSED_DECODE_MAX_BS``
    (4) requests in an engine whose requests fit ``SPLIT_KV_MAX_SEQ_LEN``; prefills and
    larger decodes reach the fallback."""
    from minisgl.attention.split_kv import SPLIT_KV_MAX_SEQ_LEN, SplitKVBackend, SplitKVMetadata
    from minisgl.attention.torch_backend import TorchAttnMetadata
    from minisgl.benchmark import manual
    from minisgl.kernel.speedups import FUSED_DECODE_MAX_BS

    engine, reqs = split_kv_engine(qwen3_path, 8, 20)
    backend = engine.attn_backend
    assert (
        isinstance(backend, SplitKVBackend) and engine.page_table.shape[1] <= SPLIT_KV_MAX_SEQ_LEN
    )
    assert FUSED_DECODE_MAX_BS == 4
    prefill = manual.build_batch(engine, reqs[:5], "prefill")
    assert isinstance(prefill.attn_metadata, TorchAttnMetadata)
    decode_all(reqs)
    for n, routed in ((1, SplitKVMetadata), (4, SplitKVMetadata), (5, TorchAttnMetadata)):
        batch = manual.build_batch(engine, reqs[:n], "decode")
        assert isinstance(batch.attn_metadata, routed), n
        if routed is SplitKVMetadata:
            meta = batch.attn_metadata
            assert meta.path == "split"
            assert meta.kv_indptr.tolist() == list(range(n + 1))  # one page of 4 tokens each
            assert meta.kv_last_page_len.tolist() == [4] * n
            assert meta.get_last_indices(n).tolist() == list(range(n))
    engine.shutdown()


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("page", [1, 16])
def test_split_kv_decode_attention_at_qwen3_shapes(page):
    """bf16 q, K, V; float32 softmax over them as the reference. Contexts of 1,000 tokens
    (16 of the 64 chunks of 64 tokens used, the last one partly) and 37 (one chunk, 63
    empty). From qkv, the reference is the same kernel on the layer's own rotated queries and
    stored K/V."""
    from minisgl.kernel.triton.decode import decode_attention, decode_attention_qkv

    for lens in ([1000], [1000, 37]):
        q, k, v, index, want = paged_decode_case(page, lens, 16, 8, 128, torch.bfloat16, "cuda")
        got = decode_attention(q, k, v, *index, page, 128**-0.5, max_seq_len=1024)
        rel = float((got.float() - want).abs().max() / want.abs().max())
        assert got.dtype == torch.bfloat16 and rel < 2**-6, (
            f"page {page}, contexts {lens}: {rel:.2e}"
        )
        args, (q_ref, k_ref, v_ref) = qkv_decode_case(page, lens, 16, 8, 128, True, k, v, index)
        want = decode_attention(q_ref, k_ref, v_ref, *index, page, 128**-0.5, max_seq_len=1024)
        got = decode_attention_qkv(*args, *index, page, 128**-0.5, 1024, 16)
        rel = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        assert rel < 2**-6, f"from qkv, page {page}, contexts {lens}: {rel:.2e}"
        for got, want in zip(args[6:8], (k_ref, v_ref)):
            bound = 2**-6 * float(want.float().abs().max())
            assert float((got.float() - want.float()).abs().max()) <= bound


@pytest.mark.gpu
def test_the_engine_picks_the_split_kv_backend_on_cuda():
    from minisgl.attention.fi import FlashInferBackend
    from minisgl.attention.split_kv import SplitKVBackend
    from tests.test_ch19_fused import gpu_engine

    _, engine = gpu_engine(page_size=16)
    assert isinstance(engine.attn_backend, SplitKVBackend)
    assert isinstance(engine.attn_backend.fallback, FlashInferBackend)
    engine.shutdown()
