"""What the scheduler trace recorder costs when it is on: chapter 7's requests, timed with
and without a ``TraceRecorder`` attached (minisgl/scheduler/trace.py).

    python -m minisgl.benchmark.trace_cost [--model PATH] [--device cpu|cuda] [--runs 7]
                                       [--requests N] [--max-tokens N]

One ``LLM`` (the naive cache, the plain loop, the torch backend on the CPU)
runs the same ``generate`` ``--runs`` times each way, alternating (off, on, off, on, ...) so
that a drifting machine moves both; one warm-up run first is not counted. Prints the median
seconds of each, their ratio, and the time spent in the recorder's hooks themselves
(``TraceRecorder.overhead_s``, which the machine's noise does not blur); the outputs must be equal both ways
(exit status 1 otherwise). With the recorder off the scheduler runs its own methods: the
recorder is detached after each timed run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List

import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV  # +ch11
from minisgl.llm import LLM
from minisgl.scheduler.trace import TraceRecorder

SUBJECTS = [
    "The capital of France is",
    "List three prime numbers:",
    "def fibonacci(n):",
    "1 + 1 =",
    "Once upon a time,",
]


def parse_args(argv: List[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=7, help="timed runs each way")
    parser.add_argument("--requests", type=int, default=5, help="requests per generate")
    parser.add_argument("--max-tokens", type=int, default=0, help="0: chapter 7's 6, 3, 5, 1, 2")
    return parser.parse_args(argv)


def timed(llm: LLM, prompts: List[str], params: List[SamplingParams], record: bool, cuda: bool):
    """One ``generate``: (seconds, token ids, steps recorded, the recorder's own seconds)."""
    recorder = TraceRecorder.attach(llm) if record else None
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = [o["token_ids"] for o in llm.generate(prompts, params)]
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    steps, overhead = 0, 0.0
    if recorder is not None:
        recorder.detach()
        steps, overhead = len(recorder.steps), recorder.overhead_s
    return seconds, outputs, steps, overhead


def main(argv: List[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = args.device.startswith("cuda")
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # +ch11
    llm = LLM(
        args.model,
        dtype=torch.bfloat16 if cuda else torch.float32,
        device=args.device,
        attention_backend="auto" if cuda else "torch",
        max_running_req=max(8, args.requests),
        num_page_override=4096,
        max_seq_len_override=512,
        cache_type="naive",  # +ch09
    )
    prompts = [SUBJECTS[i % len(SUBJECTS)] for i in range(args.requests)]
    lengths = [args.max_tokens or [6, 3, 5, 1, 2][i % 5] for i in range(args.requests)]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]

    timed(llm, prompts, params, False, cuda)  # warm-up: first-call allocations
    times: Dict[bool, List[float]] = {False: [], True: []}
    results: Dict[bool, list] = {}
    steps, overheads = 0, []
    for _ in range(args.runs):
        for record in (False, True):
            seconds, outputs, n, overhead = timed(llm, prompts, params, record, cuda)
            times[record].append(seconds)
            results[record] = outputs
            if record:
                steps, overheads = n, overheads + [overhead]
    llm.shutdown()
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"{args.requests} requests, {sum(lengths)} output tokens, {steps} steps, {args.device}: "
        f"generate takes {1000 * off:.1f} ms without the recorder, {1000 * on:.1f} ms with it "
        f"(median of {args.runs} alternating runs each), {on / off:.3f}x"
    )
    spent = statistics.median(overheads)
    print(
        f"the recorder's own time (its hooks, outside the methods they wrap): "
        f"{1000 * spent:.1f} ms a run, {1000 * spent / max(steps, 1):.2f} ms a step, "
        f"{100 * spent / on:.1f}% of generate"
    )
    same = results[False] == results[True]
    print(f"same outputs with and without the recorder: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
