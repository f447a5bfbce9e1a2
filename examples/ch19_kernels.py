"""Chapter 19: the kernel table, the row-moving kernels, and the fused decode path.

1. Which library the kernel table picks for each op, for a bf16 call on this device.
2. The KV store and the embedding gather on a small example (the torch references).
3. The fused decode path on the model: a prefill, then decode steps of one request on the
   fused path (``models/fused_decode.py``; on a CPU through its torch references) against
   the unfused path: the same logits, and the kernel ops a decode step launches.
4. On a GPU: the Triton store and gather against torch, bit for bit and timed. (The batch-1
   decode step after each of the chapter's speed-ups is ``python -m minisgl.benchmark.batch1``.)

    python examples/ch19_kernels.py [--model PATH] [--device cpu|cuda]
"""

import argparse
import os
from collections import Counter

import torch

from minisgl import kernel
from minisgl.benchmark import manual
from minisgl.benchmark.common import cuda_time_ms
from minisgl.engine import Engine, EngineConfig
from minisgl.kernel import torch_ops
from minisgl.models import fused_decode
from minisgl.utils import load_tokenizer

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
device = torch.device(args.device)

# 1. the table ---------------------------------------------------------------------------
x = torch.zeros(1, 1024, device=device, dtype=torch.bfloat16)
o_proj = torch.zeros(1024, 2048, device=device, dtype=torch.bfloat16)
slots = torch.zeros(8, 2, 64, device=device, dtype=torch.bfloat16)
loc = torch.arange(2, device=device)
calls = {
    "rms_norm": (x, x[0], 1e-6),
    "linear (1 x 2048 @ o_proj)": (torch.zeros(1, 2048, device=device, dtype=x.dtype), o_proj),
    "linear (64 rows)": (torch.zeros(64, 2048, device=device, dtype=x.dtype), o_proj),
    "store_cache": (slots, slots, loc, slots[:2], slots[:2]),
    "norm_linear": (x, x[0], 1e-6, o_proj.T.contiguous()),
}
print(f"the kernel table on {device}, for bf16 calls:")
for name, call_args in calls.items():
    print(f"  {name:28s} -> {kernel.library_for(name.split()[0], *call_args)}")

# 2. the row-moving kernels' references ----------------------------------------------------
k_cache, v_cache = torch.zeros(8, 2, 3), torch.zeros(8, 2, 3)
k = torch.arange(1, 19, dtype=torch.float32).view(3, 2, 3)
torch_ops.store_cache(k_cache, v_cache, torch.tensor([5, 1, 6]), k, -k)
print("store: slot -> first K value after storing tokens 0, 1, 2 at slots [5, 1, 6]:")
print("  " + ", ".join(f"{s}:{int(k_cache[s, 0, 0])}" for s in range(8)))
table = torch.arange(12, dtype=torch.float32).view(6, 2)
gathered = torch_ops.embedding_gather(torch.tensor([4, 0, 4]), table).tolist()
print(f"gather: ids [4, 0, 4] from a 6 x 2 table -> {gathered}")

# 3. the fused decode path -------------------------------------------------------------------
on_gpu = device.type == "cuda"
engine = Engine(
    EngineConfig(
        args.model,
        dtype=torch.bfloat16 if on_gpu else torch.float32,
        device=args.device,
        max_running_req=1,
        num_page_override=64,
        max_seq_len_override=64,
        cuda_graph_max_bs=0,
    )
)
if not isinstance(engine.model, fused_decode.FusedDecodeLM):  # no Triton here: its torch references
    engine.model = fused_decode.FusedDecodeLM(engine.model)
    fused_decode.takes = lambda model, batch: batch.is_decode and batch.padded_size == 1
models = {False: engine.model.unfused, True: engine.model}
prompt = load_tokenizer(args.model).encode("The capital of France is")


def run(fused: bool, forced=None):
    engine.model = models[fused]
    return manual.greedy(
        engine, manual.place(engine, [prompt], 4), 4, use_graph=False, forced=forced
    )


tokens, plain = run(fused=False)
_, fused = run(fused=True, forced=tokens)
layers = len(engine.model.model.layers)
diff = max(float((a - b).abs().max()) for a, b in zip(plain[1:], fused[1:]))
print(
    f"fused decode path, {layers} layers: max |fused - unfused| logit over 3 decode steps {diff:.2e}"
)


def ops_of_one_decode_step(fused_on: bool) -> Counter:
    """The kernel ops of a prefill and one decode step, less those of the prefill alone."""
    counts = []
    for steps in (1, 2):
        engine.model = models[fused_on]
        with kernel.counting() as ops:
            manual.greedy(engine, manual.place(engine, [prompt], 2), steps, use_graph=False)
        counts.append(ops)
    return counts[1] - counts[0]


for fused_on in (False, True):
    step_ops = ops_of_one_decode_step(fused_on)
    kinds = ", ".join(f"{op} {n}" for op, n in sorted(step_ops.items()))
    label = "fused" if fused_on else "unfused"
    print(
        f"  {label}: {sum(step_ops.values())} ops through the kernel table in a decode step ({kinds})"
    )
engine.shutdown()

# 4. on a GPU: the Triton kernels timed, and the batch-1 step rung by rung -----------------------
if on_gpu and kernel.has_kernel("store_cache", "triton", device):
    from minisgl.kernel.triton import store as triton_store

    dt = torch.bfloat16
    w = torch.randn(151936, 1024, device=device, dtype=dt)
    for tokens_n in (256, 8192):
        qkv = torch.randn(tokens_n, 32 * 128, device=device, dtype=dt)  # 16 q + 8 k + 8 v heads
        k, v = qkv[:, 2048:3072].view(tokens_n, 8, 128), qkv[:, 3072:].view(tokens_n, 8, 128)
        loc = torch.randperm(65536, device=device)[:tokens_n].to(torch.int32)
        kc, vc = (torch.zeros(65536, 8, 128, device=device, dtype=dt) for _ in range(2))
        kr, vr = kc.clone(), vc.clone()
        triton_store.store_cache(kc, vc, loc, k, v)
        torch_ops.store_cache(kr, vr, loc.long(), k, v)
        ids = torch.randint(0, 151936, (tokens_n,), device=device, dtype=torch.int32)
        same = torch.equal(kc, kr) and torch.equal(vc, vr)
        gather = triton_store.embedding_gather(ids, w)
        same_gather = torch.equal(gather, torch_ops.embedding_gather(ids.long(), w))
        t_ref = cuda_time_ms(lambda: torch_ops.store_cache(kr, vr, loc.long(), k, v), 100)
        t_tri = cuda_time_ms(lambda: triton_store.store_cache(kc, vc, loc, k, v), 100)
        g_ref = cuda_time_ms(lambda: torch_ops.embedding_gather(ids.long(), w), 100)
        g_tri = cuda_time_ms(lambda: triton_store.embedding_gather(ids, w), 100)
        print(
            f"{tokens_n:>5} tokens: store same bits {same}, torch {t_ref * 1e3:6.1f} us, "
            f"triton {t_tri * 1e3:6.1f} us; gather same bits {same_gather}, "
            f"torch {g_ref * 1e3:6.1f} us, triton {g_tri * 1e3:6.1f} us"
        )
else:
    print("(no GPU here: on one, the Triton store and gather are checked and timed against torch)")
