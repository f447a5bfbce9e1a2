"""Streamed loading of safetensors checkpoints into the engine's merged layout.

The checkpoint stores ``q_proj``, ``k_proj``, ``v_proj`` (and ``gate_proj``, ``up_proj``)
separately; the engine's layers want them stacked (``qkv_proj``, ``gate_up_proj``). The
loader reads one tensor at a time, holds the pieces of a merge group until the group is
complete, then yields the stacked tensor. Each piece moves to
the device as soon as it is read, so peak host memory is one full tensor, never the model.

Mirrors upstream ``minisgl.models.weight.load_weight``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterator, Tuple

import torch
from safetensors import safe_open
from tqdm import tqdm

from minisgl.distributed import get_tp_info
from minisgl.layers.shard import shard_column, shard_kv_heads, shard_row, shard_vocab  # +ch16
from minisgl.utils import cached_load_hf_config  # +ch16

from .config import ModelConfig  # +ch16

# checkpoint suffix -> (merged suffix, position in the merge group, group size)
_MERGE = {
    ".q_proj.": (".qkv_proj.", 0, 3),
    ".k_proj.": (".qkv_proj.", 1, 3),
    ".v_proj.": (".qkv_proj.", 2, 3),
    ".gate_proj.": (".gate_up_proj.", 0, 2),
    ".up_proj.": (".gate_up_proj.", 1, 2),
}
# >>> ch16: which tensors split along which dim, over the ranks
_COLUMN_SPLIT = (".q_proj.", ".k_proj.", ".v_proj.", ".gate_proj.", ".up_proj.")
_ROW_SPLIT = (".o_proj.weight", ".down_proj.weight")
_VOCAB_SPLIT = ("embed_tokens.", "lm_head.")


def shard_tensor(
    name: str, tensor: torch.Tensor, rank: int, size: int, num_kv_heads: int
) -> torch.Tensor:
    """This rank's slice of checkpoint tensor ``name`` (the whole tensor when ``size`` is 1).

    Column-parallel weights are cut along dim 0 (KV heads replicated when there are fewer
    than ranks), row-parallel along dim 1, vocabularies in zero-padded blocks of
    ``ceil(V / size)`` rows; the cuts themselves live in ``minisgl.layers.shard``.
    """
    if size == 1:
        return tensor
    if ".k_proj." in name or ".v_proj." in name:
        return shard_kv_heads(tensor, rank, size, num_kv_heads)
    if any(s in name for s in _COLUMN_SPLIT):
        return shard_column(tensor, rank, size)
    if any(name.endswith(s) for s in _ROW_SPLIT):
        return shard_row(tensor, rank, size)
    if any(s in name for s in _VOCAB_SPLIT):
        return shard_vocab(tensor, rank, size)
    return tensor


# <<< ch16


def load_weight(
    model_path: str | Path,
    device: torch.device,
    dtype: torch.dtype,
) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yield ``(engine_name, tensor)`` pairs, merged, cast to ``dtype``, on ``device``.

    Raises:
        FileNotFoundError: when the folder holds no ``*.safetensors`` file.
        ValueError: when a merge group is incomplete at the end (a corrupt checkpoint).
    """
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {str(model_path)!r}")
    tp = get_tp_info()
    # >>> ch16: with several ranks, k and v split by KV head: the checkpoint says how many
    num_kv_heads = 0
    if tp.size > 1:
        num_kv_heads = ModelConfig.from_hf(cached_load_hf_config(str(model_path))).num_kv_heads
    # <<< ch16
    pending: Dict[str, Dict[int, torch.Tensor]] = {}
    for file in tqdm(files, desc="Loading weights", disable=not tp.is_primary() or len(files) == 1):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                tensor = shard_tensor(name, tensor, tp.rank, tp.size, num_kv_heads)  # +ch16
                tensor = tensor.to(device=device, dtype=dtype)
                merge = next(((k, v) for k, v in _MERGE.items() if k in name), None)
                if merge is None:
                    yield name, tensor
                    continue
                suffix, (merged_suffix, slot, group_size) = merge
                merged_name = name.replace(suffix, merged_suffix)
                group = pending.setdefault(merged_name, {})
                group[slot] = tensor
                if len(group) == group_size:
                    del pending[merged_name]
                    yield merged_name, torch.cat([group[i] for i in range(group_size)], dim=0)
    if pending:
        raise ValueError(f"incomplete merge groups in the checkpoint: {sorted(pending)[:4]}")
