"""MoE backends chosen by name: ``torch`` (the reference loop) everywhere, ``fused`` (Triton).

``"auto"`` picks ``fused`` where the kernel table runs Triton (CUDA, with ``triton``
importable and ``MINISGL_TORCH_KERNELS`` not set), ``torch`` otherwise. Like the attention backends, each backend module is imported
only when its name is asked for. Mirrors upstream ``minisgl.moe`` (whose only backend is
``fused``).
"""

from __future__ import annotations

from typing import Callable

import torch

from minisgl.utils import Registry

from .base import BaseMoeBackend

MOE_BACKENDS = Registry[Callable[[], BaseMoeBackend]]("MoE backend")


@MOE_BACKENDS.register("torch")
def _torch_moe() -> BaseMoeBackend:
    from .torch_backend import TorchMoe

    return TorchMoe()


@MOE_BACKENDS.register("fused")
def _fused_moe() -> BaseMoeBackend:
    from .fused import FusedMoe

    return FusedMoe()


def resolve_moe_backend(name: str, device: torch.device) -> str:
    """``name``, or for ``"auto"`` the backend this device should use."""
    if name != "auto":
        return name
    from minisgl.kernel import serves

    return "fused" if device.type == "cuda" and serves("triton", device) else "torch"


def create_moe_backend(name: str, device: torch.device) -> BaseMoeBackend:
    """Build backend ``name`` (``"auto"`` resolved for ``device``).

    Raises:
        ValueError: for an unknown name.
    """
    return MOE_BACKENDS[resolve_moe_backend(name, device)]()


__all__ = ["BaseMoeBackend", "MOE_BACKENDS", "create_moe_backend", "resolve_moe_backend"]
