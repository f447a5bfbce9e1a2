"""Chapter 7: the offline interface serving requests that arrive over time, batch by batch.

The prompts reach the scheduler at different steps, as they would at a server, and ask for different numbers of tokens: a request that arrives while others
decode is prefilled at the next step and then joins their batch, and a request that has
all its tokens leaves it at once. That is continuous batching. Every output is compared with
Hugging Face generating each prompt on its own.

    python examples/ch07_scheduler.py [--model PATH] [--device cpu|cuda] [--plot timeline.png]
        [--trace trace.json]   (then: python -m tools.trace_view trace.json)
"""
# output: trace

import argparse
import os
from typing import Dict, List, Tuple

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.env import ENV  # +ch11
from minisgl.llm import LLM

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu", help="cpu or cuda (the torch backend on both)")
parser.add_argument("--plot", metavar="FILE", help="also draw the batch timeline to FILE (png/svg)")
parser.add_argument("--trace", metavar="FILE", help="record the scheduler's steps to FILE (JSON)")
args = parser.parse_args()

ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # the plain loop  # +ch11
llm = LLM(
    args.model,
    dtype=torch.float32,
    device=args.device,
    attention_backend="torch",
    max_running_req=8,
    num_page_override=1024,
    max_seq_len_override=512,
    cache_type="naive",  # +ch09
)

prompts = [
    "The capital of France is",
    "List three prime numbers:",
    "def fibonacci(n):",
    "1 + 1 =",
    "Once upon a time,",
]
lengths = [6, 3, 5, 1, 2]  # max_tokens: the short requests finish and leave first
arrivals = [0, 0, 2, 4, 4]  # the step at which each prompt reaches the scheduler

steps: List[Tuple[str, List[Tuple[int, int]]]] = []  # (phase, [(uid, extend_len)]) per step
arrived: Dict[int, List[int]] = {}  # step -> uids received just before it
original_receive_msg = llm.receive_msg
original_forward = llm._forward


def receive_on_arrival(blocking=False):
    # Hand over only the prompts whose step has come, as a server's socket would; the
    # others wait in LLM's list (uid i is prompt i: this LLM runs one generate).
    due = sum(step <= len(steps) for step in arrivals) - llm.counter
    if blocking and due == 0 and llm.pending_requests:
        due = 1  # nothing runs: a server would block until the next request comes
    later = llm.pending_requests[due:]
    llm.pending_requests = llm.pending_requests[:due]
    msgs = original_receive_msg(blocking)
    llm.pending_requests += later
    arrived.setdefault(len(steps), []).extend(msg.uid for msg in msgs)
    return msgs


def traced_forward(forward_input):
    batch = forward_input.batch
    step = len(steps)
    steps.append((batch.phase, [(r.uid, r.extend_len) for r in batch.reqs]))
    detail = ", ".join(f"uid{r.uid}:{r.extend_len}" for r in batch.reqs)
    tokens = len(batch.positions)
    line = f"  {step}  {batch.phase:<7} bs={batch.size}  tokens={tokens:<3} [{detail}]"
    if arrived.get(step):
        line = f"{line:<50} <- {', '.join(f'uid{u}' for u in arrived[step])} arrived"
    print(line)
    return original_forward(forward_input)


llm.receive_msg = receive_on_arrival
llm._forward = traced_forward
if args.trace:  # attached last: it wraps the printing hooks above
    from minisgl.scheduler.trace import TraceRecorder

    recorder = TraceRecorder.attach(llm)
print("the scheduling trace (step, phase, batch size, tokens fed, [uid:tokens]):")
outputs = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths])

tokenizer = AutoTokenizer.from_pretrained(args.model)
hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(llm.device)
for prompt, n, out in zip(prompts, lengths, outputs):
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(llm.device)
    ref = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)[
        0, ids.shape[1] :
    ].tolist()
    print(f"{prompt!r:<27} -> {out['text']!r:<24} matches HF: {out['token_ids'] == ref}")
print(
    f"afterwards: {llm.table_manager.available_size} of 8 table rows free, "
    f"{llm.cache_manager.num_free_pages} of {llm.engine.num_pages} KV pages free"
)
if args.trace:
    recorder.save(
        args.trace, run="the example's one run", example="ch07_scheduler", prompts=prompts
    )
llm.shutdown()

if args.plot:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    colors = {"prefill": "#e4572e", "decode": "#4c9be8"}
    fig, ax = plt.subplots(figsize=(7, 2.8))
    for step, (phase, reqs) in enumerate(steps):
        for uid, extend in reqs:
            ax.add_patch(plt.Rectangle((step + 0.05, uid - 0.4), 0.9, 0.8, color=colors[phase]))
            ax.text(
                step + 0.5, uid, str(extend), ha="center", va="center", fontsize=8, color="white"
            )
    for uid, step in enumerate(arrivals):  # a request reaches the scheduler at its step's start
        ax.plot(step, uid, marker=">", color="black", markersize=6, clip_on=False)
    ax.set_xlim(0, len(steps))
    ax.set_ylim(len(prompts) - 0.5, -0.5)
    ax.set_xticks([s + 0.5 for s in range(len(steps))], [str(s) for s in range(len(steps))])
    ax.set_yticks(range(len(prompts)), [f"uid{u} (max_tokens={n})" for u, n in enumerate(lengths)])
    ax.set_xlabel("scheduler step (numbers: tokens fed to the model)")
    arrival = Line2D([], [], marker=">", color="black", linestyle="none", label="arrives")
    ax.legend(
        handles=[Patch(color=c, label=p) for p, c in colors.items()] + [arrival],
        loc="lower right",
        fontsize=8,
    )
    ax.set_title("continuous batching: requests join and leave the running batch")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=150)
    print(f"timeline written to {args.plot}")
