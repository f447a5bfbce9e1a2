"""Exercise 501's speed part: the mask on Qwen3's vocabulary at three batch sizes.

Qwen3's vocabulary is 151,936 tokens, a mask row 4,748 words (19 KB); the logits are
bfloat16 as the engine samples them on a GPU. A grammar allows few tokens at most steps, so
each mask allows about one in sixteen (the AND of four random words): the kernel stores
``-inf`` into most of the row. Each side of the timing (speed.py) gets its own tensors.
"""

from __future__ import annotations

import torch

VOCAB, DTYPE = 151936, torch.bfloat16
ROWS = {"1 row": 1, "16 rows": 16, "64 rows": 64}


def workloads() -> list:
    return list(ROWS)


def make(name: str, device) -> dict:
    """The logits and mask of one workload; the same bytes every time it is made."""
    rows = ROWS[name]
    g = torch.Generator().manual_seed(rows)
    words = (VOCAB + 31) // 32
    mask = torch.full((rows, words), -1, dtype=torch.int32)
    for _ in range(4):
        mask &= torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=g)
    logits = torch.randn(rows, VOCAB, generator=g).to(device, DTYPE)
    return {"logits": logits, "bitmask": mask.to(device)}


def call(module, case: dict) -> None:
    module.apply_token_bitmask_triton(case["logits"], case["bitmask"])


def output(case: dict) -> tuple:
    return (case["logits"],)
