"""Attention backends chosen by name: ``torch`` everywhere; ``fi`` (FlashInfer) on CUDA;
``split_kv`` (chapter 19) for decode batches of up to four requests and of 64 or more, over
either.

``"prefill_name,decode_name"`` builds a ``HybridBackend`` (``"fi,torch"``, ``"torch,fi"``).
A backend module is imported only when its name is asked for, so the CPU never imports
``flashinfer``. Mirrors upstream ``minisgl.attention``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from minisgl.core import get_global_ctx
from minisgl.distributed import get_tp_info
from minisgl.utils import Registry, div_even

from .base import BaseAttnBackend, BaseAttnMetadata, HybridBackend

if TYPE_CHECKING:
    from minisgl.models import ModelConfig

ATTENTION_BACKENDS = Registry[Callable[["ModelConfig"], BaseAttnBackend]]("attention backend")


@ATTENTION_BACKENDS.register("torch")
def _torch_backend(config: ModelConfig) -> BaseAttnBackend:
    from .torch_backend import TorchAttnBackend

    tp = get_tp_info().size
    return TorchAttnBackend(
        div_even(config.num_qo_heads, tp),
        div_even(config.num_kv_heads, tp, allow_replicate=True),
        config.head_dim,
    )


@ATTENTION_BACKENDS.register("fi")
def _flashinfer_backend(config: ModelConfig) -> BaseAttnBackend:
    from .fi import FlashInferBackend  # chapter 17

    tp, ctx = get_tp_info().size, get_global_ctx()
    return FlashInferBackend(
        div_even(config.num_qo_heads, tp),
        div_even(config.num_kv_heads, tp, allow_replicate=True),
        config.head_dim,
        ctx.kv_cache,  # type: ignore[arg-type]
        ctx.page_size,
    )


@ATTENTION_BACKENDS.register("split_kv")
def _split_kv_backend(config: ModelConfig) -> BaseAttnBackend:
    """Chapter 19: decode batches of up to four requests on the split-KV kernel, of 64 or more
    on the batch kernel; every other batch on FlashInfer (an fp16/bf16 pool on CUDA) or the
    torch backend."""
    from .split_kv import SplitKVBackend

    pool = get_global_ctx().kv_cache
    on_flashinfer = pool.device.type == "cuda" and pool.dtype in (torch.float16, torch.bfloat16)
    fallback = (_flashinfer_backend if on_flashinfer else _torch_backend)(config)
    tp = get_tp_info().size
    return SplitKVBackend(
        fallback,
        div_even(config.num_qo_heads, tp),
        div_even(config.num_kv_heads, tp, allow_replicate=True),
        config.head_dim,
    )


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
    return ATTENTION_BACKENDS[name](config)


__all__ = [
    "ATTENTION_BACKENDS",
    "BaseAttnBackend",
    "BaseAttnMetadata",
    "HybridBackend",
    "create_attention_backend",
]
