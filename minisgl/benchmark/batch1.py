"""The batch-1 decode step after each of chapter 19's speed-ups in turn, against its floor.

    python -m minisgl.benchmark.batch1 --model models/qwen3-0.6b-shaped [--json batch1.json]

Chapter 19 makes a decode step of one request fast in steps; each is a field of the
speed-ups record (``minisgl/kernel/speedups.py``). This builds the engine once per rung
with every later speed-up off and times the same step as ``decode_step`` does (one request,
``--context`` cached tokens, CUDA graphs on, GPU time):

1. ``FlashInfer + cuBLAS``: chapter 18's engine (with this chapter's KV store and gather);
2. ``+ GEMV``: the Triton GEMV for ``o_proj`` and ``down_proj``;
3. ``+ fused layers``: the fused decode path, its attention still FlashInfer's;
4. ``+ split-KV attention``: the split-KV backend, from qkv;
5. ``+ PDL``: the kernels launched with programmatic dependent launch;
6. ``+ LM head``: the final norm and LM head in one persistent kernel.

``--json`` writes the rungs, the floor and the machine for the book's figure
(``tools/figures.py``). Needs CUDA, FlashInfer and Triton.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from typing import Dict, List, Tuple

import torch

from minisgl.engine import Engine, EngineConfig
from minisgl.kernel import speedups
from minisgl.utils import div_ceil

from .common import format_table, measure_copy_bandwidth
from .decode_step import (
    count_kernels,
    kv_bytes_per_token,
    make_decode_batch,
    time_steps,
    weight_bytes,
)

SWITCHES = ("gemv", "fused_decode", "split_kv", "pdl", "lm_head_kernel")  # SpeedUps fields
# each rung: its name, and the speed-ups still switched off
RUNGS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("FlashInfer + cuBLAS", SWITCHES),
    ("+ GEMV", SWITCHES[1:]),
    ("+ fused layers", SWITCHES[2:]),
    ("+ split-KV attention", SWITCHES[3:]),
    ("+ PDL", SWITCHES[4:]),
    ("+ LM head", ()),
)


def time_rung(args: argparse.Namespace, off: Tuple[str, ...]) -> Dict[str, object]:
    """One engine with the speed-ups ``off`` off and the others on: its batch-1 step (GPU and
    wall ms) and kernels."""
    with speedups.using(**{name: name not in off for name in SWITCHES}):
        return _time_engine(args)


def _time_engine(args: argparse.Namespace) -> Dict[str, object]:
    engine = Engine(
        EngineConfig(
            args.model,
            dtype=torch.bfloat16,
            device="cuda",
            page_size=args.page_size,
            max_running_req=1,
            num_page_override=div_ceil(args.context + 2, args.page_size),
            max_seq_len_override=args.context + 64,
            cuda_graph_bs=(1,),
        )
    )
    try:
        with torch.inference_mode():
            batch = make_decode_batch(engine, 1, args.context)
            gpu_ms, step_ms = time_steps(engine, batch, args.steps, use_graph=True)
            kernels = count_kernels(engine, batch)
        sizes = (weight_bytes(engine), kv_bytes_per_token(engine))
        return dict(
            gpu_ms=gpu_ms,
            step_ms=step_ms,
            kernels=kernels,
            backend=type(engine.attn_backend).__name__,
            bytes=sizes,
        )
    finally:
        engine.shutdown()
        del engine
        gc.collect()
        torch.cuda.empty_cache()


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.environ.get("MINISGL_MODEL", "models/qwen3-0.6b-shaped"))
    p.add_argument("--context", type=int, default=1024, help="cached tokens of the request")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--page-size", type=int, default=256)
    p.add_argument("--json", help="write the rungs here (for tools/figures.py)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("batch1 measures GPU time: it needs CUDA")
    rungs = [dict(name=name, off=list(off), **time_rung(args, off)) for name, off in RUNGS]
    bandwidth = measure_copy_bandwidth(torch.device("cuda"))
    w_bytes, kv_token = rungs[-1].pop("bytes")
    for rung in rungs:
        rung.pop("bytes", None)
    floor_ms = (w_bytes + (args.context + 1) * kv_token) / bandwidth * 1e3
    rows = [
        [r["name"], r["kernels"], f"{r['gpu_ms']:.3f}", f"{r['step_ms']:.3f}",
         f"{r['gpu_ms'] / floor_ms:.2f}x", r["backend"]]
        for r in rungs
    ]  # fmt: skip
    print(f"{args.model}, one request, {args.context} tokens of context; floor {floor_ms:.3f} ms")
    header = ["rung", "kernels", "GPU ms", "step ms", "GPU / floor", "attention"]
    print(format_table(header, rows))
    if args.json:
        record = dict(
            device=torch.cuda.get_device_name(),
            model=os.path.basename(os.path.normpath(args.model)),
            context=args.context,
            steps=args.steps,
            bandwidth_tb_s=bandwidth / 1e12,
            floor_ms=floor_ms,
            rungs=rungs,
        )
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
