"""Qwen3: a Llama with RMSNorm on each query and key head. Mirrors upstream ``minisgl.models.qwen3``."""

from .utils import CausalLM


class Qwen3ForCausalLM(CausalLM):
    """QK-norm keeps attention logits in range without a bias (Qwen3 drops Qwen2's)."""

    has_qk_norm = True
