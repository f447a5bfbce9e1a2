"""Online serving: requests arrive at the server as a Poisson process; TTFT, TPOT, throughput.

    python -m minisgl.benchmark.online --model models/qwen3-0.6b-shaped --rates 8 32 128
    python -m minisgl.benchmark.online --url http://127.0.0.1:1919 --rates 4   # a server already running
    python -m minisgl.benchmark.online --model models/tiny-qwen3 --device cpu --num-requests 8 \\
        --input-len 8 32 --output-len 4 16 --rates 2                           # a CPU smoke run

For each arrival rate (requests per second) the same ``--num-requests`` requests are sent:
prompts of ``randint(*input_len)`` random token ids in ``[0, 10000]`` turned into text by
the model's tokenizer, ``randint(*output_len)`` output tokens each (EOS ignored, so every
request generates exactly that many), gaps between arrivals drawn from an exponential
distribution of mean ``1 / rate``. Every request streams through ``/v1/completions``.

Measured per request, on the client's clock:

* TTFT, time to first token: request sent -> first streamed text;
* TPOT, time per output token: (last text - first text) / (tokens - 1);
* end-to-end latency: request sent -> last text.

Throughput is output tokens per second between the first request sent and the last one
finished. Eight short untimed requests warm the server up first. The table gives p50/p90/p99 of each latency. Without ``--url`` the benchmark
starts ``python -m minisgl`` on a free loopback port and stops it afterwards. Mirrors
upstream ``minisgl.benchmark.client`` and ``benchmark/online/bench_simple.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence

import httpx
from tqdm import tqdm

from minisgl.server.local import start_server, stop_server, wait_ready

from .common import format_table


@dataclass(frozen=True)
class TimedRequest:
    """One request of the trace: sent ``arrival`` seconds after the run starts."""

    arrival: float
    prompt: str
    max_tokens: int


@dataclass
class RequestResult:
    sent: float
    first: float | None = None
    last: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float:
        assert self.first is not None
        return self.first - self.sent

    @property
    def tpot(self) -> float | None:
        if self.first is None or self.last is None or self.output_tokens < 2:
            return None
        return (self.last - self.first) / (self.output_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by the nearest rank; NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def poisson_trace(
    tokenizer,
    num_requests: int,
    rate: float,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    seed: int,
) -> List[TimedRequest]:
    """The requests of one run; the same seed gives the same prompts and lengths at any rate
    (the arrival gaps come from a second generator, so only they depend on ``rate``)."""
    rng, gaps = random.Random(seed), random.Random(seed + 1)
    prompts = [
        tokenizer.decode([rng.randint(0, 10000) for _ in range(rng.randint(*input_len))])
        for _ in range(num_requests)
    ]
    lengths = [rng.randint(*output_len) for _ in range(num_requests)]
    t, trace = 0.0, []
    for prompt, n in zip(prompts, lengths):
        trace.append(TimedRequest(t, prompt, n))
        t += gaps.expovariate(rate)
    return trace


async def send_one(
    http: httpx.AsyncClient, url: str, model: str, req: TimedRequest, start: float, bar: tqdm
) -> RequestResult:
    await asyncio.sleep(max(0.0, start + req.arrival - time.perf_counter()))
    body = {
        "model": model,
        "prompt": req.prompt,
        "max_tokens": req.max_tokens,
        "temperature": 0.6,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    res = RequestResult(sent=time.perf_counter())
    try:
        async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    res.error = chunk["error"]["message"]
                    return res
                if chunk.get("usage"):
                    res.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                if any(c.get("text") for c in chunk.get("choices", [])):
                    res.last = time.perf_counter()
                    res.first = res.first or res.last
    except httpx.HTTPError as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        bar.update(1)
    return res


async def run_rate(
    url: str, model: str, trace: List[TimedRequest], rate: float, desc: str | None = None
) -> tuple[List[RequestResult], float]:
    """Send the trace; returns the results and the seconds from first send to last reply."""
    limits = httpx.Limits(max_connections=len(trace) + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(3600.0)) as http:
        with tqdm(total=len(trace), desc=desc or f"rate {rate:g} req/s", unit="req") as bar:
            start = time.perf_counter()
            results = await asyncio.gather(
                *[send_one(http, url, model, r, start, bar) for r in trace]
            )
    ends = [r.last for r in results if r.last is not None]
    return results, (max(ends) if ends else time.perf_counter()) - min(r.sent for r in results)


def summarize(rate: float, results: List[RequestResult], seconds: float) -> List[object]:
    ok = [r for r in results if r.error is None and r.first is not None]
    ttft = [r.ttft * 1e3 for r in ok]
    tpot = [t * 1e3 for t in (r.tpot for r in ok) if t is not None]
    e2e = [(r.last - r.sent) for r in ok if r.last is not None]
    pct = lambda v: " / ".join(f"{percentile(v, q):,.0f}" if v else "-" for q in (50, 90, 99))  # noqa: E731
    pct1 = lambda v: " / ".join(f"{percentile(v, q):.1f}" if v else "-" for q in (50, 90, 99))  # noqa: E731
    out_tokens = sum(r.output_tokens for r in ok)
    return [
        f"{rate:g}",
        f"{len(ok)}/{len(results)}",
        f"{seconds:.1f}",
        f"{out_tokens / seconds:,.0f}",
        f"{len(ok) / seconds:.2f}",
        pct(ttft),
        pct1(tpot),
        pct1(e2e),
    ]


def server_args(args: argparse.Namespace) -> List[str]:
    """The server's command-line options beyond the model."""
    extra = ["--max-running-requests", str(args.max_running_req)]
    extra += ["--device", args.device] if args.device else []
    return extra + (["--dtype", args.dtype] if args.dtype else [])


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default=os.environ.get("MINISGL_MODEL", "models/qwen3-0.6b-shaped"),
        help="the model folder (its tokenizer makes the prompts; the server serves it)",
    )
    p.add_argument("--url", default=None, help="a running server (default: start one on loopback)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, choices=["auto", "bfloat16", "float16", "float32"])
    p.add_argument(
        "--rates", type=float, nargs="+", default=[8, 32, 128], help="arrivals per second"
    )
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--input-len", type=int, nargs=2, default=[100, 1024], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[100, 512], metavar=("MIN", "MAX"))
    p.add_argument("--max-running-req", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--timeout", type=float, default=600, help="seconds to wait for the server to start"
    )
    args = p.parse_args(argv)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    proc, log = None, Path(tempfile.mkstemp(prefix="minisgl-online-", suffix=".log")[1])
    url = args.url
    if url is None:
        proc, url = start_server(args.model, server_args(args), log)
        print(f"server: {url} (log {log})")
    try:
        wait_ready(url, proc, log if proc else None, args.timeout)
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        # untimed warm-up: a fresh server compiles kernels on its first prefills (FlashInfer's
        # JIT: a minute on a new machine), which would otherwise land in the first rate's TTFT
        warm = poisson_trace(tokenizer, 8, 1e6, tuple(args.input_len), (4, 4), args.seed + 7)
        asyncio.run(run_rate(url, model, warm, float("inf"), desc="warm-up"))
        rows = []
        for rate in args.rates:
            trace = poisson_trace(
                tokenizer,
                args.num_requests,
                rate,
                tuple(args.input_len),
                tuple(args.output_len),
                args.seed,
            )
            results, seconds = asyncio.run(run_rate(url, model, trace, rate))
            for r in results:
                if r.error:
                    print(f"request failed: {r.error}")
            rows.append(summarize(rate, results, seconds))
        print(
            f"\n{args.num_requests} requests per rate, input {args.input_len[0]}-{args.input_len[1]} "
            f"tokens, output {args.output_len[0]}-{args.output_len[1]} tokens (EOS ignored), "
            f"streamed through /v1/completions"
        )
        print(
            format_table(
                [
                    "rate req/s",
                    "ok",
                    "time s",
                    "output tok/s",
                    "req/s",
                    "TTFT ms p50/p90/p99",
                    "TPOT ms p50/p90/p99",
                    "latency s p50/p90/p99",
                ],
                rows,
            )
        )
    finally:
        if proc is not None:
            stop_server(proc)


if __name__ == "__main__":
    main()
