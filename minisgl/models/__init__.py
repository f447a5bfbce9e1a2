"""Model classes chosen by the checkpoint's ``architectures`` field.

Each model module registers its architectures in ``MODEL_REGISTRY`` (``models/base.py``),
which finds them among this package's modules. Mirrors upstream ``minisgl.models.register``:
one registry line per architecture.
"""

from __future__ import annotations

from .base import MODEL_REGISTRY, BaseLLMModel
from .config import ModelConfig, RotaryConfig
from .weight import load_weight


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
