"""The handful of numbers the engine needs from a Hugging Face ``config.json``.

Mirrors upstream ``minisgl.models.config``. Works with transformers 4.x (``rope_theta``,
``rope_scaling``) and 5.x (``rope_parameters``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import (
    List,
    Tuple,  # +ch21
)

from transformers import PretrainedConfig

from minisgl.layers.rotary import RotaryConfig


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    intermediate_size: int
    hidden_act: str
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool
    rotary_config: RotaryConfig
    architectures: List[str] = field(default_factory=lambda: ["LlamaForCausalLM"])
    model_type: str = "llama"
    # >>> ch21: a mixture of experts: E experts of width moe_intermediate_size, top-k per
    # token; 0/empty for a dense model
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: Tuple[int, ...] = ()

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_sparse_layer(self, layer_id: int) -> bool:
        """Whether layer ``layer_id``'s MLP is the MoE block (Qwen3-MoE's rule; all layers of
        Qwen3-30B-A3B) rather than a dense ``intermediate_size`` MLP."""
        return (
            self.is_moe
            and layer_id not in self.mlp_only_layers
            and (layer_id + 1) % self.decoder_sparse_step == 0
        )

    # <<< ch21

    @classmethod
    def from_hf(cls, config: PretrainedConfig) -> "ModelConfig":
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        rope = dict(getattr(config, "rope_parameters", None) or {})
        legacy_scaling = getattr(config, "rope_scaling", None)
        if legacy_scaling and not rope:
            rope = dict(legacy_scaling)
        base = rope.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        if scaling.get("rope_type", scaling.get("type", "default")) == "default":
            scaling = {}
        model_type = getattr(config, "model_type", "llama")
        return cls(
            num_layers=config.num_hidden_layers,
            num_qo_heads=num_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            hidden_size=config.hidden_size,
            vocab_size=config.vocab_size,
            intermediate_size=config.intermediate_size,
            hidden_act=config.hidden_act,
            rms_norm_eps=config.rms_norm_eps,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama and Qwen3 say so in attention_bias
            attention_bias=model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
            rotary_config=RotaryConfig(
                head_dim=head_dim,
                rotary_dim=head_dim,
                max_position=config.max_position_embeddings,
                base=float(base),
                scaling=scaling or None,
            ),
            architectures=list(getattr(config, "architectures", None) or ["LlamaForCausalLM"]),
            model_type=model_type,
            # >>> ch21: the hub's Qwen3-MoE files name the expert count num_experts;
            # transformers 5 writes num_local_experts
            num_experts=int(
                getattr(config, "num_local_experts", None)
                or getattr(config, "num_experts", None)
                or 0
            ),
            num_experts_per_tok=int(getattr(config, "num_experts_per_tok", None) or 0),
            moe_intermediate_size=int(getattr(config, "moe_intermediate_size", None) or 0),
            norm_topk_prob=bool(getattr(config, "norm_topk_prob", False)),
            decoder_sparse_step=int(getattr(config, "decoder_sparse_step", None) or 1),
            mlp_only_layers=tuple(getattr(config, "mlp_only_layers", None) or ()),
            # <<< ch21
        )
