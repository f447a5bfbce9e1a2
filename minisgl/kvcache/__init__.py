"""KV storage and prefix caches, chosen by name. Mirrors upstream ``minisgl.kvcache``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from minisgl.utils import Registry

from .base import (
    BaseCacheHandle,
    BaseKVCachePool,
    BasePrefixCache,
    InsertResult,
    MatchResult,
    SizeInfo,
)
from .mha_pool import MHAKVCache

if TYPE_CHECKING:
    from minisgl.models import ModelConfig

# name -> factory(device, page_size); each prefix cache's module registers its own
PREFIX_CACHES = Registry[Callable[[torch.device, int], BasePrefixCache]](
    "prefix cache", package=__name__
)


def create_prefix_cache(device: torch.device, type: str, page_size: int = 1) -> BasePrefixCache:
    """The prefix cache registered as ``type`` (``"naive"`` caches nothing).

    Raises:
        ValueError: for a name no module of this package registers.
    """
    return PREFIX_CACHES[type](device, page_size)


def create_kvcache_pool(
    model_config: ModelConfig,
    num_pages: int,
    page_size: int,
    device: torch.device,
    dtype: torch.dtype,
) -> MHAKVCache:
    return MHAKVCache(
        num_kv_heads=model_config.num_kv_heads,
        num_layers=model_config.num_layers,
        head_dim=model_config.head_dim,
        num_pages=num_pages,
        page_size=page_size,
        dtype=dtype,
        device=device,
    )


__all__ = [
    "BaseCacheHandle",
    "BaseKVCachePool",
    "BasePrefixCache",
    "InsertResult",
    "MHAKVCache",
    "MatchResult",
    "SizeInfo",
    "create_kvcache_pool",
    "create_prefix_cache",
]
