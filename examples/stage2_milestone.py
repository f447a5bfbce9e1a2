"""Stage 2 milestone: the scheduler of chapters 7-11 with everything switched on.

SmolLM2 serves two waves of requests that share a long preamble, with the radix prefix
cache (page size 4), chunked prefill (at most 32 prompt tokens per step), overlap
scheduling, and a KV pool small enough that the cache must evict. It prints what the
scheduler did (steps, chunks, cache hits, prefill tokens computed against prompt tokens,
evictions, time) and compares every output with Hugging Face, token for token.

    python examples/stage2_milestone.py [--model PATH] [--device cpu|cuda]
"""
# output: mask \d+\.\d+ s\b

import argparse
import os
import time
from collections import Counter

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM
from minisgl.scheduler.prefill import ChunkedReq

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu", help="cpu or cuda (the torch backend on both)")
args = parser.parse_args()

PREAMBLE = (
    "The following are short facts from a school encyclopedia, each finished in a few words "
    "by a careful writer who never repeats herself.\n"
)
WAVES = [
    [
        "The capital of France is",
        "The largest planet in the solar system is",
        "Water boils at a temperature of",
        "The author of Hamlet was",
    ],
    [
        "Bees collect nectar and make",
        "Mount Fuji is a volcano in",
        "A cat usually has four",
        "The first person to walk on the moon was",
    ],
]
MAX_TOKENS = [8, 5, 8, 3]  # per position in a wave: requests leave at different steps

ENV.DISABLE_OVERLAP_SCHEDULING.value = False  # overlap on (the default)
llm = LLM(
    args.model,
    dtype=torch.float32,
    device=args.device,
    attention_backend="torch",
    max_running_req=8,
    cache_type="radix",
    page_size=4,
    max_extend_tokens=32,
    num_page_override=24,
    max_seq_len_override=256,
)
stats: Counter = Counter()
original_forward, original_evict = llm._forward, llm.cache_manager.prefix_cache.evict


def traced_forward(forward_input):
    batch = forward_input.batch
    stats[f"{batch.phase} steps"] += 1
    stats["largest batch"] = max(stats["largest batch"], batch.size)
    if batch.is_prefill:
        for r in batch.reqs:
            stats["prefill tokens computed"] += r.extend_len
            stats["chunks"] += isinstance(r, ChunkedReq)
            if r.uid not in seen:  # a request's first chunk: how much came from the cache
                seen.add(r.uid)
                stats["tokens matched in the cache"] += r.cached_len
                stats["requests that hit the cache"] += r.cached_len > 0
    return original_forward(forward_input)


def traced_evict(size):
    freed = original_evict(size)
    stats["evictions"] += 1
    stats["tokens evicted"] += len(freed)
    return freed


seen: set = set()
llm._forward, llm.cache_manager.prefix_cache.evict = traced_forward, traced_evict
print(
    f"{os.path.basename(args.model)} on {args.device}: radix cache, page size 4, max_extend_tokens=32, "
    f"overlap on, a pool of {llm.engine.num_pages} pages ({4 * llm.engine.num_pages} tokens)"
)
results = []
start = time.perf_counter()
for wave in WAVES:
    prompts = [PREAMBLE + q for q in wave]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    stats["prompt tokens"] += sum(len(llm.tokenizer.encode(p)) for p in prompts)
    outputs = llm.generate(prompts, params)
    results += list(zip(prompts, MAX_TOKENS, outputs))
seconds = time.perf_counter() - start
for key in [
    "prompt tokens",
    "prefill tokens computed",
    "tokens matched in the cache",
    "requests that hit the cache",
    "chunks",
    "prefill steps",
    "decode steps",
    "largest batch",
    "evictions",
    "tokens evicted",
]:
    print(f"  {key:<28} {stats[key]}")
print(f"  {'time':<28} {seconds:.2f} s")
llm.cache_manager.check_integrity()
print(
    f"  afterwards: {llm.table_manager.available_size}/8 table rows free, KV pages "
    f"{llm.cache_manager.num_free_pages} free + {llm.cache_manager.prefix_cache.size_info.total_size // 4} cached "
    f"= {llm.engine.num_pages}, check_integrity passed"
)

tokenizer = AutoTokenizer.from_pretrained(args.model)
hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(llm.device)
matches = 0
for prompt, n, out in results:
    x = tokenizer(prompt, return_tensors="pt").input_ids.to(llm.device)
    ref = hf.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)[
        0, x.shape[1] :
    ].tolist()
    matches += out["token_ids"] == ref
    question = prompt[len(PREAMBLE) :]
    print(f"  {question!r:<44} -> {out['text']!r:<34} matches HF: {out['token_ids'] == ref}")
print(f"{matches}/{len(results)} match Hugging Face")
llm.shutdown()
