"""Switches read from the environment, settable from code for experiments and tests.

``ENV.DISABLE_OVERLAP_SCHEDULING.value = True`` turns overlap scheduling (chapter 11) off,
as chapter 7's example does to show the plain loop. ``MINISGL_TORCH_KERNELS=1`` keeps the
torch reference kernels on CUDA too, instead of FlashInfer and Triton (chapters 17, 19): the
switch to reach for when a fast kernel is suspected of a wrong answer. The others each turn
one of chapter 19's speed-ups off, to measure what it saves (``minisgl.benchmark.batch1``
turns them off one after another):

* ``MINISGL_DISABLE_GEMV=1``: small-batch linear layers back on ``F.linear`` (cuBLAS);
* ``MINISGL_DISABLE_FUSED_DECODE=1``: no fused decode path (``models/fused_decode.py``);
* ``MINISGL_DISABLE_SPLIT_KV=1``: FlashInfer's decode attention at every batch size;
* ``MINISGL_DISABLE_PDL=1``: chapter 19's kernels launched without programmatic dependent launch;
* ``MINISGL_DISABLE_LM_HEAD_KERNEL=1``: the fused path's final norm and LM head on torch;
* ``MINISGL_DISABLE_SAMPLE_KERNEL=1``: temperature sampling on FlashInfer, not the Gumbel-max kernel;
* ``MINISGL_DISABLE_DECODE_BATCH_KERNEL=1``: decodes of 64 requests or more on FlashInfer, not
  the pipelined batch kernel;
* ``MINISGL_DISABLE_LONGEST_FIRST=1``: the batch kernel starts its programs in the batch's order,
  not longest context first.

Mirrors upstream ``minisgl.env`` (which has none of the kernel switches).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _as_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


@dataclass
class EnvBool:
    """A boolean read once from environment variable ``name`` (default ``default``)."""

    name: str
    default: bool = False
    value: bool = field(init=False)

    def __post_init__(self) -> None:
        raw = os.environ.get(self.name)
        self.value = self.default if raw is None else _as_bool(raw)

    def __bool__(self) -> bool:
        return self.value


class _Env:
    def __init__(self) -> None:
        self.DISABLE_OVERLAP_SCHEDULING = EnvBool("MINISGL_DISABLE_OVERLAP_SCHEDULING")
        self.TORCH_KERNELS = EnvBool("MINISGL_TORCH_KERNELS")
        self.DISABLE_GEMV = EnvBool("MINISGL_DISABLE_GEMV")
        self.DISABLE_FUSED_DECODE = EnvBool("MINISGL_DISABLE_FUSED_DECODE")
        self.DISABLE_SPLIT_KV = EnvBool("MINISGL_DISABLE_SPLIT_KV")
        self.DISABLE_PDL = EnvBool("MINISGL_DISABLE_PDL")
        self.DISABLE_LM_HEAD_KERNEL = EnvBool("MINISGL_DISABLE_LM_HEAD_KERNEL")
        self.DISABLE_SAMPLE_KERNEL = EnvBool("MINISGL_DISABLE_SAMPLE_KERNEL")
        self.DISABLE_DECODE_BATCH_KERNEL = EnvBool("MINISGL_DISABLE_DECODE_BATCH_KERNEL")
        self.DISABLE_LONGEST_FIRST = EnvBool("MINISGL_DISABLE_LONGEST_FIRST")


ENV = _Env()
