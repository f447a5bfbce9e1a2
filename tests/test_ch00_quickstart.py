"""Chapter 0: the one-file engine in examples/ch00_tiny_engine.py agrees with transformers."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def _load_tiny_engine_module():
    path = ROOT / "examples" / "ch00_tiny_engine.py"
    spec = importlib.util.spec_from_file_location("ch00_tiny_engine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_engine_matches_transformers_greedy(smollm2_path: Path, hf_reference) -> None:
    ch00 = _load_tiny_engine_module()
    engine = ch00.TinyEngine(smollm2_path, max_seq_len=64)
    expected = hf_reference(smollm2_path, PROMPTS, 8)
    for prompt, want in zip(PROMPTS, expected):
        got, _ = engine.generate(engine.tokenizer(prompt).input_ids, 8)
        assert got == want, f"{prompt!r}: engine {got} != transformers {want}"
