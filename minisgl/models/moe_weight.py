"""Stack a checkpoint's per-expert tensors into the ``[E, ...]`` tensors of ``MoELayer``.

Hub checkpoints (and ``save_pretrained`` of transformers 5, which converts back on save)
store each expert's projections on their own: ``model.layers.N.mlp.experts.E.gate_proj.weight``,
``up_proj``, ``down_proj``. ``load_weight`` already shards each for this rank and merges
gate and up into ``...experts.E.gate_up_proj.weight`` ``[2I/tp, H]``; this stage, chained
after it, holds the experts of one projection until all ``num_experts`` have arrived and
yields them stacked as ``...mlp.experts.gate_up_proj`` ``[E, 2I/tp, H]`` (and
``down_proj`` ``[E, H, I/tp]``). Host memory holds at most the pending experts of the
layers being read. A checkpoint already in the stacked layout (transformers 5's in-memory
names, no ``.weight``) passes through, cut to this rank's slice of ``I``.

Mirrors the expert branch of upstream ``minisgl.models.weight.load_weight``.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, Iterator, Tuple

import torch

from minisgl.distributed import get_tp_info

_PER_EXPERT = re.compile(
    r"^(?P<prefix>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_up_proj|down_proj)\.weight$"
)
_STACKED = (".experts.gate_up_proj", ".experts.down_proj")


def shard_stacked_experts(name: str, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's slice of an already stacked expert tensor: ``gate_up_proj [E, 2I, H]``
    keeps rows ``I/size`` of the gate half and the same of the up half; ``down_proj
    [E, H, I]`` its columns. The whole tensor when ``size`` is 1."""
    if size == 1:
        return tensor
    if name.endswith(".gate_up_proj"):
        gate, up = tensor.chunk(2, dim=1)
        return torch.cat([gate.chunk(size, dim=1)[rank], up.chunk(size, dim=1)[rank]], dim=1)
    return tensor.chunk(size, dim=2)[rank].clone()


def stack_experts(
    weights: Iterable[Tuple[str, torch.Tensor]], num_experts: int
) -> Iterator[Tuple[str, torch.Tensor]]:
    """Pass ``(name, tensor)`` pairs through, stacking per-expert tensors by expert id.

    Raises:
        ValueError: when an expert id is ``>= num_experts``, or some expert of a projection
            is still missing at the end (a corrupt checkpoint).
    """
    pending: Dict[str, Dict[int, torch.Tensor]] = {}
    tp = get_tp_info()
    for name, tensor in weights:
        match = _PER_EXPERT.match(name)
        if match is None:
            if name.endswith(_STACKED):
                tensor = shard_stacked_experts(name, tensor, tp.rank, tp.size)
            yield name, tensor
            continue
        expert = int(match["expert"])
        if expert >= num_experts:
            raise ValueError(f"{name}: expert {expert} but the config has {num_experts} experts")
        stacked_name = f"{match['prefix']}.{match['proj']}"
        group = pending.setdefault(stacked_name, {})
        group[expert] = tensor
        if len(group) == num_experts:
            del pending[stacked_name]
            yield stacked_name, torch.stack([group[e] for e in range(num_experts)])
    if pending:
        missing = {k: num_experts - len(v) for k, v in sorted(pending.items())[:4]}
        raise ValueError(f"experts missing from the checkpoint (name: how many): {missing}")
