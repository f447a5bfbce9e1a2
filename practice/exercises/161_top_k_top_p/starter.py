"""Turning logits into next tokens: greedy, temperature, top-k and top-p.

``prepare`` builds the per-request parameter tensors while the batch is being assembled
(so the copies to the device overlap other work); ``sample`` runs after the forward pass.
A greedy-only batch skips everything but ``argmax``. Mirrors upstream
``minisgl.engine.sample`` (which calls FlashInfer's sampling kernels on CUDA; this torch
version runs everywhere and is the reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minisgl.utils.device import pin

if TYPE_CHECKING:
    from minisgl.core import Batch


@dataclass
class BatchSamplingArgs:
    """``None`` temperatures means the whole batch is greedy. Otherwise ``[B]`` tensors;
    ``greedy`` marks the rows that take the argmax in a mixed batch."""

    temperatures: torch.Tensor | None
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    greedy: torch.Tensor | None = None


def _to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, pin_memory=pin(device)).to(device, non_blocking=True)


def top_k_top_p_filter(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Set to ``-inf`` the logits outside each row's top-k and outside its top-p nucleus.

    ``logits: [B, V]`` float32; ``top_k: [B]`` int (V means off); ``top_p: [B]`` float in
    (0, 1]. The nucleus is the smallest set of most likely tokens whose probability
    reaches ``top_p``; the most likely token is always kept.
    """
    raise NotImplementedError("Exercise 161: implement top_k_top_p_filter")


class Sampler:
    def __init__(self, device: torch.device, vocab_size: int, seed: int = 42) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def prepare(self, batch: Batch) -> BatchSamplingArgs:
        params = [r.sampling_params for r in batch.reqs]
        if all(p.is_greedy for p in params):
            return BatchSamplingArgs(temperatures=None)
        temps = [1.0 if p.is_greedy else p.temperature for p in params]
        top_ks = [p.top_k if p.top_k >= 1 else self.vocab_size for p in params]
        top_ps = [p.top_p for p in params]
        return BatchSamplingArgs(
            temperatures=_to_device(temps, torch.float32, self.device),
            top_k=_to_device(top_ks, torch.int64, self.device)
            if min(top_ks) < self.vocab_size
            else None,
            top_p=_to_device(top_ps, torch.float32, self.device) if min(top_ps) < 1.0 else None,
            greedy=_to_device([p.is_greedy for p in params], torch.bool, self.device),
        )

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """``logits: [B, V]`` -> token ids ``[B]`` int64."""
        raise NotImplementedError("Exercise 161: implement Sampler.sample")
