"""What the GEMV-shaped kernels of this package assume of their operands, checked on the host.

A kernel given a wrong shape reads or writes out of bounds instead of failing, so every
launcher checks first and raises a ``ValueError`` that names the assumption.
"""

from __future__ import annotations

from typing import Optional

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_gemv_args(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], rows: int
) -> None:
    """What a GEMV assumes of ``x: [M, K]``, ``weight: [N, K]`` and ``bias: [rows]`` (``rows``
    is N, or the bias length a caller expects): shapes, one float dtype (fp16, bf16 or
    float32: the kernels accumulate in float32 and round to it), contiguous rows.

    Raises:
        ValueError: naming the first assumption that fails.
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"x must be [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if bias is not None and (bias.shape != (rows,) or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous [{rows}], got {tuple(bias.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x must be fp16, bf16 or float32, got {x.dtype}")
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(
            f"dtype mismatch: x {x.dtype}, weight {weight.dtype}, "
            f"bias {None if bias is None else bias.dtype}"
        )
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("the rows of x and weight must be contiguous")
