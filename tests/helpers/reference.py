"""The oracle: float32 greedy tokens from ``transformers``, memoized for the whole session."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, List, Sequence, Tuple, Union

from .models import ensure_model

Prompt = Union[str, Sequence[int]]


@functools.lru_cache(maxsize=None)
def hf_model(model_path: Path) -> Any:
    """The float32 ``transformers`` model at ``model_path``, loaded once per session."""
    import torch
    from transformers import AutoModelForCausalLM

    ensure_model(Path(model_path))
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()


@functools.lru_cache(maxsize=None)
def hf_tokenizer(model_path: Path) -> Any:
    from transformers import AutoTokenizer

    ensure_model(Path(model_path))
    return AutoTokenizer.from_pretrained(model_path)


def hf_encode(model_path: Path, prompt: Prompt) -> List[int]:
    """Token ids of ``prompt`` as the reference sees them (a list of ids passes through)."""
    if isinstance(prompt, str):
        return list(hf_tokenizer(Path(model_path).resolve())(prompt).input_ids)
    return [int(t) for t in prompt]


@functools.lru_cache(maxsize=None)
def _hf_greedy_one(
    model_path: Path, prompt_ids: Tuple[int, ...], max_new_tokens: int
) -> Tuple[int, ...]:
    import torch

    model = hf_model(model_path)
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            # EOS must not end the reference early: the engine under test is asked for
            # exactly max_new_tokens too (ignore_eos), so both sides stay comparable.
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=model.generation_config.pad_token_id,
        )
    return tuple(out[0, len(prompt_ids) :].tolist())


def hf_greedy(model_path: Path, prompts: Sequence[Prompt], max_new_tokens: int) -> List[List[int]]:
    """Greedy continuations from ``transformers`` in float32: ``[B][max_new_tokens]`` token ids.

    Each prompt (a string, or a list of token ids) is generated on its own, so no padding
    enters the reference. Results and the loaded model are memoized for the session, so
    several tests asking for the same prompt pay once. Only the new tokens are returned.
    """
    path = Path(model_path).resolve()
    return [list(_hf_greedy_one(path, tuple(hf_encode(path, p)), max_new_tokens)) for p in prompts]
