"""The grouped GEMM of a mixture of experts: Triton's only (``triton.moe``), with no
reference at this level (the torch MoE backend, which never calls it, is its reference)."""

from __future__ import annotations

from typing import Any

import torch

from . import run


def moe_grouped_gemm(a: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    """``C[s] = A[s // top_k] @ B[expert(s)].T`` for every routing slot ``s``, in place in
    ``C`` (``triton.moe.fused_moe_kernel_triton`` gives the arguments)."""
    run("moe_grouped_gemm", a, *args, **kwargs)
