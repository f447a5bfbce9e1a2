"""Exercise 471: FlashInfer's paged-KV index (``paged_kv_index``) and ``prepare_metadata``.

The index tests are pure torch and run on the CPU; the ``gpu`` ones build a real
FlashInfer backend and are skipped without CUDA (the judge only accepts a GPU run).
Each index is checked by undoing it: the slots it describes must be the request's row of
the page table, position for position.
"""

from __future__ import annotations

import random

import pytest
import torch

from minisgl.attention.fi import PagedKVIndex, paged_kv_index
from minisgl.benchmark.manual import make_req
from tests.helpers import MODELS, SMOLLM2, hf_encode


def shuffled_table(rows: int, cols: int, page: int, seed: int = 0) -> torch.Tensor:
    """Each row owns random distinct pages; slot = page * P + offset, as CacheManager writes."""
    gen = torch.Generator().manual_seed(seed)
    per_row = -(-cols // page)
    order = torch.randperm(rows * per_row, generator=gen)
    table = torch.zeros(rows, cols, dtype=torch.int32)
    for r in range(rows):
        pages = order[r * per_row : (r + 1) * per_row]
        table[r] = (pages.unsqueeze(1) * page + torch.arange(page)).flatten()[:cols].to(torch.int32)
    return table


def req(row: int, length: int, cached: int = 0):
    return make_req(row, list(range(length)), cached_len=cached)


def slots_of(index: PagedKVIndex, i: int, page: int) -> list:
    """Undo the index: the token slots of request i, in position order."""
    pages = index.kv_page_ids[index.kv_indptr[i] : index.kv_indptr[i + 1]].cpu().long()
    slots = (pages.unsqueeze(1) * page + torch.arange(page)).flatten()
    return slots[: (len(pages) - 1) * page + int(index.kv_last_page_len[i])].tolist()


def check_rebuilds(table, reqs, page, index) -> None:
    for i, r in enumerate(reqs):
        want = table[r.table_idx, : r.device_len].tolist()
        got = slots_of(index, i, page)
        assert got == want, (
            f"request {i} (row {r.table_idx}, {r.device_len} tokens, P={page}): the index "
            f"describes slots {got[:8]}..., the page table has {want[:8]}..."
        )


@pytest.mark.parametrize("page", [1, 4, 16])
def test_page_ids_are_the_first_slot_of_each_page_over_P(page):
    table = shuffled_table(rows=3, cols=64, page=page)
    reqs = [req(0, 1), req(1, 17), req(2, 64)]
    index = paged_kv_index(table, reqs, page)
    want = [int(s) // page for r in reqs for s in table[r.table_idx, : r.device_len : page]]
    assert index.kv_page_ids.tolist() == want, (
        f"P={page}: kv_page_ids {index.kv_page_ids.tolist()[:10]}..., want {want[:10]}..."
    )
    check_rebuilds(table, reqs, page, index)


def test_indptr_are_running_sums():
    table = shuffled_table(rows=4, cols=48, page=4)
    reqs = [req(2, 5), req(0, 12), req(3, 1), req(1, 48)]
    index = paged_kv_index(table, reqs, 4)
    assert index.qo_indptr.tolist() == [0, 5, 17, 18, 66], f"qo_indptr {index.qo_indptr.tolist()}"
    assert index.kv_indptr.tolist() == [0, 2, 5, 6, 18], (
        f"kv_indptr (pages 2, 3, 1, 12) {index.kv_indptr.tolist()}"
    )
    assert index.seq_lens.tolist() == [5, 12, 1, 48], f"seq_lens {index.seq_lens.tolist()}"


def test_a_full_last_page_counts_P_not_0():
    table = shuffled_table(rows=3, cols=64, page=16)
    index = paged_kv_index(table, [req(0, 32), req(1, 33), req(2, 47)], 16)
    got = index.kv_last_page_len.tolist()
    assert got == [16, 1, 15], (
        f"32 tokens fill 2 pages (last has 16), 33 use 1 slot of a 3rd, 47 use 15: got {got}"
    )


def test_a_cached_prefix_has_kv_but_no_queries():
    table = shuffled_table(rows=2, cols=32, page=4)
    index = paged_kv_index(table, [req(0, 20, cached=12), req(1, 7)], 4)
    assert index.qo_indptr.tolist() == [0, 8, 15], (
        f"queries are the uncached tokens (20 - 12 = 8, then 7): qo_indptr {index.qo_indptr.tolist()}"
    )
    assert index.kv_indptr.tolist() == [0, 5, 7], (
        f"the KV covers the prefix too (5 pages, 2): {index.kv_indptr.tolist()}"
    )


def test_requests_keep_their_batch_order():
    table = shuffled_table(rows=5, cols=16, page=2, seed=3)
    reqs = [req(4, 9), req(1, 3), req(3, 16)]
    check_rebuilds(table, reqs, 2, paged_kv_index(table, reqs, 2))


def test_random_batches_rebuild_every_slot(drawn_seed):
    rng = random.Random(drawn_seed)  # new batches in every judged run
    for trial in range(40):
        page = rng.choice([1, 2, 4, 8, 16, 64])
        cols = page * rng.randint(1, 8)
        table = shuffled_table(rows=8, cols=cols, page=page, seed=trial)
        reqs = []
        for row in rng.sample(range(8), rng.randint(1, 8)):
            length = rng.randint(1, cols)
            reqs.append(req(row, length, rng.randint(0, length - 1)))
        index = paged_kv_index(table, reqs, page)
        assert index.qo_indptr.tolist()[-1] == sum(r.extend_len for r in reqs), f"trial {trial}"
        assert all(1 <= n <= page for n in index.kv_last_page_len.tolist()), (
            f"trial {trial}: {index.kv_last_page_len}"
        )
        check_rebuilds(table, reqs, page, index)


def test_host_arrays_are_int32_on_the_cpu():
    table = shuffled_table(rows=2, cols=16, page=4)
    index = paged_kv_index(table, [req(0, 6), req(1, 16)], 4)
    for name in ("qo_indptr", "kv_indptr", "kv_last_page_len", "seq_lens", "kv_page_ids"):
        t = getattr(index, name)
        assert t.dtype == torch.int32 and t.device.type == "cpu", (
            f"{name}: want int32 on cpu, got {t.dtype} on {t.device}"
        )
        assert t.dim() == 1, f"{name} must be 1-D, got shape {tuple(t.shape)}"


def test_the_dummy_request_reads_only_the_dummy_page():
    num_pages, page = 10, 4
    table = torch.zeros(3, 32, dtype=torch.int32)
    table[2].fill_(num_pages * page)  # what the engine writes into the dummy row
    index = paged_kv_index(table, [req(2, 1)], page)
    got = (index.kv_page_ids.tolist(), index.kv_last_page_len.tolist())
    assert got == ([num_pages], [1]), (
        f"the dummy's one token is slot {num_pages * page}: page {num_pages}; got {got}"
    )


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="page_size"):
        paged_kv_index(torch.zeros(1, 4, dtype=torch.int32), [req(0, 2)], 0)
    with pytest.raises(ValueError):
        paged_kv_index(torch.zeros(1, 4, dtype=torch.int32), [], 1)


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_prepare_metadata_indexes_the_padded_batch():
    from minisgl.benchmark import manual
    from minisgl.engine import Engine, EngineConfig

    path = next(
        (p for p in (MODELS / "qwen3-0.6b-shaped", SMOLLM2) if (p / "config.json").is_file()), None
    )
    if path is None:
        pytest.skip("no bf16 model built: python -m tools.models qwen3-0.6b-shaped")
    engine = Engine(
        EngineConfig(
            str(path),
            dtype=torch.bfloat16,
            device="cuda",
            page_size=16,
            max_running_req=8,
            num_page_override=256,
            max_seq_len_override=256,
            attention_backend="fi",
            cuda_graph_max_bs=0,
        )
    )
    try:
        backend = engine.attn_backend
        assert type(backend).__name__ == "FlashInferBackend", type(backend)
        ids = [
            hf_encode(path, p) for p in ("The capital of France is", "def fibonacci(n):", "1 + 1 =")
        ]
        reqs = manual.place(engine, ids, 4)
        prefill = manual.build_batch(engine, reqs, "prefill")
        meta = prefill.attn_metadata
        want = paged_kv_index(engine.page_table, reqs, 16)
        for name in ("qo_indptr", "kv_indptr", "kv_last_page_len", "seq_lens"):
            got = getattr(meta.index, name)
            assert got.device.type == "cpu" and got.tolist() == getattr(want, name).tolist(), (
                f"{name}: {got}"
            )
        assert meta.index.kv_page_ids.tolist() == want.kv_page_ids.tolist()
        last = meta.last_indices
        assert last.device.type == "cuda" and last.dtype == torch.int64, (
            f"last_indices: {last.dtype} on {last.device}"
        )
        assert last.tolist() == (want.qo_indptr[1:] - 1).tolist(), (
            f"last query rows {last.tolist()}"
        )
        assert meta.wrapper is backend.prefill_wrapper, "a prefill batch runs on prefill_wrapper"
        logits = manual.forward(engine, prefill, use_graph=False)
        assert logits.shape[0] == 3 and torch.isfinite(logits).all(), "the planned prefill must run"
        for r, token in zip(reqs, logits.argmax(dim=-1).tolist()):
            r.append_host(torch.tensor([token], dtype=torch.int32))

        engine.graph_runner.graph_bs = [
            4
        ]  # pad decode batches to 4 (pad_batch only reads the list)
        try:
            decode = manual.build_batch(engine, reqs, "decode")
        finally:
            engine.graph_runner.graph_bs = []
        meta = decode.attn_metadata
        assert decode.padded_size == 4 and meta.index.seq_lens.numel() == 4, (
            f"index the padded batch (4 requests, the dummy included), got {meta.index.seq_lens.tolist()}"
        )
        assert meta.wrapper is backend.decode_wrapper_for(4), (
            "a decode batch runs on the decode wrapper of its size, decode_wrapper_for"
        )
        assert meta.index.qo_indptr.tolist() == [0, 1, 2, 3, 4]
        logits = manual.forward(engine, decode, use_graph=False)
        assert logits.shape[0] == 3 and torch.isfinite(logits).all()
    finally:
        engine.shutdown()
