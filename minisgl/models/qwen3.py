"""Qwen3: a Llama with RMSNorm on each query and key head. Mirrors upstream ``minisgl.models.qwen3``."""

from .base import MODEL_REGISTRY
from .utils import CausalLM


@MODEL_REGISTRY.register("Qwen3ForCausalLM")
class Qwen3ForCausalLM(CausalLM):
    """QK-norm keeps attention logits in range without a bias (Qwen3 drops Qwen2's)."""

    has_qk_norm = True
