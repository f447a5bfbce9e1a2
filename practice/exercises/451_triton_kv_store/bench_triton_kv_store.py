"""Exercise 451's speed part: the KV store at the two sizes a Qwen3-0.6B server stores.

A decode step of 256 requests stores 256 tokens; a prefill chunk stores 4,096. Qwen3-0.6B
has 16 query heads and 8 KV heads of 128 dims in bf16, so k and v are strided views of a
fused qkv output of ``(16 + 2 * 8) * 128`` columns, as the model hands them to the store,
and every token writes 2 KiB of K and 2 KiB of V into a paged pool at scattered slots.
Each side of the timing (speed.py) gets a pool of its own, 256 MiB of K and V, larger than
any GPU's L2, and the judge flushes L2 before every call anyway.
"""

from __future__ import annotations

import torch

Q_HEADS, KV_HEADS, HEAD_DIM, DTYPE = 16, 8, 128, torch.bfloat16
SLOTS = 65536  # 65,536 token slots x 2 KiB x (K and V) = 256 MiB per side
TOKENS = {"decode: 256 tokens": 256, "prefill: a 4,096-token chunk": 4096}


def workloads() -> list:
    return list(TOKENS)


def make(name: str, device) -> dict:
    """The inputs and the pool of one workload; the same bytes every time it is made."""
    tokens = TOKENS[name]
    g = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=g).to(device, DTYPE)
    q_cols, kv_cols = Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    k = qkv[:, q_cols : q_cols + kv_cols].view(tokens, KV_HEADS, HEAD_DIM)
    v = qkv[:, q_cols + kv_cols :].view(tokens, KV_HEADS, HEAD_DIM)
    loc = torch.randperm(SLOTS, generator=g)[:tokens].to(device, torch.int32)
    caches = [torch.zeros(SLOTS, KV_HEADS, HEAD_DIM, dtype=DTYPE, device=device) for _ in range(2)]
    return {"k_cache": caches[0], "v_cache": caches[1], "loc": loc, "k": k, "v": v, "qkv": qkv}


def call(module, case: dict) -> None:
    module.store_cache(case["k_cache"], case["v_cache"], case["loc"], case["k"], case["v"])


def output(case: dict) -> tuple:
    return case["k_cache"], case["v_cache"]
