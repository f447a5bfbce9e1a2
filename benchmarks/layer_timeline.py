"""Where a batch-1 decoder layer's microseconds go, kernel by kernel, on the GPU's clock.

The fused decode path runs a layer as six kernels chained by programmatic dependent launch
(chapter 19): ``qkv`` (norm + GEMV), ``attn`` (split-KV partials from qkv), ``merge``,
``o`` (GEMV + residual), ``gate_up`` (norm + GEMV + SwiGLU), ``down`` (GEMV + residual).
Timing the chain as a whole cannot say which link is slow, and a profiler serialises the
kernels that PDL overlaps. So this script builds *instrumented copies* of
``triton_fused`` and ``triton_decode``: every program of every kernel reads the GPU's
global timer (``%globaltimer``, ns) when it starts, when its PDL wait returns and when it
ends, and writes the three stamps (and its SM) to a buffer. It runs Qwen3-0.6B's 28
layers with random weights (``fused_decode.make_layers``) and a 1,025-token context in one
CUDA graph, and prints, for each kernel averaged over layers 2-27:

* ``starts``: from the first to the last of its programs starting (a program starts only
  where an SM has registers free for it);
* ``boundary``: from the last program of the kernel before ending to the first program of
  this one passing its wait (the cost of the kernel boundary itself);
* ``spread``: from the first to the last program passing its wait (a program that started
  late, for want of free registers, or whose weights had not arrived, passes it late);
* ``after``: from the last program passing its wait to the last program ending (the
  dependent work after the wait);
* ``total``: last end to last end, the kernel's share of the layer.

The stamps cost a little: on an H200 a layer took 19.3 us stamped and 17.8 us without
(both are printed). The engine's own modules are untouched: the copies are written to a
temporary folder and imported as ``minisgl.kernel._timed_*``. Needs CUDA on Hopper (PDL).

    python benchmarks/layer_timeline.py [--rows 1 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Dict

import torch

BENCHMARKS = Path(__file__).resolve().parent
KERNEL_DIR = BENCHMARKS.parent / "minisgl" / "kernel"
NAMES = ["qkv", "attn", "merge", "o", "gate_up", "down"]
CONTEXT, PAGE, MAX_SEQ_LEN = 1025, 256, 4096
MAX_PROGRAMS = 4096  # stamps kept per launch

STAMPS = '''

@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _record(stamps_ptr, started, waited):
    """This program's three stamps and its SM, at row (its linear program id) of the launch's buffer."""
    ended = _now()
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    pid = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
    row = stamps_ptr + pid.to(tl.int64) * 4
    tl.store(row, started)
    tl.store(row + 1, waited)
    tl.store(row + 2, ended)
    tl.store(row + 3, sm.to(tl.int64))
'''


def instrument(source: str) -> str:
    """The module's source with stamps: a ``STAMPS=None`` argument added to each
    ``_..._kernel``, a stamp at its start, after ``gdc_wait()`` (0 for a program that returns
    before waiting), before each ``return`` and at its end; and ``STAMPS=_next_stamps()``
    passed by every launch that passes PDL's options."""
    lines = source.split("\n") + ["# end"]  # a line at column 0 after the last kernel ends it
    out, in_kernel = [], False
    i = 0
    while i < len(lines):
        line = lines[i]
        if re.match(
            r"def _\w+_kernel\($", line
        ):  # a kernel's signature: add the argument, stamp the start
            while not lines[i].startswith("):"):
                out.append(lines[i])
                i += 1
            out += [
                "    STAMPS=None,",
                lines[i],
                "    _started = _now()",
                "    _waited = 0 * _started",
            ]
            in_kernel, i = True, i + 1
            continue
        if in_kernel and line and not line.startswith(" "):  # past the kernel's body: stamp its end
            end = max(j for j, text in enumerate(out) if text.strip())
            out.insert(end + 1, "    _record(STAMPS, _started, _waited)")
            in_kernel = False
        elif in_kernel and re.match(r"\s*return\b", line):
            out.append(re.match(r"(\s*)", line).group(1) + "_record(STAMPS, _started, _waited)")
        out.append(line)
        if in_kernel and "tl.extra.cuda.gdc_wait()" in line:
            out.append(re.match(r"(\s*)", line).group(1) + "_waited = _now()")
        i += 1
    source = "\n".join(out[:-1])
    source = source.replace("\n\n@triton.jit", STAMPS + "\n\n@triton.jit", 1)
    stamps_import = "from minisgl.kernel._timed_stamps import next_stamps as _next_stamps\n"
    source = source.replace("from .pdl import", stamps_import + "from .pdl import", 1)
    return source.replace("**launch_options(pdl),", "STAMPS=_next_stamps(), **launch_options(pdl),")


class Stamps(ModuleType):
    """The buffer the instrumented launches write to: one ``[MAX_PROGRAMS, 4]`` block per
    launch, handed out in launch order (a CUDA graph keeps the order of its capture)."""

    def __init__(self, launches: int) -> None:
        super().__init__("minisgl.kernel._timed_stamps")
        self.buffer = torch.zeros(launches, MAX_PROGRAMS, 4, dtype=torch.int64, device="cuda")
        self.count = 0

    def next_stamps(self) -> torch.Tensor:
        block = self.buffer[self.count]
        self.count += 1
        return block


def load_instrumented(folder: Path, name: str) -> ModuleType:
    path = folder / f"_timed_{name}.py"
    path.write_text(instrument((KERNEL_DIR / f"{name}.py").read_text()))
    spec = importlib.util.spec_from_file_location(f"minisgl.kernel._timed_{name}", path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "minisgl.kernel"  # its relative imports resolve to the real package
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Layers:
    """Qwen3-0.6B's 28 layers at ``m`` rows on the fused path, attention included."""

    def __init__(
        self, cfg: Dict[str, float], m: int, fused: ModuleType, decode: ModuleType
    ) -> None:
        from fused_decode import Step, make_layers  # GPU only: it brings chapter 21's table helper

        step = Step(cfg, m, torch.bfloat16)
        self.cfg, self.m, self.residual, self.cos_sin = cfg, m, step.residual, step.cos_sin
        self.fused, self.decode, self.weights = fused, decode, make_layers(cfg, torch.bfloat16)
        kv_heads, d = int(cfg["kv_heads"]), int(cfg["head_dim"])
        pages = -(-CONTEXT // PAGE)
        self.pools = [
            [
                torch.randn(pages * PAGE * m, kv_heads, d, device="cuda", dtype=torch.bfloat16)
                for _ in range(2)
            ]
            for _ in self.weights
        ]
        self.indptr = torch.arange(0, (m + 1) * pages, pages, device="cuda", dtype=torch.int32)
        self.page_ids = torch.arange(m * pages, device="cuda", dtype=torch.int32)
        self.last_len = torch.full(
            (m,), CONTEXT - (pages - 1) * PAGE, device="cuda", dtype=torch.int32
        )
        self.pos = torch.full((m,), CONTEXT - 1, device="cuda", dtype=torch.int64)
        self.loc = self.indptr[:-1].long() * PAGE + CONTEXT - 1

    def layer(self, i: int) -> None:
        c, w, res, (k, v) = self.cfg, self.weights[i], self.residual, self.pools[i]
        hq, d = int(c["heads"]), int(c["head_dim"])
        qkv = self.fused.norm_gemv(res, w["norm_in"], c["eps"], w["qkv"])
        o = self.decode.decode_attention_qkv(
            qkv,
            self.pos,
            self.cos_sin,
            w["q_norm"],
            w["k_norm"],
            c["eps"],
            k,
            v,
            self.loc,
            self.indptr,
            self.page_ids,
            self.last_len,
            PAGE,
            d**-0.5,
            MAX_SEQ_LEN,
            hq,
        )
        self.fused.gemv_add_residual_(o.reshape(self.m, hq * d), w["o"], res)
        act = self.fused.norm_gemv(res, w["norm_post"], c["eps"], w["gate_up"], swiglu=True)
        self.fused.gemv_add_residual_(act, w["down"], res)


def report(buffer: torch.Tensor, m: int) -> None:
    """The per-kernel table from one replay's stamps (us). The stamps are nanoseconds since
    1970 (~1.8e18): differences are taken in int64, since a float64 that large is exact only
    to 256 ns."""
    stamps = buffer.cpu()
    origin = int(stamps[..., 0][stamps[..., 0] > 0].min())
    kernels = []
    for block in stamps:
        ran = block[block[:, 0] > 0]
        waited = ran[ran[:, 1] > 0]  # an empty chunk's program returns before its wait
        start, wait, end = (
            (t - origin).double() / 1e3 for t in (ran[:, 0], waited[:, 1], ran[:, 2])
        )
        kernels.append(
            dict(
                start_first=float(start.min()),
                start_last=float(start.max()),
                wait_first=float(wait.min()),
                wait_last=float(wait.max()),
                end_last=float(end.max()),
            )
        )
    print(f"batch {m}: us per kernel, averaged over layers 2-27")
    print("kernel   | starts | boundary | spread | after | total")
    for j, name in enumerate(NAMES):
        rows = [(kernels[6 * layer + j], kernels[6 * layer + j - 1]) for layer in range(2, 28)]
        cols = [
            [k["start_last"] - k["start_first"] for k, _ in rows],
            [k["wait_first"] - prev["end_last"] for k, prev in rows],
            [k["wait_last"] - k["wait_first"] for k, _ in rows],
            [k["end_last"] - k["wait_last"] for k, _ in rows],
            [k["end_last"] - prev["end_last"] for k, prev in rows],
        ]
        print(f"{name:8s} | " + " | ".join(f"{statistics.mean(c):6.2f}" for c in cols))
    print(
        f"layer    | {(kernels[6 * 27 + 5]['end_last'] - kernels[6 * 1 + 5]['end_last']) / 26:.2f} us (stamped)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--rows",
        type=int,
        nargs="+",
        default=[1, 2],
        choices=[1, 2],
        help="decode batch sizes (the fused path takes one or two rows)",
    )
    args = p.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        raise SystemExit("layer_timeline needs a Hopper GPU (PDL)")
    sys.path.insert(0, str(BENCHMARKS))
    from fused_decode import QWEN3_0_6B
    from gemv import graph_time_us

    from minisgl.kernel import triton_decode, triton_fused

    cfg = dict(QWEN3_0_6B)
    with torch.inference_mode(), tempfile.TemporaryDirectory() as folder:
        stamps = Stamps(6 * int(cfg["layers"]))
        sys.modules[stamps.__name__] = stamps
        fused, decode = (
            load_instrumented(Path(folder), name) for name in ("triton_fused", "triton_decode")
        )
        for m in args.rows:
            plain = Layers(cfg, m, triton_fused, triton_decode)
            plain_us = graph_time_us(
                [lambda i=i: plain.layer(i) for i in range(len(plain.weights))], 30
            )
            timed = Layers(cfg, m, fused, decode)
            # the warm-up and the capture each hand out the stamp blocks from the first; every
            # replay rewrites them, so after the timing they hold the last replay's stamps
            restart = lambda: setattr(stamps, "count", 0)  # noqa: E731
            graph_time_us(
                [restart] + [lambda i=i: timed.layer(i) for i in range(len(timed.weights))], 5
            )
            print(
                f"batch {m}: a layer takes {plain_us:.2f} us without the stamps (28 layers in one CUDA graph)"
            )
            report(stamps.buffer, m)


if __name__ == "__main__":
    main()
