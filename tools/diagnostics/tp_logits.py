"""Teacher-forced logits at tp=1 and tp=N, compared step by step (chapter 16).

    python -m tools.diagnostics.tp_logits --model models/qwen3-0.6b-shaped --tp 2  # GPUs, bf16
    python -m tools.diagnostics.tp_logits --model models/tiny-qwen3 --tp 2 --device cpu  # float32

Comparing served texts (``tools.diagnostics.tp_compare``) says little in bf16 when the model's
next-token logits are nearly flat: one rounding difference in the order of a sum picks
the other of two near-tied tokens, and from there the two runs read different contexts.
This tool removes that cascade. It drives the engines by hand
(``minisgl.benchmark.manual``), the eight prompts of ``tp_compare`` in one batch, prefill
then CUDA-graph decode steps:

1. tp=1 decodes greedily for ``--steps`` steps: the reference tokens and logits;
2. tp=N is fed exactly the reference tokens (teacher forcing) and its logits are kept,
   so every step of both runs sees the same context;
3. tp=N also decodes greedily on its own, for the first token where the texts part.

Per prompt it prints the largest logit difference as a share of that step's logit range
(max - min at tp=1), how many forced steps have the same argmax, and for each step where
the argmax differs, tp=1's margin between the two tokens. The run passes when every
difference is within ``--tolerance`` of the range; exit status 1 otherwise. An argmax
can then only flip between two tokens whose tp=1 logits are within twice that of each
other (each moved by at most the difference): a near-tie, which the margins show.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Dict, List

import torch
import torch.multiprocessing as mp

from minisgl.benchmark.manual import greedy, place
from minisgl.distributed import DistributedInfo
from minisgl.engine import Engine, EngineConfig
from minisgl.layers.shard import check_tp_size
from minisgl.models import ModelConfig
from minisgl.utils import cached_load_hf_config, check_model_path, div_ceil
from minisgl.utils.mp import new_ipc_dir
from tools.diagnostics.tp_compare import PROMPTS


def _rank_main(
    rank: int,
    args: argparse.Namespace,
    tp: int,
    prompts: List[List[int]],
    forced: List[List[int]] | None,
    out: str,
) -> None:
    """One rank: build the engine, run greedy (and the forced run when given); rank 0 saves."""
    engine = Engine(
        EngineConfig(
            args.model,
            tp_info=DistributedInfo(rank, tp),
            distributed_addr=args.addr,
            dtype=args.torch_dtype,
            device=args.device,
            page_size=args.page_size,
            max_running_req=len(prompts),
            num_page_override=sum(div_ceil(len(p) + args.steps, args.page_size) for p in prompts),
            max_seq_len_override=max(len(p) for p in prompts) + args.steps,
        )
    )
    result: Dict[str, object] = {}
    free_tokens, free_logits = greedy(engine, place(engine, prompts, args.steps), args.steps)
    result["tokens"], result["logits"] = free_tokens, torch.stack(free_logits)  # [steps, B, V]
    if forced is not None:  # place() starts again at page 0: the forced run overwrites the free one
        _, forced_logits = greedy(
            engine, place(engine, prompts, args.steps), args.steps, forced=forced
        )
        result["forced_logits"] = torch.stack(forced_logits)
    if rank == 0:
        torch.save(result, out)
    engine.shutdown()


def run(
    args: argparse.Namespace, tp: int, prompts: List[List[int]], forced: List[List[int]] | None
) -> dict:
    """Spawn ``tp`` ranks (fresh interpreters), return rank 0's saved result."""
    out = os.path.join(args.workdir, f"tp{tp}.pt")
    args.addr = f"file://{new_ipc_dir()}/distributed"
    mp.start_processes(
        _rank_main,
        args=(args, tp, prompts, forced, out),
        nprocs=tp,
        start_method="spawn",
        join=True,
    )
    return torch.load(out)


def compare(ref: dict, other: dict, tp: int, tolerance: float) -> bool:
    """Print the per-prompt comparison; True when it passes (see the module docstring)."""
    ref_logits, forced_logits = ref["logits"], other["forced_logits"]  # [steps, B, V]
    diff = (forced_logits - ref_logits).abs().amax(dim=-1)  # [steps, B]
    span = ref_logits.amax(dim=-1) - ref_logits.amin(dim=-1)
    rel = diff / span
    ok = True
    print(
        f"{'prompt':<46} {'max |dlogit| / range':>21} {'same argmax':>12} {'free run equal for':>19}"
    )
    for b, prompt in enumerate(PROMPTS):
        ref_tokens, free = ref["tokens"][b], other["tokens"][b]
        steps = len(ref_tokens)
        chosen = forced_logits[:, b].argmax(dim=-1).tolist()
        flips = [s for s in range(steps) if chosen[s] != ref_tokens[s]]
        equal_for = next((s for s in range(steps) if free[s] != ref_tokens[s]), steps)
        worst = rel[:, b].max().item()
        print(
            f"{prompt!r:<46} {worst:>21.1e} {steps - len(flips):>8}/{steps:<3} {equal_for:>8} tokens"
        )
        ok &= worst <= tolerance
        for s in flips:
            margin = (ref_logits[s, b, ref_tokens[s]] - ref_logits[s, b, chosen[s]]).item()
            print(
                f"    step {s}: tp=1 picks {ref_tokens[s]}, tp={tp} picks {chosen[s]}: a near-tie, tp=1's margin "
                f"{margin:.4f} = {margin / span[s, b].item():.1e} of the range"
            )
    print(
        f"largest |dlogit| {rel.max().item():.1e} of the logit range (tolerance {tolerance:g}); "
        f"mean {rel.mean().item():.1e}"
    )
    return ok


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.diagnostics.tp_logits", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--model",
        default="models/qwen3-0.6b-shaped",
        help="a local model folder (default: %(default)s, built by "
        "python -m tools.models qwen3-0.6b-shaped)",
    )
    p.add_argument(
        "--tp", type=int, default=2, help="ranks to compare with tp=1 (default: %(default)s)"
    )
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"]
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16", "float32"],
        help="default: bfloat16 on CUDA, float32 on the CPU",
    )
    p.add_argument(
        "--steps", type=int, default=32, help="tokens per prompt (1 prefill + decode steps)"
    )
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.02,
        help="largest |dlogit| as a share of the logit range",
    )
    args = p.parse_args(argv)
    for name in ("tp", "steps", "page_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0 < args.tolerance < 1:
        p.error(f"--tolerance is a share of the logit range, between 0 and 1; got {args.tolerance}")
    try:  # a local folder only (never a hub name), and a rank count the heads can be split over
        mc = ModelConfig.from_hf(cached_load_hf_config(str(check_model_path(args.model))))
        check_tp_size(mc.num_qo_heads, mc.num_kv_heads, mc.intermediate_size, args.tp)
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e))
    args.torch_dtype = getattr(
        torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    )
    if args.device == "cuda" and torch.cuda.device_count() < args.tp:
        raise SystemExit(
            f"--tp {args.tp} needs {args.tp} GPUs; this machine has {torch.cuda.device_count()}"
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = workdir
        ref = run(args, 1, prompts, None)
        other = run(args, args.tp, prompts, ref["tokens"])
    print(
        f"model {args.model}, {args.torch_dtype}, {args.device}: {len(prompts)} prompts x {args.steps} "
        f"teacher-forced steps, tp=1 vs tp={args.tp}"
    )
    ok = compare(ref, other, args.tp, args.tolerance)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
