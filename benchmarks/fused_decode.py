"""A decoder layer's decode work at batch 1, op by op and fused (chapter 19).

    python benchmarks/fused_decode.py            # Qwen3-0.6B's shapes, M = 1 and 2 rows
    python benchmarks/fused_decode.py --sweep    # also each fused GEMV alone, over other tiles
    python benchmarks/fused_decode.py --distinct-layers 1  # one layer's weights, hot in L2

Everything a layer does in a decode step except the attention itself (its output is
stood in for by the queries, of the same shape), on 28 layers' worth of distinct weights so
that they come from memory as in a real step, captured in a CUDA graph:

* ``unfused``: what the engine runs without the fused path (``MINISGL_DISABLE_FUSED_DECODE=1``):
  add + norm, qkv, q-norm, k-norm, RoPE, the KV store, o_proj, add + norm, gate/up, SwiGLU,
  down: FlashInfer, cuBLAS or chapter 19's GEMV, and the Triton store;
* ``fused``: ``norm_linear`` (qkv), ``qk_norm_rope_store``, ``linear_add_residual_`` (o_proj),
  ``norm_linear(swiglu=True)`` (gate/up), ``linear_add_residual_`` (down): five kernels,
  launched with programmatic dependent launch; ``fused, no PDL`` the same without it.

Prints microseconds per layer and the weight bytes read per second. ``--sweep`` times each
fused GEMV alone over a grid of tiles, beside the tiles ``fused_gemv_config`` picks.
Needs CUDA, FlashInfer and Triton.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Callable, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv import graph_time_us  # noqa: E402

from minisgl import kernel  # noqa: E402
from minisgl.kernel import pdl as pdl_switch  # noqa: E402
from minisgl.kernel import triton_fused  # noqa: E402
from minisgl.layers.rotary import _cos_sin_cache  # noqa: E402

QWEN3_0_6B = dict(
    hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072, layers=28, eps=1e-6
)


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


class Step:
    """The per-step inputs every layer shares: hidden states, positions, slots, the pool."""

    def __init__(self, cfg: Dict[str, float], m: int, dtype: torch.dtype) -> None:
        self.cfg, self.m = cfg, m
        h, d = int(cfg["hidden"]), int(cfg["head_dim"])
        self.x = torch.randn(m, h, device="cuda", dtype=dtype)
        self.residual = torch.randn(m, h, device="cuda", dtype=dtype)
        self.positions = torch.arange(1000, 1000 + m, device="cuda", dtype=torch.int32)
        self.out_loc = torch.arange(m, device="cuda", dtype=torch.int32)
        self.cos_sin = _cos_sin_cache(d, 4096, 1e6, None, torch.device("cuda"))
        self.k_slots = torch.zeros(64, int(cfg["kv_heads"]), d, device="cuda", dtype=dtype)
        self.v_slots = torch.zeros_like(self.k_slots)

    def unfused(self, w: Dict[str, torch.Tensor]) -> None:
        c, m = self.cfg, self.m
        hq, hkv, d = int(c["heads"]), int(c["kv_heads"]), int(c["head_dim"])
        x, res = kernel.fused_add_rms_norm(self.x, self.residual, w["norm_in"], c["eps"])
        q, k, v = kernel.linear(x, w["qkv"]).split([hq * d, hkv * d, hkv * d], dim=-1)
        q = kernel.rms_norm(q.reshape(m, hq, d), w["q_norm"], c["eps"])
        k = kernel.rms_norm(k.reshape(m, hkv, d), w["k_norm"], c["eps"])
        q, k = kernel.apply_rotary(self.positions, q, k, self.cos_sin)
        kernel.store_cache(self.k_slots, self.v_slots, self.out_loc, k, v.reshape(m, hkv, d))
        x = kernel.linear(q.reshape(m, hq * d), w["o"])  # q stands in for the attention's output
        x, res = kernel.fused_add_rms_norm(x, res, w["norm_post"], c["eps"])
        kernel.linear(kernel.silu_and_mul(kernel.linear(x, w["gate_up"])), w["down"])

    def fused(self, w: Dict[str, torch.Tensor]) -> None:
        c, res = self.cfg, self.residual
        hq, hkv, d = int(c["heads"]), int(c["kv_heads"]), int(c["head_dim"])
        qkv = kernel.norm_linear(res, w["norm_in"], c["eps"], w["qkv"])
        q = kernel.qk_norm_rope_store(
            qkv,
            self.positions,
            self.cos_sin,
            w["q_norm"],
            w["k_norm"],
            c["eps"],
            self.k_slots,
            self.v_slots,
            self.out_loc,
            hq,
            hkv,
            d,
        )
        kernel.linear_add_residual_(q.reshape(self.m, hq * d), w["o"], res)
        act = kernel.norm_linear(res, w["norm_post"], c["eps"], w["gate_up"], swiglu=True)
        kernel.linear_add_residual_(act, w["down"], res)


def layer_bytes(w: Dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in w.values())


def sweep(
    step: Step, layers: List[Dict[str, torch.Tensor]], replays: int, top: int = 3
) -> List[list]:
    """Each fused GEMV alone, cycling through the layers' weights, over a grid of tiles."""
    m, eps = step.m, step.cfg["eps"]
    act = torch.randn(m, int(step.cfg["intermediate"]), device="cuda", dtype=step.x.dtype)
    attn = torch.randn(
        m, int(step.cfg["heads"] * step.cfg["head_dim"]), device="cuda", dtype=step.x.dtype
    )
    gemvs: Dict[str, tuple] = {  # name: (weight key, swiglu, call(w, config))
        "qkv (norm)": (
            "qkv",
            False,
            lambda w, cf: triton_fused.norm_gemv(
                step.residual, w["norm_in"], eps, w["qkv"], config=cf
            ),
        ),
        "gate_up (norm, swiglu)": (
            "gate_up",
            True,
            lambda w, cf: triton_fused.norm_gemv(
                step.residual, w["norm_post"], eps, w["gate_up"], swiglu=True, config=cf
            ),
        ),
        "o (add)": (
            "o",
            False,
            lambda w, cf: triton_fused.gemv_add_residual_(attn, w["o"], step.residual, config=cf),
        ),
        "down (add)": (
            "down",
            False,
            lambda w, cf: triton_fused.gemv_add_residual_(act, w["down"], step.residual, config=cf),
        ),
    }
    rows = []
    for name, (key, swiglu, call) in gemvs.items():
        n, k = layers[0][key].shape
        n = n // 2 if swiglu else n
        picked = triton_fused.fused_gemv_config(m, n, k, swiglu)
        block_m = picked.block_m
        grid = [
            triton_fused.FusedGemvConfig(block_m, bn, bk, wp)
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


def _fmt(c: triton_fused.FusedGemvConfig) -> str:
    return f"{c.block_n}x{c.block_k} w{c.num_warps}"


def main(argv: List[str] | None = None) -> None:
    from minisgl.benchmark.workload import format_table  # chapter 21's: only main prints tables

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
        raise SystemExit("fused_decode times GPU kernels: it needs CUDA")
    if args.distinct_layers < 1:
        raise SystemExit("--distinct-layers must be at least 1")
    cfg, dtype = QWEN3_0_6B, torch.bfloat16
    layers = make_layers(dict(cfg, layers=min(args.distinct_layers, cfg["layers"])), dtype)
    chain = [layers[i % len(layers)] for i in range(int(cfg["layers"]))]  # always 28 layers' work
    nbytes = layer_bytes(layers[0])
    rows = []
    with torch.inference_mode():
        for m in args.rows:
            step = Step(cfg, m, dtype)
            timings: Dict[str, float] = {}
            for name, fn, pdl in (
                ("unfused", step.unfused, False),
                ("no PDL", step.fused, False),
                ("fused", step.fused, True),
            ):
                pdl_switch.ENABLED = pdl
                calls: List[Callable[[], None]] = [lambda w=w, fn=fn: fn(w) for w in chain]
                timings[name] = graph_time_us(calls, args.replays)
            pdl_switch.ENABLED = True
            rows.append(
                [
                    m,
                    *(f"{timings[k]:.2f}" for k in ("unfused", "no PDL", "fused")),
                    f"{timings['unfused'] / timings['fused']:.2f}x",
                    *(f"{nbytes / timings[k] / 1e3:.0f}" for k in ("unfused", "fused")),
                ]
            )
        print(
            f"one layer of Qwen3-0.6B's shapes without the attention: {nbytes / 2**20:.1f} MiB of weights; "
            f"{len(chain)} layers cycling through {len(layers)} layers' weights"
        )
        print(
            format_table(
                [
                    "rows",
                    "unfused us/layer",
                    "fused, no PDL",
                    "fused us/layer",
                    "speed-up",
                    "unfused GB/s",
                    "fused GB/s",
                ],
                rows,
            )
        )
        for m in args.rows if args.sweep else []:
            print(
                f"\neach fused GEMV alone, M={m}: the heuristic's tiles (BLOCK_N x BLOCK_K, warps), then the sweep's fastest"
            )
            print(
                format_table(
                    ["gemv", "N x K", "us", "GB/s", "tiles", "fastest: tiles us"],
                    sweep(Step(cfg, m, dtype), layers, args.replays),
                )
            )


if __name__ == "__main__":
    main()
