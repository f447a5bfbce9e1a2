"""Exercise 461: a tensor-parallel rank's slice of column, row, KV-head and vocabulary
weights. Small hand-made tensors on ``MINISGL_DEVICE`` (the CPU by default)."""

from __future__ import annotations

import os
import random

import pytest
import torch

from minisgl.distributed import set_tp_info
from minisgl.layers import VocabParallelEmbedding
from minisgl.layers.shard import shard_column, shard_kv_heads, shard_row, shard_vocab, vocab_range

DEVICE = torch.device(os.environ.get("MINISGL_DEVICE") or "cpu")
W = torch.arange(12 * 24, dtype=torch.float32, device=DEVICE).view(12, 24)


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Shapes first, then the largest difference and the first index that differs."""
    assert tuple(got.shape) == tuple(want.shape), (
        f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    )
    diff = (got.detach().cpu().double() - want.detach().cpu().double()).abs()
    if bool((diff > 0).any()):
        idx = tuple(int(i) for i in (diff > 0).nonzero()[0])
        raise AssertionError(
            f"{what}: max |diff| {float(diff.max()):.3g}; first at {idx}: "
            f"got {float(got[idx]):.6g}, expected {float(want[idx]):.6g}"
        )


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_column_shards_are_equal_blocks_of_dim_0(size):
    rows = 12 // size
    for rank in range(size):
        assert_same(
            shard_column(W, rank, size),
            W[rank * rows : (rank + 1) * rows],
            f"rank {rank} of {size}: rows {rank * rows}..{(rank + 1) * rows - 1}",
        )
    bias = W[:, 0].clone()
    assert_same(
        shard_column(bias, size - 1, size),
        bias[(size - 1) * rows :],
        f"a bias, last rank of {size}",
    )


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_row_shards_are_equal_blocks_of_dim_1(size):
    cols = 24 // size
    for rank in range(size):
        assert_same(
            shard_row(W, rank, size),
            W[:, rank * cols : (rank + 1) * cols],
            f"rank {rank} of {size}: columns {rank * cols}..{(rank + 1) * cols - 1}",
        )


def test_uneven_cuts_are_refused():
    with pytest.raises(ValueError):
        shard_column(W, 0, 5)  # 12 rows do not split 5 ways
    with pytest.raises(ValueError):
        shard_row(W, 0, 5)  # nor 24 columns


def test_shards_own_their_memory():
    for shard in (
        shard_column(W, 1, 2),
        shard_row(W, 1, 2),
        shard_kv_heads(W, 3, 4, 2),
        shard_vocab(W, 1, 2),
    ):
        assert shard.untyped_storage().data_ptr() != W.untyped_storage().data_ptr(), (
            "a shard is a view of the whole weight: it keeps the whole tensor alive (clone it)"
        )


def test_kv_heads_go_to_neighbouring_ranks():
    head_dim = 6  # 2 heads of 6 rows
    for rank, head in enumerate([0, 0, 1, 1]):
        assert_same(
            shard_kv_heads(W, rank, 4, 2),
            W[head * head_dim : (head + 1) * head_dim],
            f"2 KV heads on 4 ranks: rank {rank} keeps head {head}",
        )
    for rank in range(2):  # 4 heads of 3 rows on 2 ranks: an ordinary column cut
        assert_same(
            shard_kv_heads(W, rank, 2, 4),
            W[rank * 6 : (rank + 1) * 6],
            f"4 KV heads, rank {rank} of 2",
        )
    for rank in range(2):  # 1 head on 2 ranks: both keep all of it
        assert_same(shard_kv_heads(W, rank, 2, 1), W, f"1 KV head, rank {rank} of 2")
    bias = W[:, 0].clone()
    assert_same(shard_kv_heads(bias, 3, 4, 2), bias[6:], "a k_proj bias, rank 3 of 4, 2 heads")


@pytest.mark.parametrize("vocab,size", [(10, 4), (12, 4), (3, 4), (7, 2), (7, 1), (10, 3)])
def test_vocab_ranges_tile_the_vocabulary(vocab, size):
    block = -(-vocab // size)
    ranges = [vocab_range(vocab, r, size) for r in range(size)]
    for rank, r in enumerate(ranges):
        want = (min(rank * block, vocab), min((rank + 1) * block, vocab), block)
        assert tuple(r) == want, (
            f"V={vocab}, rank {rank} of {size}: got {tuple(r)}, expected {want}"
        )


@pytest.mark.parametrize("vocab,size", [(10, 4), (12, 4), (3, 4), (7, 2)])
def test_vocab_shards_are_padded_with_zeros(vocab, size):
    table = (torch.arange(vocab * 3, device=DEVICE).view(vocab, 3) + 1).to(
        torch.bfloat16
    )  # no real row is zero
    block = -(-vocab // size)
    for rank in range(size):
        lo, hi = min(rank * block, vocab), min((rank + 1) * block, vocab)
        want = torch.cat(
            [table[lo:hi], torch.zeros(block - (hi - lo), 3, dtype=table.dtype, device=DEVICE)]
        )
        got = shard_vocab(table, rank, size)
        assert got.dtype == table.dtype, f"the shard is {got.dtype}, the weight {table.dtype}"
        assert_same(
            got,
            want,
            f"V={vocab}, rank {rank} of {size}: rows {lo}..{hi - 1}, then {block - (hi - lo)} zero rows",
        )


def test_the_embedding_allocates_the_padded_block():
    set_tp_info(3, 4)
    try:
        with torch.device("meta"):
            embed = VocabParallelEmbedding(10, 5)
    finally:
        set_tp_info(0, 1)
    assert tuple(embed.weight.shape) == (3, 5), (
        f"rank 3 of 4 with V=10 allocates {tuple(embed.weight.shape)}; every rank needs 3 rows"
    )


def test_drawn_shapes_shard_into_blocks_that_tile_the_weight(drawn_seed):
    """Weights, ranks and vocabularies of drawn sizes (each judged run draws new ones): the
    column and row shards put back together are the weight, and the vocabulary shards are
    its rows with zeros after ``V``."""
    rng = random.Random(drawn_seed)
    g = torch.Generator().manual_seed(drawn_seed)
    for _ in range(8):
        size = rng.randint(1, 8)
        w = torch.randn(size * rng.randint(1, 5), size * rng.randint(1, 5), generator=g)
        w = w.to(DEVICE)
        cols = torch.cat([shard_column(w, r, size) for r in range(size)])
        assert_same(cols, w, f"{size} column shards of {tuple(w.shape)}, concatenated")
        rows = torch.cat([shard_row(w, r, size) for r in range(size)], dim=1)
        assert_same(rows, w, f"{size} row shards of {tuple(w.shape)}, concatenated")
        vocab = rng.randint(1, 40)
        table = torch.randn(vocab, 3, generator=g).to(DEVICE)
        block = -(-vocab // size)
        padded = torch.cat([table, torch.zeros(block * size - vocab, 3, device=DEVICE)])
        shards = torch.cat([shard_vocab(table, r, size) for r in range(size)])
        assert_same(shards, padded, f"V={vocab} over {size} ranks, padded with zeros")
