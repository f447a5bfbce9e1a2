"""Llama (and SmolLM2, which is a small Llama). Mirrors upstream ``minisgl.models.llama``."""

from .base import MODEL_REGISTRY
from .utils import CausalLM


@MODEL_REGISTRY.register("MistralForCausalLM")  # the same blocks as Llama
@MODEL_REGISTRY.register("LlamaForCausalLM")
class LlamaForCausalLM(CausalLM):
    """Llama 2/3 and look-alikes: no attention bias, no QK-norm."""
