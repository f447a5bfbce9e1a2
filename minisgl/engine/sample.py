"""Turning logits into next tokens: greedy, temperature, top-k and top-p.

``prepare`` builds the per-request parameter tensors while the batch is being assembled
(so the copies to the device overlap other work); ``sample`` runs after the forward pass.
A greedy-only batch skips everything but ``argmax``; otherwise the random draw is the
kernel op ``sample``: the torch reference (``kernel/torch_sampling.py``) everywhere, and on
CUDA with ``flashinfer`` installed FlashInfer's sampling kernels, which filter top-k/top-p
by rejection sampling instead of sorting the vocabulary (chapter 17). Mirrors upstream
``minisgl.engine.sample``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minisgl.kernel import sample as sample_tokens
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
        greedy_tokens = logits.argmax(dim=-1)
        if args.temperatures is None:
            return greedy_tokens
        sampled = sample_tokens(logits, args.temperatures, args.top_k, args.top_p, self.generator)
        return torch.where(args.greedy, greedy_tokens, sampled)
