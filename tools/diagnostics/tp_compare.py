"""Serve the same greedy prompts at tp=1 and at tp=N and compare the texts (chapter 16).

    python -m tools.diagnostics.tp_compare --model models/qwen3-0.6b-shaped --tp 2  # GPUs
    python -m tools.diagnostics.tp_compare --model models/tiny-qwen3 --tp 2 --device cpu  # gloo
    python -m tools.diagnostics.tp_compare --tp 2 --dtype float32   # NCCL, float32: texts equal

Each server is ``python -m minisgl`` on a free loopback port; the prompts are sent at once
(so they are batched) with temperature 0 and ``ignore_eos``. Prints, per prompt, whether
the texts are equal and, if not, the first differing character. In bf16 on GPUs a split
reduction can flip a near-tie, and with flat logits (seeded weights) that happens early:
``tools.diagnostics.tp_logits`` then compares the logits step by step instead. Exit status 1
if any text differs.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List

import httpx

from minisgl.server.local import start_server, stop_server, wait_ready

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "List three prime numbers:",
    "Once upon a time,",
    "Explain tensor parallelism in one sentence.",
    "1, 2, 3, 5, 8,",
    "The opposite of hot is",
    "Translate to French: good morning",
]


def serve_and_generate(args: argparse.Namespace, tp: int) -> List[str]:
    extra = [
        "--tp",
        str(tp),
        "--max-seq-len",
        "2048",
        *(["--device", args.device] if args.device else []),
        *(["--dtype", args.dtype] if args.dtype else []),
    ]
    log = Path(f"/tmp/tp_compare_tp{tp}.log")
    proc, url = start_server(args.model, extra, log)
    try:
        wait_ready(url, proc, log, args.timeout)
        name = Path(args.model).name

        def one(prompt: str) -> str:
            body = {
                "model": name,
                "prompt": prompt,
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            return httpx.post(f"{url}/v1/completions", json=body, timeout=300).json()["choices"][0][
                "text"
            ]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            texts = list(pool.map(one, PROMPTS))
        print(
            f"tp={tp}: {len(PROMPTS)} prompts x {args.max_tokens} tokens in {time.perf_counter() - t0:.2f} s"
        )
        return texts
    finally:
        stop_server(proc, signal.SIGINT)


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.diagnostics.tp_compare", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", default="models/qwen3-0.6b-shaped")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, help="the server's --dtype (default: bfloat16 on CUDA)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    one, many = serve_and_generate(args, 1), serve_and_generate(args, args.tp)
    bad = 0
    for prompt, a, b in zip(PROMPTS, one, many):
        if a == b:
            print(f"  equal    {prompt!r}")
        else:
            bad += 1
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(
                f"  DIFFERS  {prompt!r} at character {at}: tp=1 {a[at : at + 30]!r} / tp={args.tp} {b[at : at + 30]!r}"
            )
    print(f"{len(PROMPTS) - bad} of {len(PROMPTS)} texts equal at tp=1 and tp={args.tp}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
