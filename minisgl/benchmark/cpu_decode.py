"""CPU decode speed of the engine beside Hugging Face ``generate``, on the same prompts.

    python -m minisgl.benchmark.cpu_decode [--model PATH] [--tokens 32] [--threads N]

For batch sizes 1 and 8 it prints the time per decode step and the output tokens per
second of mini-sglang (offline ``LLM``, torch backend, float32) and of ``transformers``
(``generate``, greedy, float32, left-padded batch), then the peak resident memory of the
process. The KV pool is sized explicitly (``num_page_override``), never from host RAM.
"""

import argparse
import os
import resource
import time
from typing import List

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM

PROMPTS = [
    "The capital of France is",
    "List three prime numbers:",
    "def fibonacci(n):",
    "1 + 1 =",
    "Once upon a time,",
    "The best way to learn is",
    "Water boils at",
    "My favourite colour is",
]


def bench_minisgl(llm: LLM, prompts: List[str], tokens: int) -> tuple[float, float]:
    """Returns (seconds per decode step, output tokens per second over the whole generate)."""
    decode_times: List[float] = []
    original = llm._forward

    def timed(forward_input):
        start = time.perf_counter()
        out = original(forward_input)
        if forward_input.batch.is_decode:
            decode_times.append(time.perf_counter() - start)
        return out

    llm._forward = timed
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True))
    total = time.perf_counter() - start
    llm._forward = original
    return sum(decode_times) / len(decode_times), len(prompts) * tokens / total


def bench_hf(model, tokenizer, prompts: List[str], tokens: int) -> tuple[float, float]:
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(**enc, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(**enc, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        total = time.perf_counter() - start
    return (total - prefill) / (tokens - 1), len(prompts) * tokens / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
    )
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"model {args.model}, float32, CPU, {args.threads} threads, {args.tokens} output tokens per request"
    )

    ENV.DISABLE_OVERLAP_SCHEDULING.value = True
    llm = LLM(
        args.model,
        dtype=torch.float32,
        device="cpu",
        attention_backend="torch",
        num_page_override=4096,
        max_running_req=16,
        cache_type="naive",
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    bench_minisgl(llm, PROMPTS[:2], 4)  # warm-up
    print(f"{'batch':>5} | {'engine':<12} | {'ms / decode step':>16} | {'tokens/s':>8}")
    for bs in (1, 8):
        prompts = PROMPTS[:bs]
        for name, (step, tps) in (
            ("mini-sglang", bench_minisgl(llm, prompts, args.tokens)),
            ("transformers", bench_hf(hf, tokenizer, prompts, args.tokens)),
        ):
            print(f"{bs:>5} | {name:<12} | {step * 1e3:>16.1f} | {tps:>8.1f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"peak resident memory of this process (both engines loaded): {peak:.0f} MiB")
    llm.shutdown()


if __name__ == "__main__":
    main()
