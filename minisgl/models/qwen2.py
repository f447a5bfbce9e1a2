"""Qwen2: a Llama with biases on the q/k/v projections. Mirrors upstream ``minisgl.models.qwen2``."""

from .utils import CausalLM


class Qwen2ForCausalLM(CausalLM):
    """The q/k/v bias comes from ``ModelConfig.attention_bias`` (always on for Qwen2)."""
