"""Model classes chosen by the checkpoint's ``architectures`` field.

Mirrors upstream ``minisgl.models.register``: one registry line per architecture.
"""

from __future__ import annotations

from typing import Callable

from minisgl.utils import Registry

from .base import BaseLLMModel
from .config import ModelConfig, RotaryConfig
from .llama import LlamaForCausalLM
from .qwen2 import Qwen2ForCausalLM
from .qwen3 import Qwen3ForCausalLM
from .weight import load_weight

MODEL_REGISTRY = Registry[Callable[[ModelConfig], BaseLLMModel]]("model architecture")
MODEL_REGISTRY.register("LlamaForCausalLM")(LlamaForCausalLM)
MODEL_REGISTRY.register("MistralForCausalLM")(LlamaForCausalLM)  # same blocks as Llama
MODEL_REGISTRY.register("Qwen2ForCausalLM")(Qwen2ForCausalLM)
MODEL_REGISTRY.register("Qwen3ForCausalLM")(Qwen3ForCausalLM)


@MODEL_REGISTRY.register("Qwen3MoeForCausalLM")
def _qwen3_moe(config: ModelConfig) -> BaseLLMModel:
    from .qwen3_moe import Qwen3MoeForCausalLM  # chapter 21: imported only when asked for

    return Qwen3MoeForCausalLM(config)


def create_model(config: ModelConfig) -> BaseLLMModel:
    """Build the (unloaded) model for ``config.architectures[0]``.

    Raises:
        ValueError: for an architecture the book does not implement.
    """
    return MODEL_REGISTRY[config.architectures[0]](config)


__all__ = [
    "BaseLLMModel",
    "ModelConfig",
    "RotaryConfig",
    "create_model",
    "load_weight",
    "MODEL_REGISTRY",
]
