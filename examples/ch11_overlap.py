"""Chapter 11: overlap scheduling. The scheduler launches batch N+1 before it handles batch
N's results, so on a GPU the CPU's bookkeeping hides behind the device's compute.

Runs the same requests with overlap off and on and prints, for each, a timeline of when
each batch was launched and when its results were handled, then whether the outputs are
the same and the mean time per step. On the CPU the "device" is this same thread, so the
order changes and the time does not. With ``--device cuda`` the step times show the gain
when the CPU only launches the forward pass; the torch attention backend keeps the CPU busy
launching thousands of small kernels per step, and then there is little left to hide.

    python examples/ch11_overlap.py [--model PATH] [--device cpu|cuda] [--requests N] [--max-tokens N]
        [--attention-backend NAME] [--dtype float32|bfloat16] [--trace FILE]
"""
# output: trace
# output: mask \s*\d+\.\d+ ms
# output: mask overlap is \d+\.\d+x

import argparse
import os
import time

import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu", help="cpu or cuda (the torch backend on both)")
parser.add_argument(
    "--requests", type=int, help="how many requests (default 3 on the CPU, 32 on CUDA)"
)
parser.add_argument(
    "--max-tokens", type=int, help="tokens per request (default 6 on the CPU, 128 on CUDA)"
)
parser.add_argument("--timeline", type=int, default=10, help="timeline lines to print per mode")
parser.add_argument(
    "--attention-backend", help="default: torch on the CPU, auto (the fastest that runs) on CUDA"
)
parser.add_argument("--dtype", help="default: float32 on the CPU, bfloat16 on CUDA")
# >>> ch18
parser.add_argument(
    "--cuda-graph-max-bs", type=int, help="0 turns CUDA graphs off (default: the engine's)"
)
# <<< ch18
parser.add_argument("--trace", metavar="FILE", help="record the scheduler's steps to FILE (JSON)")
args = parser.parse_args()
cuda = args.device.startswith("cuda")
backend = args.attention_backend or ("auto" if cuda else "torch")
dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
n_requests = args.requests or (32 if cuda else 3)
max_tokens = args.max_tokens or (128 if cuda else 6)

subjects = [
    "The capital of France is",
    "Once upon a time,",
    "The best way to learn a language is",
    "In the year 2050, cities will",
    "A good cup of coffee needs",
    "The ocean is deep because",
]
prompts = [
    subjects[i % len(subjects)] + f" (note {i})" * (i // len(subjects)) for i in range(n_requests)
]
params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
llm = LLM(
    args.model,
    dtype=dtype,
    device=args.device,
    attention_backend=backend,
    max_running_req=max(4, n_requests),
    max_seq_len_override=512,
    cache_type="naive",
    cuda_graph_max_bs=args.cuda_graph_max_bs,  # +ch18
)
events = []  # (seconds, "launch" | "results", batch number, phase, batch size)
launched = []  # the batches, in launch order (kept alive, so identity finds their number)
original_forward, original_process = llm._forward, llm._process_last_data


def traced_forward(forward_input):
    batch = forward_input.batch
    launched.append(batch)
    events.append((time.perf_counter(), "launch", len(launched) - 1, batch.phase, batch.size))
    return original_forward(forward_input)


def traced_process(last_data):
    original_process(last_data)
    if last_data is not None:
        batch = last_data[0].batch
        number = next(i for i, b in enumerate(launched) if b is batch)
        events.append((time.perf_counter(), "results", number, batch.phase, batch.size))


llm._forward, llm._process_last_data = traced_forward, traced_process


def run(overlap):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    events.clear()
    launched.clear()
    if args.device != "cpu":
        torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    return [o["token_ids"] for o in outputs], seconds, list(events), start


if cuda:  # the first run on a GPU pays for allocations and kernel loading
    run(True)
results = {}
for overlap in [False, True]:
    recorder = None
    if overlap and args.trace:  # the overlapped run
        from minisgl.scheduler.trace import TraceRecorder

        recorder = TraceRecorder.attach(llm)
    outputs, seconds, timeline, start = run(overlap)
    if recorder is not None:
        recorder.detach()
        recorder.save(
            args.trace, run="the run with overlap on", example="ch11_overlap", prompts=prompts
        )
    results[overlap] = (outputs, seconds, len(launched))
    print(
        f"overlap {'on' if overlap else 'off'}: {len(launched)} batches, first {args.timeline} events"
    )
    handled = set()
    for t, what, n, phase, size in timeline[: args.timeline]:
        note = ""
        if what == "launch" and n > 0 and n - 1 not in handled:
            note = f"   <- before batch {n - 1}'s results are handled"
        if what == "results":
            handled.add(n)
        print(
            f"  {1000 * (t - start):8.1f} ms  {what:<7} batch {n:<3} ({phase}, {size} requests){note}"
        )

(off, t_off, steps_off), (on, t_on, steps_on) = results[False], results[True]
print(f"same outputs with overlap on and off: {off == on}")
print(
    f"mean time per step: overlap off {1000 * t_off / steps_off:.2f} ms, "
    f"on {1000 * t_on / steps_on:.2f} ms ({n_requests} requests x {max_tokens} tokens, {args.device}, "
    f"{type(llm.engine.attn_backend).__name__}, {str(dtype).removeprefix('torch.')})"
)
print(
    f"overlap is {t_off / t_on:.2f}x as fast"
    + ("" if cuda else " (on the CPU nothing runs in parallel, so expect about 1x)")
)
print(f"first reply: {llm.tokenizer.decode(on[0])!r}")
llm.shutdown()
