"""Prefix reuse: 64 requests that share a long system prompt, with the naive cache and the
radix cache. How many prompt tokens does prefill actually compute?

    python -m minisgl.benchmark.prefix_reuse [--model PATH] [--requests 64] [--system-tokens 256]
        [--max-extend-tokens 512] [--max-tokens 4] [--page-size 1] [--device cpu|cuda]

Every request is the same system prompt followed by its own short question. The count is
the sum of ``extend_len`` over the requests of every prefill batch (what the model is fed
in prefill), measured by wrapping the scheduler's ``_forward``. With the naive cache it is
every prompt token; with the radix cache a request admitted after the system prompt was
cached computes only its own part. Requests admitted in the same step as the first one
cannot hit (nothing is cached yet), so the saving depends on the step budget
``--max-extend-tokens``. The outputs of both runs are compared too. Defaults to the tiny
Qwen3 (models/tiny-qwen3, built by ``python -m tools.models tiny``).
"""
# output: nondeterministic

import argparse
import os
import time
from typing import Dict, List

import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM


def make_prompts(args: argparse.Namespace, vocab_text: str, tokenizer) -> List[List[int]]:
    words = vocab_text.split()
    system: List[int] = []
    while len(system) < args.system_tokens:  # repeat the text until the prompt is long enough
        system += tokenizer.encode(" ".join(words) + "\n")
    system = system[: args.system_tokens]
    questions = [f"Question {i}: what is {i} times {i + 3}? Answer:" for i in range(args.requests)]
    return [system + tokenizer.encode(q) for q in questions]


SYSTEM_TEXT = (
    "You are a careful assistant for a small bookshop. Answer questions about opening hours, "
    "orders, deliveries and returns politely and briefly. The shop opens at nine and closes "
    "at six, Monday to Saturday; orders over thirty euros ship free; returns are accepted "
    "within thirty days with a receipt. Never invent a policy that is not written here."
)


def run(args: argparse.Namespace, cache_type: str, prompts: List[List[int]]) -> Dict[str, object]:
    llm = LLM(
        args.model,
        dtype=torch.float32,
        device=args.device,
        attention_backend="torch",
        max_running_req=args.requests,
        page_size=args.page_size,
        cache_type=cache_type,
        max_extend_tokens=args.max_extend_tokens,
        max_seq_len_override=1024,
        num_page_override=(args.requests * 400) // args.page_size + 8,
    )
    stats = {"prefill_tokens": 0, "prefill_steps": 0, "hits": 0}
    original, seen = llm._forward, set()

    def counted(forward_input):
        batch = forward_input.batch
        if batch.is_prefill:
            stats["prefill_steps"] += 1
            stats["prefill_tokens"] += sum(r.extend_len for r in batch.reqs)
            for r in batch.reqs:  # a request's first chunk: how much came from the cache
                if r.uid not in seen:
                    seen.add(r.uid)
                    stats["hits"] += r.cached_len >= args.system_tokens // 2
        return original(forward_input)

    llm._forward = counted
    start = time.perf_counter()
    outputs = llm.generate(prompts, SamplingParams(max_tokens=args.max_tokens, ignore_eos=True))
    stats["seconds"] = time.perf_counter() - start
    stats["outputs"] = [o["token_ids"] for o in outputs]
    llm.shutdown()
    return stats


def main(argv: List[str] | None = None) -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("MINISGL_MODEL", "models/tiny-qwen3"))
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument(
        "--system-tokens", type=int, default=256, help="length of the shared system prompt"
    )
    parser.add_argument(
        "--max-extend-tokens", type=int, default=512, help="prefill token budget of a step"
    )
    parser.add_argument("--max-tokens", type=int, default=4, help="output tokens per request")
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True
    prompts = make_prompts(args, SYSTEM_TEXT, AutoTokenizer.from_pretrained(args.model))
    prompt_tokens = sum(len(p) for p in prompts)
    print(
        f"{args.requests} requests: a {args.system_tokens}-token system prompt + a question each; "
        f"{prompt_tokens} prompt tokens in all; max_extend_tokens={args.max_extend_tokens}, "
        f"page size {args.page_size}, {os.path.basename(args.model.rstrip('/'))} on {args.device}"
    )
    results = {cache: run(args, cache, prompts) for cache in ["naive", "radix"]}
    for cache, r in results.items():
        print(
            f"  {cache:<5}: prefill computed {r['prefill_tokens']:>6} tokens in {r['prefill_steps']:>2} prefill steps "
            f"({r['hits']:>2} requests started from the cached system prompt), {r['seconds']:.2f} s"
        )
    naive, radix = results["naive"]["prefill_tokens"], results["radix"]["prefill_tokens"]
    print(
        f"  saving: {naive - radix} of {naive} prefill tokens not computed ({100 * (naive - radix) / naive:.1f}%), "
        f"{naive / radix:.1f}x fewer"
    )
    print(
        f"  same outputs with both caches: {results['naive']['outputs'] == results['radix']['outputs']}"
    )


if __name__ == "__main__":
    main()
