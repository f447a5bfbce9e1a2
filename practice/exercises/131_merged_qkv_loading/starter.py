"""Streamed loading of safetensors checkpoints into the engine's merged, sharded layout.

The checkpoint stores ``q_proj``, ``k_proj``, ``v_proj`` (and ``gate_proj``, ``up_proj``)
separately; the engine's layers want them stacked (``qkv_proj``, ``gate_up_proj``). The
loader reads one tensor at a time, cuts this rank's shard, holds the pieces of a merge
group until the group is complete, then yields the stacked tensor. Peak host memory is
one full tensor plus the pending group, never the whole model.

Mirrors upstream ``minisgl.models.weight.load_weight``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Tuple

import torch

# checkpoint suffix -> (merged suffix, position in the merge group, group size)
_MERGE = {
    ".q_proj.": (".qkv_proj.", 0, 3),
    ".k_proj.": (".qkv_proj.", 1, 3),
    ".v_proj.": (".qkv_proj.", 2, 3),
    ".gate_proj.": (".gate_up_proj.", 0, 2),
    ".up_proj.": (".gate_up_proj.", 1, 2),
}
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
    raise NotImplementedError("Exercise 131: implement shard_tensor")


def load_weight(
    model_path: str | Path, device: torch.device, dtype: torch.dtype, num_kv_heads: int
) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yield ``(engine_name, tensor)`` pairs, sharded, merged, cast to ``dtype``, on ``device``.

    Raises:
        FileNotFoundError: when the folder holds no ``*.safetensors`` file.
        ValueError: when a merge group is incomplete at the end (a corrupt checkpoint).
    """
    raise NotImplementedError("Exercise 131: implement load_weight")
