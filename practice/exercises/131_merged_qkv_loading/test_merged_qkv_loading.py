"""Exercise 131: load_weight merges q/k/v and gate/up as it streams the checkpoint.

The tiny Qwen2 (2 layers, hidden 64, 4 query heads and 2 KV heads of 16, q/k/v biases)
and the tiny Qwen3 (tied embeddings) under ``models/`` are loaded with ``load_weight`` and
compared with their checkpoints read directly; hand-made checkpoints cover the corners.
Tensors are built on ``MINISGL_DEVICE`` (the CPU by default).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from minisgl.models.weight import load_weight

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


def attn(layer: int, what: str) -> str:
    return f"model.layers.{layer}.self_attn.{what}"


def mlp(layer: int, what: str) -> str:
    return f"model.layers.{layer}.mlp.{what}"


# ---- merging, one rank ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["weight", "bias"])
def test_qkv_is_merged_q_then_k_then_v(qwen2_path, kind):
    ckpt = checkpoint(qwen2_path)
    got, _ = load_all(qwen2_path)
    for layer in range(2):
        name = attn(layer, f"qkv_proj.{kind}")
        assert name in got, (
            f"{name} was never yielded; got {sorted(n for n in got if 'self_attn' in n)}"
        )
        want = torch.cat([ckpt[attn(layer, f"{p}_proj.{kind}")] for p in "qkv"])
        assert_same(got[name], want, f"{name} (rows: q 64, then k 32, then v 32)")


def test_gate_and_up_are_merged_gate_first(qwen2_path):
    ckpt = checkpoint(qwen2_path)
    got, _ = load_all(qwen2_path)
    for layer in range(2):
        name = mlp(layer, "gate_up_proj.weight")
        assert name in got, (
            f"{name} was never yielded; got {sorted(n for n in got if '.mlp.' in n)}"
        )
        want = torch.cat([ckpt[mlp(layer, "gate_proj.weight")], ckpt[mlp(layer, "up_proj.weight")]])
        assert_same(got[name], want, f"{name} (rows: gate 128, then up 128)")


def test_each_name_is_yielded_once(qwen2_path):
    ckpt = checkpoint(qwen2_path)
    _, names = load_all(qwen2_path)
    dup = sorted({n for n in names if names.count(n) > 1})
    assert not dup, f"yielded more than once: {dup}"
    members = sorted(
        n for n in names if any(f".{p}_proj." in n for p in ("q", "k", "v", "gate", "up"))
    )
    assert not members, f"members of a merge group must only come out merged, got {members}"
    merged = {
        n.replace(f".{p}_proj.", ".qkv_proj." if p in "qkv" else ".gate_up_proj.")
        for n in ckpt
        for p in ("q", "k", "v", "gate", "up")
        if f".{p}_proj." in n
    }
    want = {
        n for n in ckpt if not any(f".{p}_proj." in n for p in ("q", "k", "v", "gate", "up"))
    } | merged
    assert set(names) == want, (
        f"missing {sorted(want - set(names))}, unexpected {sorted(set(names) - want)}"
    )


def test_other_tensors_pass_through_unchanged(qwen2_path):
    ckpt = checkpoint(qwen2_path)
    got, _ = load_all(qwen2_path)
    for name in (
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
        attn(1, "o_proj.weight"),
        mlp(0, "down_proj.weight"),
        "model.layers.1.input_layernorm.weight",
    ):
        assert name in got, f"{name} was never yielded"
        assert_same(got[name], ckpt[name], name)


def test_tied_embeddings_are_not_duplicated(qwen3_path):
    ckpt = checkpoint(qwen3_path)
    assert "lm_head.weight" not in ckpt, (
        "the tiny Qwen3 is expected to be tied (no lm_head in the file)"
    )
    got, names = load_all(qwen3_path)
    assert "lm_head.weight" not in got, (
        "the loader invented lm_head.weight; a tied model's head is set by BaseLLMModel.load_state_dict"
    )
    assert names.count("model.embed_tokens.weight") == 1, "the embedding must come exactly once"
    assert_same(got["model.embed_tokens.weight"], ckpt["model.embed_tokens.weight"], "embed_tokens")


def test_dtype_and_device_are_applied(qwen2_path):
    got, _ = load_all(qwen2_path, dtype=torch.bfloat16)
    wrong = sorted(
        f"{n}: {t.dtype} on {t.device}"
        for n, t in got.items()
        if t.dtype != torch.bfloat16 or t.device.type != DEVICE.type
    )
    assert not wrong, f"every tensor must be bfloat16 on {DEVICE.type}: {wrong[:4]}"
    ckpt = checkpoint(qwen2_path)
    want = torch.cat([ckpt[attn(0, f"{p}_proj.weight")] for p in "qkv"]).to(torch.bfloat16)
    assert_same(got[attn(0, "qkv_proj.weight")], want, "qkv_proj.weight in bfloat16")


def _save(path: Path, tensors: Dict[str, torch.Tensor]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def test_a_merge_group_may_span_files(tmp_path, drawn_seed):
    g = torch.Generator().manual_seed(drawn_seed)  # new weights in every judged run
    q, k, v = (torch.randn(n, 4, generator=g) for n in (4, 2, 2))
    _save(
        tmp_path / "model-00001-of-00002.safetensors",
        {"l.self_attn.v_proj.weight": v, "l.norm.weight": q[0]},
    )
    _save(
        tmp_path / "model-00002-of-00002.safetensors",
        {"l.self_attn.q_proj.weight": q, "l.self_attn.k_proj.weight": k},
    )
    got = dict(load_weight(tmp_path, DEVICE, torch.float32))
    assert sorted(got) == ["l.norm.weight", "l.self_attn.qkv_proj.weight"], f"got {sorted(got)}"
    assert_same(
        got["l.self_attn.qkv_proj.weight"], torch.cat([q, k, v]), "qkv merged across two files"
    )


def test_an_incomplete_merge_group_is_an_error(tmp_path):
    _save(
        tmp_path / "model.safetensors",
        {
            "l.self_attn.q_proj.weight": torch.ones(4, 4),
            "l.self_attn.k_proj.weight": torch.ones(2, 4),
            "l.mlp.gate_proj.weight": torch.ones(8, 4),
            "l.mlp.up_proj.weight": torch.ones(8, 4),
        },
    )
    with pytest.raises(ValueError):
        list(load_weight(tmp_path, DEVICE, torch.float32))


def test_an_empty_folder_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(load_weight(tmp_path, DEVICE, torch.float32))
