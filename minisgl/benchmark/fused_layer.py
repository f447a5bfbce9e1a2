"""A decoder layer's decode work at batch 1 or 2, op by op and fused (chapter 19).

    python -m minisgl.benchmark.fused_layer            # Qwen3-0.6B's shapes, M = 1 and 2 rows
    python -m minisgl.benchmark.fused_layer --sweep    # also each fused GEMV alone, other tiles
    python -m minisgl.benchmark.fused_layer --distinct-layers 1  # one layer's weights, in L2

A layer of a decode step over a 1,025-token context on 28 layers' worth of distinct weights
(so that they come from memory as in a real step), each layer's KV in its own pool, captured
in a CUDA graph:

* ``unfused``: the layer op by op, as the engine runs it without the fused path: add + norm,
  qkv, q-norm, k-norm, RoPE, the KV store, the attention, o_proj, add + norm, gate/up, SwiGLU,
  down (FlashInfer, cuBLAS or the GEMV, the Triton store; the split-KV attention in both rows);
* ``fused``: ``norm_linear`` (qkv), ``decode_attention_qkv`` (the q/k norms, RoPE, the store
  and the attention), ``linear_add_residual_`` (o_proj), ``norm_linear(swiglu=True)``
  (gate/up), ``linear_add_residual_`` (down): the fused decode path's six launches, with
  programmatic dependent launch; ``fused, no PDL`` the same without it (the speed-up ``pdl``).

Prints microseconds per layer and the weight bytes read per second. ``--sweep`` times each
fused GEMV alone over a grid of tiles, beside the tiles ``fused_gemv_config`` picks.
Needs CUDA, FlashInfer and Triton.
"""

from __future__ import annotations

import argparse
import itertools
from typing import Callable, Dict, List, Optional

import torch

from minisgl import kernel
from minisgl.kernel import speedups
from minisgl.kernel.triton import fused as fused_kernels
from minisgl.layers.rotary import _cos_sin_cache

from .common import format_table, graph_time_us

QWEN3_0_6B = dict(
    hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072, layers=28, eps=1e-6
)
CONTEXT, PAGE, MAX_SEQ_LEN = 1025, 256, 4096  # tokens per request (this step's included)
KERNELS = ("qkv", "attn", "merge", "o", "gate_up", "down")  # the fused layer's launches


def make_layers(cfg: Dict[str, float], dtype: torch.dtype) -> List[Dict[str, torch.Tensor]]:
    """Random weights of ``cfg['layers']`` layers, each a dict of the layer's tensors."""
    h, d, i = cfg["hidden"], cfg["head_dim"], cfg["intermediate"]
    qkv = (cfg["heads"] + 2 * cfg["kv_heads"]) * d
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)

    return [
        dict(
            qkv=rand(qkv, h, scale=h**-0.5),
            o=rand(h, cfg["heads"] * d, scale=(cfg["heads"] * d) ** -0.5),
            gate_up=rand(2 * i, h, scale=h**-0.5),
            down=rand(h, i, scale=i**-0.5),
            norm_in=1 + rand(h, scale=0.1),
            norm_post=1 + rand(h, scale=0.1),
            q_norm=1 + rand(d, scale=0.1),
            k_norm=1 + rand(d, scale=0.1),
        )
        for _ in range(int(cfg["layers"]))
    ]


class LayerChain:
    """``cfg['layers']`` layers at ``m`` rows (requests), each request ``CONTEXT`` tokens long
    on pages of ``PAGE``: the weights (``distinct`` layers' worth, cycled), every layer's KV
    pool, the paged index, positions and slots of this step's tokens, the residual stream."""

    def __init__(self, cfg: Dict[str, float], m: int, distinct: Optional[int] = None) -> None:
        dtype, h, d = torch.bfloat16, int(cfg["hidden"]), int(cfg["head_dim"])
        self.cfg, self.m = cfg, m
        weights = make_layers(
            dict(cfg, layers=min(distinct or cfg["layers"], cfg["layers"])), dtype
        )
        self.weights = [weights[i % len(weights)] for i in range(int(cfg["layers"]))]
        self.residual = torch.randn(m, h, device="cuda", dtype=dtype)
        self.x = torch.randn(m, h, device="cuda", dtype=dtype)
        self.cos_sin = _cos_sin_cache(d, MAX_SEQ_LEN, 1e6, None, torch.device("cuda"))
        pages = -(-CONTEXT // PAGE)
        slots = pages * PAGE * m
        kv_heads = int(cfg["kv_heads"])
        self.pools = [
            [torch.randn(slots, kv_heads, d, device="cuda", dtype=dtype) for _ in range(2)]
            for _ in self.weights
        ]
        i32 = dict(device="cuda", dtype=torch.int32)
        self.index = (
            torch.arange(0, (m + 1) * pages, pages, **i32),  # kv_indptr
            torch.arange(m * pages, **i32),  # kv_page_ids
            torch.full((m,), CONTEXT - (pages - 1) * PAGE, **i32),  # kv_last_page_len
        )
        self.positions = torch.full((m,), CONTEXT - 1, device="cuda", dtype=torch.int64)
        self.out_loc = self.index[0][:-1].long() * PAGE + CONTEXT - 1

    def fused(self, i: int, stamps: Optional[Dict[str, torch.Tensor]] = None) -> None:
        """Layer ``i`` on the fused path; ``stamps`` (a buffer per name of ``KERNELS``)
        records each launch's per-program timeline."""
        c, w, res, (k, v) = self.cfg, self.weights[i], self.residual, self.pools[i]
        hq, d = int(c["heads"]), int(c["head_dim"])
        st = stamps or {}
        qkv = fused_kernels.norm_gemv(res, w["norm_in"], c["eps"], w["qkv"], stamps=st.get("qkv"))
        o = kernel.decode_attention_qkv(
            qkv,
            self.positions,
            self.cos_sin,
            w["q_norm"],
            w["k_norm"],
            c["eps"],
            k,
            v,
            self.out_loc,
            *self.index,
            PAGE,
            d**-0.5,
            MAX_SEQ_LEN,
            hq,
            stamps=(st["attn"], st["merge"]) if st else None,
        )
        fused_kernels.gemv_add_residual_(o.reshape(self.m, hq * d), w["o"], res, stamps=st.get("o"))
        act = fused_kernels.norm_gemv(
            res, w["norm_post"], c["eps"], w["gate_up"], swiglu=True, stamps=st.get("gate_up")
        )
        fused_kernels.gemv_add_residual_(act, w["down"], res, stamps=st.get("down"))

    def unfused(self, i: int) -> None:
        """Layer ``i`` op by op, through the kernel table."""
        c, w, m, (k_slots, v_slots) = self.cfg, self.weights[i], self.m, self.pools[i]
        hq, hkv, d = int(c["heads"]), int(c["kv_heads"]), int(c["head_dim"])
        x, res = kernel.fused_add_rms_norm(self.x, self.residual, w["norm_in"], c["eps"])
        q, k, v = kernel.linear(x, w["qkv"]).split([hq * d, hkv * d, hkv * d], dim=-1)
        q = kernel.rms_norm(q.reshape(m, hq, d), w["q_norm"], c["eps"])
        k = kernel.rms_norm(k.reshape(m, hkv, d), w["k_norm"], c["eps"])
        q, k = kernel.apply_rotary(self.positions, q, k, self.cos_sin)
        kernel.store_cache(k_slots, v_slots, self.out_loc, k, v.reshape(m, hkv, d))
        o = kernel.decode_attention(
            q.contiguous(), k_slots, v_slots, *self.index, PAGE, d**-0.5, MAX_SEQ_LEN
        )
        x = kernel.linear(o.reshape(m, hq * d), w["o"])
        x, res = kernel.fused_add_rms_norm(x, res, w["norm_post"], c["eps"])
        kernel.linear(kernel.silu_and_mul(kernel.linear(x, w["gate_up"])), w["down"])

    def time_us(self, fn: Callable[[int], None], replays: int) -> float:
        """Microseconds per layer of ``fn`` over all the layers, in one CUDA graph."""
        return graph_time_us([lambda i=i: fn(i) for i in range(len(self.weights))], replays)


def layer_bytes(w: Dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in w.values())


def sweep(chain: "LayerChain", replays: int, top: int = 3) -> List[list]:
    """Each fused GEMV alone, cycling through the layers' weights, over a grid of tiles."""
    m, eps, layers, residual = chain.m, chain.cfg["eps"], chain.weights, chain.residual
    act = torch.randn(m, int(chain.cfg["intermediate"]), device="cuda", dtype=residual.dtype)
    attn = torch.randn(
        m, int(chain.cfg["heads"] * chain.cfg["head_dim"]), device="cuda", dtype=residual.dtype
    )
    gemvs: Dict[str, tuple] = {  # name: (weight key, swiglu, call(w, config))
        "qkv (norm)": (
            "qkv",
            False,
            lambda w, cf: fused_kernels.norm_gemv(residual, w["norm_in"], eps, w["qkv"], config=cf),
        ),
        "gate_up (norm, swiglu)": (
            "gate_up",
            True,
            lambda w, cf: fused_kernels.norm_gemv(
                residual, w["norm_post"], eps, w["gate_up"], swiglu=True, config=cf
            ),
        ),
        "o (add)": (
            "o",
            False,
            lambda w, cf: fused_kernels.gemv_add_residual_(attn, w["o"], residual, config=cf),
        ),
        "down (add)": (
            "down",
            False,
            lambda w, cf: fused_kernels.gemv_add_residual_(act, w["down"], residual, config=cf),
        ),
    }
    rows = []
    for name, (key, swiglu, call) in gemvs.items():
        n, k = layers[0][key].shape
        n = n // 2 if swiglu else n
        picked = fused_kernels.fused_gemv_config(m, n, k, swiglu)
        block_m = picked.block_m
        grid = [
            fused_kernels.FusedGemvConfig(block_m, bn, bk, wp)
            for bn, bk, wp in itertools.product((1, 2, 4, 8, 16), (512, 1024, 2048, 4096), (4, 8))
            if bk < 2 * k and block_m * bn * bk * (2 if swiglu else 1) <= 128 * 32 * wp
        ]
        timed = sorted(
            (graph_time_us([lambda w=w, cf=cf: call(w, cf) for w in layers], replays), cf)
            for cf in {picked, *grid}
        )
        nbytes = layers[0][key].numel() * layers[0][key].element_size()
        mine = next(us for us, cf in timed if cf == picked)
        rows.append(
            [
                name,
                f"{n}x{k}",
                f"{mine:.2f}",
                f"{nbytes / mine / 1e3:.0f}",
                _fmt(picked),
                ", ".join(f"{_fmt(cf)} {us:.2f}" for us, cf in timed[:top]),
            ]
        )
    return rows


def _fmt(c: fused_kernels.FusedGemvConfig) -> str:
    return f"{c.block_n}x{c.block_k} w{c.num_warps}"


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2], help="M: decode batch sizes")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument(
        "--sweep",
        action="store_true",
        help="time each fused GEMV alone over a grid of tiles, at each M",
    )
    p.add_argument(
        "--distinct-layers",
        type=int,
        default=QWEN3_0_6B["layers"],
        help="how many layers' weights the 28 layers cycle through (1: one layer's 30 MiB, which "
        "stays in an H200's 50 MB L2, so weights come from cache)",
    )
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fused_layer times GPU kernels: it needs CUDA")
    if args.distinct_layers < 1:
        raise SystemExit("--distinct-layers must be at least 1")
    cfg = QWEN3_0_6B
    rows, sweeps = [], []
    with torch.inference_mode():
        for m in args.rows:
            chain = LayerChain(cfg, m, args.distinct_layers)
            nbytes = layer_bytes(chain.weights[0])
            timings = {"unfused": chain.time_us(chain.unfused, args.replays)}
            with speedups.using(pdl=False):
                timings["no PDL"] = chain.time_us(chain.fused, args.replays)
            timings["fused"] = chain.time_us(chain.fused, args.replays)
            rows.append(
                [
                    m,
                    *(f"{timings[k]:.2f}" for k in ("unfused", "no PDL", "fused")),
                    f"{timings['unfused'] / timings['fused']:.2f}x",
                    *(f"{nbytes / timings[k] / 1e3:.0f}" for k in ("unfused", "fused")),
                ]
            )
            if args.sweep:
                sweeps.append((m, sweep(chain, args.replays)))
    print(
        f"a layer of Qwen3-0.6B's shapes, {CONTEXT} tokens of context: "
        f"{nbytes / 2**20:.1f} MiB of weights; {cfg['layers']} layers cycling through "
        f"{min(args.distinct_layers, cfg['layers'])} layers' weights"
    )
    header = ["rows", "unfused us/layer", "fused, no PDL", "fused us/layer", "speed-up"]
    print(format_table(header + ["unfused GB/s", "fused GB/s"], rows))
    for m, table in sweeps:
        print(
            f"\neach fused GEMV alone, M={m}: the rule's tiles (BLOCK_N x BLOCK_K, warps), the fastest"
        )
        print(format_table(["gemv", "N x K", "us", "GB/s", "tiles", "fastest: tiles us"], table))


if __name__ == "__main__":
    main()
