"""Chapter 0: what you will have built by the end of the book, in a dozen lines.

The finished offline interface takes a list of prompts and returns their continuations,
scheduling them together: continuous batching, a paged KV cache and a prefix cache
underneath. Chapter 7 builds this ``LLM`` class; chapter 0 just uses it.

    python examples/ch00_quickstart.py [--model PATH] [--device cpu|cuda]
"""

import argparse
import os
import time

import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu")
args = parser.parse_args()

llm = LLM(
    args.model, dtype=torch.float32, device=args.device, num_page_override=2048, max_running_req=8
)
chats = ["What is the capital of France?", "Give me a synonym for 'happy'.", "What is 12 times 12?"]
prompts = [
    llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": c}], add_generation_prompt=True, tokenize=False
    )
    for c in chats
]
start = time.perf_counter()
outputs = llm.generate(
    prompts, SamplingParams(max_tokens=48)
)  # greedy; stops at the end-of-turn token
elapsed = time.perf_counter() - start
for chat, out in zip(chats, outputs):
    print(f"Q: {chat}\nA: {out['text'].strip()}\n")
tokens = sum(len(o["token_ids"]) for o in outputs)
# output: mask in \d+\.\d s
print(f"{tokens} tokens for {len(chats)} requests in {elapsed:.1f} s")
llm.shutdown()
