"""Decode step time under tensor parallelism, and how much of it the collectives take.

    python -m minisgl.benchmark.tp_decode --model models/qwen3-0.6b-shaped --tp 2
    python -m minisgl.benchmark.tp_decode --tp 1 --batch-sizes 1 64     # the same table, one GPU

One process per rank (rank ``r`` on GPU ``r``), each with its own ``Engine``. For each
batch size every rank builds the same decode batch (``decode_step.make_decode_batch``)
and the table gives, as rank 0 measured them:

* ``step ms``: one decode forward pass (CUDA-graph replay when captured), CUDA events;
* ``collectives ms``: the same step's collectives alone, issued back to back with the
  step's shapes: one all-reduce ``[B, hidden]`` for the embedding, two per layer
  (attention's ``o_proj`` and the MLP's ``down_proj``), and the LM head's all-gather of
  ``[ceil(V / tp), B]`` logits; ``share`` is their part of the step.

The collectives run eagerly here, so their time includes one launch each; inside the
captured graph they cost less. With ``--tp 1`` there are none. On the CPU (gloo) the
same runs with wall-clock timing, for a smoke test only. Upstream has no such script;
its README reports TP throughput only.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Callable, List

import torch
import torch.multiprocessing as mp

from minisgl.distributed import DistributedCommunicator, DistributedInfo
from minisgl.engine import Engine, EngineConfig
from minisgl.utils import div_ceil
from minisgl.utils.mp import new_ipc_dir

from .decode_step import make_decode_batch
from .workload import format_table


def _timed(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Milliseconds per call of ``fn``, after 3 untimed calls."""
    for _ in range(3):
        fn()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters


def step_collectives(engine: Engine, bs: int) -> Callable[[], None]:
    """A function that issues one decode step's collectives, with its shapes and dtype."""
    mc, tp = engine.config.model_config, engine.config.tp_info.size
    comm = DistributedCommunicator()
    hidden = torch.zeros(bs, mc.hidden_size, dtype=engine.dtype, device=engine.device)
    logits_t = torch.zeros(div_ceil(mc.vocab_size, tp), bs, dtype=engine.dtype, device=engine.device)

    def run() -> None:
        if tp == 1:
            return
        for _ in range(1 + 2 * mc.num_layers):
            comm.all_reduce(hidden)
        comm.all_gather(logits_t)

    return run


def _rank_main(rank: int, args: argparse.Namespace, addr: str) -> None:
    device = "cuda" if args.device == "cuda" else "cpu"
    max_bs = max(args.batch_sizes)
    pages = max_bs * div_ceil(args.context + 2, args.page_size)
    engine = Engine(EngineConfig(
        args.model, tp_info=DistributedInfo(rank, args.tp), distributed_addr=addr,
        dtype=torch.bfloat16 if device == "cuda" else torch.float32, device=device, page_size=args.page_size,
        max_running_req=max_bs, num_page_override=pages, max_seq_len_override=args.context + 64,
        attention_backend=args.attention_backend, cuda_graph_bs=tuple(args.batch_sizes),
    ))
    rows = []
    with torch.inference_mode():
        for bs in args.batch_sizes:
            batch = make_decode_batch(engine, bs, args.context)
            use_graph = engine.graph_runner.can_use_cuda_graph(batch)

            def step() -> None:
                engine.attn_backend.prepare_metadata(batch)
                with engine.ctx.forward_batch(batch):
                    engine.graph_runner.replay(batch) if use_graph else engine.model.forward()

            step_ms = _timed(step, engine.device, args.steps)
            comm_ms = _timed(step_collectives(engine, bs), engine.device, args.steps)
            rows.append([bs, "yes" if use_graph else "no", f"{step_ms:.3f}", f"{comm_ms:.3f}",
                         f"{comm_ms / step_ms:.0%}"])
    if rank == 0:
        mc = engine.config.model_config
        print(f"model {args.model}: {mc.num_layers} layers, hidden {mc.hidden_size}, vocab {mc.vocab_size}; "
              f"tp {args.tp} on {engine.device.type}; {1 + 2 * mc.num_layers} all-reduces and 1 all-gather per step")
        print(format_table(["batch", "graph", "step ms", "collectives ms", "share"], rows), flush=True)
    engine.shutdown()


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.environ.get("MINISGL_MODEL", "models/qwen3-0.6b-shaped"))
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--context", type=int, default=1024, help="cached tokens per request")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--page-size", type=int, default=256)
    p.add_argument("--attention-backend", default="auto")
    args = p.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < args.tp:
        raise SystemExit(f"--tp {args.tp} needs {args.tp} GPUs; this machine has {torch.cuda.device_count()}")
    addr = f"file://{new_ipc_dir()}/distributed"
    mp.start_processes(_rank_main, args=(args, addr), nprocs=args.tp, start_method="spawn", join=True)


if __name__ == "__main__":
    main()
