"""Chapter 20: decode attention for a large batch: the pipelined batch kernel, longest
contexts first, and the split-KV backend's "batch" path.

The kernel is compared with softmax attention computed directly (float32), on the CPU under
``TRITON_INTERPRET=1`` and on a GPU at Qwen3-0.6B's shapes (``paged_decode_case`` and
``qkv_decode_case`` are chapter 19's); the backend's routing, its order and its CUDA-graph
buffers are checked on the engine.
"""

from __future__ import annotations

import pytest
import torch

from minisgl.kernel import speedups
from tests.helpers.interpreter import interpret
from tests.test_ch19_split_kv import needs_triton, paged_decode_case

BATCH_SCRIPT = """
import torch
from tests.test_ch19_split_kv import paged_decode_case, qkv_decode_case
# the batch kernel: one program per (request, KV head) over its whole context, tiles of 64
# tokens that span pages (P = 4), end on a page's edge (64, 128) or hold one token
from minisgl.kernel.triton.decode_batch import decode_attention_batch, decode_attention_batch_qkv
from minisgl.attention.split_kv import longest_first
# (the earlier tokens fill their last tile exactly at 65 and 129)
for page, lens, hq, hkv in ((4, [64, 1, 130, 7], 4, 2), (1, [128, 3, 65], 2, 2), (16, [129, 200], 8, 2)):
    q, k_slots, v_slots, index, want = paged_decode_case(page, lens, hq, hkv, 16, torch.float32, "cpu")
    got = decode_attention_batch(q, k_slots, v_slots, *index, page, 16 ** -0.5)
    err = float((got - want).abs().max())
    assert err < 1e-5, ("batch kernel", page, lens, err)
    # longest first: the programs start in another order and every row gets the same values
    order = torch.tensor(longest_first(lens, hkv, 0), dtype=torch.int32)
    assert order.tolist() != list(range(len(lens))), "the case must reorder something"
    again = decode_attention_batch(q, k_slots, v_slots, *index, page, 16 ** -0.5, order)
    assert torch.equal(again, got), ("longest first", page, lens)
    for norm in (False, True) if page == 1 else (True,):  # from qkv: the layer's ops, then the kernel
        args, (q_ref, k_ref, v_ref) = qkv_decode_case(page, lens, hq, hkv, 16, norm, k_slots, v_slots, index)
        want = decode_attention_batch(q_ref, k_ref, v_ref, *index, page, 16 ** -0.5)
        got = decode_attention_batch_qkv(*args, *index, page, 16 ** -0.5, hq, order)
        err = float((got - want).abs().max())
        assert err < 1e-5, ("batch kernel from qkv", page, lens, norm, err)
        assert torch.allclose(args[6], k_ref, atol=1e-6) and torch.equal(args[7], v_ref), "the stored K/V"
# the kernel reads ``order`` (int64 here): a row it does not list keeps its allocation's NaN
real_empty_like = torch.empty_like
torch.empty_like = lambda t, **kw: real_empty_like(t, **kw).fill_(float("nan"))
try:
    q, k_slots, v_slots, index, want = paged_decode_case(4, [9, 70], 4, 2, 16, torch.float32, "cpu")
    got = decode_attention_batch(q, k_slots, v_slots, *index, 4, 16 ** -0.5, torch.tensor([1, 1]))
    assert got[0].isnan().all() and float((got[1] - want[1]).abs().max()) < 1e-5, "order unread"
finally:
    torch.empty_like = real_empty_like
print("batch ok")
"""


@needs_triton
def test_the_batch_kernel_matches_softmax_attention_in_the_interpreter():
    res = interpret(BATCH_SCRIPT)
    assert res.returncode == 0 and "batch ok" in res.stdout, res.stderr[-3000:]


@needs_triton
def test_the_batch_kernels_refuse_bad_input_before_launching():
    """Checked on the host, so a wrong call is a ValueError, never an out-of-bounds kernel."""
    from minisgl.kernel.triton.decode_batch import (
        decode_attention_batch,
        decode_attention_batch_qkv,
    )

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
                kv_page_ids=index[1], kv_last_page_len=index[2], page_size=1, sm_scale=0.25)  # fmt: skip
    for bad in (
        dict(kv_indptr=index[0][:2]),
        dict(kv_last_page_len=index[2][:1]),
        dict(v_slots=slots[:, :1]),
        dict(q=good["q"].bfloat16()),
        dict(q=good["q"][:, :3]),
        dict(q=good["q"].transpose(0, 1).contiguous().transpose(0, 1)),
        dict(page_size=0),
        dict(kv_page_ids=index[1].float()),
        dict(order=torch.tensor([1], **i32)),
        dict(order=torch.tensor([1.0, 0.0])),
        dict(order=torch.tensor([1, 9, 0, 9], **i32)[::2]),
        dict(order=torch.tensor([1, 0], device="meta")),
    ):
        refused(decode_attention_batch, **{**good, **bad})
    qkv = torch.randn(2, (4 + 2 * 2) * 16)
    good = dict(qkv=qkv, positions=torch.tensor([0, 1]), cos_sin_cache=torch.zeros(8, 16),
                q_norm=None, k_norm=None, eps=1e-6, k_slots=slots, v_slots=slots.clone(),
                out_loc=torch.tensor([3, 4]), kv_indptr=index[0], kv_page_ids=index[1],
                kv_last_page_len=index[2], page_size=1, sm_scale=0.25, num_qo_heads=4)  # fmt: skip
    strided = torch.tensor([0, 9, 1, 9, 2, 9], **i32)[::2]  # kv_indptr's values, every other one
    for bad in (
        dict(num_qo_heads=3),
        dict(qkv=qkv[:, :-16]),
        dict(out_loc=torch.tensor([3])),
        dict(q_norm=torch.ones(16)),
        dict(cos_sin_cache=torch.zeros(8, 16).double()),
        dict(kv_indptr=strided),
        dict(qkv=qkv.int(), k_slots=slots.int(), v_slots=slots.int()),
        dict(order=torch.tensor([1, 0, 2], **i32)),
    ):
        refused(decode_attention_batch_qkv, **{**good, **bad})


@needs_triton
@pytest.mark.parametrize("from_qkv", [False, True])
def test_the_batch_kernel_compiles_for_hopper_with_its_pipeline_and_pdl(from_qkv):
    """As the engine launches it on an H200 at Qwen3-0.6B's shapes: Triton's software
    pipeline turns the loop's K/V loads into asynchronous copies, and the kernel waits for
    the one before and lets the next one start."""
    from minisgl.kernel.triton import decode_batch as tdb
    from tests.test_ch19_fused import ptx_for_hopper

    bf, i32 = "*bf16", "*i32"
    types = dict(q_ptr=bf, k_ptr=bf, v_ptr=bf, out_ptr=bf, order_ptr=i32, indptr_ptr=i32, page_ids_ptr=i32,
                 last_len_ptr=i32, pos_ptr="*i64", loc_ptr="*i64", cos_sin_ptr="*fp32",
                 q_norm_ptr=bf, k_norm_ptr=bf, scale_log2="fp32", stride_slot="i32",
                 stride_q="i32", eps="fp32")  # fmt: skip
    constexprs = dict(GROUP=2, BLOCK_G=16, HEAD_DIM=128, NUM_KV_HEADS=8, PAGE=256,
                      BLOCK_T=tdb.BLOCK_T, NUM_STAGES=tdb.NUM_STAGES, PDL=True,
                      FROM_QKV=from_qkv, HAS_QK_NORM=from_qkv)  # fmt: skip
    aligned = ("q_ptr", "k_ptr", "v_ptr", "out_ptr", "stride_slot", "stride_q")
    ptx = ptx_for_hopper(tdb._decode_batch_kernel, types, constexprs, tdb.NUM_WARPS, aligned)
    assert "cp.async" in ptx
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx


def test_the_batch_kernel_starts_the_longest_contexts_first(qwen3_path, monkeypatch):
    """``longest_first`` orders a batch's rows by context, longest first, ties in the batch's
    order, when it has more programs than the GPU holds at once; the backend hands that order
    to the batch kernel in its metadata (and its switch keeps the batch's order)."""
    from minisgl.attention.split_kv import longest_first
    from minisgl.benchmark import manual
    from minisgl.engine import Engine, EngineConfig

    assert longest_first([5, 9, 1, 9, 7], 2, 9) == [1, 3, 4, 0, 2]  # 10 programs, 9 at once
    assert longest_first([5, 9, 1, 9, 7], 2, 10) == [0, 1, 2, 3, 4]  # all at once: as they are
    assert longest_first([], 8, 0) == []
    engine = Engine(
        EngineConfig(str(qwen3_path), dtype=torch.float32, device="cpu", max_running_req=64,
                     num_page_override=300, max_seq_len_override=32, attention_backend="split_kv",
                     page_size=4)
    )  # fmt: skip
    prompts = [[1] * (1 + (7 * i) % 20) for i in range(64)]
    reqs = manual.place(engine, prompts, 4)
    for req in reqs:
        req.complete_one()
        req.append_host(torch.tensor([7], dtype=torch.int32))
    lens = [r.device_len for r in reqs]
    assert len(set(lens)) > 1
    assert engine.attn_backend.resident_programs == 0  # on the CPU: every batch is sorted
    batch = manual.build_batch(engine, reqs, "decode")
    order = batch.attn_metadata.order.tolist()
    assert sorted(order) == list(range(64))
    assert [lens[b] for b in order] == sorted(lens, reverse=True)
    with speedups.using(longest_first=False):
        batch = manual.build_batch(engine, reqs, "decode")
    assert batch.attn_metadata.order.tolist() == list(range(64))
    engine.shutdown()


@pytest.mark.gpu
@pytest.mark.parametrize("page", [1, 16, 256])
def test_the_batch_kernel_at_qwen3_shapes(page):
    """bf16 q, K, V of 64 requests from 1 to 1,000 tokens (tiles that end on a page's edge,
    contexts of one token); float32 softmax over them as the reference."""
    from minisgl.attention.split_kv import longest_first
    from minisgl.kernel.triton.decode_batch import decode_attention_batch

    lens = [1, 64, 1000, 37, 256, 513] + [(97 * i) % 1000 + 1 for i in range(58)]
    q, k, v, index, want = paged_decode_case(page, lens, 16, 8, 128, torch.bfloat16, "cuda")
    got = decode_attention_batch(q, k, v, *index, page, 128**-0.5)
    rel = float((got.float() - want).abs().max() / want.abs().max())
    assert got.dtype == torch.bfloat16 and rel < 2**-6, f"page {page}: {rel:.2e}"
    order = torch.tensor(longest_first(lens, 8, 0), dtype=torch.int32, device="cuda")
    assert torch.equal(decode_attention_batch(q, k, v, *index, page, 128**-0.5, order), got)


@pytest.mark.gpu
def test_a_large_decode_on_the_batch_kernel_gives_flashinfers_logits(monkeypatch):
    """64 requests of different lengths, teacher-forced: the batch kernel's logits, from q (the
    unfused layers) and from qkv, against FlashInfer's (the kernel off), within chapter 17's
    tolerance, 2 % of each step's logit range; then the batch kernel in a CUDA graph of 64,
    its programs longest first, gives the eager run's tokens."""
    from minisgl.attention import split_kv
    from minisgl.attention.split_kv import longest_first
    from minisgl.benchmark import manual
    from minisgl.engine import Engine, EngineConfig
    from tests.helpers import hf_encode
    from tests.test_ch19_fused import PROMPTS, SHAPED, SMOLLM2, count_calls

    path = next((p for p in (SHAPED, SMOLLM2) if (p / "config.json").is_file()), None)
    if path is None:
        pytest.skip("no bf16 model built: python -m tools.models qwen3-0.6b-shaped")
    engine = Engine(
        EngineConfig(str(path), dtype=torch.bfloat16, device="cuda", page_size=16,
                     max_running_req=64, num_page_override=512, max_seq_len_override=256,
                     cuda_graph_max_bs=64)
    )  # fmt: skip
    ids = [hf_encode(path, " ".join([PROMPTS[i % 4]] * (1 + i % 7))) for i in range(64)]
    steps = 4
    assert 64 in engine.graph_runner.graph_bs and engine.attn_backend.batch_kernel
    monkeypatch.setattr(engine.attn_backend, "batch_kernel", False)  # as the switch would
    tokens, plain = manual.greedy(engine, manual.place(engine, ids, steps), steps, use_graph=False)
    monkeypatch.setattr(engine.attn_backend, "batch_kernel", True)
    for unfused, op in ((True, "decode_attention_batch"), (False, "decode_attention_batch_qkv")):
        calls = count_calls(monkeypatch, split_kv, op)
        reqs = manual.place(engine, ids, steps)
        with speedups.using(fused_decode=not unfused):
            _, batched = manual.greedy(engine, reqs, steps, use_graph=False, forced=tokens)
        assert len(calls) == (steps - 1) * len(engine.model.model.layers), op
        for step, (a, b) in enumerate(zip(batched, plain)):
            diff, scale = float((a - b).abs().max()), float(b.max() - b.min())
            assert diff <= 0.02 * scale, f"{op}, step {step}: max |diff| {diff:.3f}"
    # 512 programs fit the GPU at once; counted as none, the batch is sorted, eager and replayed
    monkeypatch.setattr(engine.attn_backend, "resident_programs", 0)
    eager, _ = manual.greedy(engine, manual.place(engine, ids, 8), 8, use_graph=False)
    graph, _ = manual.greedy(engine, manual.place(engine, ids, 8), 8, use_graph=True)
    assert graph == eager
    index = engine.attn_backend._graph_index  # the last replay's copies
    pages, last = index.kv_indptr[:65].diff().tolist(), index.kv_last_page_len[:64].tolist()
    lens = [(n - 1) * engine.attn_backend.page_size + t for n, t in zip(pages, last)]
    replayed = index.order[:64].tolist()
    assert replayed == longest_first(lens, engine.attn_backend.num_kv_heads, 0)
    assert replayed != list(range(64))  # the prompts' lengths differ
    engine.shutdown()


def test_the_attention_benchmark_reads_its_cases():
    """``minisgl.benchmark.decode_attention`` runs on a GPU only; its cases and lengths are
    plain host code."""
    from minisgl.benchmark import decode_attention as bench

    assert bench.parse_case("64x1024") == (64, 1024, False)
    assert bench.parse_case("256x559r") == (256, 559, True)
    for bad in ("64", "x1024", "64x0", "8x64r", "axb"):
        with pytest.raises(ValueError):
            bench.parse_case(bad)
    assert bench.context_lengths(4, 100, False).tolist() == [100] * 4
    ragged = bench.context_lengths(4096, 559, True)
    assert ragged.min() >= 64 and ragged.max() <= 2 * 559 - 64
    assert abs(float(ragged.float().mean()) - 559) < 10


def test_the_backend_sends_large_decodes_to_the_batch_kernel(qwen3_path, monkeypatch):
    """``SplitKVBackend.path``: "batch" for decode batches of at least ``DECODE_BATCH_MIN_BS``
    (64) requests, unless the speed-up ``decode_batch_kernel`` is off (read when the backend
    is built); the batches between reach the fallback."""
    from minisgl.attention import create_attention_backend
    from minisgl.attention.split_kv import DECODE_BATCH_MIN_BS, SplitKVMetadata
    from minisgl.attention.torch_backend import TorchAttnMetadata
    from minisgl.benchmark import manual
    from tests.test_ch19_split_kv import decode_all, split_kv_engine

    assert DECODE_BATCH_MIN_BS == 64
    engine, reqs = split_kv_engine(qwen3_path, 64, 140)
    decode_all(reqs)
    for n, path in ((1, "split"), (5, None), (63, None), (64, "batch")):
        meta = manual.build_batch(engine, reqs[:n], "decode").attn_metadata
        if path is None:
            assert isinstance(meta, TorchAttnMetadata), n
        else:
            assert isinstance(meta, SplitKVMetadata) and meta.path == path, n
    monkeypatch.setattr(engine.attn_backend, "batch_kernel", False)  # the speed-up, at start-up
    batch = manual.build_batch(engine, reqs, "decode")
    assert isinstance(batch.attn_metadata, TorchAttnMetadata), "the speed-up off"
    with speedups.using(decode_batch_kernel=False):
        assert not create_attention_backend("split_kv", engine.config.model_config).batch_kernel
    engine.shutdown()
