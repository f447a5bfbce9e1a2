"""Chapter 9: the radix prefix cache. Requests that share a system prompt compute it once;
a tiny KV pool makes the cache evict its least recently used, unreferenced leaves.

Four rounds of requests run through SmolLM2 with the radix cache, for page sizes 1 and 4;
each prefill prints how much of the prompt was matched in the cache and how much was
computed, then the tree's size; evictions are printed as they happen, each node in the
order it was evicted. Every output is compared with Hugging Face.

    python examples/ch09_radix_cache.py [--model PATH] [--device cpu|cuda] [--trace FILE]
"""
# output: trace

import argparse
import os

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
parser.add_argument("--trace", metavar="FILE", help="record the scheduler's steps to FILE (JSON)")
args = parser.parse_args()

SYSTEM = "You are a friendly assistant. You answer every question in one short sentence.\n"
OTHER = (
    "A long unrelated document: the history of the bicycle begins in the early nineteenth "
    "century, when inventors in Europe built wooden machines pushed along by the rider's feet, "
    "and continued through pedals, chains and pneumatic tyres. Summary:"
)
ROUNDS = [
    ("a cold cache", [SYSTEM + "The capital of France is"]),
    (
        "the system prompt is shared",
        [SYSTEM + "Once upon a time,", SYSTEM + "The capital of France is"],
    ),
    ("an unrelated long prompt needs room", [OTHER]),
    ("what survived the eviction", [SYSTEM + "List three prime numbers:"]),
]
POOL_TOKENS = 72
MAX_TOKENS = 4

ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # +ch11
tokenizer = AutoTokenizer.from_pretrained(args.model)
hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device)


def hf_greedy(prompt):
    x = tokenizer(prompt, return_tensors="pt").input_ids.to(args.device)
    out = hf.generate(x, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False)
    return out[0, x.shape[1] :].tolist()


def tree_line(llm):
    cache = llm.cache_manager.prefix_cache
    info = cache.size_info
    nodes = sum(1 for _ in cache._nodes())
    return (
        f"tree: {nodes} nodes, {info.total_size} tokens cached ({info.evictable_size} evictable, "
        f"{info.protected_size} in use); free pages {llm.cache_manager.num_free_pages}"
    )


for P in [1, 4]:
    print(f"page size {P}: a pool of {POOL_TOKENS // P} pages = {POOL_TOKENS} tokens")
    llm = LLM(
        args.model,
        dtype=torch.float32,
        device=args.device,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=POOL_TOKENS // P,
        page_size=P,
        max_seq_len_override=256,
        cache_type="radix",
    )
    cache = llm.cache_manager.prefix_cache
    original_forward, original_evict = llm._forward, cache.evict

    def traced_forward(forward_input, llm=llm, original=original_forward):
        batch = forward_input.batch
        if batch.is_prefill:
            for r in batch.reqs:
                total = len(r.input_ids)
                print(
                    f"    uid{r.uid}: prompt {total:>2} tokens, matched {r.cached_len:>2} in the cache, "
                    f"computes {r.extend_len:>2}"
                )
        return original(forward_input)

    def traced_evict(size, cache=cache, original=original_evict):
        before = list(cache._nodes())
        freed = original(size)
        left = {id(n) for n in cache._nodes()}
        rank = {int(slot): i for i, slot in enumerate(freed.tolist())}  # freed: in evict order
        gone = sorted((n for n in before if id(n) not in left), key=lambda n: rank[int(n.value[0])])
        names = ", ".join(repr(tokenizer.decode(n.key)) for n in gone)
        print(
            f"    evict: asked for {size} tokens, freed {len(freed)}, leaves in eviction order: {names}"
        )
        return freed

    llm._forward, cache.evict = traced_forward, traced_evict
    recorder = None
    if args.trace and P == 1:  # the page-size-1 run: one token a page
        from minisgl.scheduler.trace import TraceRecorder

        recorder = TraceRecorder.attach(llm)
    for title, prompts in ROUNDS:
        print(f"  round: {title}")
        outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        same = all(o["token_ids"] == hf_greedy(p) for p, o in zip(prompts, outputs))
        print(f"    {tree_line(llm)}; outputs match HF: {same}")
    if recorder is not None:
        recorder.save(
            args.trace,
            run="the run with pages of 1 token",
            example="ch09_radix_cache",
            rounds=[t for t, _ in ROUNDS],
        )
    llm.cache_manager.check_integrity()
    llm.shutdown()
