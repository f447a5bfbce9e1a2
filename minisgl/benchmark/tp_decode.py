"""Decode step time under tensor parallelism, and how much of it the collectives take.

    python -m minisgl.benchmark.tp_decode --model models/qwen3-0.6b-shaped --tp 2
    python -m minisgl.benchmark.tp_decode --tp 1 --batch-sizes 1 64     # the same table, one GPU

One process per rank (rank ``r`` on GPU ``r``), each with its own ``Engine``. For each
batch size every rank builds the same decode batch (``decode_step.make_decode_batch``)
and the table gives, as rank 0 measured them with CUDA events:

* ``step ms``: one decode forward pass, a CUDA-graph replay when captured;
* ``no-comm step ms``: the same step with every collective replaced by a local stand-in
  of the same shape (the graphs are captured again for it, and again for ``step ms``,
  so that both columns time graphs captured the same way). Each rank then computes
  alone, so the outputs are wrong, but ``step - no-comm step`` is what the collectives
  cost inside a real step, waiting for the slower rank included: the ``comm ms`` and
  ``share`` columns;
* ``collectives alone ms``: the step's collectives by themselves, captured in one CUDA
  graph and replayed: one all-reduce ``[B, hidden]`` for the embedding, two per layer
  (attention's ``o_proj`` and the MLP's ``down_proj``), and the LM head's all-gather of
  ``[ceil(V / tp), B]`` logits. (Issued eagerly instead, each would pay a launch and a
  CPU round trip, several times its cost in a graph.)

With ``--tp 1`` there are no collectives and the columns agree. On the CPU (gloo, no
graphs, wall-clock timing) the same runs as a smoke test only. Upstream has no such
script; its README reports TP throughput only.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Callable, Iterator, List

import torch
import torch.multiprocessing as mp

from minisgl.distributed import DistributedCommunicator, DistributedInfo, get_tp_info
from minisgl.engine import Engine, EngineConfig
from minisgl.engine.graph import GraphRunner
from minisgl.utils import div_ceil
from minisgl.utils.mp import new_ipc_dir

from .common import format_table
from .decode_step import add_batch_args, make_decode_batch


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
    logits_t = torch.zeros(
        div_ceil(mc.vocab_size, tp), bs, dtype=engine.dtype, device=engine.device
    )

    def run() -> None:
        if tp == 1:
            return
        for _ in range(1 + 2 * mc.num_layers):
            comm.all_reduce(hidden)
        comm.all_gather(logits_t)

    return run


def in_graph(fn: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """``fn`` captured once in a CUDA graph; the returned function replays it (CUDA only)."""
    if device.type != "cuda":
        return fn
    fn()  # NCCL sets up its communicator for these shapes before capture
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


@contextlib.contextmanager
def collectives_off() -> Iterator[None]:
    """Every ``DistributedCommunicator`` returns a local tensor of the right shape instead of
    talking to the other ranks (wrong values, same kernels otherwise)."""
    saved = DistributedCommunicator.all_reduce, DistributedCommunicator.all_gather
    DistributedCommunicator.all_reduce = lambda self, x: x  # type: ignore[method-assign]
    DistributedCommunicator.all_gather = (  # type: ignore[method-assign]
        lambda self, x: x.repeat(get_tp_info().size, *[1] * (x.dim() - 1))
    )
    try:
        yield
    finally:
        DistributedCommunicator.all_reduce, DistributedCommunicator.all_gather = saved  # type: ignore[method-assign]


def recapture(engine: Engine) -> None:
    """Capture the engine's decode graphs again (after ``collectives_off`` changed what they run)."""
    old = engine.graph_runner
    if not old.graph_bs:
        return
    old.destroy()
    engine.graph_runner = GraphRunner(
        engine.model,
        engine.attn_backend,
        engine.stream,
        engine.device,
        engine.dummy_req,
        old.graph_bs,
        engine.page_table.shape[1],
    )


def time_steps(engine: Engine, args: argparse.Namespace) -> List[float]:
    """Milliseconds per decode step at each of ``args.batch_sizes``."""
    times = []
    for bs in args.batch_sizes:
        batch = make_decode_batch(engine, bs, args.context)
        use_graph = engine.graph_runner.can_use_cuda_graph(batch)

        def step() -> None:
            engine.attn_backend.prepare_metadata(batch)
            with engine.ctx.forward_batch(batch):
                engine.graph_runner.replay(batch) if use_graph else engine.model.forward()

        times.append(_timed(step, engine.device, args.steps))
    return times


def _rank_main(rank: int, args: argparse.Namespace, addr: str) -> None:
    device = "cuda" if args.device == "cuda" else "cpu"
    max_bs = max(args.batch_sizes)
    pages = max_bs * div_ceil(args.context + 2, args.page_size)
    engine = Engine(
        EngineConfig(
            args.model,
            tp_info=DistributedInfo(rank, args.tp),
            distributed_addr=addr,
            dtype=torch.bfloat16 if device == "cuda" else torch.float32,
            device=device,
            page_size=args.page_size,
            max_running_req=max_bs,
            num_page_override=pages,
            max_seq_len_override=args.context + 64,
            attention_backend=args.attention_backend,
            cuda_graph_bs=tuple(args.batch_sizes),
        )
    )
    with torch.inference_mode():
        graphed = [bs in engine.graph_runner.graphs for bs in args.batch_sizes]
        alone_ms = [
            _timed(in_graph(step_collectives(engine, bs), engine.device), engine.device, args.steps)
            for bs in args.batch_sizes
        ]
        # both timed steps run recaptured graphs: a recapture alone moved a tp=1 step by ~0.15 ms
        with collectives_off():
            recapture(engine)
            no_comm_ms = time_steps(engine, args)
        recapture(engine)
        step_ms = time_steps(engine, args)
    if rank == 0:
        mc = engine.config.model_config
        print(
            f"model {args.model}: {mc.num_layers} layers, hidden {mc.hidden_size}, vocab {mc.vocab_size}; "
            f"tp {args.tp} on {engine.device.type}; {1 + 2 * mc.num_layers} all-reduces and 1 all-gather per step"
        )
        rows = [
            [
                bs,
                "yes" if g else "no",
                f"{s:.3f}",
                f"{n:.3f}",
                f"{s - n:.3f}",
                f"{(s - n) / s:.0%}",
                f"{a:.3f}",
            ]
            for bs, g, s, n, a in zip(args.batch_sizes, graphed, step_ms, no_comm_ms, alone_ms)
        ]
        print(
            format_table(
                [
                    "batch",
                    "graph",
                    "step ms",
                    "no-comm step ms",
                    "comm ms",
                    "share",
                    "collectives alone ms",
                ],
                rows,
            ),
            flush=True,
        )
    engine.shutdown()


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_batch_args(p, [1, 8, 64, 256])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"]
    )
    p.add_argument("--steps", type=int, default=50)
    args = p.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < args.tp:
        raise SystemExit(
            f"--tp {args.tp} needs {args.tp} GPUs; this machine has {torch.cuda.device_count()}"
        )
    addr = f"file://{new_ipc_dir()}/distributed"
    mp.start_processes(
        _rank_main, args=(args, addr), nprocs=args.tp, start_method="spawn", join=True
    )


if __name__ == "__main__":
    main()
