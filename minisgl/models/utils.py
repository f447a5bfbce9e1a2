"""The blocks Llama-family decoders share: gated MLP, RoPE attention, decoder layer, stack.

Llama, Qwen2 and Qwen3 differ only in details (attention bias, per-head QK-norm), so one
set of blocks with two switches serves them all. Attribute names follow the Hugging Face
checkpoints (``self_attn``, ``mlp``, ``input_layernorm``...) so weights load by name.
Mirrors upstream ``minisgl.models.utils``.
"""

from __future__ import annotations

from typing import Callable

import torch

from minisgl.core import get_global_ctx
from minisgl.layers import (
    AttentionLayer,
    BaseOP,
    LinearColParallelMerged,
    LinearOProj,
    LinearQKVMerged,
    LinearRowParallel,
    OPList,
    ParallelLMHead,
    RMSNorm,
    RMSNormFused,
    VocabParallelEmbedding,
    silu_and_mul,
)

from .base import BaseLLMModel
from .config import ModelConfig


class GatedMLP(BaseOP):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, with gate and up in one matmul."""

    def __init__(self, config: ModelConfig) -> None:
        if config.hidden_act != "silu":
            raise ValueError(f"unsupported activation {config.hidden_act!r} (only silu)")
        size = config.intermediate_size
        self.gate_up_proj = LinearColParallelMerged(
            config.hidden_size, [size, size], has_bias=False
        )
        self.down_proj = LinearRowParallel(size, config.hidden_size, has_bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(silu_and_mul(self.gate_up_proj.forward(x)))


class RopeAttn(BaseOP):
    """Self-attention with RoPE; ``has_qk_norm`` adds Qwen3's per-head RMSNorm on q and k."""

    def __init__(self, config: ModelConfig, layer_id: int, has_qk_norm: bool = False) -> None:
        head_dim = config.head_dim
        self.qkv_proj = LinearQKVMerged(
            config.hidden_size,
            head_dim,
            config.num_qo_heads,
            config.num_kv_heads,
            has_bias=config.attention_bias,
        )
        self.q_norm = RMSNorm(head_dim, config.rms_norm_eps) if has_qk_norm else None
        self.k_norm = RMSNorm(head_dim, config.rms_norm_eps) if has_qk_norm else None
        self.attn = AttentionLayer(
            layer_id,
            config.num_qo_heads,
            config.num_kv_heads,
            head_dim,
            config.rotary_config,
            q_norm=self.q_norm,
            k_norm=self.k_norm,
        )
        self.o_proj = LinearOProj(
            config.num_qo_heads * head_dim, config.hidden_size, has_bias=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj.forward(self.attn.forward(self.qkv_proj.forward(x)))


class DecoderLayer(BaseOP):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``; the residual
    stream is carried separately so each add fuses with the next norm."""

    def __init__(self, config: ModelConfig, layer_id: int, has_qk_norm: bool, mlp: BaseOP) -> None:
        self.self_attn = RopeAttn(config, layer_id, has_qk_norm)
        self.mlp = mlp
        self.input_layernorm = RMSNormFused(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNormFused(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(x)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual


class DecoderModel(BaseOP):
    """Embedding, the layer stack and the final norm: ``ids: [T]`` -> hidden ``[T, hidden]``.

    ``make_mlp(config, layer_id)`` builds each layer's MLP (``CausalLM.make_mlp``)."""

    def __init__(
        self, config: ModelConfig, has_qk_norm: bool, make_mlp: Callable[[ModelConfig, int], BaseOP]
    ) -> None:
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = OPList(
            [
                DecoderLayer(config, i, has_qk_norm, make_mlp(config, i))
                for i in range(config.num_layers)
            ]
        )
        self.norm = RMSNormFused(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens.forward(input_ids), None
        for layer in self.layers:
            x, residual = layer.forward(x, residual)
        return self.norm.forward(x, residual)[0]


class CausalLM(BaseLLMModel):
    """A decoder stack plus LM head; subclasses only pick the switches."""

    has_qk_norm = False

    def __init__(self, config: ModelConfig) -> None:
        self.tie_word_embeddings = config.tie_word_embeddings
        self.model = DecoderModel(config, self.has_qk_norm, self.make_mlp)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)

    def make_mlp(self, config: ModelConfig, layer_id: int) -> BaseOP:
        """Layer ``layer_id``'s MLP: the dense SwiGLU (a model with another MLP overrides this)."""
        return GatedMLP(config)

    def forward(self) -> torch.Tensor:
        hidden = self.model.forward(get_global_ctx().batch.input_ids)
        return self.lm_head.forward(hidden)
