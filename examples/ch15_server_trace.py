"""Chapter 15: the server's scheduler under eight concurrent clients, recorded with ``--trace``.

Starts ``python -m minisgl --trace FILE`` (chapter 7's recorder in the scheduler process),
lets eight clients arrive a quarter of a second apart, each asking for a different number of
tokens, checks that each got exactly that many, and stops the server, which writes the trace
on its way out. Prints, per step of the trace, who was in the batch: requests join the
running batch as they arrive and leave it when done. Which step a request arrives at depends
on timing, so the output differs from run to run.

    python examples/ch15_server_trace.py [--model PATH] [--device cpu|cuda] [--trace FILE]
        (then: python -m tools.trace_view FILE)
"""
# capture-output
# output: nondeterministic
# output: trace

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import openai

from minisgl.server.local import start_server, stop_server, wait_ready

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu")
parser.add_argument("--trace", metavar="FILE", help="where the trace goes (default: a temp file)")
args = parser.parse_args()

tmp = Path(tempfile.mkdtemp(prefix="ch15-trace-"))
trace = Path(args.trace) if args.trace else tmp / "trace.json"
extra = ["--device", args.device, "--max-seq-len", "512", "--num-pages", "4096"]
server, url = start_server(args.model, [*extra, "--trace", str(trace.resolve())], tmp / "log")
try:
    wait_ready(url, server, tmp / "log", timeout=600)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time,"]
    lengths = [24, 4, 12, 2, 8, 6, 14, 3]

    async def one(model: str, i: int, n: int) -> int:
        await asyncio.sleep(0.25 * i)  # clients arrive one after another
        out = await client.completions.create(
            model=model,
            prompt=prompts[i % len(prompts)],
            max_tokens=n,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        return out.usage.completion_tokens

    async def main():
        model = (await client.models.list()).data[0].id
        return await asyncio.gather(*[one(model, i, n) for i, n in enumerate(lengths)])

    got = asyncio.run(main())
    print(f"8 clients, max_tokens {lengths}: each got its tokens: {got == lengths}")
finally:
    stop_server(server)  # SIGTERM: the scheduler writes the trace as it exits

doc = json.loads(trace.read_text())
print(  # stderr: the output the book shows stays the same
    f"wrote the trace of the server's whole run to {trace}; "
    f"view it: python -m tools.trace_view {trace}",
    file=sys.stderr,
)
steps = doc["steps"]
print(f"the trace: {len(steps)} steps, batch sizes up to {max(len(s['reqs']) for s in steps)}")
for s in steps:
    uids = " ".join(f"uid{r['uid']}" for r in s["reqs"])
    joined = f"  <- {', '.join(f'uid{u}' for u in s['arrived'])} arrived" if s["arrived"] else ""
    print(f"  {s['index']:>2} {s['kind']:<7} [{uids}]{joined}")
