"""The blocks Llama-family decoders share: gated MLP, RoPE attention, decoder layer, stack.

Llama, Qwen2 and Qwen3 differ only in details (attention bias, per-head QK-norm), so one
set of blocks with two switches serves them all. Attribute names follow the Hugging Face
checkpoints (``self_attn``, ``mlp``, ``input_layernorm``...) so weights load by name.
Mirrors upstream ``minisgl.models.utils``.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from minisgl.core import get_global_ctx
from minisgl.distributed import get_tp_info
from minisgl.kernel import linear_add_residual_, norm_linear, use_fused_decode
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
        self.gate_up_proj = LinearColParallelMerged(config.hidden_size, [size, size], has_bias=False)
        self.down_proj = LinearRowParallel(size, config.hidden_size, has_bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(silu_and_mul(self.gate_up_proj.forward(x)))

    def forward_fused(self, residual: torch.Tensor, norm: RMSNorm) -> None:
        """Fused decode path (chapter 19): ``residual += mlp(norm(residual))`` in place, in two
        kernels: norm, gate/up and SwiGLU in one; down and the residual add in the other."""
        act = norm_linear(residual, norm.weight, norm.eps, self.gate_up_proj.weight, swiglu=True)
        linear_add_residual_(act, self.down_proj.weight, residual)


class RopeAttn(BaseOP):
    """Self-attention with RoPE; ``has_qk_norm`` adds Qwen3's per-head RMSNorm on q and k."""

    def __init__(self, config: ModelConfig, layer_id: int, has_qk_norm: bool = False) -> None:
        head_dim = config.head_dim
        self.qkv_proj = LinearQKVMerged(
            config.hidden_size, head_dim, config.num_qo_heads, config.num_kv_heads,
            has_bias=config.attention_bias,
        )
        self.q_norm = RMSNorm(head_dim, config.rms_norm_eps) if has_qk_norm else None
        self.k_norm = RMSNorm(head_dim, config.rms_norm_eps) if has_qk_norm else None
        self.attn = AttentionLayer(
            layer_id, config.num_qo_heads, config.num_kv_heads, head_dim,
            config.rotary_config, q_norm=self.q_norm, k_norm=self.k_norm,
        )
        self.o_proj = LinearOProj(config.num_qo_heads * head_dim, config.hidden_size, has_bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj.forward(self.attn.forward(self.qkv_proj.forward(x)))

    def forward_fused(self, residual: torch.Tensor, norm: RMSNorm) -> None:
        """Fused decode path (chapter 19): ``residual += attn(norm(residual))`` in place: norm
        and qkv in one kernel; q/k norms, RoPE, the KV store and the attention in the backend's
        ``forward_qkv`` (FlashInfer's, for one or two requests: the split-KV kernel and its
        merge); then o_proj and the residual add in one."""
        qkv = norm_linear(residual, norm.weight, norm.eps, self.qkv_proj.weight, self.qkv_proj.bias)
        linear_add_residual_(self.attn.forward_fused(qkv), self.o_proj.weight, residual, self.o_proj.bias)


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

    def forward_fused(self, residual: torch.Tensor) -> None:
        """Fused decode path (chapter 19): the same layer on the residual stream alone, in
        place: each sublayer adds its output into ``residual: [T, hidden]``, and each norm
        runs inside the GEMV that reads it."""
        self.self_attn.forward_fused(residual, self.input_layernorm)
        self.mlp.forward_fused(residual, self.post_attention_layernorm)


class DecoderModel(BaseOP):
    """Embedding, the layer stack and the final norm: ``ids: [T]`` -> hidden ``[T, hidden]``.

    ``make_mlp(config, layer_id)`` builds each layer's MLP (``CausalLM.make_mlp``)."""

    def __init__(
        self, config: ModelConfig, has_qk_norm: bool, make_mlp: Callable[[ModelConfig, int], BaseOP]
    ) -> None:
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = OPList(
            [DecoderLayer(config, i, has_qk_norm, make_mlp(config, i)) for i in range(config.num_layers)]
        )
        self.norm = RMSNormFused(config.hidden_size, config.rms_norm_eps)
        # the fused path adds each layer's full output into the residual: one rank, dense MLPs
        self._fusable = get_tp_info().size == 1 and all(isinstance(layer.mlp, GatedMLP) for layer in self.layers)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x, residual = self.forward_layers(input_ids)
        return self.norm.forward(x, residual)[0]

    def forward_layers(self, input_ids: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Everything but the final norm: ``(x, residual)`` for ``self.norm``. On the fused
        decode path ``residual`` is None and ``x`` is the residual stream itself, which
        ``CausalLM`` hands to the LM head's kernel with the norm (chapter 19)."""
        x, residual = self.embed_tokens.forward(input_ids), None
        fused = self._fusable and use_fused_decode(x) and get_global_ctx().attn_backend.accepts_stored_kv
        if fused:  # a batch of 1-2 tokens on CUDA: chapter 19
            for layer in self.layers:
                layer.forward_fused(x)  # x is the residual stream, updated in place
            return x, None
        for layer in self.layers:
            x, residual = layer.forward(x, residual)
        return x, residual


class CausalLM(BaseLLMModel):
    """A decoder stack plus LM head; subclasses only pick the switches."""

    has_qk_norm = False

    def __init__(self, config: ModelConfig) -> None:
        self.tie_word_embeddings = config.tie_word_embeddings
        self.model = DecoderModel(config, self.has_qk_norm, self.make_mlp)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)

    def make_mlp(self, config: ModelConfig, layer_id: int) -> BaseOP:
        """Layer ``layer_id``'s MLP: the dense SwiGLU (chapter 20's MoE model overrides this)."""
        return GatedMLP(config)

    def forward(self) -> torch.Tensor:
        x, residual = self.model.forward_layers(get_global_ctx().batch.input_ids)
        norm = self.model.norm
        if residual is None:  # the fused decode path: the final norm inside the LM head's kernel
            return self.lm_head.forward_with_norm(x, norm.weight, norm.eps)
        return self.lm_head.forward(norm.forward(x, residual)[0])
