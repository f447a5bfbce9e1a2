"""Exercise 461 through the loader: shard_tensor (minisgl/models/weight.py) picks one of your
cuts for each checkpoint tensor, and load_weight merges the slices of a rank.

Small hand-made tensors cover each kind of name; the tiny Qwen2 under ``models/`` (2 layers,
hidden 64, 4 query heads and 2 KV heads of 16, q/k/v biases) is loaded as rank 1 of 2 and
rank 2 of 4 and compared with its checkpoint cut by hand. Tensors are built on
``MINISGL_DEVICE`` (the CPU by default).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

import pytest
import torch
from safetensors import safe_open

from minisgl.distributed import set_tp_info
from minisgl.models.weight import load_weight, shard_tensor

DEVICE = torch.device(os.environ.get("MINISGL_DEVICE") or "cpu")


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


def checkpoint(path: Path) -> Dict[str, torch.Tensor]:
    """Every tensor of the model folder, as stored (float32, CPU)."""
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out


def load_all(path: Path, dtype: torch.dtype = torch.float32):
    pairs = list(load_weight(path, DEVICE, dtype))
    names = [n for n, _ in pairs]
    return dict(pairs), names


@pytest.fixture
def tp():
    """``tp(rank, size)`` pretends to be that rank; the single rank comes back afterwards."""
    yield set_tp_info
    set_tp_info(0, 1)


def attn(layer: int, what: str) -> str:
    return f"model.layers.{layer}.self_attn.{what}"


def mlp(layer: int, what: str) -> str:
    return f"model.layers.{layer}.mlp.{what}"


# ---- shard_tensor ----------------------------------------------------------------------------

W = torch.arange(8 * 6, dtype=torch.float32).view(8, 6)


def test_one_rank_keeps_everything():
    for name in (
        "x.q_proj.weight",
        "x.o_proj.weight",
        "model.embed_tokens.weight",
        "x.norm.weight",
    ):
        assert_same(shard_tensor(name, W, 0, 1, 2), W, f"{name} with one rank")


@pytest.mark.parametrize(
    "name",
    [
        "x.q_proj.weight",
        "x.k_proj.weight",
        "x.v_proj.weight",
        "x.gate_proj.weight",
        "x.up_proj.weight",
        "x.q_proj.bias",
    ],
)
def test_column_parallel_shards_cut_the_output_dim(name):
    w = W[:, 0].clone() if name.endswith("bias") else W
    for rank in range(2):
        assert_same(
            shard_tensor(name, w, rank, 2, 2),
            w[rank * 4 : (rank + 1) * 4],
            f"{name}, rank {rank} of 2 (rows {rank * 4}..{rank * 4 + 3})",
        )


@pytest.mark.parametrize("name", ["x.o_proj.weight", "x.down_proj.weight"])
def test_row_parallel_shards_cut_the_input_dim(name):
    for rank in range(2):
        assert_same(
            shard_tensor(name, W, rank, 2, 2),
            W[:, rank * 3 : (rank + 1) * 3],
            f"{name}, rank {rank} of 2 (columns {rank * 3}..{rank * 3 + 2})",
        )


@pytest.mark.parametrize("name", ["model.embed_tokens.weight", "lm_head.weight"])
def test_vocab_shards_are_blocks_of_ceil_v_over_size(name):
    table = torch.arange(10 * 3, dtype=torch.float32).view(10, 3) + 1
    for rank, (lo, hi) in enumerate([(0, 3), (3, 6), (6, 9), (9, 10)]):
        # every rank gets 3 rows: the last rank's real row 9, then 2 zero rows of padding
        want = torch.cat([table[lo:hi], torch.zeros(3 - (hi - lo), 3)])
        assert_same(
            shard_tensor(name, table, rank, 4, 4),
            want,
            f"{name}, V=10, rank {rank} of 4 (rows {lo}..{hi - 1}, zero-padded to 3)",
        )


def test_replicated_tensors_stay_whole():
    for name in (
        "model.norm.weight",
        "x.input_layernorm.weight",
        "x.o_proj.bias",
        "x.self_attn.q_norm.weight",
    ):
        assert_same(shard_tensor(name, W, 1, 2, 2), W, f"{name} is replicated on every rank")


def test_kv_heads_are_replicated_when_fewer_than_ranks():
    head_dim = 4
    kv = torch.arange(2 * head_dim * 3, dtype=torch.float32).view(2 * head_dim, 3)  # 2 KV heads
    q = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)
    for rank, head in enumerate([0, 0, 1, 1]):
        for name in ("x.k_proj.weight", "x.v_proj.weight"):
            assert_same(
                shard_tensor(name, kv, rank, 4, 2),
                kv[head * head_dim : (head + 1) * head_dim],
                f"{name}, 2 KV heads on 4 ranks: rank {rank} keeps head {head}",
            )
        assert_same(
            shard_tensor("x.q_proj.weight", q, rank, 4, 2),
            q[rank * 2 : (rank + 1) * 2],
            f"q_proj is still cut 4 ways, rank {rank}",
        )
    bias = kv[:, 0].clone()
    assert_same(
        shard_tensor("x.k_proj.bias", bias, 3, 4, 2),
        bias[head_dim:],
        "k_proj.bias, rank 3 keeps head 1",
    )
    assert_same(
        shard_tensor("x.k_proj.weight", kv, 1, 2, 1), kv, "1 KV head on 2 ranks: both keep it whole"
    )


@pytest.mark.parametrize(
    "name", ["x.q_proj.weight", "x.o_proj.weight", "lm_head.weight", "x.k_proj.weight"]
)
def test_a_shard_owns_its_memory(name):
    big = torch.randn(8, 8)  # both dims split 4 ways
    shard = shard_tensor(name, big, 1, 4, 1)
    held = shard.untyped_storage().nbytes()
    assert held == shard.numel() * shard.element_size(), (
        f"{name}: the shard {tuple(shard.shape)} keeps {held} bytes of storage alive, the whole tensor's "
        f"{big.numel() * big.element_size()}; clone the slice"
    )


# ---- load_weight with several ranks --------------------------------------------------------


def test_loading_rank_1_of_2_merges_the_shards(qwen2_path, tp):
    ckpt = checkpoint(qwen2_path)
    tp(1, 2)
    got, _ = load_all(qwen2_path)
    half = lambda t, dim=0: t.chunk(2, dim=dim)[1]  # noqa: E731
    for kind in ("weight", "bias"):
        want = torch.cat([half(ckpt[attn(0, f"{p}_proj.{kind}")]) for p in "qkv"])
        assert_same(
            got[attn(0, f"qkv_proj.{kind}")],
            want,
            f"qkv_proj.{kind} on rank 1 of 2 (q, k, v halves)",
        )
    want = torch.cat([half(ckpt[mlp(1, "gate_proj.weight")]), half(ckpt[mlp(1, "up_proj.weight")])])
    assert_same(got[mlp(1, "gate_up_proj.weight")], want, "gate_up_proj on rank 1 of 2")
    assert_same(
        got[attn(0, "o_proj.weight")],
        half(ckpt[attn(0, "o_proj.weight")], 1),
        "o_proj on rank 1 of 2",
    )
    assert_same(got["lm_head.weight"], half(ckpt["lm_head.weight"]), "lm_head on rank 1 of 2")
    assert_same(
        got["model.norm.weight"], ckpt["model.norm.weight"], "the final norm on rank 1 of 2"
    )


def test_loading_rank_2_of_4_replicates_a_kv_head(qwen2_path, tp):
    ckpt = checkpoint(qwen2_path)
    tp(2, 4)
    got, _ = load_all(qwen2_path)
    head_dim = 16  # 2 KV heads of 16 for 4 ranks: ranks 2 and 3 both keep head 1
    for kind in ("weight", "bias"):
        q = ckpt[attn(1, f"q_proj.{kind}")].chunk(4)[2]
        k, v = (ckpt[attn(1, f"{p}_proj.{kind}")][head_dim : 2 * head_dim] for p in "kv")
        assert_same(
            got[attn(1, f"qkv_proj.{kind}")],
            torch.cat([q, k, v]),
            f"qkv_proj.{kind} on rank 2 of 4 (q quarter 2, then KV head 1 of k and of v)",
        )
