"""The offline workload, and the small helpers every benchmark shares (timing, tables).

``nano_vllm_workload`` is the request set of nano-vllm's ``bench.py``, which upstream
mini-sglang copied so the two engines can be compared on equal terms: with
``random.seed(0)``, 256 prompts of ``randint(100, 1024)`` random token ids in
``[0, 10000]``, then 256 output lengths ``randint(100, 1024)``, sampled at temperature 0.6
with EOS ignored. The draws must happen in exactly that order (all prompts first, then
all lengths); that is what makes the total 133,966 output tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List, Tuple

from minisgl.core import SamplingParams

NANO_VLLM_OUTPUT_TOKENS = 133_966  # sum of max_tokens of the default workload


@dataclass(frozen=True)
class OfflineWorkload:
    """``prompts[i]`` token ids, ``max_tokens[i]`` output tokens to generate (EOS ignored)."""

    prompts: List[List[int]]
    max_tokens: List[int]
    temperature: float = 0.6

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def input_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.max_tokens)

    def sampling_params(self) -> List[SamplingParams]:
        return [
            SamplingParams(temperature=self.temperature, ignore_eos=True, max_tokens=n)
            for n in self.max_tokens
        ]


def nano_vllm_workload(
    num_seqs: int = 256,
    input_len: Tuple[int, int] = (100, 1024),
    output_len: Tuple[int, int] = (100, 1024),
    seed: int = 0,
) -> OfflineWorkload:
    """nano-vllm's benchmark requests (see the module docstring); deterministic for a seed.

    ``input_len`` and ``output_len`` are inclusive ``(min, max)`` lengths in tokens; smaller
    values give a quick smoke run of the same shape.

    Raises:
        ValueError: for a length range with ``min < 1`` or ``min > max``.
    """
    for lo, hi in (input_len, output_len):
        if not 1 <= lo <= hi:
            raise ValueError(f"a length range must satisfy 1 <= min <= max, got ({lo}, {hi})")
    rng = random.Random(seed)  # the same stream as random.seed(seed) on the module functions
    prompts = [
        [rng.randint(0, 10000) for _ in range(rng.randint(*input_len))] for _ in range(num_seqs)
    ]
    max_tokens = [rng.randint(*output_len) for _ in range(num_seqs)]
    return OfflineWorkload(prompts, max_tokens)


def gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"
