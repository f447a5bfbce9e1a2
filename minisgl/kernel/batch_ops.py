"""Decode attention for a large batch: a pipelined program per (request, KV head), from q or
from the qkv GEMV's output. Triton's only (``triton.decode_batch``), with no reference at this
level: the attention backend that calls them runs only where Triton does, and the torch
attention backend is their reference.
"""

from __future__ import annotations

from typing import Any

import torch

from . import run


def decode_attention_batch(q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Attention of one query per request, ``q: [B, H_q, D]`` -> ``[B, H_q, D]``
    (``triton.decode_batch.decode_attention_batch`` gives the arguments)."""
    return run("decode_attention_batch", q, *args, **kwargs)


def decode_attention_batch_qkv(qkv: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The same from the qkv GEMV's output, with the q/k norms, RoPE and the KV store
    inside: ``qkv: [B, (H_q + 2 H_kv) D]`` -> ``[B, H_q, D]``
    (``triton.decode_batch.decode_attention_batch_qkv``)."""
    return run("decode_attention_batch_qkv", qkv, *args, **kwargs)
