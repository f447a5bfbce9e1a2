"""Reading a Hugging Face checkpoint folder: its config and its tokenizer.

Only local folders are accepted: the book never downloads from a hub at run time.
Mirrors upstream ``minisgl.utils.hf``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from transformers import (
    AutoConfig,
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)

_HOW_TO_GET = (
    "get the book's default model with `python -m tools.models smollm2` "
    "(it lands in models/SmolLM2-135M-Instruct), or pass the path of a local "
    "Hugging Face checkpoint folder"
)


def check_model_path(model_path: str | Path) -> Path:
    """Return ``model_path`` as a Path.

    Raises:
        FileNotFoundError: when the folder or its ``config.json`` is missing, saying how to
            get the default model.
    """
    path = Path(model_path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no model at {str(path)!r} (config.json not found): {_HOW_TO_GET}")
    return path


@functools.lru_cache(maxsize=8)
def cached_load_hf_config(model_path: str) -> PretrainedConfig:
    return AutoConfig.from_pretrained(check_model_path(model_path))


def load_tokenizer(model_path: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(check_model_path(model_path))


def load_eos_token_ids(model_path: str, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The ids that end a generation.

    A chat model's generation config names its end-of-turn token(s) (SmolLM2: ``<|im_end|>``;
    Qwen3: two ids), which is what ``transformers.generate`` stops on; without one, the
    tokenizer's ``eos_token_id``.
    """
    path = check_model_path(model_path)
    ids: set[int] = set()
    if (path / "generation_config.json").is_file():
        eos = GenerationConfig.from_pretrained(path).eos_token_id
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if not ids and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
