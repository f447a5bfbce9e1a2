"""Qwen2: a Llama with biases on the q/k/v projections. Mirrors upstream ``minisgl.models.qwen2``."""

from .base import MODEL_REGISTRY
from .utils import CausalLM


@MODEL_REGISTRY.register("Qwen2ForCausalLM")
class Qwen2ForCausalLM(CausalLM):
    """The q/k/v bias comes from ``ModelConfig.attention_bias`` (always on for Qwen2)."""
