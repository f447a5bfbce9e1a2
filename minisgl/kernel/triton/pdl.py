"""Programmatic dependent launch (PDL): let a kernel start before the one it depends on ends.

Kernels on one stream normally run strictly one after another: the next is launched only
when the previous has finished and its writes are visible, so every kernel boundary costs
a launch latency and the previous kernel's tail, a few microseconds. At decode batch 1, with
about 200 kernels per step, that is a large share of the step. On Hopper (sm_90) and newer
a kernel launched as a PDL *secondary* may start while its *primary* is still running:

* the secondary does the work that does not depend on the primary (a GEMV loads its
  weights), then calls ``tl.extra.cuda.gdc_wait()``, which returns once the primary has
  finished and its writes are visible;
* the primary calls ``tl.extra.cuda.gdc_launch_dependents()`` to let its secondary be
  scheduled now rather than at its end. Ours call it first thing: the secondary is then
  scheduled once every program of the primary is running, and its own secondary once all
  of *its* programs run, so as far as the SMs have room, the weights of the next few
  kernels stream in while one kernel finishes. The wait keeps it correct: nothing a
  kernel reads before ``gdc_wait`` may be written by the kernels before it in the step.

Both are no-ops unless the launch asked for PDL, and CUDA graphs keep the relation. The
kernels of a decode step (``fused``, ``decode``) take ``PDL: tl.constexpr`` from ``use_pdl``
and the launch option from ``launch_options``; ``MINISGL_DISABLE_PDL=1`` (the speed-up
``pdl``) launches them plainly, to measure what PDL saves. Upstream mini-sglang does not use PDL;
SGLang's own kernels do.
"""

from __future__ import annotations

import functools

import torch

from minisgl.kernel import speedups


@functools.lru_cache(maxsize=None)
def _supported(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def use_pdl(x: torch.Tensor) -> bool:
    """Whether kernels on ``x``'s device launch with PDL: CUDA on Hopper or newer
    (``griddepcontrol`` is sm_90 PTX), unless the speed-up ``pdl`` is off."""
    return x.is_cuda and speedups.current().pdl and _supported(x.device)


def launch_options(pdl: bool) -> dict:
    """The launch option that makes a Triton kernel a PDL secondary; empty off CUDA (the
    interpreter has no such option)."""
    return {"launch_pdl": True} if pdl else {}
