"""The grammar's op: a packed token bitmask applied to a batch of logits, in place.

Bit ``j % 32`` of word ``j // 32`` of a row's mask says whether token ``j`` is allowed; a
token whose bit is 0 gets the logit ``-inf``, so no sampler (greedy, temperature, top-k,
top-p) can pick it. The torch reference here serves every call; the Triton kernel
(``triton/bitmask.py``) registers itself for the same op where it runs.
"""

from __future__ import annotations

import torch

from . import Impl, register, run


def apply_token_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """``logits: [B, V]`` float, ``bitmask: [B, ceil(V / 32)]`` int32 on the same device:
    every token whose bit is 0 gets ``-inf``, in place."""
    bits = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).flatten(1)[:, : logits.shape[1]]
    logits.masked_fill_(allowed == 0, float("-inf"))


register("apply_token_bitmask", Impl("torch", apply_token_bitmask_reference))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Mask ``logits: [B, V]`` in place with ``bitmask: [B, ceil(V / 32)]`` int32 (a word of
    all ones leaves a row untouched). Mirrors llguidance's and xgrammar's
    ``apply_token_bitmask_inplace``.

    Raises:
        ValueError: when the shapes do not match.
    """
    B, V = logits.shape
    if bitmask.shape != (B, (V + 31) // 32) or bitmask.dtype != torch.int32:
        raise ValueError(
            f"bitmask must be [{B}, {(V + 31) // 32}] int32 for logits [{B}, {V}], "
            f"got {list(bitmask.shape)} {bitmask.dtype}"
        )
    run("apply_token_bitmask", logits, bitmask)
