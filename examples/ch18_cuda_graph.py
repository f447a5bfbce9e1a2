"""Chapter 18: CUDA graphs for decode: which sizes are captured, padding, and the speed-up.

Prints the batch sizes the engine would capture, how batches of 1..40 requests are
padded with the dummy request, and shows that padding leaves the real rows' logits alone
(the dummy writes its KV to the dummy page). On a GPU it then times one decode step
eagerly and through a graph at batch 1 and 8, and checks that greedy output with graphs
on and off is the same.

    python examples/ch18_cuda_graph.py [--model PATH] [--device cpu|cuda]
"""

import argparse
import os
import time

import torch

from minisgl.benchmark import manual
from minisgl.core import SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.engine.graph import determine_graph_bs, padded_batch_size
from minisgl.utils import load_tokenizer

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
on_gpu = args.device.startswith("cuda")

sizes = determine_graph_bs(None, None, max_running_req=256)
print(f"captured by default ({len(sizes)} graphs): {sizes[:6]} ... {sizes[-2:]}")
print(
    f"with --cuda-graph-max-bs 20: {determine_graph_bs(None, 20, 256)}; with 0: {determine_graph_bs(None, 0, 256)}"
)
print(
    "a decode batch of n requests runs as: "
    + ", ".join(f"{n}->{padded_batch_size(n, sizes)}" for n in (1, 3, 5, 9, 17, 30, 40))
)

engine = Engine(
    EngineConfig(
        args.model,
        dtype=torch.bfloat16 if on_gpu else torch.float32,
        device=args.device,
        max_running_req=8,
        num_page_override=1024,
        max_seq_len_override=256,
    )
)
runner = engine.graph_runner
print(
    f"engine on {engine.device}: attention {type(engine.attn_backend).__name__}, "
    f"captured {sorted(runner.graphs) or 'nothing (graphs need CUDA and a graph-capable backend)'}"
)

tok = load_tokenizer(args.model)
ids = [tok.encode(p) for p in ["The capital of France is", "def fibonacci(n):", "1 + 1 ="]]
reqs = manual.place(engine, ids, 4)
tokens, _ = manual.greedy(engine, reqs, 2, use_graph=False)
plain = manual.forward(engine, manual.build_batch(engine, reqs, "decode"), use_graph=False)
reqs = manual.place(engine, ids, 4)
manual.greedy(engine, reqs, 2, use_graph=False, forced=tokens)
saved, runner.graph_bs = (
    runner.graph_bs,
    runner.graph_bs or [4],
)  # on the CPU: pad as if 4 were captured
batch = manual.build_batch(engine, reqs, "decode")
runner.graph_bs = saved
padded = manual.forward(engine, batch, use_graph=False)
dummy = engine.dummy_req
change = float((padded - plain).abs().max() / (plain.max() - plain.min()))
print(
    f"3 requests padded to {batch.padded_size}: the dummy (row {dummy.table_idx}) writes slot "
    f"{int(batch.out_loc[-1])}, the dummy page; the real rows' logits are unchanged "
    f"(within 1e-4 of their range): {change < 1e-4}"
)

if runner.graphs:
    for bs in (1, 8):
        reqs = manual.place(engine, [ids[0]] * bs, 1)
        for r in reqs:
            r.cached_len = r.device_len - 1  # pretend the prompt is cached: a pure decode step
        batch = manual.build_batch(engine, reqs, "decode")
        timings = {}
        for use_graph in (False, True):
            for step in range(23):
                if step == 3:
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                engine.attn_backend.prepare_metadata(batch)
                with torch.inference_mode(), engine.ctx.forward_batch(batch):
                    logits = runner.replay(batch) if use_graph else engine.model.forward()
            torch.cuda.synchronize()
            timings[use_graph] = (time.perf_counter() - start) / 20 * 1e3
        print(
            f"decode step at batch {bs}: eager {timings[False]:.2f} ms, CUDA graph {timings[True]:.2f} ms"
        )
    engine.shutdown()
    from minisgl.llm import LLM

    outputs = []
    for max_bs in (8, 0):
        llm = LLM(
            args.model,
            dtype=torch.bfloat16,
            device=args.device,
            max_running_req=8,
            cuda_graph_max_bs=max_bs,
            max_seq_len_override=256,
            kv_memory_cap=1 << 30,
        )
        outputs.append(
            [
                o["token_ids"]
                for o in llm.generate(
                    ids + [ids[0]], SamplingParams(max_tokens=32, ignore_eos=True)
                )
            ]
        )
        llm.shutdown()
    print(
        f"greedy, 4 requests x 32 tokens: identical with graphs on and off: {outputs[0] == outputs[1]}"
    )
else:
    engine.shutdown()
