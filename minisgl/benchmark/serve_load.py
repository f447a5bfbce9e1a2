"""A bounded load test of the server: many concurrent streaming clients on loopback.

    python -m minisgl.benchmark.serve_load [--model PATH] [--clients 200] [--disconnect 20]
                                    [--min-tokens 4] [--max-tokens 48] [--device cpu|cuda]
                                    [--dtype float32|bfloat16] [--url http://127.0.0.1:PORT] [--timeout 900]

It starts ``python -m minisgl`` on a free loopback port (or uses ``--url``, which must be
a loopback address), computes every answer offline first with ``LLM.generate`` (greedy,
``ignore_eos``, so each client gets exactly its ``max_tokens``), then opens all streams at
once through ``/v1/completions``. ``--disconnect`` of the clients hang up mid-stream. Both
sides run in float32 by default: in bfloat16 a batch of another size may round a logit
differently and flip a near-tie, so token-for-token equality is only promised in float32.
Meanwhile a monitor thread scrapes ``/metrics`` every 0.2 s, as Prometheus would.

The server may refuse a client with 429 (too many outstanding tokens, chapter 15); any
other refusal is an error. Checks, each printed with ok/FAIL (exit status 1 on any
failure): every accepted stream that did not hang up finished, equal to its offline text;
every scrape was answered 200; the server and its workers are alive afterwards; once idle,
no request is open, no KV page is in use and every table row is free (``GET /stats``).
Prints accepted and refused counts, throughput (output tokens per second over the whole
run), p50/p99 of TTFT (request sent -> first text), TPOT (mean time between tokens after
the first, per request) and the scrapes' latency. Stops by itself: the server it started is
shut down with SIGTERM, and the whole run is capped by ``--timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple
from urllib.parse import urlparse

import httpx

from minisgl.server.local import start_server, stop_server, wait_ready

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "List three prime numbers:",
    "Once upon a time,",
    "The quick brown fox",
    "import numpy as np\n",
    "Water boils at",
    "My favourite colour is",
    "To be or not to be,",
    "The largest planet in the solar system is",
    "SELECT * FROM",
    "In 1969, humans",
    "Translate to French: cheese ->",
    "The recipe for pancakes:",
    "A haiku about autumn:",
    "1, 2, 3, 4,",
]


@dataclass
class Client:
    prompt: str
    max_tokens: int
    hang_up_after: int | None  # chunks read before disconnecting; None: read to the end
    status: int = 0  # the HTTP status of the answer
    text: str = ""
    sent: float = 0.0
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    chunks: int = 0
    error: str | None = None
    times: List[float] = field(default_factory=list)


def percentile(values: List[float], q: float) -> float:
    values = sorted(values)
    return (
        values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]
        if values
        else float("nan")
    )


def server_args(args: argparse.Namespace) -> List[str]:
    """The server's command-line options beyond the model."""
    return [
        "--device",
        args.device,
        "--max-seq-len",
        str(args.max_seq_len),
        "--max-running-requests",
        str(args.clients),
        "--dtype",
        args.dtype,
    ]


def offline_reference(
    args: argparse.Namespace, clients: List[Client]
) -> Dict[Tuple[str, int], str]:
    """Greedy text of every (prompt, max_tokens), from one offline run per prompt."""
    import torch

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    llm = LLM(
        args.model,
        dtype=getattr(torch, args.dtype),
        device=args.device,
        max_seq_len_override=args.max_seq_len,
    )
    prompts = sorted({c.prompt for c in clients})
    longest = max(c.max_tokens for c in clients)
    outs = llm.generate(prompts, SamplingParams(max_tokens=longest, ignore_eos=True))
    ref = {}
    for c in clients:
        ids = outs[prompts.index(c.prompt)]["token_ids"][: c.max_tokens]
        ref[(c.prompt, c.max_tokens)] = llm.tokenizer.decode(ids)
    llm.shutdown()
    return ref


async def run_client(http: httpx.AsyncClient, url: str, model: str, c: Client) -> None:
    body = {
        "model": model,
        "prompt": c.prompt,
        "max_tokens": c.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    c.sent = time.perf_counter()
    try:
        async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
            c.status = r.status_code
            if r.status_code == 429:  # refused up front: come back later
                return
            if r.status_code != 200:
                c.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    c.error = chunk["error"]["message"]
                    return
                if chunk.get("usage"):
                    c.tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    now = time.perf_counter()
                    c.first = c.first or now
                    c.last = now
                    c.text += choice["text"]
                    c.chunks += 1
                if c.hang_up_after is not None and c.chunks >= c.hang_up_after:
                    return  # leaving the `async with` closes the connection mid-stream
    except httpx.HTTPError as e:
        c.error = f"{type(e).__name__}: {e}"


async def load(url: str, model: str, clients: List[Client]) -> float:
    limits = httpx.Limits(max_connections=len(clients) + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0)) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*[run_client(http, url, model, c) for c in clients])
        return time.perf_counter() - t0


def scrape_metrics(url: str, stop: threading.Event) -> List[Tuple[int, float]]:
    """(status, seconds) of a ``GET /metrics`` every 0.2 s until ``stop`` is set."""
    scrapes = []
    with httpx.Client(timeout=30) as http:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                status = http.get(f"{url}/metrics").status_code
            except httpx.HTTPError:
                status = 0
            scrapes.append((status, time.perf_counter() - t0))
            stop.wait(0.2)
    return scrapes


def wait_idle(url: str, timeout: float = 60) -> Dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(f"{url}/stats", timeout=30).json()
        idle = stats["running_reqs"] == stats["pending_reqs"] == stats["open_requests"] == 0
        if idle or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
    )
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--disconnect", type=int, default=20, help="clients that hang up mid-stream")
    p.add_argument("--min-tokens", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--url", help="an already running server (loopback only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900, help="seconds for the whole run")
    args = p.parse_args()
    signal.signal(
        signal.SIGALRM,
        lambda *_: sys.exit(f"stopped: the run took longer than {args.timeout:.0f} s"),
    )
    signal.alarm(int(args.timeout))

    rng = random.Random(args.seed)
    hang_ups = set(rng.sample(range(args.clients), min(args.disconnect, args.clients)))
    clients = []
    for i in range(args.clients):
        n = rng.randint(args.min_tokens, args.max_tokens)
        clients.append(
            Client(
                rng.choice(PROMPTS), n, rng.randint(1, max(1, n // 3)) if i in hang_ups else None
            )
        )

    proc, log = None, None
    if args.url:
        url = args.url.rstrip("/")
        if urlparse(url).hostname not in ("127.0.0.1", "localhost", "::1"):
            sys.exit("--url must be a loopback address: this load test never leaves the machine")
    else:
        log = Path(tempfile.mkdtemp(prefix="serve-load-")) / "server.log"
        proc, url = start_server(args.model, server_args(args), log)
    try:
        print(f"offline reference for {len({c.prompt for c in clients})} prompts ...", flush=True)
        t0 = time.perf_counter()
        ref = offline_reference(args, clients)
        print(
            f"  done in {time.perf_counter() - t0:.1f} s; waiting for the server at {url} ...",
            flush=True,
        )
        health = wait_ready(url, proc, log, args.timeout)
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        print(
            f"{args.clients} streaming clients ({len(hang_ups)} hang up mid-stream), "
            f"max_tokens {args.min_tokens}..{args.max_tokens}, model {model} on {args.device} ({args.dtype})",
            flush=True,
        )
        stop, scrapes = threading.Event(), []
        monitor = threading.Thread(target=lambda: scrapes.extend(scrape_metrics(url, stop)))
        monitor.start()
        try:
            wall = asyncio.run(load(url, model, clients))
        finally:
            stop.set()
            monitor.join()

        refused = [c for c in clients if c.status == 429]
        accepted = [c for c in clients if c.status == 200]
        done = [c for c in accepted if c.hang_up_after is None]
        errors = [c for c in clients if c.error]
        wrong = [c for c in done if not c.error and c.text != ref[(c.prompt, c.max_tokens)]]
        finished = [c for c in done if not c.error and c.tokens == c.max_tokens]
        stats = wait_idle(url)
        health_after = httpx.get(f"{url}/health", timeout=10)
        alive = (
            health_after.status_code == 200 and health_after.json()["workers"] == health["workers"]
        )
        out_tokens = sum(c.tokens for c in done) + sum(
            c.chunks for c in accepted if c.hang_up_after is not None
        )
        scrape_s = [t for _, t in scrapes]
        ttft = [c.first - c.sent for c in clients if c.first is not None]
        tpot = [
            (c.last - c.first) / (c.tokens - 1)
            for c in done
            if c.first is not None and c.tokens > 1
        ]

        print(
            f"\naccepted             {len(accepted):8d}  ({len(accepted) - len(done)} hang up), "
            f"refused (429) {len(refused)}, finished {len(finished)}/{len(done)}"
        )
        print(f"wall time            {wall:8.2f} s")
        print(
            f"output throughput    {out_tokens / wall:8.1f} tokens/s  ({out_tokens} tokens, "
            f"{len(done) / wall:.2f} completed requests/s)"
        )
        print(
            f"TTFT  p50 / p99      {1000 * percentile(ttft, 50):8.0f} / {1000 * percentile(ttft, 99):.0f} ms"
        )
        print(
            f"TPOT  p50 / p99      {1000 * percentile(tpot, 50):8.1f} / {1000 * percentile(tpot, 99):.1f} ms"
        )
        print(
            f"/metrics p50 / p99   {1000 * percentile(scrape_s, 50):8.0f} / "
            f"{1000 * percentile(scrape_s, 99):.0f} ms  ({len(scrapes)} scrapes)"
        )
        checks = [
            (
                f"{len(finished) - len(wrong)}/{len(done)} accepted streams finished, equal to "
                "their offline text",
                not wrong and not errors and len(finished) == len(done),
            ),
            (
                f"{sum(1 for st, _ in scrapes if st == 200)}/{len(scrapes)} scrapes of /metrics "
                "answered 200",
                bool(scrapes) and all(st == 200 for st, _ in scrapes),
            ),
            (f"server and workers alive afterwards ({', '.join(health['workers'])})", alive),
            (
                f"idle: {stats['open_requests']} requests open, {stats['kv_pages_in_use']} KV pages in use ({stats['kv_pages_free']} free, "
                f"{stats['kv_pages_cached']} cached of {stats['kv_pages_total']}), "
                f"{stats['table_rows_free']}/{stats['table_rows_total']} table rows free",
                stats["open_requests"] == stats["kv_pages_in_use"] == 0
                and stats["table_rows_free"] == stats["table_rows_total"],
            ),
        ]
        for c in (errors + wrong)[:3]:
            print(f"  e.g. {c.prompt!r} max_tokens={c.max_tokens}: {c.error or repr(c.text)}")
        for what, ok in checks:
            print(f"{'ok  ' if ok else 'FAIL'} {what}")
        return 0 if all(ok for _, ok in checks) else 1
    finally:
        if proc is not None:
            stop_server(proc)


if __name__ == "__main__":
    sys.exit(main())
