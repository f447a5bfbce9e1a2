"""What the benchmarks share: CUDA-event timers, the copy bandwidth, plain-text tables.

A GPU kernel of a few microseconds cannot be timed by the host's clock, nor one launch at a
time: ``graph_time_us`` captures a list of calls into one CUDA graph and times its replays
with CUDA events, which is also how the engine runs a decode step (chapter 18);
``cuda_time_ms`` times eager calls the same way, after a warm-up in which kernels compile.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import torch


def graph_time_us(calls: List[Callable[[], torch.Tensor]], replays: int) -> float:
    """Microseconds per call: ``calls`` captured once, in order, into a CUDA graph that is
    replayed ``replays`` times after a warm-up (compilation happens before capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * len(calls))


def cuda_time_ms(fn: Callable[[], object], iters: int, warmup: int = 3) -> float:
    """Milliseconds per call of ``fn``, eager, between two CUDA events after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def measure_copy_bandwidth(
    device: torch.device, num_bytes: int = 1 << 30, iters: int = 20
) -> float:
    """Device memory bandwidth in bytes/s: ``2 * num_bytes`` moved per copy (read + write)."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    del src, dst
    return 2 * num_bytes * iters / seconds


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with right-aligned columns (numbers line up), as a string."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)
