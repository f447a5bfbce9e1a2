"""The reference sampler, in plain torch: temperature, top-k, top-p, then one draw per row.

The engine's ``Sampler`` calls the kernel ops ``sample`` and ``sample_seeded``
(``kernel/sampling.py``); this module is their implementation everywhere, and the reference
any faster kernel for them is tested against. Mirrors upstream ``minisgl.engine.sample``
(whose torch path sorts the vocabulary the same way).
"""

from __future__ import annotations

import torch


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


def sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    generator: torch.Generator,
) -> torch.Tensor:
    """One token per row: ``logits: [B, V]``, ``temperatures: [B]`` > 0, ``top_k: [B]`` int
    (V = off) or None, ``top_p: [B]`` in (0, 1] or None -> ``[B]`` int64.

    The float32 logits are divided by each row's temperature, cut by ``top_k_top_p_filter``
    and turned into probabilities; ``torch.multinomial`` draws with ``generator``, so a run
    with the same seed draws the same tokens.
    """
    scaled = logits.float() / temperatures.unsqueeze(1)
    probs = top_k_top_p_filter(scaled, top_k, top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


MASK64 = (1 << 64) - 1


def seed_key(seed: int, position: int) -> int:
    """A 64-bit generator seed for the draw of request seed ``seed`` at sequence position
    ``position``: splitmix64 of the pair, so nearby seeds and positions give unrelated streams."""
    x = ((seed & MASK64) * 0x9E3779B97F4A7C15 + position + 1) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def sample_seeded(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    keys: list[int],
) -> torch.Tensor:
    """One token per row, each row's randomness its own: ``logits: [R, V]``, the filters as in
    ``sample``, ``keys``: R generator seeds (``seed_key``) -> ``[R]`` int64.

    The exponential race: with ``E_i ~ Exp(1)`` independent, ``argmax_i p_i / E_i`` is token
    ``i`` with probability ``p_i`` (the Gumbel-max trick in another guise). Row ``r``'s noise
    comes from a generator seeded with ``keys[r]`` alone, so its token depends on its own
    probabilities and key, never on which rows share the batch or where it sits in it.
    """
    scaled = logits.float() / temperatures.unsqueeze(1)
    probs = top_k_top_p_filter(scaled, top_k, top_p).softmax(dim=-1)
    noise = torch.empty_like(probs)
    generator = torch.Generator(device=probs.device)
    for row, key in enumerate(keys):
        generator.manual_seed(key)
        noise[row].exponential_(generator=generator)
    # a draw of exactly 0 would make 0 / 0 = NaN, which argmax takes for the largest
    return (probs / noise.clamp_min_(torch.finfo(torch.float32).tiny)).argmax(dim=-1)
