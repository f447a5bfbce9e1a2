"""Exercise 151: TorchAttnBackend's metadata and its paged attention against dense attention.

A ``Scene`` is a small KV pool (2 layers, ``H_kv`` = 2 heads of ``D`` = 16) on
``MINISGL_DEVICE`` (the CPU by default), a page table whose rows are handed out out of
batch order and whose pages are shuffled, and for each request a whole random sequence of
q/k/v. The cached prefix of each request is written to the pool first, as an earlier step
would have; the backend then gets only this step's tokens. The reference is dense causal
attention over each whole sequence, in float64.
"""

from __future__ import annotations

import os
import random
from typing import List, Optional

import pytest
import torch

from minisgl.attention.torch_backend import TorchAttnBackend, TorchAttnMetadata
from minisgl.core import Batch, Context, Req, SamplingParams, set_global_ctx
from minisgl.kvcache import MHAKVCache

DEVICE = torch.device(os.environ.get("MINISGL_DEVICE") or "cpu")
HQ, HKV, D, LAYERS, ROWS, MAX_LEN = 4, 2, 16, 2, 4, 32
ATOL = 1e-4

# a fresh prompt, a prompt with 3 tokens cached, a one-token extension of 8 cached tokens
MIXED = dict(lens=[5, 7, 9], cached=[0, 3, 8], rows=[2, 0, 3])


def assert_close(
    got: torch.Tensor, want: torch.Tensor, what: str, cu: Optional[List[int]] = None
) -> None:
    """Shapes first, then the largest difference and the first index that differs (and the
    request it belongs to, given the query offsets ``cu``)."""
    assert tuple(got.shape) == tuple(want.shape), (
        f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    )
    diff = (got.detach().cpu().double() - want.detach().cpu().double()).abs()
    bad = diff > ATOL + ATOL * want.detach().cpu().double().abs()
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        where = ""
        if cu is not None:
            req = max(i for i in range(len(cu) - 1) if cu[i] <= idx[0])
            where = f" (request {req}, its query {idx[0] - cu[req]})"
        raise AssertionError(
            f"{what}: max |diff| {float(diff.max()):.3g} (allowed {ATOL} + {ATOL} * |expected|); "
            f"first at {idx}{where}: got {float(got[idx]):.6g}, expected {float(want[idx]):.6g}"
        )


def dense_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Reference, float64: one whole sequence ``q: [S, H_q, D]``, ``k, v: [S, H_kv, D]``;
    query head ``h`` uses KV head ``h // (H_q / H_kv)``."""
    q, k, v = (x.detach().cpu().double() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5
    s = q.shape[0]
    scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


class Scene:
    """Requests ``lens[i]`` tokens long with ``cached[i]`` of them in the pool, in table rows
    ``rows[i]``; ``phase`` is the batch's."""

    def __init__(
        self,
        page_size: int,
        lens: List[int],
        cached: List[int],
        rows: List[int],
        phase: str = "prefill",
        hq: int = HQ,
        num_pages: int = 40,
        seed: int = 0,
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ctx = Context(page_size)
        self.ctx.kv_cache = MHAKVCache(HKV, LAYERS, D, num_pages, page_size, torch.float32, DEVICE)
        self.ctx.page_table = torch.zeros(ROWS + 1, MAX_LEN, dtype=torch.int32, device=DEVICE)
        self.backend = self.ctx.attn_backend = TorchAttnBackend(hq, HKV, D)
        set_global_ctx(self.ctx)
        self.lens, self.cached, self.rows = lens, cached, rows
        perm, used = torch.randperm(num_pages, generator=g).tolist(), 0
        for row, n in zip(rows, lens):
            pages = perm[used : used + -(-n // page_size)]
            used += len(pages)
            slots = torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages])[:n]
            self.ctx.page_table[row, :n] = slots.to(torch.int32)
        # per layer, per request: the whole sequence's q, k, v
        self.q = [[torch.randn(n, hq, D, generator=g) for n in lens] for _ in range(LAYERS)]
        self.k = [[torch.randn(n, HKV, D, generator=g) for n in lens] for _ in range(LAYERS)]
        self.v = [[torch.randn(n, HKV, D, generator=g) for n in lens] for _ in range(LAYERS)]
        for layer in range(LAYERS):  # what earlier steps stored
            for i, (row, c) in enumerate(zip(rows, cached)):
                self.ctx.kv_cache.store_kv(
                    self.k[layer][i][:c].to(DEVICE),
                    self.v[layer][i][:c].to(DEVICE),
                    self.ctx.page_table[row, :c],
                    layer,
                )
        reqs = [
            Req(torch.zeros(n, dtype=torch.int32), row, c, 4, uid, SamplingParams(), None)
            for uid, (n, c, row) in enumerate(zip(lens, cached, rows))
        ]
        self.batch = Batch(reqs, phase)  # type: ignore[arg-type]
        self.batch.out_loc = torch.cat(
            [self.ctx.page_table[r, c:n] for r, c, n in zip(rows, cached, lens)]
        )

    @property
    def cu(self) -> List[int]:
        out = [0]
        for n, c in zip(self.lens, self.cached):
            out.append(out[-1] + n - c)
        return out

    def step(self, layer: int):
        """This step's packed q, k, v of ``layer`` (the uncached tokens of every request)."""
        return tuple(
            torch.cat([x[i][c:] for i, c in enumerate(self.cached)]).to(DEVICE)
            for x in (self.q[layer], self.k[layer], self.v[layer])
        )

    def forward(self, layer: int) -> torch.Tensor:
        q, k, v = self.step(layer)
        return self.backend.forward(q, k, v, layer, self.batch)

    def reference(self, layer: int) -> torch.Tensor:
        return torch.cat(
            [
                dense_causal(self.q[layer][i], self.k[layer][i], self.v[layer][i])[c:]
                for i, c in enumerate(self.cached)
            ]
        )


@pytest.fixture(autouse=True)
def _clear_context():
    yield
    set_global_ctx(None)


def metadata(scene: Scene) -> TorchAttnMetadata:
    scene.backend.prepare_metadata(scene.batch)
    meta = scene.batch.attn_metadata
    assert isinstance(meta, TorchAttnMetadata), (
        f"batch.attn_metadata must be a TorchAttnMetadata, got {type(meta)}"
    )
    return meta


def ints(xs) -> List[int]:
    return [int(x) for x in xs]


# ---- prepare_metadata ------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 4])
def test_metadata_of_a_mixed_batch(page_size):
    s = Scene(page_size, **MIXED)
    meta = metadata(s)
    assert ints(meta.cu_seqlens_q) == [0, 5, 9, 10], (
        f"cu_seqlens_q: extend lens are 5, 4, 1, so [0, 5, 9, 10]; got {ints(meta.cu_seqlens_q)}"
    )
    assert ints(meta.cached_lens) == [0, 3, 8], f"cached_lens: got {ints(meta.cached_lens)}"
    assert ints(meta.seq_lens) == [5, 7, 9], (
        f"seq_lens (the whole context): got {ints(meta.seq_lens)}"
    )
    last = meta.get_last_indices(3)
    assert last.tolist() == [4, 8, 9], (
        f"last_indices: the rows of each request's last query are [4, 8, 9], got {last.tolist()}"
    )
    assert last.dtype == torch.int64 and last.device.type == DEVICE.type, (
        f"last_indices must be int64 on {DEVICE.type}, got {last.dtype} on {last.device}"
    )
    assert meta.get_last_indices(2).tolist() == [4, 8], (
        "get_last_indices(bs) is the first bs entries"
    )


@pytest.mark.parametrize("page_size", [1, 4])
def test_metadata_reads_the_row_of_each_request(page_size):
    s = Scene(page_size, **MIXED)
    meta = metadata(s)
    assert len(meta.kv_indices) == 3, (
        f"one kv_indices entry per request, got {len(meta.kv_indices)}"
    )
    for i, (row, n) in enumerate(zip(s.rows, s.lens)):
        want = s.ctx.page_table[row, :n].tolist()
        got = [int(x) for x in meta.kv_indices[i]]
        assert got == want, (
            f"kv_indices[{i}]: request {i} lives in table row {row}; its slots are {want}, got {got}"
        )


def test_padded_requests_get_metadata_too():
    s = Scene(1, lens=[4, 6], cached=[3, 5], rows=[1, 0], phase="decode")
    dummy = Req(torch.zeros(1, dtype=torch.int32), ROWS, 0, 1, 99, SamplingParams(), None)
    s.batch.padded_reqs = s.batch.reqs + [dummy]  # as CUDA graphs pad a decode batch
    meta = metadata(s)
    assert ints(meta.cu_seqlens_q) == [0, 1, 2, 3], (
        f"padded_reqs count: got cu_seqlens_q {ints(meta.cu_seqlens_q)}"
    )
    assert meta.get_last_indices(s.batch.padded_size).tolist() == [0, 1, 2], (
        f"get_last_indices(padded_size) must cover the padding; got {meta.get_last_indices(3).tolist()}"
    )


# ---- forward ---------------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 4])
def test_forward_stores_this_steps_kv(page_size):
    s = Scene(page_size, **MIXED)
    metadata(s)
    _, k, v = s.step(1)
    s.forward(1)
    pool = s.ctx.kv_cache
    assert_close(pool.k_slots(1)[s.batch.out_loc.long()], k, "k_slots(1)[out_loc] after forward")
    assert_close(pool.v_slots(1)[s.batch.out_loc.long()], v, "v_slots(1)[out_loc] after forward")


@pytest.mark.parametrize("page_size", [1, 4])
def test_no_cached_prefix_equals_dense_attention(page_size):
    s = Scene(page_size, lens=[5, 3, 8], cached=[0, 0, 0], rows=[1, 3, 0])
    metadata(s)
    assert_close(s.forward(0), s.reference(0), "output of fresh prompts", s.cu)


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_cached_prefix_is_visible(page_size):
    s = Scene(page_size, **MIXED)
    metadata(s)
    assert_close(
        s.forward(0), s.reference(0), "output with cached prefixes of 0, 3 and 8 tokens", s.cu
    )


@pytest.mark.parametrize("hq", [4, 2], ids=["gqa", "mha"])
def test_grouped_and_plain_multi_head(hq):
    s = Scene(4, hq=hq, **MIXED)
    metadata(s)
    assert_close(
        s.forward(0), s.reference(0), f"output with {hq} query heads and {HKV} KV heads", s.cu
    )


def test_each_layer_reads_its_own_slots():
    s = Scene(4, **MIXED)
    metadata(s)
    for layer in range(LAYERS):
        assert_close(s.forward(layer), s.reference(layer), f"output of layer {layer}", s.cu)


@pytest.mark.parametrize("page_size", [1, 4])
def test_decode_step_over_scattered_pages(page_size):
    s = Scene(page_size, lens=[6, 11, 2], cached=[5, 10, 1], rows=[3, 1, 2], phase="decode", seed=1)
    meta = metadata(s)
    assert meta.get_last_indices(3).tolist() == [0, 1, 2], (
        "in decode each request has one query: its own row"
    )
    assert_close(
        s.forward(1), s.reference(1), "decode output (the last row of dense attention)", s.cu
    )


def test_output_keeps_the_query_layout():
    s = Scene(1, **MIXED)
    metadata(s)
    out = s.forward(0)
    assert (
        tuple(out.shape) == (10, HQ, D)
        and out.dtype == torch.float32
        and out.device.type == DEVICE.type
    ), (
        f"forward returns [T, H_q, D] = (10, {HQ}, {D}) float32 on {DEVICE.type}, "
        f"got {tuple(out.shape)} {out.dtype} on {out.device}"
    )


def test_drawn_batches_equal_dense_attention(drawn_seed):
    """Batches drawn at random (each judged run draws new ones): page size, rows, lengths,
    cached prefixes, prefill or decode; every layer's output equals dense attention."""
    rng = random.Random(drawn_seed)
    for _ in range(4):
        page_size = rng.choice([1, 2, 4, 8])
        rows = rng.sample(range(ROWS), rng.randint(1, ROWS))
        lens = [rng.randint(1, 10) for _ in rows]
        decode = rng.random() < 0.5
        cached = [n - 1 if decode else rng.randint(0, n - 1) for n in lens]
        s = Scene(page_size, lens, cached, rows, "decode" if decode else "prefill", seed=drawn_seed)
        metadata(s)
        for layer in range(LAYERS):
            assert_close(s.forward(layer), s.reference(layer), f"output of layer {layer}", s.cu)
