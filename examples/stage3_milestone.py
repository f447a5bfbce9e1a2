"""Stage 3 milestone: a server you can talk to, started, used by many clients, stopped.

Starts ``python -m minisgl`` on a free loopback port, then six chat clients stream their
answers at the same time through the official ``openai`` client (one of them hangs up
halfway). Every completed answer is compared with the offline ``LLM.generate`` of the same
chat (greedy, float32 on both sides), the server's counters show every KV page and table
row free afterwards, and Ctrl-C (SIGINT to the server's process group) stops the API
server, the tokenizer worker and the scheduler.

    python examples/stage3_milestone.py [--model PATH] [--device cpu|cuda]
"""
# capture-output
# output: mask \d+ ms

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import psutil
import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.server.local import free_port, wait_ready

QUESTIONS = [
    "What is the capital of France?",
    "Name three fruits.",
    "What is 12 times 12?",
    "Say hello in Spanish.",
    "What colour is the sky?",
    "Write a haiku about rain.",
]
MAX_TOKENS = 32

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu")
args = parser.parse_args()

port = free_port()
url = f"http://127.0.0.1:{port}"
# float32 and the torch attention backend on any device: the offline answers below must match
cmd = [
    sys.executable,
    "-m",
    "minisgl",
    "--model",
    args.model,
    "--port",
    str(port),
    "--device",
    args.device,
    "--dtype",
    "float32",
    "--attn",
    "torch",
    "--max-seq-len",
    "1024",
    "--num-pages",
    "16384",
]
server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, start_new_session=True)
print(
    "server: python -m minisgl --model",
    args.model,
    "--device",
    args.device,
    "(loopback, a free port)",
)

# the offline answers, computed while the server starts
llm = LLM(
    args.model,
    dtype=torch.float32,
    device=args.device,
    attention_backend="torch",
    max_seq_len_override=1024,
    num_page_override=16384,
)
chats = [
    llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
    )
    for q in QUESTIONS
]
offline = [o["text"] for o in llm.generate(chats, SamplingParams(max_tokens=MAX_TOKENS))]
llm.shutdown()

health = wait_ready(url, server, None, timeout=600)
# the spawned workers (no response carries PIDs; multiprocessing's resource tracker is not one)
workers = [
    p
    for p in psutil.Process(server.pid).children(recursive=True)
    if "spawn_main" in " ".join(p.cmdline())
]
print("processes:", ", ".join(["api server", *health["workers"]]))
client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]


async def ask(i: int, question: str) -> tuple:
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    text, ttft = "", None
    async for chunk in stream:
        ttft = ttft or time.perf_counter() - t0
        text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        if i == 5 and len(text) > 10:
            await stream.close()  # this client hangs up halfway
            return text, ttft, False
    return text, ttft, True


async def main() -> list:
    return await asyncio.gather(*[ask(i, q) for i, q in enumerate(QUESTIONS)])


print(f"{len(QUESTIONS)} clients stream at once:")
for question, ref, (text, ttft, complete) in zip(QUESTIONS, offline, asyncio.run(main())):
    verdict = f"equals offline: {text == ref}" if complete else "hung up halfway (aborted)"
    print(f"  {question:<32} first text after {1000 * ttft:.0f} ms, {verdict}")
    print(f"    {text!r}")

deadline = time.monotonic() + 30
while (stats := httpx.get(f"{url}/stats").json())["running_reqs"] and time.monotonic() < deadline:
    time.sleep(0.2)
print(
    f"afterwards: {stats['kv_pages_in_use']} KV pages in use, "
    f"{stats['table_rows_free']}/{stats['table_rows_total']} table rows free"
)
os.killpg(server.pid, signal.SIGINT)  # Ctrl-C in the server's terminal
print(
    "Ctrl-C -> exit code",
    server.wait(60),
    "; still running:",
    [p.pid for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] or "none",
)
