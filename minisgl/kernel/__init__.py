"""Kernels: torch references here; on CUDA, FlashInfer and custom kernels (chapters 17, 19)."""

from .torch_ops import (
    apply_rotary,
    embedding_gather,
    fused_add_rms_norm,
    rms_norm,
    silu_and_mul,
    store_cache,
)

__all__ = [
    "apply_rotary",
    "embedding_gather",
    "fused_add_rms_norm",
    "rms_norm",
    "silu_and_mul",
    "store_cache",
]
