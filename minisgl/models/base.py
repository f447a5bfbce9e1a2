"""What every model class provides to the engine. Mirrors upstream ``minisgl.models.base``."""

from __future__ import annotations

from typing import Callable

import torch

from minisgl.layers import BaseOP
from minisgl.layers.base import StateDict
from minisgl.utils import Registry


class BaseLLMModel(BaseOP):
    """A causal LM: ``forward()`` reads the current batch from the global context and
    returns logits ``[B, V]`` (one row per request: the next-token distribution)."""

    tie_word_embeddings: bool = False

    def forward(self) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement forward")

    def load_state_dict(
        self, state_dict: StateDict, *, prefix: str = "", _root: bool = True
    ) -> None:
        # A tied LM head reuses the embedding table; checkpoints usually omit lm_head.weight.
        if self.tie_word_embeddings:
            state_dict["lm_head.weight"] = state_dict["model.embed_tokens.weight"]
        super().load_state_dict(state_dict, prefix=prefix, _root=_root)


# A checkpoint's ``architectures[0]`` -> its model class: each model module registers its
# classes, and the registry imports this package's modules the first time it is asked.
MODEL_REGISTRY = Registry[Callable[..., BaseLLMModel]]("model architecture", package=__package__)
