"""Offline throughput: nano-vllm's 256-request workload through mini-sglang, and through
Hugging Face ``transformers``' own continuous batching on the same requests.

    python -m minisgl.benchmark.offline --model models/qwen3-0.6b-shaped --hf
    python -m minisgl.benchmark.offline --matrix          # overlap on/off x radix/naive
    python -m minisgl.benchmark.offline --tp 1 2          # one GPU, then two (tensor parallel, chapter 16)
    python -m minisgl.benchmark.offline --num-seqs 4 --input-len 4 16 --output-len 2 4   # a smoke run

Each system runs the same requests (``workload.nano_vllm_workload``) after a warm-up that
is not timed; throughput is output tokens per second of wall time. The table gives
tokens/s, the ratio to ``transformers`` (with ``--hf``), peak GPU memory and the KV pool
size; a second table splits mini-sglang's start-up into weight loading, kernel
compilation (JIT: FlashInfer and Triton compile on first use) and CUDA-graph capture.

``transformers`` runs first and is freed before mini-sglang starts, because the engine
sizes its KV pool from the free memory it finds (90% by default). Its requests go through
the manager behind ``generate_batch`` (``init_continuous_batching``), which, unlike
``generate_batch`` itself, takes a ``max_new_tokens`` per request. Mirrors upstream
``benchmark/offline/bench.py`` (which runs mini-sglang alone).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

import torch
from tqdm import tqdm

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM
from minisgl.message import DetokenizeMsg
from minisgl.utils.device import default_device, is_cuda, synchronize

from .common import format_table
from .workload import OfflineWorkload, gib, nano_vllm_workload


@dataclass
class RunResult:
    system: str
    variant: str
    output_tokens: int
    seconds: float
    peak_memory: int | None  # bytes allocated through torch at most, None on the CPU
    kv: str  # "pages x P = tokens"

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.seconds


class ProgressLLM(LLM):
    """``LLM`` that advances a progress bar by every token it hands out."""

    progress: tqdm | None = None

    def send_result(self, reply: List[DetokenizeMsg]) -> None:
        super().send_result(reply)
        if self.progress is not None:
            self.progress.update(len(reply))


def _reset_peak(device: torch.device) -> None:
    if is_cuda(device):
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if is_cuda(device) else None


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if is_cuda(device):
        torch.cuda.empty_cache()


def reset_prefix_cache(llm: LLM) -> None:
    """Evict everything the prefix cache holds, so a second run starts as cold as the first."""
    cm = llm.cache_manager
    size = cm.prefix_cache.size_info.evictable_size
    if size > 0:
        evicted = cm.prefix_cache.evict(size)
        cm.free_slots = torch.cat([cm.free_slots, evicted[:: cm.page_size]])
    cm.check_integrity()


def run_minisgl(
    args: argparse.Namespace, workload: OfflineWorkload, cache_type: str, overlaps: Sequence[bool]
) -> tuple[List[RunResult], Dict[str, float]]:
    """One engine with ``cache_type``, one timed run per overlap setting."""
    device = torch.device(args.device) if args.device else default_device()
    _reset_peak(device)
    t0 = time.perf_counter()
    llm = ProgressLLM(
        args.model,
        dtype=args.dtype,
        device=args.device,
        page_size=args.page_size,
        max_running_req=args.max_running_req,
        max_extend_tokens=args.max_extend_tokens,
        max_seq_len_override=args.max_seq_len,
        memory_ratio=args.memory_ratio,
        attention_backend=args.attention_backend,
        cuda_graph_max_bs=args.cuda_graph_max_bs,
        cache_type=cache_type,
        enable_retraction=args.enable_retraction,  # +ch23
        tp=args.tp,
    )
    t1 = time.perf_counter()
    startup = dict(llm.engine.startup_seconds)
    startup["scheduler"] = (t1 - t0) - startup.pop("total")  # tokenizer, tables, streams
    llm.generate(
        ["Benchmark: "], SamplingParams(temperature=0.6, max_tokens=8)
    )  # prefill + sampling compile here
    startup["first_request"] = time.perf_counter() - t1
    startup["total"] = time.perf_counter() - t0
    engine = llm.engine
    kv = f"{engine.num_pages:,} x {args.page_size} = {engine.num_pages * args.page_size:,}"
    results = []
    for overlap in overlaps:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
        if args.tp == 1:  # under TP one run only: the other ranks' caches cannot be reset from here
            reset_prefix_cache(llm)
        variant = f"{'overlap' if overlap else 'no overlap'}, {cache_type}, {engine.attn_backend.__class__.__name__}"
        variant += (
            f", graphs<={engine.graph_runner.max_graph_bs}"
            if engine.graph_runner.max_graph_bs
            else ", no graphs"
        )
        variant += f", tp={args.tp}" if args.tp > 1 else ""
        variant += ", retraction" if args.enable_retraction else ""  # +ch23
        with tqdm(total=workload.output_tokens, desc=f"mini-sglang ({variant})", unit="tok") as bar:
            llm.progress = bar
            synchronize(device)
            start = time.perf_counter()
            outputs = llm.generate(workload.prompts, workload.sampling_params())
            synchronize(device)
            seconds = time.perf_counter() - start
            llm.progress = None
        tokens = sum(len(o["token_ids"]) for o in outputs)
        results.append(RunResult("mini-sglang", variant, tokens, seconds, _peak(device), kv))
    ENV.DISABLE_OVERLAP_SCHEDULING.value = False
    llm.shutdown()
    del llm, engine
    _free_memory(device)
    return results, startup


def run_hf(args: argparse.Namespace, workload: OfflineWorkload) -> RunResult:
    """``transformers`` continuous batching on the same requests (bf16 on CUDA).

    Raises:
        RuntimeError: when its generation thread dies before every request finished.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    device = torch.device(args.device) if args.device else default_device()
    _reset_peak(device)
    kwargs: Dict[str, Any] = {"dtype": args.dtype}
    if args.hf_attn:
        kwargs["attn_implementation"] = args.hf_attn
    model = AutoModelForCausalLM.from_pretrained(args.model, **kwargs).to(device).eval()
    gen = GenerationConfig(
        do_sample=True,
        temperature=workload.temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max(workload.max_tokens),
        eos_token_id=None,  # None: EOS ignored, as ours
        pad_token_id=model.generation_config.pad_token_id,
    )
    # Not under torch.inference_mode(): the manager's generation thread updates, in place,
    # tensors made here, and inference mode is per thread (transformers 5.17 fails on that)
    manager = model.init_continuous_batching(generation_config=gen)
    manager.start()
    try:
        _hf_collect(manager, [workload.prompts[0][:32]] * 4, [16] * 4, None, "warmup")  # not timed
        with tqdm(
            total=workload.output_tokens, desc="transformers (continuous batching)", unit="tok"
        ) as bar:
            start = time.perf_counter()
            tokens = _hf_collect(manager, workload.prompts, workload.max_tokens, bar, "bench")
            synchronize(device)
            seconds = time.perf_counter() - start
    finally:
        manager.stop(block=True)
    result = RunResult(
        "transformers",
        f"generate_batch manager, {model.config._attn_implementation}",
        tokens,
        seconds,
        _peak(device),
        "-",
    )
    del manager, model
    _free_memory(device)
    return result


def _hf_collect(
    manager: Any,
    prompts: Sequence[List[int]],
    max_tokens: Sequence[int],
    bar: tqdm | None,
    prefix: str,
) -> int:
    """Submit every request, wait for all of them; returns the tokens generated."""
    pending = set()
    for i, (ids, n) in enumerate(zip(prompts, max_tokens)):
        rid = f"{prefix}_{i}"
        manager.add_request(input_ids=list(ids), request_id=rid, max_new_tokens=n)
        pending.add(rid)
    tokens = 0
    while pending:
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                raise RuntimeError(
                    f"transformers' generation thread stopped with {len(pending)} requests left"
                )
            continue
        if result.is_finished() and result.request_id in pending:
            pending.discard(result.request_id)
            n = len(result.generated_tokens)
            tokens += n
            if bar is not None:
                bar.update(n)
    return tokens


def print_report(
    workload: OfflineWorkload, results: List[RunResult], startups: Dict[str, Dict[str, float]]
) -> None:
    hf = next((r for r in results if r.system == "transformers"), None)
    print(
        f"\nworkload: {workload.num_requests} requests, {workload.input_tokens:,} prompt tokens, "
        f"{workload.output_tokens:,} output tokens (temperature {workload.temperature}, EOS ignored)"
    )
    rows = []
    for r in results:
        ratio = f"{r.tokens_per_second / hf.tokens_per_second:.1f}x" if hf else "-"
        rows.append(
            [
                r.system,
                r.variant,
                f"{r.output_tokens:,}",
                f"{r.seconds:.2f}",
                f"{r.tokens_per_second:,.0f}",
                ratio,
                gib(r.peak_memory) if r.peak_memory is not None else "-",
                r.kv,
            ]
        )
    print(
        format_table(
            [
                "system",
                "variant",
                "output tokens",
                "time s",
                "tok/s",
                "vs transformers",
                "peak GPU memory",
                "KV pages x P = tokens",
            ],
            rows,
        )
    )
    if startups:
        print(
            "\nmini-sglang start-up, seconds: load = weights; kv_cache = KV pool, page table, attention "
            "backend; jit_warmup = the sampler's first draw and the first eager decode pass, "
            "first_request = the first prefill (FlashInfer and Triton compile there); "
            "graph_capture = the rest of the capture"
        )
        keys = [
            "load",
            "kv_cache",
            "jit_warmup",
            "graph_capture",
            "scheduler",
            "first_request",
            "total",
        ]
        print(
            format_table(
                ["engine", *keys],
                [[name, *(f"{s.get(k, 0.0):.1f}" for k in keys)] for name, s in startups.items()],
            )
        )


def parse_args(argv: List[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.environ.get("MINISGL_MODEL", "models/qwen3-0.6b-shaped"))
    p.add_argument(
        "--device", default=None, help="default: MINISGL_DEVICE, else CUDA when available"
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16", "float16", "float32"],
        help="default: bfloat16 on CUDA, float32 on the CPU",
    )
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--input-len", type=int, nargs=2, default=[100, 1024], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[100, 1024], metavar=("MIN", "MAX"))
    p.add_argument("--page-size", type=int, default=256)
    p.add_argument("--max-running-req", type=int, default=256)
    p.add_argument("--max-extend-tokens", type=int, default=16384)
    p.add_argument("--max-seq-len", type=int, default=4096)
    p.add_argument("--memory-ratio", type=float, default=0.9)
    p.add_argument("--attention-backend", default="auto")
    p.add_argument(
        "--cuda-graph-max-bs", type=int, default=None, help="0 disables CUDA graphs (default 256)"
    )
    p.add_argument("--cache", default="radix", choices=["radix", "naive"])
    # >>> ch23
    p.add_argument(
        "--enable-retraction", action="store_true", help="optimistic admission with retraction"
    )
    # <<< ch23
    p.add_argument(
        "--tp",
        dest="tp_sizes",
        type=int,
        nargs="+",
        default=[1],
        help="tensor-parallel ranks, one GPU each (chapter 16); several values run in turn: --tp 1 2",
    )
    p.add_argument("--matrix", action="store_true", help="overlap on/off x radix/naive, four rows")
    p.add_argument("--hf", action="store_true", help="also run transformers' continuous batching")
    p.add_argument("--hf-only", action="store_true")
    p.add_argument(
        "--hf-attn", default=None, help="attn_implementation for transformers (default: its choice)"
    )
    args = p.parse_args(argv)
    args.tp = args.tp_sizes[0]  # run_minisgl's; main() runs each of tp_sizes in turn
    if (
        max(args.tp_sizes) > 1 and args.matrix
    ):  # the other ranks cannot follow a switch of loop made in this one
        p.error("--matrix runs one rank only; drop --tp or --matrix")
    device = torch.device(args.device) if args.device else default_device()
    args.dtype = getattr(torch, args.dtype or ("bfloat16" if is_cuda(device) else "float32"))
    return args


def main(argv: List[str] | None = None) -> List[RunResult]:
    args = parse_args(argv)
    workload = nano_vllm_workload(
        args.num_seqs, input_len=tuple(args.input_len), output_len=tuple(args.output_len)
    )
    results: List[RunResult] = []
    startups: Dict[str, Dict[str, float]] = {}
    if args.hf or args.hf_only:
        results.append(run_hf(args, workload))
    if not args.hf_only:
        caches = ["radix", "naive"] if args.matrix else [args.cache]
        overlaps = [True, False] if args.matrix else [True]
        for tp in args.tp_sizes:
            for cache in caches:
                rows, startup = run_minisgl(
                    argparse.Namespace(**{**vars(args), "tp": tp}), workload, cache, overlaps
                )
                results.extend(rows)
                startups[f"{cache} cache" + (f", tp={tp}" if len(args.tp_sizes) > 1 else "")] = (
                    startup
                )
    print_report(workload, results, startups)
    return results


if __name__ == "__main__":
    main()
