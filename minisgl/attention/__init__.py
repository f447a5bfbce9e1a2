"""Attention backends chosen by name: ``torch`` everywhere, and whatever else registers.

Each backend's module registers it in ``ATTENTION_BACKENDS`` (``register_backend``) with a
rank and a test of which engines it serves; ``"auto"`` takes the lowest-ranked backend that
serves the engine's device and dtype, so a faster backend only has to register. The registry
finds the backends among this package's modules the first time it is asked, and a backend
imports its kernel library only when it is built, so the CPU never imports a GPU library.
``"prefill_name,decode_name"`` builds a ``HybridBackend`` (``"torch,torch"`` is one torch
backend). Mirrors upstream ``minisgl.attention``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Tuple

import torch

from minisgl.distributed import get_tp_info
from minisgl.utils import Registry, div_even

from .base import BaseAttnBackend, BaseAttnMetadata, HybridBackend

if TYPE_CHECKING:
    from minisgl.models import ModelConfig


@dataclass(frozen=True)
class BackendSpec:
    """A registered backend: ``build(config)`` makes it; ``"auto"`` tries backends in
    increasing ``rank`` and takes the first whose ``serves(device, dtype)`` is true."""

    build: Callable[[ModelConfig], BaseAttnBackend]
    rank: int
    serves: Callable[[torch.device, torch.dtype], bool]


ATTENTION_BACKENDS = Registry[BackendSpec]("attention backend", package=__name__)


def register_backend(
    name: str, rank: int, serves: Callable[[torch.device, torch.dtype], bool]
) -> Callable[[Callable[[ModelConfig], BaseAttnBackend]], Callable[..., BaseAttnBackend]]:
    """Decorate a backend's ``build(config)`` to register it as ``name``."""

    def decorator(
        build: Callable[[ModelConfig], BaseAttnBackend],
    ) -> Callable[..., BaseAttnBackend]:
        ATTENTION_BACKENDS.register(name)(BackendSpec(build, rank, serves))
        return build

    return decorator


def local_heads(config: ModelConfig) -> Tuple[int, int]:
    """This rank's query and KV heads (KV heads replicated when there are fewer than ranks)."""
    tp = get_tp_info().size
    return div_even(config.num_qo_heads, tp), div_even(
        config.num_kv_heads, tp, allow_replicate=True
    )


def resolve_attention_backend(name: str, device: torch.device, dtype: torch.dtype) -> str:
    """``name``, or for ``"auto"`` the lowest-ranked backend that serves ``device`` and
    ``dtype`` (``torch`` serves every engine)."""
    if name != "auto":
        return name
    specs = sorted(ATTENTION_BACKENDS.items().items(), key=lambda item: item[1].rank)
    return next(n for n, spec in specs if spec.serves(device, dtype))


def create_attention_backend(name: str, config: ModelConfig) -> BaseAttnBackend:
    """Build backend ``name`` (or a ``"prefill,decode"`` pair).

    Raises:
        ValueError: for an unknown name or more than one comma.
    """
    if "," in name:
        parts = name.split(",")
        if len(parts) != 2:
            raise ValueError(f"a hybrid backend is 'prefill,decode', got {name!r}")
        if parts[0] != parts[1]:
            return HybridBackend(*(create_attention_backend(p, config) for p in parts))
        name = parts[0]
    return ATTENTION_BACKENDS[name].build(config)


__all__ = [
    "ATTENTION_BACKENDS",
    "BackendSpec",
    "BaseAttnBackend",
    "BaseAttnMetadata",
    "HybridBackend",
    "create_attention_backend",
    "local_heads",
    "register_backend",
    "resolve_attention_backend",
]
