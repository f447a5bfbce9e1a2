"""Chapter 10: chunked prefill. With ``max_extend_tokens=16`` a step computes at most 16
prompt tokens, so a long prompt is prefilled in chunks: each chunk samples nothing and
the rest of the prompt continues first in the next step.

Prints every step's batch (the positions each request computes), then checks that the
chunked run gives the same tokens as prefilling in one go and as Hugging Face.

    python examples/ch10_chunked_prefill.py [--model PATH] [--device cpu|cuda] [--trace FILE]
"""
# output: trace

import argparse
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.env import ENV  # +ch11
from minisgl.llm import LLM
from minisgl.scheduler.prefill import ChunkedReq

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu", help="cpu or cuda (the torch backend on both)")
parser.add_argument("--trace", metavar="FILE", help="record the scheduler's steps to FILE (JSON)")
args = parser.parse_args()

prompts = [
    "Here is a short story about a lighthouse keeper who lived alone on a rocky island far from "
    "the coast, and who one stormy night saw a small boat struggling in the waves. The story:",
    "The capital of France is",
    "Once upon a time, in a land far away, there lived",
]
params = SamplingParams(max_tokens=6, ignore_eos=True)
ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # +ch11


def run(budget, trace):
    llm = LLM(
        args.model,
        dtype=torch.float32,
        device=args.device,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=512,
        max_seq_len_override=256,
        cache_type="naive",
        max_extend_tokens=budget,
    )
    original = llm._forward

    def traced(forward_input):
        batch = forward_input.batch
        parts = []
        for r in batch.reqs:
            if isinstance(r, ChunkedReq):
                what = " chunk, samples nothing"
            elif batch.is_prefill:
                what = " last chunk, samples" if r.cached_len > 0 else " whole prompt, samples"
            else:
                what = ""
            parts.append(f"uid{r.uid} [{r.cached_len}, {r.device_len}){what}")
        print(f"  {batch.phase:<7} {len(batch.positions):>2} tokens: " + "; ".join(parts))
        return original(forward_input)

    if trace:
        llm._forward = traced
        lengths = [len(llm.tokenizer.encode(p)) for p in prompts]
        print(f"max_extend_tokens={budget}: prompts of {lengths} tokens")
    recorder = None
    if trace and args.trace:  # the chunked run
        from minisgl.scheduler.trace import TraceRecorder

        recorder = TraceRecorder.attach(llm)
    outputs = [o["token_ids"] for o in llm.generate(prompts, params)]
    if recorder is not None:
        recorder.save(
            args.trace,
            run=f"the chunked run (max_extend_tokens={budget})",
            example="ch10_chunked_prefill",
            prompts=prompts,
        )
    llm.shutdown()
    return outputs


chunked = run(16, trace=True)
one_shot = run(8192, trace=False)
tokenizer = AutoTokenizer.from_pretrained(args.model)
hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device)
for prompt, tokens, whole in zip(prompts, chunked, one_shot):
    x = tokenizer(prompt, return_tensors="pt").input_ids.to(args.device)
    ref = hf.generate(x, max_new_tokens=6, min_new_tokens=6, do_sample=False)[
        0, x.shape[1] :
    ].tolist()
    print(
        f"{prompt[:24]!r:<27} -> {tokenizer.decode(tokens)!r:<26} same as one-shot prefill: "
        f"{tokens == whole}, matches HF: {tokens == ref}"
    )
