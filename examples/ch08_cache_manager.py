"""Chapter 8: the CacheManager hands out KV pages and takes them back, and admission
control lets a request in only when every page it will ever need is there.

Part 1 drives the managers by hand, with no model: one request's pages (page size 4) as
it is prefilled, decodes across a page boundary and finishes. Part 2 runs SmolLM2 with
a pool of only 10 pages, printing each step's free pages and the space reserved for the
decoding requests: the third request waits until the first two leave.

    python examples/ch08_cache_manager.py [--model PATH] [--device cpu|cuda] [--trace FILE]
"""
# output: trace

import argparse
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.env import ENV  # +ch11
from minisgl.llm import LLM
from minisgl.message import UserMsg
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import PrefillManager
from minisgl.scheduler.table import TableManager

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu", help="cpu or cuda (the torch backend on both)")
parser.add_argument("--trace", metavar="FILE", help="record the scheduler's steps to FILE (JSON)")
args = parser.parse_args()

# ---- part 1: the managers by hand -------------------------------------------------------------
P = 4
print(f"part 1: a pool of 8 pages of {P} tokens, no model")
page_table = torch.zeros((3, 32), dtype=torch.int32)
table = TableManager(2, page_table)
cache = CacheManager(num_pages=8, page_size=P, page_table=page_table, type="naive")
decode = DecodeManager(P)
prefill = PrefillManager(cache, table, decode)


def pages_of(req):
    """The pages the request's row points at, for its computed positions [0, cached_len)."""
    return sorted(set((page_table[req.table_idx, : req.cached_len] // P).tolist()))


prefill.add_one_req(UserMsg(0, torch.arange(1, 7, dtype=torch.int32), SamplingParams(max_tokens=5)))
req = prefill.schedule_next_batch(prefill_budget=100).reqs[0]
print(f"  admitted uid0: prompt 6 tokens, max_tokens 5, row {req.table_idx}")
for step in range(5):
    before = cache.num_free_pages
    positions = f"[{req.cached_len}, {req.device_len})"
    cache.allocate_paged([req])  # pages for positions [cached_len, device_len) not yet covered
    req.complete_one()  # what the forward pass does: those positions are now cached
    decode.filter_reqs([req])
    print(
        f"  step {step}: positions {positions:<8} -> {before - cache.num_free_pages} new page(s), "
        f"the row points at pages {pages_of(req)}, free pages {cache.num_free_pages}/8"
    )
with cache.lazy_free_region():  # how the scheduler frees: once per result-processing pass
    cache.cache_req(req, finished=True)  # the naive cache keeps nothing: every page comes back
    print(f"  finished: inside lazy_free_region free pages are still {cache.num_free_pages}/8")
table.free(req.table_idx)
print(f"  after the region: free pages {cache.num_free_pages}/8")
cache.check_integrity()
print("  check_integrity: free + cached pages == all pages, none free twice")

# ---- part 2: admission control with a real model ------------------------------------------------
print(f"\npart 2: {os.path.basename(args.model)}, a pool of 10 pages x {P} tokens = 40 tokens")
ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # +ch11
llm = LLM(
    args.model,
    dtype=torch.float32,
    device=args.device,
    attention_backend="torch",
    max_running_req=4,
    num_page_override=10,
    page_size=P,
    max_seq_len_override=256,
    cache_type="naive",  # +ch09
)
original_forward = llm._forward


def traced_forward(forward_input):
    batch = forward_input.batch
    detail = " ".join(f"uid{r.uid}:{r.extend_len}" for r in batch.reqs)
    output = original_forward(forward_input)  # pages were allocated while preparing it
    reserved = llm.decode_manager.inflight_tokens
    line = (
        f"  {batch.phase:<7} [{detail:<13}] free pages {llm.cache_manager.num_free_pages:>2}/10, "
        f"reserved for decoding {reserved:>2} tokens"
    )
    if llm.prefill_manager.pending_list:  # what the next step's admission check will see
        head = llm.prefill_manager.pending_list[0]
        needed, free = head.input_len + head.output_len, llm.cache_manager.available_size
        verdict = "waits" if needed + reserved > free else "fits"
        line += f"; uid{head.uid} needs {needed} + {reserved} of {free} free: {verdict}"
    print(line)
    return output


llm._forward = traced_forward
if args.trace:  # attached last: it wraps the printing hook above
    from minisgl.scheduler.trace import TraceRecorder

    recorder = TraceRecorder.attach(llm)
prompts = ["The capital of France is", "Once upon a time,", "List three prime numbers:"]
params = SamplingParams(max_tokens=8, ignore_eos=True)
lengths = [len(llm.tokenizer.encode(p)) for p in prompts]
print(
    f"  prompts of {lengths} tokens, 8 output tokens each; once admitted, a request reserves "
    f"prompt + 8 + (P - 1) tokens"
)
outputs = llm.generate(prompts, params)
if args.trace:
    recorder.save(
        args.trace, run="the three prompts", example="ch08_cache_manager", prompts=prompts
    )
llm.cache_manager.check_integrity()
print(f"  afterwards: {llm.cache_manager.num_free_pages}/10 pages free, check_integrity passed")

tokenizer = AutoTokenizer.from_pretrained(args.model)
hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(llm.device)
for prompt, out in zip(prompts, outputs):
    x = tokenizer(prompt, return_tensors="pt").input_ids.to(llm.device)
    ref = hf.generate(x, max_new_tokens=8, min_new_tokens=8, do_sample=False)[
        0, x.shape[1] :
    ].tolist()
    print(f"  {prompt!r:<28} -> {out['text']!r:<36} matches HF: {out['token_ids'] == ref}")
llm.shutdown()
