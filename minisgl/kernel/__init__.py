"""Kernels, chosen per call: one table of ops, one rule.

Every layer calls the ops below, never a kernel library directly. ``OPS`` lists each op's
implementations, each run by a *library* (``LIBRARIES``: torch here; a module of this
package that brings a faster library registers it, and its kernels, with ``register``).
A call of an op runs the first implementation, in the libraries' order (``rank``), that

1. runs where the call's *main input* lives (its first floating-point tensor): the
   library's ``runs_on`` says; torch runs everywhere; and
2. takes the call's arguments (its ``accepts`` check on dtypes, shapes and strides).

The torch references (``torch_ops``) come last and take every call. The modules of this
package are imported the first time the table is read, each registering what it brings; a
library's own kernel modules are imported only where it runs (``Library.load``). The
choice costs a few attribute reads per call. ``library_for(op, ...)`` says which library a
call would use, ``run(op, ...)`` makes the call: an op declared in another module (a
sampler's, say) is a function that calls ``run``. Inside ``with counting() as calls:``,
``calls`` counts every op run, by name: what a forward pass launches.

Mirrors upstream ``minisgl.kernel`` (which has no choice to make: upstream is CUDA only and
calls its kernel libraries from its layers).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from . import torch_ops

HALF = (torch.float16, torch.bfloat16)  # what most fast kernels take  # +ch17

Where = Optional[torch.Tensor | torch.device]


@dataclass(frozen=True)
class Library:
    """A kernel library: ``runs_on(where)`` says whether it may run a kernel whose main input
    is the tensor ``where`` (or lives on the device ``where``; None: no tensor at all).
    Libraries are tried in increasing ``rank``; ``load`` imports the modules of its kernels
    (each registers them) the first time a call could use them."""

    name: str
    rank: int
    runs_on: Callable[[Where], bool]
    load: Callable[[], None] = field(default=lambda: None)


@dataclass(frozen=True)
class Impl:
    """One implementation of an op: ``function``, run by ``library`` when ``accepts(*args,
    **kwargs)`` is true (None: every call)."""

    library: str
    function: Callable[..., Any]
    accepts: Optional[Callable[..., bool]] = None


LIBRARIES: Dict[str, Library] = {"torch": Library("torch", 100, lambda where: True)}
OPS: Dict[str, List[Impl]] = {}
_calls: List[Counter] = []  # the counters of the counting() blocks open now


def register_library(library: Library) -> None:
    """Add a kernel library (a module of this package calls it when imported)."""
    LIBRARIES[library.name] = library


def register(op: str, impl: Impl) -> None:
    """Add ``impl`` to ``op``'s implementations, kept in their libraries' order."""
    impls = OPS.setdefault(op, [])
    impls.append(impl)
    impls.sort(key=lambda i: LIBRARIES[i.library].rank)  # stable: ties keep their order


# the model's ops, on their torch references
for _op in (
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "apply_rotary",
    "linear",
    "embedding_gather",
    "store_cache",  # +ch04
):
    register(_op, Impl("torch", getattr(torch_ops, _op)))


# ---- the rule -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _load_package() -> None:
    """Import every module of this package once: each registers what it brings."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


@functools.lru_cache(maxsize=None)
def _load(library: str) -> None:
    LIBRARIES[library].load()


def serves(library: str, where: Where) -> bool:
    """Whether ``library`` may run a kernel whose main input is the tensor ``where`` (or
    lives on the device ``where``): rule 1 above. False for a library this tree lacks."""
    _load_package()
    return library in LIBRARIES and LIBRARIES[library].runs_on(where)


def has_kernel(op: str, library: str, where: Where) -> bool:
    """Whether ``library`` has an implementation of ``op`` that may run on ``where``."""
    if not serves(library, where):
        return False
    _load(library)
    return any(impl.library == library for impl in OPS.get(op, ()))


def _main_input(args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    return None


def implementation(op: str, *args: Any, **kwargs: Any) -> Impl:
    """The implementation a call of ``op`` with these arguments runs.

    Raises:
        KeyError: for an op no module of this tree registers.
        RuntimeError: when none of the op's implementations takes the call.
    """
    _load_package()
    x = _main_input(args, kwargs)
    running = [name for name, lib in LIBRARIES.items() if lib.runs_on(x)]
    for name in running:
        _load(name)
    for impl in OPS[op]:
        if impl.library in running and (impl.accepts is None or impl.accepts(*args, **kwargs)):
            return impl
    where = "no tensor" if x is None else f"{x.dtype} on {x.device}"
    libraries = sorted({impl.library for impl in OPS[op]})
    raise RuntimeError(f"no kernel for {op} takes this call ({where}); it needs {libraries}")


def library_for(op: str, *args: Any, **kwargs: Any) -> str:
    """``"torch"`` or another library's name: the library a call of ``op`` would use."""
    return implementation(op, *args, **kwargs).library


def run(op: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``op`` on the implementation the rule picks for these arguments."""
    for calls in _calls:
        calls[op] += 1
    return implementation(op, *args, **kwargs).function(*args, **kwargs)


@contextmanager
def counting() -> Iterator[Counter]:
    """Count every op run inside the ``with`` block, by name."""
    calls: Counter = Counter()
    _calls.append(calls)
    try:
        yield calls
    finally:
        _calls.remove(calls)


# ---- the model's ops: shapes and meaning; each implementation's docstring says the rest -----
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x: [..., N]`` -> ``x / rms(x) * weight``, same shape (``torch_ops.rms_norm``)."""
    return run("rms_norm", x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``; a fast kernel may compute it in place in
    ``x`` and ``residual`` (callers use the returned tensors only)."""
    return run("fused_add_rms_norm", x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``[T, 2I]`` holding ``[gate | up]`` -> ``silu(gate) * up``, ``[T, I]``."""
    return run("silu_and_mul", x)


def apply_rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """RoPE on ``q: [T, H_q, D]``, ``k: [T, H_kv, D]`` at ``positions: [T]``
    (``torch_ops.apply_rotary``); a fast kernel may rotate them in place."""
    return run("apply_rotary", positions, q, k, cos_sin_cache)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``x @ weight.T + bias``: ``x: [T, K]``, ``weight: [N, K]``, ``bias: [N]`` -> ``[T, N]``,
    like ``F.linear``."""
    return run("linear", x, weight, bias)


def embedding_gather(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rows of ``weight: [V, hidden]`` for ``ids: [T]`` -> ``[T, hidden]``."""
    return run("embedding_gather", ids, weight)


# >>> ch04: the KV pool stores each layer's new keys and values with it
def store_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """``k_cache[indices[i]] = k[i]``, same for v (``torch_ops.store_cache``)."""
    run("store_cache", k_cache, v_cache, indices, k, v)


# <<< ch04


__all__ = [
    "HALF",  # +ch17
    "LIBRARIES",
    "OPS",
    "Impl",
    "Library",
    "Where",
    "apply_rotary",
    "counting",
    "embedding_gather",
    "fused_add_rms_norm",
    "has_kernel",
    "implementation",
    "library_for",
    "linear",
    "register",
    "register_library",
    "rms_norm",
    "run",
    "serves",
    "silu_and_mul",
    "store_cache",  # +ch04
]
