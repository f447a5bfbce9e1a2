"""What the chapter tests share, imported as ``from tests.helpers import ...``.

``models``: where the models live and how a missing one is built; ``reference``: the
``transformers`` oracle. ``tests/conftest.py`` turns them into fixtures and adds the ``gpu``
marker.
"""

from .models import (
    DEVICE,
    MODELS,
    QWEN2,
    QWEN3,
    QWEN3_TOKENIZER,
    ROOT,
    SMOLLM2,
    ensure_model,
)
from .reference import Prompt, hf_encode, hf_greedy, hf_model, hf_tokenizer

__all__ = [
    "DEVICE",
    "MODELS",
    "QWEN2",
    "QWEN3",
    "QWEN3_TOKENIZER",
    "ROOT",
    "SMOLLM2",
    "Prompt",
    "ensure_model",
    "hf_encode",
    "hf_greedy",
    "hf_model",
    "hf_tokenizer",
]
