"""Turning logits into next tokens: greedy, temperature, top-k and top-p.

``prepare`` builds the per-request parameter tensors while the batch is being assembled
(so the copies to the device overlap other work); ``sample`` runs after the forward pass.
A greedy-only batch skips everything but ``argmax``. On CUDA (with ``flashinfer``
installed) the random draw uses FlashInfer's sampling kernels, which filter top-k/top-p
by rejection sampling instead of sorting the vocabulary (chapter 17); the torch version
here runs everywhere and is the reference. Mirrors upstream ``minisgl.engine.sample``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minisgl.kernel import fi_ops, use_flashinfer
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
    if top_k is None and top_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        drop |= ranks >= top_k.unsqueeze(1)
    if top_p is not None:
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above
        drop |= mass_before >= top_p.unsqueeze(1)
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


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
        if use_flashinfer(logits):  # CUDA, an fp16/bf16 model, flashinfer installed
            sampled = fi_ops.sample(
                logits.float(), args.temperatures, args.top_k, args.top_p, self.generator
            )
        else:
            scaled = logits.float() / args.temperatures.unsqueeze(1)
            probs = top_k_top_p_filter(scaled, args.top_k, args.top_p).softmax(dim=-1)
            sampled = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        return torch.where(args.greedy, greedy_tokens, sampled)
