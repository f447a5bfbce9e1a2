"""Decode step time at several batch sizes, CUDA graphs on and off, beside the floor.

    python -m minisgl.benchmark.decode_step --model models/qwen3-0.6b-shaped
    python -m minisgl.benchmark.decode_step --batch-sizes 1 8 --context 1024 --steps 100

A decode step reads every weight once and each request's whole KV cache once, and does
little arithmetic per byte, so its time is bounded below by

    floor = (weight bytes + KV bytes read) / memory bandwidth

with the bandwidth measured here by a large device-to-device copy (bytes read + bytes
written per second). For each batch size the script builds B requests of ``--context``
cached tokens by hand (consecutive pages, zero KV), then times ``--steps`` steps two ways:

* ``GPU ms``: CUDA events around the forward pass alone (graph replay, or the eager
  model), so launch gaps count but the CPU's batch preparation does not;
* ``step ms``: wall time of a whole step as the scheduler runs it: attention metadata,
  the forward pass, the argmax, and a wait for the result.

``kernels`` counts the GPU kernels of one forward pass (``torch.profiler``, copies left
out): at batch 1 the step's time follows this count more than its bytes (chapter 19).

The KV written by each step goes to the same slot every time, so the context stays fixed.
Mirrors upstream ``minisgl.benchmark.perf`` (kernel timing); upstream's README reports
offline and online throughput, no decode step time.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Dict, List

import torch

from minisgl.core import Batch
from minisgl.engine import Engine, EngineConfig
from minisgl.utils import div_ceil

from .common import format_table, measure_copy_bandwidth
from .manual import build_batch, place


def weight_bytes(engine: Engine) -> int:
    """Bytes of all weights, each tensor once (a tied LM head shares the embedding)."""
    seen: Dict[int, int] = {}
    for t in engine.model.state_dict().values():
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def kv_bytes_per_token(engine: Engine) -> int:
    mc = engine.config.model_config
    return 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * engine.dtype.itemsize


def make_decode_batch(engine: Engine, bs: int, context: int) -> Batch:
    """``bs`` requests in rows ``0..bs-1``, each with ``context`` cached tokens on its own
    consecutive pages, about to decode one token at position ``context``."""
    reqs = place(engine, [[0] * (context + 1)] * bs, max_new_tokens=1)
    for req in reqs:
        req.cached_len = context  # the pool's KV (zeros) stands for an already computed context
    return build_batch(engine, reqs, "decode")


def time_steps(engine: Engine, batch: Batch, steps: int, use_graph: bool) -> tuple[float, float]:
    """``(GPU ms, step ms)`` per step, averaged over ``steps`` after 3 warm-up steps."""
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(steps)
    ]
    for i in range(-3, steps):
        if i == 0:
            torch.cuda.synchronize(engine.device)
            wall_start = time.perf_counter()
        engine.attn_backend.prepare_metadata(batch)
        with engine.ctx.forward_batch(batch):
            if i >= 0:
                events[i][0].record()
            logits = engine.graph_runner.replay(batch) if use_graph else engine.model.forward()
            if i >= 0:
                events[i][1].record()
        next_tokens = logits[: batch.size].argmax(dim=-1)
        next_tokens.to("cpu", non_blocking=True)
    torch.cuda.synchronize(engine.device)
    wall_ms = (time.perf_counter() - wall_start) * 1e3 / steps
    gpu_ms = sum(a.elapsed_time(b) for a, b in events) / steps
    return gpu_ms, wall_ms


def count_kernels(engine: Engine, batch: Batch) -> int:
    """GPU kernels launched by one eager forward pass of ``batch`` (memory copies and sets
    not counted), as ``torch.profiler`` records them."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    engine.attn_backend.prepare_metadata(batch)
    with engine.ctx.forward_batch(batch):
        engine.model.forward()  # FlashInfer plans in the first layer: keep that out of the count
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.model.forward()
            torch.cuda.synchronize(engine.device)
    return sum(
        1
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
    )


def add_batch_args(p: argparse.ArgumentParser, batch_sizes: List[int]) -> None:
    """The options the decode-step benchmarks share: the model, the batch sizes, each
    request's cached context, the page size and the attention backend."""
    p.add_argument("--model", default=os.environ.get("MINISGL_MODEL", "models/qwen3-0.6b-shaped"))
    p.add_argument("--batch-sizes", type=int, nargs="+", default=batch_sizes)
    p.add_argument("--context", type=int, default=1024, help="cached tokens per request")
    p.add_argument("--page-size", type=int, default=256)
    p.add_argument("--attention-backend", default="auto")


def build_engine(args: argparse.Namespace) -> Engine:
    """A bf16 engine with just enough pages for the largest batch's contexts and a graph for
    every batch size asked for."""
    max_bs = max(args.batch_sizes)
    pages = max_bs * div_ceil(args.context + 2, args.page_size)  # context, the new token, one spare
    return Engine(
        EngineConfig(
            args.model,
            dtype=torch.bfloat16,
            device="cuda",
            page_size=args.page_size,
            max_running_req=max_bs,
            num_page_override=pages,
            max_seq_len_override=args.context + 64,
            attention_backend=args.attention_backend,
            cuda_graph_bs=tuple(args.batch_sizes),
        )
    )


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_batch_args(p, [1, 8, 64, 256])
    p.add_argument("--steps", type=int, default=50)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decode_step measures GPU time: it needs CUDA")

    engine = build_engine(args)
    startup = engine.startup_seconds
    bandwidth = measure_copy_bandwidth(engine.device)
    w_bytes, kv_token = weight_bytes(engine), kv_bytes_per_token(engine)
    graphs = bool(engine.graph_runner.graphs)
    print(
        f"model {args.model}: weights {w_bytes / 2**20:.0f} MiB, KV {kv_token / 1024:.0f} KiB per token; "
        f"attention {type(engine.attn_backend).__name__}; copy bandwidth {bandwidth / 1e12:.2f} TB/s"
    )
    print("start-up, s: " + ", ".join(f"{k} {v:.1f}" for k, v in startup.items()))

    rows = []
    with torch.inference_mode():
        for bs in args.batch_sizes:
            batch = make_decode_batch(engine, bs, args.context)
            on = time_steps(engine, batch, args.steps, use_graph=True) if graphs else None
            off = time_steps(engine, batch, args.steps, use_graph=False)
            floor_ms = (w_bytes + bs * (args.context + 1) * kv_token) / bandwidth * 1e3
            fmt = lambda t: f"{t[0]:.3f} / {t[1]:.3f}" if t else "-"  # noqa: E731
            rows.append(
                [
                    bs,
                    args.context,
                    count_kernels(engine, batch),
                    fmt(on),
                    fmt(off),
                    f"{floor_ms:.3f}",
                    f"{on[0] / floor_ms:.2f}x" if on else "-",
                ]
            )
    print(
        format_table(
            [
                "batch",
                "context",
                "kernels",
                "graphs on: GPU / step ms",
                "graphs off: GPU / step ms",
                "floor ms",
                "graphs GPU / floor",
            ],
            rows,
        )
    )
    engine.shutdown()


if __name__ == "__main__":
    main()
