"""Time one MoE layer: the torch reference loop against the fused Triton backend (chapter 21).

    python -m minisgl.benchmark.moe_layer               # Qwen3-30B-A3B's MoE shapes, bf16, on CUDA
    python -m minisgl.benchmark.moe_layer --tokens 1 64 4096 --experts 64 --top-k 4

For each token count it builds random inputs and router logits, checks that both backends
agree (largest difference relative to the largest output), and prints the milliseconds
per layer forward (routing included) of each, measured with CUDA events over ``--iters``
calls after a warm-up, plus the fused path's weight traffic: the experts the batch touches
(``E_hit``) times the bytes of one expert's three matrices, over the time. Few tokens touch
few experts and the layer is bound by reading their weights; many tokens touch all of
them and it becomes a grouped GEMM bound by compute. Needs a CUDA GPU and ``triton``.
"""

from __future__ import annotations

import argparse
from typing import Dict, List

import torch

from minisgl.moe.fused import FusedMoe
from minisgl.moe.routing import fused_topk
from minisgl.moe.torch_backend import TorchMoe

from .common import cuda_time_ms


def time_moe_layer(
    tokens: int,
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    dtype: torch.dtype = torch.bfloat16,
    iters: int = 50,
    seed: int = 0,
) -> Dict[str, float]:
    """One row of the table: ``torch_ms``, ``fused_ms`` (per layer forward), ``rel_diff``
    (max |fused - torch| / max |torch|), ``experts_hit`` and ``fused_gbps`` (weight bytes
    of the experts hit / fused time)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype, generator=gen)
    w1 = (
        torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=dtype, generator=gen)
        / hidden**0.5
    )
    w2 = torch.randn(experts, hidden, inter, device="cuda", dtype=dtype, generator=gen) / inter**0.5
    logits = torch.randn(tokens, experts, device="cuda", dtype=dtype, generator=gen)
    ref, fused = TorchMoe(), FusedMoe()
    want = ref.forward(x, w1, w2, logits, top_k, True).float()
    got = fused.forward(x, w1, w2, logits, top_k, True).float()
    rel = float((got - want).abs().max() / want.abs().max())
    hit = int(fused_topk(logits, top_k, True)[1].unique().numel())
    torch_ms = cuda_time_ms(lambda: ref.forward(x, w1, w2, logits, top_k, True), iters)
    fused_ms = cuda_time_ms(lambda: fused.forward(x, w1, w2, logits, top_k, True), iters)
    weight_bytes = hit * 3 * hidden * inter * w1.element_size()
    return {
        "tokens": tokens,
        "torch_ms": torch_ms,
        "fused_ms": fused_ms,
        "rel_diff": rel,
        "experts_hit": hit,
        "fused_gbps": weight_bytes / fused_ms / 1e6,
    }


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256, 1024, 4096])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--inter", type=int, default=768, help="moe_intermediate_size (per rank)")
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (the fused backend is a Triton kernel)")
    dtype = getattr(torch, args.dtype)
    print(
        f"{torch.cuda.get_device_name()}: MoE layer, H={args.hidden}, I={args.inter}, E={args.experts}, "
        f"top-{args.top_k}, {args.dtype}; ms per layer forward (routing included)"
    )
    print(
        f"{'tokens':>7} {'E_hit':>6} {'torch ms':>9} {'fused ms':>9} {'speed-up':>8} {'fused GB/s':>10} {'rel diff':>9}"
    )
    for t in args.tokens:
        r = time_moe_layer(t, args.hidden, args.inter, args.experts, args.top_k, dtype, args.iters)
        print(
            f"{t:>7} {r['experts_hit']:>6} {r['torch_ms']:>9.3f} {r['fused_ms']:>9.3f} "
            f"{r['torch_ms'] / r['fused_ms']:>7.1f}x {r['fused_gbps']:>10.0f} {r['rel_diff']:>9.1e}"
        )


if __name__ == "__main__":
    main()
