"""The sampler's ops: one token per row drawn from ``softmax(logits / T)``, cut to each row's
top-k and top-p; from a generator the batch shares (``sample``), or from each row's own seed
(``sample_seeded``). The torch references in ``torch_sampling`` serve every call; a faster
library registers its kernels for the same ops (``minisgl.kernel.register``).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import Impl, register, run, torch_sampling

register("sample", Impl("torch", torch_sampling.sample))
# a request with its own seed: the torch path everywhere, row by row
register("sample_seeded", Impl("torch", torch_sampling.sample_seeded))


def sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: Optional[torch.Tensor],
    top_p: Optional[torch.Tensor],
    generator: torch.Generator,
) -> torch.Tensor:
    """One token per row of ``logits: [B, V]`` from ``softmax(logits / temperatures)`` cut
    to each row's top-k and top-p -> ``[B]`` int64 (``torch_sampling.sample``)."""
    return run("sample", logits, temperatures, top_k, top_p, generator)


def sample_seeded(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: Optional[torch.Tensor],
    top_p: Optional[torch.Tensor],
    keys: list,
) -> torch.Tensor:
    """The same draw for rows with their own seeds: row ``r``'s randomness comes from
    ``keys[r]`` alone (``torch_sampling.sample_seeded``) -> ``[R]`` int64."""
    return run("sample_seeded", logits, temperatures, top_k, top_p, keys)
