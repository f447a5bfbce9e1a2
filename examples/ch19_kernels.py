"""Chapter 19: the KV store and the embedding gather, as Triton kernels and as torch.

Both ops only move rows: the store scatters each new token's K and V into the pool at
``out_loc``, the gather copies one embedding row per token. The script runs the torch
references on a small example and prints what they do; on a GPU it also runs the Triton
kernels, checks they produce the same bits, and times both at serving sizes (a prefill
chunk of 8,192 tokens, a decode batch of 256).

    python examples/ch19_kernels.py [--device cpu|cuda]
"""

import argparse

import torch

from minisgl.kernel import torch_ops, use_triton

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
device = torch.device(args.device)

# a pool of 8 token slots, 2 KV heads of dim 3; three tokens go to slots 5, 1 and 6
k_cache, v_cache = torch.zeros(8, 2, 3), torch.zeros(8, 2, 3)
k = torch.arange(1, 19, dtype=torch.float32).view(3, 2, 3)
out_loc = torch.tensor([5, 1, 6])
torch_ops.store_cache(k_cache, v_cache, out_loc, k, -k)
print("store: slot -> first K value after storing tokens 0, 1, 2 at slots [5, 1, 6]:")
print("  " + ", ".join(f"{s}:{int(k_cache[s, 0, 0])}" for s in range(8)))
table = torch.arange(12, dtype=torch.float32).view(6, 2)
print(
    f"gather: ids [4, 0, 4] from a 6 x 2 table -> {torch_ops.embedding_gather(torch.tensor([4, 0, 4]), table).tolist()}"
)
print(
    f"on {device}: the engine's KV store and embedding run on "
    f"{'Triton' if use_triton(torch.zeros(1, device=device)) else 'the torch reference'}"
)


def time_ms(fn, iters: int = 100) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


if use_triton(torch.zeros(1, device=device)):
    from minisgl.kernel import triton_store

    dt = torch.bfloat16
    w = torch.randn(151936, 1024, device=device, dtype=dt)
    for tokens in (256, 8192):
        qkv = torch.randn(
            tokens, 32 * 128, device=device, dtype=dt
        )  # Qwen3-0.6B: 16 q + 8 k + 8 v heads
        k, v = qkv[:, 2048:3072].view(tokens, 8, 128), qkv[:, 3072:].view(tokens, 8, 128)
        loc = torch.randperm(65536, device=device)[:tokens].to(torch.int32)
        kc, vc = (
            torch.zeros(65536, 8, 128, device=device, dtype=dt),
            torch.zeros(65536, 8, 128, device=device, dtype=dt),
        )
        kr, vr = kc.clone(), vc.clone()
        triton_store.store_cache(kc, vc, loc, k, v)
        torch_ops.store_cache(kr, vr, loc.long(), k, v)
        ids = torch.randint(0, 151936, (tokens,), device=device, dtype=torch.int32)
        same = torch.equal(kc, kr) and torch.equal(vc, vr)
        same_gather = torch.equal(
            triton_store.embedding_gather(ids, w), torch_ops.embedding_gather(ids.long(), w)
        )
        t_ref = time_ms(lambda: torch_ops.store_cache(kr, vr, loc.long(), k, v))
        t_tri = time_ms(lambda: triton_store.store_cache(kc, vc, loc, k, v))
        g_ref = time_ms(lambda: torch_ops.embedding_gather(ids.long(), w))
        g_tri = time_ms(lambda: triton_store.embedding_gather(ids, w))
        moved = 2 * 2 * tokens * 8 * 128 * 2  # K and V, read and written, bf16
        print(
            f"{tokens:>5} tokens: store  same bits {same}, torch {t_ref * 1e3:6.1f} us, triton {t_tri * 1e3:6.1f} us "
            f"({moved / (t_tri / 1e3) / 1e9:,.0f} GB/s)"
        )  # t_tri is in ms
        print(
            f"{tokens:>5} tokens: gather same bits {same_gather}, torch {g_ref * 1e3:6.1f} us, "
            f"triton {g_tri * 1e3:6.1f} us"
        )
else:
    print(
        "(no GPU here: on one, this compares the Triton kernels with torch bit for bit and times both)"
    )
