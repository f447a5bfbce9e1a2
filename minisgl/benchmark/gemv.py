"""Time small-batch linear layers: cuBLAS (``F.linear``) against the Triton GEMV (chapter 19).

    python -m minisgl.benchmark.gemv                        # Qwen3-0.6B's layers, TP=1 and 2, bf16
    python -m minisgl.benchmark.gemv --rows 1 --tp 1 --sweep    # also try other tiles, best first

For each layer shape ``N x K`` and each row count ``M`` it checks that both give the same
result (largest difference relative to the largest output) and prints the microseconds
per call of each and the weight bandwidth they reach: weight bytes / time (the activations
are a few KB). At ``M <= 8`` both should be bound by reading the weight, so the ceiling is
the copy bandwidth printed in the header (bytes read + written per second of a 1 GiB
device-to-device copy, ``common.measure_copy_bandwidth``).

Each timing captures a sequence of calls into one CUDA graph and replays it, as a decode
step does, so launch overhead does not count. The calls cycle through enough copies of the
weight (``--rotate-mb``, default 256 MB, five times an H200's 50 MB L2) that each call
reads its weight from memory, not from the L2 cache where the previous call left it.
``--sweep`` times a grid of other tile configurations per shape and prints the fastest,
the data to tune ``kernel/triton/gemv.py``'s ``gemv_config`` with. Needs a CUDA GPU and ``triton``.
"""

from __future__ import annotations

import argparse
import itertools
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from .common import graph_time_us, measure_copy_bandwidth

# Qwen3-0.6B's linear layers as (N, K): rows of the weight, and the input width.
SHAPES = {
    "lm_head": (151936, 1024),
    "qkv_proj": (4096, 1024),
    "o_proj": (1024, 2048),
    "gate_up_proj": (6144, 1024),
    "down_proj": (1024, 3072),
}


def shapes_at_tp(tp: int) -> Dict[str, tuple]:
    """Each rank's share at tensor parallelism ``tp``: column-parallel layers (lm_head,
    qkv, gate_up) split N, row-parallel ones (o_proj, down) split K."""
    row_parallel = ("o_proj", "down_proj")
    return {
        name: (n, k // tp) if name in row_parallel else (n // tp, k)
        for name, (n, k) in SHAPES.items()
    }


def make_weights(
    n: int, k: int, dtype: torch.dtype, rotate_bytes: int, seed: int = 0
) -> List[torch.Tensor]:
    """Enough ``[n, k]`` weights (at least one) to total ``rotate_bytes``, scaled by 1/sqrt(k)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    one = n * k * dtype.itemsize
    copies = max(1, -(-rotate_bytes // one))
    return [
        torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) / k**0.5 for _ in range(copies)
    ]


def time_gemv(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype = torch.bfloat16,
    rotate_bytes: int = 256 << 20,
    replays: int = 20,
    configs: Optional[list] = None,
    weights: Optional[List[torch.Tensor]] = None,
) -> Dict[str, object]:
    """One row of the table: ``torch_us`` and ``triton_us`` per call, ``torch_gbps`` and
    ``triton_gbps`` (weight bytes / time), ``rel_diff`` (max |triton - torch| / max |torch|)
    and ``config`` (the heuristic's). With ``configs``, also ``sweep``: ``(us, config)`` for
    each, fastest first."""
    from minisgl.kernel.triton.gemv import gemv, gemv_config

    weights = weights if weights is not None else make_weights(n, k, dtype, rotate_bytes)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    want, got = F.linear(x, weights[0]), gemv(x, weights[0])
    rel = float((got.float() - want.float()).abs().max() / want.float().abs().max())
    calls = max(20, len(weights))  # every copy at least once per replay
    order = [weights[i % len(weights)] for i in range(calls)]
    torch_us = graph_time_us([lambda w=w: F.linear(x, w) for w in order], replays)
    triton_us = graph_time_us([lambda w=w: gemv(x, w) for w in order], replays)
    nbytes = weights[0].numel() * weights[0].element_size()
    row: Dict[str, object] = {
        "torch_us": torch_us,
        "triton_us": triton_us,
        "rel_diff": rel,
        "torch_gbps": nbytes / torch_us / 1e3,
        "triton_gbps": nbytes / triton_us / 1e3,
        "config": gemv_config(
            m, n, k, torch.cuda.get_device_properties(x.device).multi_processor_count
        ),
    }
    if configs:
        timed = [
            (graph_time_us([lambda w=w, c=c: gemv(x, w, config=c) for w in order], replays), c)
            for c in configs
        ]
        row["sweep"] = sorted(timed, key=lambda t: t[0])
    return row


def sweep_configs(m: int, k: int) -> list:
    """The tiles ``--sweep`` tries at ``M = m``: BLOCK_N 4..32, BLOCK_K 256 or 512, 1, 2 or 4
    K splits, 4 or 8 warps (at most 48, each compiled on first use), leaving out those
    that need more than 128 accumulator registers per thread or split K into parts
    smaller than a chunk."""
    import triton

    from minisgl.kernel.triton.gemv import GemvConfig

    block_m = triton.next_power_of_2(m)
    out = []
    for bn, bk, split, warps in itertools.product((4, 8, 16, 32), (256, 512), (1, 2, 4), (4, 8)):
        if block_m * bn * bk > 128 * 32 * warps or bk > triton.next_power_of_2(k) or split * bk > k:
            continue
        out.append(GemvConfig(block_m, bn, bk, split, warps))
    return out


def _fmt_config(c) -> str:
    return f"{c.block_n}x{c.block_k} s{c.split_k} w{c.num_warps}"


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="M, the rows of x"
    )
    parser.add_argument(
        "--tp", type=int, nargs="+", default=[1, 2], help="tensor-parallel sizes to take shapes at"
    )
    parser.add_argument("--layers", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument(
        "--rotate-mb", type=int, default=256, help="weight copies cycled through, in MB"
    )
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument(
        "--sweep", action="store_true", help="also time other tile configs, print the best 3"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("minisgl.benchmark.gemv times GPU kernels: it needs CUDA (and triton)")

    dtype = getattr(torch, args.dtype)
    bandwidth = measure_copy_bandwidth(torch.device("cuda"))
    print(
        f"{torch.cuda.get_device_name()}: linear layers, {args.dtype}; us per call (CUDA graph of calls, "
        f"weights cycled over {args.rotate_mb} MB); copy bandwidth {bandwidth / 1e9:.0f} GB/s"
    )
    print(
        f"{'layer':>14} {'tp':>2} {'N':>6} {'K':>5} {'M':>3} {'torch us':>9} {'triton us':>9} "
        f"{'torch GB/s':>10} {'triton GB/s':>11} {'speed-up':>8} {'rel diff':>8}  config"
    )
    with torch.inference_mode():
        for tp in args.tp:
            for name in args.layers:
                n, k = shapes_at_tp(tp)[name]
                weights = make_weights(n, k, dtype, args.rotate_mb << 20)
                for m in args.rows:
                    r = time_gemv(
                        m,
                        n,
                        k,
                        dtype,
                        replays=args.replays,
                        weights=weights,
                        configs=sweep_configs(m, k) if args.sweep else None,
                    )
                    print(
                        f"{name:>14} {tp:>2} {n:>6} {k:>5} {m:>3} {r['torch_us']:>9.2f} {r['triton_us']:>9.2f} "
                        f"{r['torch_gbps']:>10.0f} {r['triton_gbps']:>11.0f} "
                        f"{r['torch_us'] / r['triton_us']:>7.2f}x {r['rel_diff']:>8.1e}  {_fmt_config(r['config'])}"
                    )
                    for us, c in r.get("sweep", [])[:3]:
                        print(
                            f"{'':>14} {'':>2} {'':>6} {'':>5} {'':>3} {'':>9} {us:>9.2f} {'':>10} "
                            f"{n * k * dtype.itemsize / us / 1e3:>11.0f} {'':>8} {'':>8}  sweep {_fmt_config(c)}"
                        )
                del weights


if __name__ == "__main__":
    main()
