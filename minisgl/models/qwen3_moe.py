"""Qwen3-MoE: Qwen3's attention, with a mixture of experts in place of the dense MLP.

Each sparse layer's ``mlp`` is a router (``gate``, a ``[E, H]`` linear layer, replicated
on every rank) and ``E`` experts (``experts``, a :class:`~minisgl.layers.moe.MoELayer`);
each token runs through the ``k`` experts its router ranks highest, and their outputs are
summed with the (renormalised) router probabilities as weights. Layers listed in
``mlp_only_layers`` (or off the ``decoder_sparse_step`` grid) keep a dense MLP of
``intermediate_size``. Attribute names are the checkpoint's (``mlp.gate.weight``,
``mlp.experts.…``). Mirrors upstream ``minisgl.models.qwen3_moe`` and
``minisgl.models.utils.MoEMLP``.
"""

from __future__ import annotations

import torch

from minisgl.layers import BaseOP, LinearReplicated
from minisgl.layers.moe import MoELayer

from .base import MODEL_REGISTRY
from .config import ModelConfig
from .utils import CausalLM, GatedMLP


class MoEMLP(BaseOP):
    """``x: [T, H]`` -> ``[T, H]``: router logits ``gate(x): [T, E]``, then the experts."""

    def __init__(self, config: ModelConfig) -> None:
        if config.hidden_act != "silu":
            raise ValueError(f"unsupported activation {config.hidden_act!r} (only silu)")
        self.gate = LinearReplicated(config.hidden_size, config.num_experts, has_bias=False)
        self.experts = MoELayer(
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size,
            intermediate_size=config.moe_intermediate_size,
            renormalize=config.norm_topk_prob,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts.forward(x, self.gate.forward(x))


@MODEL_REGISTRY.register("Qwen3MoeForCausalLM")
class Qwen3MoeForCausalLM(CausalLM):
    """Qwen3 (QK-norm, no attention bias) whose sparse layers' MLP is :class:`MoEMLP`."""

    has_qk_norm = True

    def make_mlp(self, config: ModelConfig, layer_id: int) -> BaseOP:
        return MoEMLP(config) if config.is_sparse_layer(layer_id) else GatedMLP(config)
