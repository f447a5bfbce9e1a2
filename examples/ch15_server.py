"""Chapter 15: the OpenAI-compatible server, started and used like any OpenAI endpoint.

Starts ``python -m minisgl`` on a free loopback port (three processes: this API server,
the tokenizer worker, the scheduler), then talks to it with the official ``openai``
client: the model list, a completion, a streamed chat answer, and two requests the
server refuses with a clear message. The raw Server-Sent Events of ``/generate`` show the
wire format. Then ``GET /stats`` shows every KV page and table row free again, and
SIGTERM stops all three processes.

    python examples/ch15_server.py [--model PATH] [--device cpu|cuda]
"""
# capture-output

import argparse
import os
import signal
import subprocess
import sys

import httpx
import openai
import psutil

from minisgl.server.local import free_port, wait_ready

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu")
args = parser.parse_args()

port = free_port()
url = f"http://127.0.0.1:{port}"
server = subprocess.Popen(
    [
        sys.executable,
        "-m",
        "minisgl",
        "--model",
        args.model,
        "--port",
        str(port),
        "--device",
        args.device,
        "--max-seq-len",
        "1024",
        "--num-pages",
        "8192",
    ],
    stdout=subprocess.DEVNULL,
)
print(f"$ python -m minisgl --model {args.model} --port <free port> --device {args.device}")
health = wait_ready(url, server, None, timeout=600)  # /health answers once the model has loaded
print("processes:", ", ".join(["API server (this one's child)", *health["workers"]]))

client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
model = client.models.list().data[0].id
print("model:", model)

out = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=8, temperature=0
)
print(
    f"completion: {out.choices[0].text!r} (finish_reason={out.choices[0].finish_reason}, "
    f"usage={out.usage.prompt_tokens}+{out.usage.completion_tokens} tokens)"
)

print("chat, streamed chunk by chunk:")
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Name two colours."}],
    max_tokens=24,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(f"  {chunk.choices[0].delta.content!r}")
    elif chunk.choices and chunk.choices[0].finish_reason:
        print(f"  (finish_reason={chunk.choices[0].finish_reason})")
    elif chunk.usage:
        print(f"  (usage: {chunk.usage.completion_tokens} completion tokens)")

for bad in [dict(prompt="hi", n=2), dict(prompt="hello " * 2000)]:
    try:
        client.completions.create(model=model, max_tokens=4, **bad)
    except openai.APIStatusError as e:
        print(f"refused with {e.status_code}: {e.body['message']}")

print("raw /generate stream:")
with httpx.stream(
    "POST",
    f"{url}/generate",
    json={"prompt": "1, 2, 3,", "max_tokens": 4, "temperature": 0, "stream": True},
) as r:
    for line in r.iter_lines():
        if line:
            print("  " + line)

stats = httpx.get(f"{url}/stats").json()
print(
    f"stats: {stats['kv_pages_in_use']} KV pages in use, {stats['table_rows_free']}/{stats['table_rows_total']} "
    f"table rows free, {stats['running_reqs']} running"
)
# the spawned workers (no response carries PIDs; multiprocessing's resource tracker is not one)
workers = [
    p
    for p in psutil.Process(server.pid).children(recursive=True)
    if "spawn_main" in " ".join(p.cmdline())
]
server.send_signal(signal.SIGTERM)
print(
    "SIGTERM -> server exit code",
    server.wait(60),
    "; workers still running:",
    [w.name() for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE],
)
