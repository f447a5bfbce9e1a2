"""Where a batch-1 decoder layer's microseconds go, kernel by kernel, on the GPU's clock.

    python -m minisgl.benchmark.layer_timeline [--rows 1 2] [--json timeline.json]

The fused decode path runs a layer as six launches chained by programmatic dependent launch
(chapter 19): ``qkv`` (norm + GEMV), ``attn`` (split-KV partials from qkv), ``merge``, ``o``
(GEMV + residual), ``gate_up`` (norm + GEMV + SwiGLU), ``down`` (GEMV + residual). Timing
the chain as a whole cannot say which link is slow, and a profiler serialises the kernels
that PDL overlaps. So each launch is given a stamps buffer (``kernel/triton/timeline.py``):
every program records the global timer when it starts, when its PDL wait returns and when
it ends. Qwen3-0.6B's 28 layers run with random weights and a 1,025-token context in one
CUDA graph (``fused_layer.LayerChain``), and for each kernel, averaged over layers 2-26
(counting from 0):

* ``starts``: from the first to the last of its programs starting (a program starts only
  where an SM has registers free for it);
* ``boundary``: from the last program of the kernel before ending to the first program of
  this one passing its wait (the cost of the kernel boundary itself);
* ``spread``: from the first to the last program passing its wait;
* ``after``: from the last program passing its wait to the last program ending (the
  dependent work after the wait);
* ``total``: last end to last end, the kernel's share of the layer.

The stamps cost a little, so the layer's time without them is printed too. ``--json``
writes one layer's kernels (their first start, first wait, last wait and last end, in
microseconds from the layer's start) for the book's figure (``tools/figures.py``). Needs
CUDA on Hopper (PDL).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Dict, List

import torch

from minisgl.kernel.triton.timeline import stamps_buffer

from .fused_layer import KERNELS, QWEN3_0_6B, LayerChain

MAX_PROGRAMS = 4096  # stamp rows kept per launch (the largest launch has 1,024 programs)
COLUMNS = ("starts", "boundary", "spread", "after", "total")


def record(chain: LayerChain, replays: int = 5) -> List[Dict[str, torch.Tensor]]:
    """Every layer's stamps buffers, as the last of ``replays`` graph replays left them."""
    from .common import graph_time_us

    buffers = [
        {name: stamps_buffer(MAX_PROGRAMS, torch.device("cuda")) for name in KERNELS}
        for _ in chain.weights
    ]
    graph_time_us([lambda i=i: chain.fused(i, buffers[i]) for i in range(len(buffers))], replays)
    return buffers


def kernel_times(buffers: List[Dict[str, torch.Tensor]]) -> List[Dict[str, float]]:
    """Per launch, in layer order: the first and last start, first and last wait, last end,
    in microseconds from the first stamp. The stamps are nanoseconds since 1970 (~1.8e18):
    differences are taken in int64, since a float64 that large is exact only to 256 ns."""
    stamps = [buffers[layer][name].cpu() for layer in range(len(buffers)) for name in KERNELS]
    origin = min(int(s[s[:, 0] > 0, 0].min()) for s in stamps)
    times = []
    for block in stamps:
        ran = block[block[:, 0] > 0]
        waited = ran[ran[:, 1] > 0]  # an empty chunk's program returns before its wait
        start, wait, end = (
            (t - origin).double() / 1e3 for t in (ran[:, 0], waited[:, 1], ran[:, 2])
        )
        times.append(
            dict(
                start_first=float(start.min()),
                start_last=float(start.max()),
                wait_first=float(wait.min()),
                wait_last=float(wait.max()),
                end_last=float(end.max()),
            )
        )
    return times


def table(times: List[Dict[str, float]]) -> Dict[str, Dict[str, float]]:
    """``COLUMNS`` per kernel, averaged over layers 2 to the second last (us)."""
    n = len(KERNELS)
    layers = range(2, len(times) // n - 1)
    out = {}
    for j, name in enumerate(KERNELS):
        pairs = [(times[n * layer + j], times[n * layer + j - 1]) for layer in layers]
        cols = (
            [k["start_last"] - k["start_first"] for k, _ in pairs],
            [k["wait_first"] - prev["end_last"] for k, prev in pairs],
            [k["wait_last"] - k["wait_first"] for k, _ in pairs],
            [k["end_last"] - k["wait_last"] for k, _ in pairs],
            [k["end_last"] - prev["end_last"] for k, prev in pairs],
        )
        out[name] = {col: statistics.mean(values) for col, values in zip(COLUMNS, cols)}
    return out


def one_layer(times: List[Dict[str, float]], layer: int) -> List[Dict[str, object]]:
    """Layer ``layer``'s kernels for the figure, in us from the previous layer's last end."""
    n = len(KERNELS)
    zero = times[n * layer - 1]["end_last"]
    return [
        dict(name=name, **{key: value - zero for key, value in times[n * layer + j].items()})
        for j, name in enumerate(KERNELS)
    ]


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--rows",
        type=int,
        nargs="+",
        default=[1, 2],
        choices=[1, 2],
        help="decode batch sizes (this timeline covers the fused path's one- and two-row steps)",
    )
    p.add_argument("--json", help="write each batch size's table and one layer's kernels here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        raise SystemExit("layer_timeline needs a Hopper GPU (PDL)")
    cfg, results = dict(QWEN3_0_6B), {}
    layers = int(cfg["layers"])
    with torch.inference_mode():
        for m in args.rows:
            chain = LayerChain(cfg, m)
            plain_us = chain.time_us(chain.fused, 30)
            times = kernel_times(record(chain))
            stamped_us = (times[-1]["end_last"] - times[len(KERNELS) - 1]["end_last"]) / (
                layers - 1
            )
            per_kernel = table(times)
            results[m] = dict(
                layer_us=plain_us, stamped_us=stamped_us, kernels=per_kernel,
                layer=one_layer(times, layers // 2),
            )  # fmt: skip
            print(f"batch {m}: a layer takes {plain_us:.2f} us ({stamped_us:.2f} stamped)")
            print("kernel   | " + " | ".join(f"{c:>8s}" for c in COLUMNS))
            for name, row in per_kernel.items():
                print(f"{name:8s} | " + " | ".join(f"{row[c]:8.2f}" for c in COLUMNS))
    if args.json:
        device = torch.cuda.get_device_name()
        with open(args.json, "w") as f:
            json.dump(dict(device=device, context=1025, batches=results), f, indent=1)


if __name__ == "__main__":
    main()
