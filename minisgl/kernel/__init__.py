"""Kernels, chosen per call: one table of ops, one rule.

Every layer, attention backend, MoE backend and the sampler call the ops below, never a
kernel library directly. ``OPS`` lists each op's implementations, fastest first, and a call
runs the first one that

1. is in this tree: a chapter's step tree (``python -m tools.steps``) lacks the modules that later
   chapters add, and their ops then keep an earlier implementation;
2. runs where the call's *main input* lives (its first floating-point tensor): torch
   everywhere; FlashInfer (``fi_ops``, chapter 17) and Triton (``triton/``, chapters 19 and
   21) on CUDA, when they import and ``MINISGL_TORCH_KERNELS`` is not set; Triton also on the
   CPU under ``TRITON_INTERPRET=1``, which is how the CPU tests run its kernels;
3. is not switched off by its ``ENV`` switch (``MINISGL_DISABLE_GEMV``,
   ``MINISGL_DISABLE_LM_HEAD_KERNEL``, ``MINISGL_DISABLE_SAMPLE_KERNEL``: for measuring what
   a kernel saves); and
4. takes the call's arguments (its ``accepts`` check on dtypes, shapes and strides).

The torch references come last and take every call: ``torch_ops`` for the model's ops
(chapter 2), ``torch_sampling`` (chapter 6), ``torch_fused`` for the fused decode path's ops
(chapter 19). The decode attentions (split-KV and batch, from q and from qkv) and the MoE
grouped GEMM have no reference at this level (their backends are chosen only where Triton
runs, and the torch attention and MoE backends are their references), and raise
``RuntimeError`` where no kernel takes a call. The choice costs a few attribute reads per call; inside a CUDA graph it is made once,
at capture. ``library_for(op, ...)`` says which library a call would use.

Mirrors upstream ``minisgl.kernel`` (which has no choice to make: upstream is CUDA only,
calls FlashInfer from its layers, and has neither a GEMV nor fused decode kernels).
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch

HALF = (torch.float16, torch.bfloat16)  # what FlashInfer's kernels and the GEMV take
# The Triton GEMV serves at most this many rows, and only weights with K >= N (o_proj,
# down_proj): where N > K, and from a few rows on, cuBLAS streams the weight as fast
# (chapter 19 measures it).
GEMV_MAX_M = 2


@dataclass(frozen=True)
class Impl:
    """One implementation of an op: ``function`` in ``minisgl.kernel.<module>``, run by
    ``library`` ("triton", "flashinfer" or "torch") when ``accepts(*args, **kwargs)`` (None:
    every call) and the ``ENV`` attribute named by ``switch`` (if any) is not set."""

    library: str
    module: str
    function: str
    accepts: Optional[Callable[..., bool]] = None
    switch: Optional[str] = None


def _fi_rms_norm(x: torch.Tensor, *_: Any) -> bool:
    return x.dtype in HALF and x.dim() in (2, 3) and x.stride(-1) == 1


def _fi_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, *_: Any) -> bool:
    return x.dtype in HALF and x.dim() == 2 and x.is_contiguous() and residual.is_contiguous()


def _fi_silu_and_mul(x: torch.Tensor) -> bool:
    return x.dtype in HALF and x.is_contiguous() and (x.shape[-1] * x.element_size()) % 16 == 0


def _fi_rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, table: torch.Tensor):
    return (
        q.dtype in HALF
        and q.stride(-1) == 1
        and k.stride(-1) == 1
        and table.dtype == torch.float32
        and table.shape[-1] == q.shape[-1]
    )


def _fi_sample(logits: torch.Tensor, *_: Any) -> bool:
    return logits.dtype in HALF  # a float32 model keeps the torch sampler, run for run


def _gumbel_fits(logits: torch.Tensor, temperatures, top_k, top_p, *_: Any) -> bool:
    return (
        logits.dtype in HALF
        and logits.dim() == 2
        and logits.stride(-1) == 1
        and top_k is None
        and top_p is None
        and logits.numel() < 2**31  # the noise's counter is an int32
    )


def _gemv_fits(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
    return (
        x.dim() == 2
        and weight.dim() == 2
        and 0 < x.shape[0] <= GEMV_MAX_M
        and weight.shape[1] >= weight.shape[0]
        and x.dtype in HALF
        and weight.dtype == x.dtype
        and x.is_contiguous()
        and weight.stride(-1) == 1
        and (bias is None or (bias.dtype == x.dtype and bias.is_contiguous()))
    )


def _lm_head_fits(x: torch.Tensor, *_: Any) -> bool:
    return x.shape[1] <= _module("triton.lm_head").MAX_K  # a row of K in one tile


def _torch(op: str, module: str = "torch_ops") -> Impl:
    return Impl("torch", module, op)


#  op: its implementations, tried in this order
OPS: Dict[str, Tuple[Impl, ...]] = {
    # the model (chapters 2, 4, 17, 19)
    "rms_norm": (Impl("flashinfer", "fi_ops", "rms_norm", _fi_rms_norm), _torch("rms_norm")),
    "fused_add_rms_norm": (
        Impl("flashinfer", "fi_ops", "fused_add_rms_norm", _fi_add_rms_norm),
        _torch("fused_add_rms_norm"),
    ),
    "silu_and_mul": (
        Impl("flashinfer", "fi_ops", "silu_and_mul", _fi_silu_and_mul),
        _torch("silu_and_mul"),
    ),
    "apply_rotary": (
        Impl("flashinfer", "fi_ops", "apply_rotary", _fi_rotary),
        _torch("apply_rotary"),
    ),
    "linear": (
        Impl("triton", "triton.gemv", "gemv", _gemv_fits, switch="DISABLE_GEMV"),
        _torch("linear"),
    ),
    "embedding_gather": (
        Impl("triton", "triton.store", "embedding_gather"),
        _torch("embedding_gather"),
    ),
    "store_cache": (Impl("triton", "triton.store", "store_cache"), _torch("store_cache")),
    # sampling (chapters 6, 17, 19)
    "sample": (
        Impl("triton", "triton.sample", "gumbel_sample", _gumbel_fits, "DISABLE_SAMPLE_KERNEL"),
        Impl("flashinfer", "fi_ops", "sample", _fi_sample),
        _torch("sample", "torch_sampling"),
    ),
    # a request with its own seed (chapter 6): the torch path everywhere, row by row
    "sample_seeded": (_torch("sample_seeded", "torch_sampling"),),
    # the fused decode path (chapter 19)
    "norm_linear": (
        Impl("triton", "triton.fused", "norm_gemv"),
        _torch("norm_linear", "torch_fused"),
    ),
    "linear_add_residual_": (
        Impl("triton", "triton.fused", "gemv_add_residual_"),
        _torch("linear_add_residual_", "torch_fused"),
    ),
    "norm_lm_head": (
        Impl("triton", "triton.lm_head", "norm_lm_head", _lm_head_fits, "DISABLE_LM_HEAD_KERNEL"),
        _torch("norm_lm_head", "torch_fused"),
    ),
    "decode_attention": (Impl("triton", "triton.decode", "decode_attention"),),
    "decode_attention_qkv": (Impl("triton", "triton.decode", "decode_attention_qkv"),),
    "decode_attention_batch": (Impl("triton", "triton.decode_batch", "decode_attention_batch"),),
    "decode_attention_batch_qkv": (
        Impl("triton", "triton.decode_batch", "decode_attention_batch_qkv"),
    ),
    # mixture of experts (chapter 21)
    "moe_grouped_gemm": (Impl("triton", "triton.moe", "fused_moe_kernel_triton"),),
}


# ---- the rule -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _module(name: str) -> Optional[Any]:
    """``minisgl.kernel.<name>``, or None when this tree does not have it."""
    full = f"{__name__}.{name}"
    try:
        return importlib.import_module(full)
    except ModuleNotFoundError as e:
        if e.name is not None and full.startswith(e.name):  # the module (or its package) is absent
            return None
        raise


@functools.lru_cache(maxsize=None)
def _imports(library: str) -> bool:
    """Whether ``import <library>`` works (checked once per library)."""
    try:
        importlib.import_module(library)
    except ImportError:
        return False
    return True


def _env(switch: str) -> bool:
    from minisgl.env import ENV  # chapter 7's; read only off the plain CPU path

    return bool(getattr(ENV, switch))


Where = Optional[torch.Tensor | torch.device]


def _runs_on(library: str, where: Where) -> bool:
    """Rule 2 without the switch: the main input's device, and the library imports."""
    if library == "torch":
        return True
    if where is None:
        return False
    is_cuda = where.is_cuda if isinstance(where, torch.Tensor) else where.type == "cuda"
    if library == "flashinfer":
        on_device = is_cuda
    elif library == "triton":
        on_device = is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    else:
        raise ValueError(f"unknown kernel library {library!r}")
    return on_device and _imports(library)


def serves(library: str, where: Where) -> bool:
    """Whether ``library`` may run a kernel whose main input is the tensor ``where`` (or lives
    on the device ``where``): rule 2 above."""
    return _runs_on(library, where) and (library == "torch" or not _env("TORCH_KERNELS"))


def has_kernel(op: str, library: str, where: Where) -> bool:
    """Whether this tree has a ``library`` implementation of ``op`` that may run on ``where``
    (rules 1 and 2): what the engine asks before it chooses one of chapter 19's paths."""
    present = any(impl.library == library and _module(impl.module) for impl in OPS[op])
    return present and serves(library, where)


def _main_input(args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    return None


def implementation(op: str, *args: Any, **kwargs: Any) -> Tuple[Impl, Callable[..., Any]]:
    """The implementation a call of ``op`` with these arguments runs, and its function.

    Raises:
        KeyError: for an op not in ``OPS``.
        RuntimeError: when none of the op's implementations takes the call.
    """
    x = _main_input(args, kwargs)
    for impl in OPS[op]:
        if not _runs_on(impl.library, x):
            continue
        module = _module(impl.module)  # before any ENV read: chapters 2-6 have no minisgl.env
        if module is None:
            continue
        if impl.library != "torch" and _env("TORCH_KERNELS"):
            continue
        if impl.switch is not None and _env(impl.switch):
            continue
        if impl.accepts is not None and not impl.accepts(*args, **kwargs):
            continue
        return impl, getattr(module, impl.function)
    where = "no tensor" if x is None else f"{x.dtype} on {x.device}"
    libraries = sorted({impl.library for impl in OPS[op]})
    raise RuntimeError(f"no kernel for {op} takes this call ({where}); it needs {libraries}")


def library_for(op: str, *args: Any, **kwargs: Any) -> str:
    """``"triton"``, ``"flashinfer"`` or ``"torch"``: the library a call of ``op`` would use."""
    return implementation(op, *args, **kwargs)[0].library


def _run(op: str, *args: Any, **kwargs: Any) -> Any:
    return implementation(op, *args, **kwargs)[1](*args, **kwargs)


# ---- the ops: shapes and meaning; each implementation's docstring says the rest -------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x: [..., N]`` -> ``x / rms(x) * weight``, same shape (``torch_ops.rms_norm``)."""
    return _run("rms_norm", x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``; on FlashInfer computed in place in
    ``x`` and ``residual`` (callers use the returned tensors only)."""
    return _run("fused_add_rms_norm", x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``[T, 2I]`` holding ``[gate | up]`` -> ``silu(gate) * up``, ``[T, I]``."""
    return _run("silu_and_mul", x)


def apply_rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE on ``q: [T, H_q, D]``, ``k: [T, H_kv, D]`` at ``positions: [T]``
    (``torch_ops.apply_rotary``); on FlashInfer in place."""
    return _run("apply_rotary", positions, q, k, cos_sin_cache)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``x @ weight.T + bias``: ``x: [T, K]``, ``weight: [N, K]``, ``bias: [N]`` -> ``[T, N]``,
    like ``F.linear``; a small decode batch times a weight with ``K >= N`` (``o_proj``,
    ``down_proj``) on the Triton GEMV (chapter 19)."""
    return _run("linear", x, weight, bias)


def embedding_gather(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rows of ``weight: [V, hidden]`` for ``ids: [T]`` -> ``[T, hidden]``."""
    return _run("embedding_gather", ids, weight)


def store_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """``k_cache[indices[i]] = k[i]``, same for v (``torch_ops.store_cache``)."""
    _run("store_cache", k_cache, v_cache, indices, k, v)


def sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: Optional[torch.Tensor],
    top_p: Optional[torch.Tensor],
    generator: torch.Generator,
) -> torch.Tensor:
    """One token per row of ``logits: [B, V]`` from ``softmax(logits / temperatures)`` cut
    to each row's top-k and top-p -> ``[B]`` int64 (``torch_sampling.sample``)."""
    return _run("sample", logits, temperatures, top_k, top_p, generator)


def sample_seeded(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: Optional[torch.Tensor],
    top_p: Optional[torch.Tensor],
    keys: list,
) -> torch.Tensor:
    """The same draw for rows with their own seeds: row ``r``'s randomness comes from
    ``keys[r]`` alone (``torch_sampling.sample_seeded``) -> ``[R]`` int64."""
    return _run("sample_seeded", logits, temperatures, top_k, top_p, keys)


def norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    swiglu: bool = False,
) -> torch.Tensor:
    """``linear(rms_norm(x), weight, bias)``, then ``silu_and_mul`` when ``swiglu``:
    ``x: [M, K]`` -> ``[M, N]`` (``[M, N/2]``) (``torch_fused.norm_linear``)."""
    return _run("norm_linear", x, norm_weight, eps, weight, bias, swiglu)


def linear_add_residual_(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``residual += linear(x, weight, bias)`` in place, ``[M, N]``; returns ``residual``."""
    return _run("linear_add_residual_", x, weight, residual, bias)


def norm_lm_head(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> torch.Tensor:
    """Logits ``linear(rms_norm(x, norm_weight, eps), weight)``: ``x: [M, K]`` (the residual
    stream before the final norm), ``weight: [V, K]`` -> ``[M, V]``."""
    return _run("norm_lm_head", x, norm_weight, eps, weight)


def decode_attention(q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Split-KV attention of one query per request, ``q: [B, H_q, D]`` -> ``[B, H_q, D]``
    (``triton.decode.decode_attention`` gives the arguments)."""
    return _run("decode_attention", q, *args, **kwargs)


def decode_attention_qkv(qkv: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The same from the qkv GEMV's output, with the q/k norms, RoPE and the KV store
    inside: ``qkv: [B, (H_q + 2 H_kv) D]`` -> ``[B, H_q, D]``
    (``triton.decode.decode_attention_qkv``)."""
    return _run("decode_attention_qkv", qkv, *args, **kwargs)


def decode_attention_batch(q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Attention of one query per request for a large batch, a pipelined program per
    (request, KV head): ``q: [B, H_q, D]`` -> ``[B, H_q, D]``
    (``triton.decode_batch.decode_attention_batch`` gives the arguments)."""
    return _run("decode_attention_batch", q, *args, **kwargs)


def decode_attention_batch_qkv(qkv: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The same from the qkv GEMV's output, with the q/k norms, RoPE and the KV store
    inside: ``qkv: [B, (H_q + 2 H_kv) D]`` -> ``[B, H_q, D]``
    (``triton.decode_batch.decode_attention_batch_qkv``)."""
    return _run("decode_attention_batch_qkv", qkv, *args, **kwargs)


def moe_grouped_gemm(a: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    """``C[s] = A[s // top_k] @ B[expert(s)].T`` for every routing slot ``s``, in place in
    ``C`` (``triton.moe.fused_moe_kernel_triton`` gives the arguments)."""
    _run("moe_grouped_gemm", a, *args, **kwargs)


__all__ = [
    "GEMV_MAX_M",
    "HALF",
    "OPS",
    "Impl",
    "apply_rotary",
    "decode_attention",
    "decode_attention_batch",
    "decode_attention_batch_qkv",
    "decode_attention_qkv",
    "embedding_gather",
    "fused_add_rms_norm",
    "has_kernel",
    "implementation",
    "library_for",
    "linear",
    "linear_add_residual_",
    "moe_grouped_gemm",
    "norm_linear",
    "norm_lm_head",
    "rms_norm",
    "sample",
    "sample_seeded",
    "serves",
    "silu_and_mul",
    "store_cache",
]
