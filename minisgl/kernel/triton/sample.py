"""Temperature sampling in one pass over the logits: the Gumbel-max trick as a Triton kernel.

With ``G_i`` independent standard Gumbel noise (``-log(-log(U_i))``, ``U_i`` uniform), the
index of the largest ``x_i / T + G_i`` is token ``i`` with probability ``softmax(x / T)_i``:
a sample without a softmax. FlashInfer's path (``fi_ops.sample``) converts the bf16 logits
to float32, writes the probabilities and reads them again to draw; at 256 requests and
Qwen3's 151,936-token vocabulary that is about 0.7 GB of traffic and three kernels per step.
This kernel reads each bf16 logit once. A row is cut into *parts* of whole blocks of
``BLOCK`` logits, so that a batch of any size has up to about ``TARGET_PROGRAMS`` programs:
program ``(b, p)`` scans part ``p`` of row ``b``, adds noise from Philox (``tl.rand``, seeded
once per draw, counted by row and token) and keeps its best score; an ``argmax`` over the
parts' best scores picks the token. It serves a batch whose random rows set no top-k or
top-p (the offline benchmark's, and any batch whose requests set only a temperature); a
filtered draw stays on FlashInfer's rejection sampler.

The seed of each draw comes from the sampler's ``torch.Generator``, so a run with the same
seed draws the same tokens; they are not FlashInfer's tokens for that seed (another stream
of noise, the same distribution). ``MINISGL_DISABLE_SAMPLE_KERNEL=1`` keeps FlashInfer.
There is no upstream counterpart: upstream samples with FlashInfer.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from minisgl.kernel import speedups

from .. import HALF, Impl, register

BLOCK = 2048  # logits per loop iteration of a program (4 KiB of bf16)
TARGET_PROGRAMS = 1024  # enough programs in flight to stream the logits at the memory's speed


@triton.jit
def _gumbel_max_kernel(
    logits_ptr,
    temperatures_ptr,
    seed_ptr,
    best_score_ptr,
    best_token_ptr,
    row_stride,
    vocab_size,
    part_len,
    num_parts,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    seed = tl.load(seed_ptr)
    inv_temperature = 1.0 / tl.load(temperatures_ptr + row)
    row_ptr = logits_ptr + row.to(tl.int64) * row_stride
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_cols = tl.zeros([BLOCK], tl.int32)
    start = part * part_len
    for offset in range(0, part_len, BLOCK):
        cols = start + offset + tl.arange(0, BLOCK)
        mask = cols < vocab_size
        x = tl.load(row_ptr + cols, mask=mask, other=float("-inf")).to(tl.float32)
        u = tl.rand(seed, row * vocab_size + cols)  # one uniform per (row, token) and draw
        score = x * inv_temperature - tl.log(-tl.log(u))
        score = tl.where(mask, score, float("-inf"))
        better = score > best
        best = tl.where(better, score, best)
        best_cols = tl.where(better, cols, best_cols)
    score, lane = tl.max(best, axis=0, return_indices=True)
    # best_cols[lane]: a block cannot be indexed by a scalar, so sum the one lane that matches
    token = tl.sum(tl.where(tl.arange(0, BLOCK) == lane, best_cols, 0), axis=0)
    tl.store(best_score_ptr + row * num_parts + part, score)
    tl.store(best_token_ptr + row * num_parts + part, token)


def gumbel_sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    generator: torch.Generator,
) -> torch.Tensor:
    """One token per row from ``softmax(logits / temperatures)``: ``logits: [B, V]`` fp16 or
    bf16, ``temperatures: [B]`` float32 > 0 -> ``[B]`` int64. ``top_k`` and ``top_p`` must be
    None, and ``B * V`` below 2**31 (the noise's counter is an int32); ``generator`` (on the
    logits' device) seeds the draw.

    Raises:
        ValueError: when ``top_k`` or ``top_p`` is given, or ``B * V`` is too large.
    """
    if top_k is not None or top_p is not None:
        raise ValueError("gumbel_sample draws without top-k or top-p; filter with fi_ops.sample")
    batch, vocab = logits.shape
    if batch * vocab >= 2**31:
        raise ValueError(f"gumbel_sample takes B * V < 2**31 logits, got {batch} x {vocab}")
    num_parts = max(1, min(triton.cdiv(TARGET_PROGRAMS, batch), triton.cdiv(vocab, BLOCK)))
    part_len = triton.cdiv(triton.cdiv(vocab, num_parts), BLOCK) * BLOCK
    num_parts = triton.cdiv(vocab, part_len)  # parts rounded up to whole blocks: fewer may do
    device = logits.device
    # 62 bits: a draw's seed does not come back in any run a server lives through
    seed = torch.randint(0, 2**62, (1,), device=device, generator=generator)
    best_score = torch.empty(batch, num_parts, device=device, dtype=torch.float32)
    best_token = torch.empty(batch, num_parts, device=device, dtype=torch.int32)
    _gumbel_max_kernel[(batch, num_parts)](
        logits,
        temperatures.float(),
        seed,
        best_score,
        best_token,
        logits.stride(0),
        vocab,
        part_len,
        num_parts,
        BLOCK=BLOCK,
    )
    part = best_score.argmax(dim=1, keepdim=True)
    return best_token.gather(1, part).squeeze(1).long()


# ---- the kernel table's entry ---------------------------------------------------------------
def gumbel_fits(logits: torch.Tensor, temperatures, top_k, top_p, *_: Any) -> bool:
    """A draw with no top-k or top-p filter, from half-precision logits, unless the speed-up
    ``sample_kernel`` is off."""
    return (
        speedups.current().sample_kernel
        and logits.dtype in HALF
        and logits.dim() == 2
        and logits.stride(-1) == 1
        and top_k is None
        and top_p is None
        and logits.numel() < 2**31  # the noise's counter is an int32
    )


register("sample", Impl("triton", gumbel_sample, gumbel_fits))
