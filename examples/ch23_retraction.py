"""Chapter 23: admission on an estimate of future tokens, and retraction when it runs out.

Part 1 runs SmolLM2 with a pool of only 9 pages of 4 tokens and three requests of 14 output
tokens, retraction on: each step's batch, free pages and new-token ratio, and every
retraction as it happens; then the outputs beside a run that reserves everything and
beside Hugging Face. Part 2 is the starvation case: two requests that may run to the
context (the default max_tokens) and a 4-token one behind them, with and without
retraction; it prints when the short one finishes.

    python examples/ch23_retraction.py [--model PATH] [--device cpu|cuda]
"""

# output: mask \d+\.\d+ s

import argparse
import os
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM
from minisgl.scheduler.retract import RetractedReq

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu", help="cpu or cuda (the torch backend on both)")
args = parser.parse_args()
ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # one batch at a time, so the trace reads in order


def make_llm(num_pages: int, max_seq_len: int, retract: bool) -> LLM:
    return LLM(
        args.model,
        dtype=torch.float32,
        device=args.device,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=num_pages,
        page_size=4,
        max_seq_len_override=max_seq_len,
        cache_type="radix",
        enable_retraction=retract,
    )


# ---- part 1: a pool too small for the estimate ------------------------------------------------
print("part 1: SmolLM2, 9 pages x 4 tokens, three requests of 14 output tokens, retraction on")
llm = make_llm(num_pages=9, max_seq_len=64, retract=True)
original_forward = llm._forward
reported: set = set()


def traced_forward(forward_input):
    batch = forward_input.batch
    detail = " ".join(f"uid{r.uid}[{r.cached_len},{r.device_len})" for r in batch.reqs)
    ratio = llm.retract_manager.new_token_ratio.value
    output = original_forward(forward_input)
    print(
        f"  {batch.phase:<7} {detail:<34} free pages {llm.cache_manager.num_free_pages}/9, "
        f"new_token_ratio {ratio:.3f}"
    )
    for p in llm.prefill_manager.pending_list:
        if isinstance(p, RetractedReq) and id(p) not in reported:
            reported.add(id(p))
            print(
                f"  -> uid{p.uid} retracted before this step: back at the head of the queue "
                f"with {p.input_len} tokens (prompt + output so far), {p.output_len} to go"
            )
    return output


llm._forward = traced_forward
prompts = ["The capital of France is", "Once upon a time,", "List three prime numbers:"]
params = SamplingParams(max_tokens=14, ignore_eos=True)
retracted_out = [o["token_ids"] for o in llm.generate(prompts, params)]
llm.cache_manager.check_integrity()
llm.shutdown()

reserve_all = make_llm(num_pages=9, max_seq_len=64, retract=False)
plain_out = [o["token_ids"] for o in reserve_all.generate(prompts, params)]
reserve_all.shutdown()
tokenizer = AutoTokenizer.from_pretrained(args.model)
hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device)
for prompt, got, plain in zip(prompts, retracted_out, plain_out):
    x = tokenizer(prompt, return_tensors="pt").input_ids.to(args.device)
    ref = hf.generate(x, max_new_tokens=14, min_new_tokens=14, do_sample=False)[0, x.shape[1] :]
    print(
        f"  {prompt!r:<28} -> {tokenizer.decode(got)!r:<44} same as reserving all: "
        f"{got == plain}, as HF: {got == ref.tolist()}"
    )

# ---- part 2: the starvation case ---------------------------------------------------------------
CONTEXT = 64
print(f"\npart 2: a context of {CONTEXT} tokens, 30 pages x 4 = 120 tokens (1.9 contexts)")
long_params = SamplingParams(ignore_eos=True)  # max_tokens left at its default: up to the context
short_params = SamplingParams(max_tokens=4, ignore_eos=True)
starve_prompts = ["Write a long story about a dragon.", "Describe the sea at night.", "Hi!"]
for retract in (False, True):
    llm = make_llm(num_pages=30, max_seq_len=CONTEXT, retract=retract)
    steps, short_done = [0], {}
    forward, send = llm._forward, llm.send_result

    def counting_forward(forward_input, forward=forward):
        steps[0] += 1
        return forward(forward_input)

    def watching_send(reply, send=send):
        for msg in reply:
            if msg.uid == 2 and msg.finished:  # the short request (uids count from 0)
                short_done.update(step=steps[0], seconds=time.perf_counter() - start)
        send(reply)

    llm._forward, llm.send_result = counting_forward, watching_send
    start = time.perf_counter()
    out = llm.generate(starve_prompts, [long_params, long_params, short_params])
    lengths = [len(o["token_ids"]) for o in out]
    print(
        f"  retraction {'on ' if retract else 'off'}: the short request finished at step "
        f"{short_done['step']:>3} ({short_done['seconds']:.2f} s); all done at step {steps[0]}, "
        f"outputs of {lengths} tokens"
    )
    llm.cache_manager.check_integrity()
    llm.shutdown()
