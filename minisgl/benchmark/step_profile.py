"""Where a decode step's GPU time goes: its kernels, grouped, from a profiled graph replay.

    python -m minisgl.benchmark.step_profile --batch-sizes 8 64 256
    python -m minisgl.benchmark.step_profile --batch-sizes 8 --top 30 --json prof.json

For each batch size the script builds the decode batch ``decode_step`` builds (B requests of
``--context`` cached tokens), replays its CUDA graph a few times under ``torch.profiler`` and
prints, per kernel name (shortened), how many launches one step makes, their summed GPU
time in microseconds and its share of the step. ``sum`` is the kernels' own durations; the
step's time from CUDA events is beside it, and the difference is time between kernels
(launch gaps and dependency waits inside the graph), negative where kernels overlap
(programmatic dependent launch lets one start before the one before it ends).

Not in upstream, which ships no profiling tool (its ``.gitignore`` lists ``nsys`` reports);
this table comes from ``torch.profiler``, which needs nothing but torch.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from typing import Dict, List

import torch

from minisgl.core import Batch
from minisgl.engine import Engine

from .common import format_table
from .decode_step import add_batch_args, build_engine, make_decode_batch, time_steps

_TEMPLATE_NOISE = re.compile(r"<[^<>]*>|\([^()]*\)")  # innermost first, until none is left


def short_name(name: str) -> str:
    """A kernel's name without its template arguments and parameter list, cut to 60 chars."""
    previous = None
    while previous != name:
        previous, name = name, _TEMPLATE_NOISE.sub("", name)
    name = name.replace("void ", "").strip()
    return name[:60]


def profile_replays(engine: Engine, batch: Batch, replays: int) -> Dict[str, List[float]]:
    """``{kernel name: [launches per step, summed µs per step]}`` over ``replays`` replays."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    engine.attn_backend.prepare_metadata(batch)
    with engine.ctx.forward_batch(batch):
        engine.graph_runner.replay(batch)
        torch.cuda.synchronize(engine.device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                engine.graph_runner.replay(batch)
            torch.cuda.synchronize(engine.device)
    table: Dict[str, List[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in prof.events():
        if e.device_type != DeviceType.CUDA or e.name.startswith(("Memcpy", "Memset")):
            continue
        row = table[short_name(e.name)]
        row[0] += 1 / replays
        row[1] += e.device_time / replays
    return dict(table)


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_batch_args(p, [8, 64, 256])
    p.add_argument("--replays", type=int, default=5)
    p.add_argument("--top", type=int, default=15, help="kernel names shown per batch size")
    p.add_argument("--json", help="write every batch size's whole table here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("step_profile profiles GPU kernels: it needs CUDA")

    engine = build_engine(args)
    record = {}
    with torch.inference_mode():
        for bs in args.batch_sizes:
            batch = make_decode_batch(engine, bs, args.context)
            step_ms = time_steps(engine, batch, 20, use_graph=True)[0]
            table = profile_replays(engine, batch, args.replays)
            total = sum(us for _, us in table.values())
            launches = sum(n for n, _ in table.values())
            ranked = sorted(table.items(), key=lambda kv: -kv[1][1])
            print(
                f"\nbatch {bs}, context {args.context}: step {step_ms * 1e3:.0f} µs (CUDA events), "
                f"kernels {launches:.0f}, their sum {total:.0f} µs, "
                f"between them {step_ms * 1e3 - total:.0f} µs"
            )
            rows = [
                [name, f"{n:.0f}", f"{us:.1f}", f"{us / n:.2f}", f"{100 * us / total:.1f}%"]
                for name, (n, us) in ranked[: args.top]
            ]
            print(format_table(["kernel", "per step", "µs", "µs each", "share"], rows))
            record[bs] = {"step_us": step_ms * 1e3, "kernels": dict(ranked)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    engine.shutdown()


if __name__ == "__main__":
    main()
