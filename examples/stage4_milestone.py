"""Stage 4 milestone: FlashInfer, CUDA graphs, the Triton kernels and the benchmarks, together.

Five checks, each printed with ok/FAIL (exit status 1 if any fails):

1. kernels: which implementation serves each op on this device (chapter 17, 19);
2. FlashInfer's paged-KV index recovers every token slot of random batches, page sizes
   1 and 16 (chapter 17); on a GPU also: FlashInfer's logits against the torch backend
   with the torch kernels, teacher-forced, within 2% of the logit range;
3. the Triton KV store and embedding gather give the torch references' exact bits
   (chapter 19): compiled and timed on a GPU, under Triton's interpreter on the CPU;
4. CUDA graphs (chapter 18): on a GPU, greedy output with graphs on and off is identical;
   everywhere, padding a decode batch with the dummy request leaves the real rows alone;
5. the offline benchmark on a small workload (chapter 22): every requested token comes
   back; on a GPU three rows (everything on, graphs off, the torch path) and the decode
   step beside its memory-bandwidth floor.

On the CPU nothing here is fast and nothing GPU-specific runs: the script says which
checks ran and which need a GPU, and prints no GPU figure.

    python examples/stage4_milestone.py [--model PATH] [--device cpu|cuda]
"""
# output: mask \d+\.\d+ s\b
# output: mask \d+\.\d+ tok/s
# output: mask \d\.\d+e[-+]\d+

import argparse
import importlib.util
import os
import random
import subprocess
import sys
import textwrap
import time

import torch

from minisgl.attention import create_attention_backend
from minisgl.attention.fi import paged_kv_index
from minisgl.benchmark import manual, offline
from minisgl.benchmark.workload import nano_vllm_workload
from minisgl.core import Req, SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.env import ENV
from minisgl.kernel import serves, torch_ops
from minisgl.utils import load_tokenizer

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
ON_GPU = args.device.startswith("cuda")
DTYPE = torch.bfloat16 if ON_GPU else torch.float32
LOGIT_TOL = 0.02  # of a step's logit range: the tolerance of tests/test_ch17_flashinfer.py
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "1 + 1 =",
    "Once upon a time, in a small village,",
]
failures: list = []
gpu_only: list = []


def check(name: str, ok: bool, detail: str) -> None:
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        failures.append(name)


def relative_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| as a fraction of b's logit range."""
    return float((a - b).abs().max() / (b.max() - b.min()))


tok = load_tokenizer(args.model)
ids = [tok.encode(p) for p in PROMPTS]
print(f"stage 4 on {args.device} ({DTYPE}), model {os.path.basename(args.model)}")

# ---- 1. which kernel serves which op ------------------------------------------------------
print("1. kernels")
probe = torch.zeros(1, device=args.device, dtype=DTYPE)
fi, tr = serves("flashinfer", probe), serves("triton", probe)
print(
    f"  norms, SwiGLU, RoPE, sampling: {'FlashInfer' if fi else 'torch reference'}; "
    f"KV store, embedding gather: {'Triton' if tr else 'torch reference'}"
)
if ON_GPU:
    check(
        "CUDA uses the fast kernels",
        fi and tr,
        "FlashInfer and Triton"
        if fi and tr
        else "flashinfer or triton is missing: pip install -e .[gpu]",
    )
else:
    check(
        "the CPU uses the torch references", not fi and not tr, "the only kernels that run on a CPU"
    )

# ---- 2. FlashInfer's index, and its logits -------------------------------------------------
print("2. FlashInfer attention")
rng = random.Random(0)
for page in (1, 16):
    per_row = 8
    order = torch.randperm(8 * per_row, generator=torch.Generator().manual_seed(page))
    table = torch.stack(
        [
            (order[r * per_row : (r + 1) * per_row, None] * page + torch.arange(page)).flatten()
            for r in range(8)
        ]
    ).to(torch.int32)  # each row: random distinct pages
    reqs = []
    for row in rng.sample(range(8), 5):
        length = rng.randint(1, per_row * page)
        reqs.append(
            Req(
                torch.zeros(length, dtype=torch.int32),
                row,
                rng.randint(0, length - 1),
                1,
                row,
                SamplingParams(),
                None,
            )
        )  # type: ignore[arg-type]
    index = paged_kv_index(table, reqs, page)
    recovered = True
    for i, r in enumerate(reqs):
        pages = index.kv_page_ids[index.kv_indptr[i] : index.kv_indptr[i + 1]].long()
        slots = (pages[:, None] * page + torch.arange(page)).flatten()[
            : (len(pages) - 1) * page + int(index.kv_last_page_len[i])
        ]
        recovered &= torch.equal(slots, table[r.table_idx, : r.device_len].long())
    check(
        f"page size {page:>2}: index of 5 requests",
        recovered,
        f"{int(index.kv_indptr[-1])} pages, {int(index.qo_indptr[-1])} query rows; every slot recovered",
    )

engine = Engine(
    EngineConfig(
        args.model,
        dtype=DTYPE,
        device=args.device,
        page_size=16,
        max_running_req=8,
        num_page_override=256,
        max_seq_len_override=256,
        cuda_graph_max_bs=0,
        attention_backend="fi" if fi else "auto",
    )
)
backend = type(engine.attn_backend).__name__
if backend == "FlashInferBackend":
    tokens, fi_logits = manual.greedy(engine, manual.place(engine, ids, 6), 6)
    engine.attn_backend = engine.ctx.attn_backend = create_attention_backend(
        "torch", engine.config.model_config
    )
    ENV.TORCH_KERNELS.value = True  # the whole reference path: torch attention and torch kernels
    _, ref_logits = manual.greedy(engine, manual.place(engine, ids, 6), 6, forced=tokens)
    ENV.TORCH_KERNELS.value = False
    worst = max(relative_diff(a, b) for a, b in zip(fi_logits, ref_logits))
    same = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(fi_logits, ref_logits))
    check(
        "FlashInfer vs the torch path, 4 prompts x 6 steps",
        worst < LOGIT_TOL,
        f"max |diff| {worst:.3%} of the logit range (limit {LOGIT_TOL:.0%}); same argmax {same}/{6 * len(ids)}",
    )
else:
    check(
        "the engine picks the torch attention backend",
        backend == "TorchAttnBackend",
        f"{backend}: FlashInfer needs CUDA and fp16/bf16",
    )
    gpu_only.append("FlashInfer's logits against the torch backend (bf16, pages of 16)")
engine.shutdown()

# ---- 3. the Triton kernels -----------------------------------------------------------------
print("3. Triton kernels")
TRITON_CHECK = """
import torch
from minisgl.kernel import torch_ops
from minisgl.kernel.triton import store as triton_store
dev, dtype, tokens = {dev!r}, getattr(torch, {dtype!r}), {tokens}
gen = torch.Generator().manual_seed(0)
qkv = torch.randn(tokens, 32 * 64, generator=gen).to(dev, dtype)  # 16 q + 8 k + 8 v heads of 64
k, v = qkv[:, 1024:1536].view(tokens, 8, 64), qkv[:, 1536:].view(tokens, 8, 64)  # strided views
loc = torch.randperm(4 * tokens, generator=gen)[:tokens].to(dev, torch.int32)
kc, vc = (torch.zeros(4 * tokens, 8, 64, device=dev, dtype=dtype) for _ in range(2))
kr, vr = kc.clone(), vc.clone()
triton_store.store_cache(kc, vc, loc, k, v)
torch_ops.store_cache(kr, vr, loc.long(), k, v)
w = torch.randn(1000, 576, generator=gen).to(dev, dtype)
ids = torch.randint(0, 1000, (tokens,), generator=gen).to(dev, torch.int32)
same = torch.equal(kc, kr) and torch.equal(vc, vr)
same_gather = torch.equal(triton_store.embedding_gather(ids, w), torch_ops.embedding_gather(ids.long(), w))
if __name__ == "__main__":  # in a subprocess (python -c); not under exec()
    print(same, same_gather)
"""
if ON_GPU and tr:
    namespace: dict = {}
    exec(TRITON_CHECK.format(dev="cuda", dtype="bfloat16", tokens=8192), namespace)
    from minisgl.kernel.triton import store as triton_store

    def time_us(fn, iters: int = 100) -> float:
        for _ in range(5):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iters * 1e3

    n = namespace
    t_ref = time_us(
        lambda: torch_ops.store_cache(n["kr"], n["vr"], n["loc"].long(), n["k"], n["v"])
    )
    t_tri = time_us(lambda: triton_store.store_cache(n["kc"], n["vc"], n["loc"], n["k"], n["v"]))
    check(
        "store and gather, 8192 tokens, bf16, compiled",
        n["same"] and n["same_gather"],
        f"same bits as torch; store: torch {t_ref:.1f} us, Triton {t_tri:.1f} us",
    )
elif importlib.util.find_spec("triton") is not None:
    env = dict(os.environ, TRITON_INTERPRET="1")  # read when triton is imported: a fresh process
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(TRITON_CHECK.format(dev="cpu", dtype="float32", tokens=7)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    ok = res.returncode == 0 and res.stdout.split() == ["True", "True"]
    check(
        "store and gather, 7 tokens, under Triton's interpreter",
        ok,
        "same bits as torch (the indexing is right; nothing about speed)"
        if ok
        else res.stderr[-500:],
    )
    gpu_only.append("the Triton kernels compiled, and their time against torch's")
else:
    print("  triton is not installed: nothing to check here")
    gpu_only.append("the Triton kernels compiled, and their time against torch's")

# ---- 4. CUDA graphs ------------------------------------------------------------------------
print("4. CUDA graphs")
engine = Engine(
    EngineConfig(
        args.model,
        dtype=DTYPE,
        device=args.device,
        max_running_req=8,
        num_page_override=1024,
        max_seq_len_override=256,
        cuda_graph_bs=(4,) if ON_GPU else None,
    )
)
runner = engine.graph_runner
three, saved = ids[:3], runner.graph_bs
runner.graph_bs = []  # the reference: 3 requests, unpadded, eager
reqs = manual.place(engine, three, 4)
tokens, _ = manual.greedy(engine, reqs, 2, use_graph=False)
plain = manual.forward(engine, manual.build_batch(engine, reqs, "decode"), use_graph=False)
reqs = manual.place(engine, three, 4)
manual.greedy(engine, reqs, 2, use_graph=False, forced=tokens)
runner.graph_bs = saved or [4]  # on the CPU: pad as if 4 were captured
batch = manual.build_batch(engine, reqs, "decode")
runner.graph_bs = saved
captured = bool(runner.graphs)
padded = manual.forward(
    engine, batch, use_graph=captured
)  # with graphs: a replay of the size-4 graph
tol = LOGIT_TOL if ON_GPU else 1e-4  # bf16 on a GPU: the tolerance of chapter 17's tests
diff = relative_diff(padded, plain)
check(
    f"3 requests padded to {batch.padded_size} with the dummy",
    batch.padded_size == 4 and diff < tol,
    f"the real rows' logits move by {diff:.2e} of their range (limit {tol:g}); "
    f"{'replayed the graph of 4' if captured else 'run eagerly: nothing was captured on ' + args.device}",
)
engine.shutdown()
if captured:
    from minisgl.llm import LLM

    outputs, replays = {}, {}
    for max_bs in (16, 0):
        llm = LLM(
            args.model,
            dtype=DTYPE,
            device=args.device,
            max_running_req=16,
            cuda_graph_max_bs=max_bs,
            max_seq_len_override=512,
            kv_memory_cap=1 << 30,
        )
        count, original = [0], llm.engine.graph_runner.replay
        llm.engine.graph_runner.replay = lambda b: count.__setitem__(0, count[0] + 1) or original(b)  # type: ignore
        outputs[max_bs] = [
            o["token_ids"]
            for o in llm.generate(ids, SamplingParams(max_tokens=32, ignore_eos=True))
        ]
        replays[max_bs] = count[0]
        llm.shutdown()
    check(
        "greedy, 4 prompts x 32 tokens, graphs on vs off",
        outputs[16] == outputs[0] and replays[16] > 0,
        f"identical; {replays[16]} decode steps replayed with graphs on, {replays[0]} with them off",
    )
else:
    gpu_only.append("capturing and replaying graphs, and greedy output with graphs on and off")

# ---- 5. the benchmarks ---------------------------------------------------------------------
print("5. benchmarks")
if ON_GPU:
    argv = [
        "--model",
        args.model,
        "--num-seqs",
        "64",
        "--input-len",
        "64",
        "256",
        "--output-len",
        "32",
        "128",
        "--max-seq-len",
        "1024",
        "--page-size",
        "16",
        "--max-running-req",
        "64",
        "--memory-ratio",
        "0.5",
    ]
    workload = nano_vllm_workload(64, input_len=(64, 256), output_len=(32, 128))
    results, startups = [], {}
    for name, extra, torch_kernels in [
        ("everything on", ["--cuda-graph-max-bs", "64"], False),
        ("graphs off", ["--cuda-graph-max-bs", "0"], False),
        ("torch path", ["--attention-backend", "torch"], True),
    ]:
        ENV.TORCH_KERNELS.value = torch_kernels
        rows, startups[name] = offline.run_minisgl(
            offline.parse_args(argv + extra), workload, "radix", [True]
        )
        ENV.TORCH_KERNELS.value = False
        rows[0].variant += ", torch kernels" if torch_kernels else ""
        results += rows
    offline.print_report(workload, results, startups)
    check(
        "every requested token came back, in all three runs",
        all(r.output_tokens == workload.output_tokens for r in results),
        f"{workload.output_tokens:,} tokens each",
    )
    from minisgl.benchmark import decode_step

    print()
    decode_step.main(
        [
            "--model",
            args.model,
            "--batch-sizes",
            "1",
            "8",
            "64",
            "--context",
            "512",
            "--steps",
            "20",
        ]
    )
else:
    cpu_args = offline.parse_args(
        [
            "--model",
            args.model,
            "--device",
            "cpu",
            "--num-seqs",
            "4",
            "--input-len",
            "4",
            "16",
            "--output-len",
            "4",
            "8",
            "--max-seq-len",
            "128",
            "--page-size",
            "16",
            "--max-running-req",
            "4",
        ]
    )
    workload = nano_vllm_workload(4, input_len=(4, 16), output_len=(4, 8))
    start = time.perf_counter()
    [result], _ = offline.run_minisgl(cpu_args, workload, "radix", [True])
    check(
        f"offline workload, {workload.num_requests} requests of nano-vllm's shape",
        result.output_tokens == workload.output_tokens,
        f"{result.output_tokens} of {workload.output_tokens} output tokens in {result.seconds:.2f} s "
        f"({result.tokens_per_second:.1f} tok/s: a CPU figure in float32, nothing to compare with a GPU's)",
    )
    gpu_only.append(
        "tokens per second with everything on, graphs off and the torch path; "
        "decode step time against the memory-bandwidth floor"
    )

if gpu_only:
    print(
        f"only a GPU shows ({args.device} ran none of these; run this script on one):"
        if not ON_GPU
        else "not checked in this run (they need flashinfer and triton: pip install -e .[gpu]):"
    )
    for item in gpu_only:
        print(f"  - {item}")
print(f"{'all checks passed' if not failures else 'FAILED: ' + ', '.join(failures)}")
sys.exit(1 if failures else 0)
