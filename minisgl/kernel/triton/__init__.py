"""The book's Triton kernels, one module per kernel family.

* ``store``: the KV store and the embedding gather (rows moved, nothing computed);
* ``gemv``: a small-batch matrix-vector product with split-K;
* ``fused``: the layer's GEMVs of a decode step, with the norm, SwiGLU and residual add fused in;
* ``lm_head``: the final norm and the LM head in one persistent kernel;
* ``decode``: split-KV decode attention for a few requests;
* ``pdl``, ``timeline``, ``checks``: what the kernels share (programmatic dependent launch,
  per-program timestamps, the host-side checks of their operands).

Nothing here is called directly by the engine: this package registers Triton as a library
of the kernel table (``minisgl.kernel``), which runs it where Triton runs (CUDA, or the CPU
under ``TRITON_INTERPRET=1``), and each module registers its kernels when imported. Importing
this package imports no Triton; the table imports its modules only where Triton runs.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil

import torch

from minisgl.env import ENV

from .. import Library, Where, register_library


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether ``import triton`` works (checked once)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def runs_on(where: Where) -> bool:
    """CUDA, or the CPU under ``TRITON_INTERPRET=1`` (how the CPU tests run the kernels),
    where ``triton`` imports, unless ``MINISGL_TORCH_KERNELS`` keeps the torch references."""
    if where is None:
        return False
    is_cuda = where.is_cuda if isinstance(where, torch.Tensor) else where.type == "cuda"
    on_device = is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    return on_device and triton_available() and not ENV.TORCH_KERNELS


def load() -> None:
    """Import every kernel module of this package: each registers its kernels."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


register_library(Library("triton", 10, runs_on, load))
