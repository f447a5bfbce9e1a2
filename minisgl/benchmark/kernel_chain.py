"""What one kernel boundary costs at batch 1, and what a grid barrier costs instead (chapter 19).

    python -m minisgl.benchmark.kernel_chain

A batch-1 decode step is a chain of about 170 kernels, each needing all of the one before.
This times that chain with the work taken out, in a CUDA graph:

* ``chain``: 171 trivial kernels (each program sums the first 1,024 values of the buffer
  the kernel before wrote into, and writes four), one after another, launched with and
  without programmatic dependent launch (``pdl``): microseconds per kernel, at 128, 256
  and 1,024 programs;
* ``persistent``: one kernel of one program per SM (or two) doing the same 171 steps, each
  step (the same load, sum and store) ending in a grid-wide barrier (an atomic counter
  every program increments, then spins on until all have): microseconds per step. This is
  the synchronisation a persistent "megakernel" would use between stages that need all of
  the previous one.

Needs CUDA and Triton; PDL needs Hopper or newer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import graph_time_us

KERNELS = 171  # a Qwen3-0.6B batch-1 decode step on the fused path
K = 1024  # values each program reads from the step before (a hidden row)


@triton.jit
def _link_kernel(x_ptr, y_ptr, K: tl.constexpr, PDL: tl.constexpr):
    """One link of the chain: read what the kernel before wrote, write for the next."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    total = tl.sum(tl.load(x_ptr + tl.arange(0, K)).to(tl.float32))
    pid = tl.program_id(0)
    tl.store(y_ptr + pid * 4 + tl.arange(0, 4), (total * 1e-6 + pid).to(tl.bfloat16))


@triton.jit
def _persistent_kernel(
    x_ptr, counter_ptr, num_programs, STEPS: tl.constexpr, K: tl.constexpr, PER: tl.constexpr
):
    """``STEPS`` links in one kernel, with a grid barrier after each (``counter_ptr[s]``)."""
    pid = tl.program_id(0)
    offs = tl.arange(0, K)
    for s in range(STEPS):
        src = x_ptr + (s % 2) * K
        dst = x_ptr + ((s + 1) % 2) * K
        # .cg: from L2, not a stale L1 line written by another SM
        x = tl.load(src + offs, mask=offs < num_programs * PER, other=0.0, cache_modifier=".cg")
        tl.store(
            dst + pid * PER + tl.arange(0, PER),
            (tl.sum(x.to(tl.float32)) * 1e-6 + pid).to(tl.bfloat16),
        )
        arrived = tl.atomic_add(counter_ptr + s, 1, sem="acq_rel", scope="gpu") + 1
        while arrived < num_programs:
            arrived = tl.atomic_add(counter_ptr + s, 0, sem="acquire", scope="gpu")


def chain_us(programs: int, pdl: bool) -> float:
    """Microseconds per kernel of a chain of ``KERNELS`` links of ``programs`` programs."""
    bufs = [torch.randn(max(K, programs * 4), device="cuda").to(torch.bfloat16) for _ in range(2)]
    options = {"launch_pdl": True} if pdl else {}
    calls = [
        lambda i=i: _link_kernel[(programs,)](
            bufs[i % 2], bufs[(i + 1) % 2], K=K, PDL=pdl, **options
        )
        for i in range(KERNELS)
    ]
    return graph_time_us(calls, 20)


def persistent_us(programs: int, steps: int) -> float:
    """Microseconds of one persistent kernel of ``steps`` barriered steps (programs must all
    be resident at once, or the barrier never opens: at most a few per SM)."""
    width = triton.next_power_of_2(programs * 8)
    x = torch.randn(2 * width, device="cuda").to(torch.bfloat16)
    counters = torch.zeros(steps, device="cuda", dtype=torch.int32)

    def call() -> None:
        counters.zero_()
        _persistent_kernel[(programs,)](x, counters, programs, STEPS=steps, K=width, PER=8)

    return graph_time_us([call], 20)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("kernel_chain times GPU kernels: it needs CUDA")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pdl = torch.cuda.get_device_capability()[0] >= 9
    print(
        f"{torch.cuda.get_device_name()}: {sms} SMs; a chain of {KERNELS} trivial kernels, CUDA graph"
    )
    for programs in (128, 256, 1024):
        with_pdl = f"{chain_us(programs, True):.2f}" if pdl else "n/a"
        print(
            f"  {programs:5d} programs: {with_pdl} us per kernel with PDL, {chain_us(programs, False):.2f} without"
        )
    print(f"one persistent kernel, {KERNELS} steps each ending in a grid barrier")
    for programs in (sms, 2 * sms):
        one, many = persistent_us(programs, 1), persistent_us(programs, KERNELS)
        print(
            f"  {programs:5d} programs: {(many - one) / (KERNELS - 1):.2f} us per step with its barrier"
        )


if __name__ == "__main__":
    main()
