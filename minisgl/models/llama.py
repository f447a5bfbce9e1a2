"""Llama (and SmolLM2, which is a small Llama). Mirrors upstream ``minisgl.models.llama``."""

from .utils import CausalLM


class LlamaForCausalLM(CausalLM):
    """Llama 2/3 and look-alikes: no attention bias, no QK-norm."""
