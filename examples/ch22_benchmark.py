"""Chapter 22: the offline benchmark's workload, and a run of it.

Prints the nano-vllm workload (256 random prompts, 133,966 output tokens) and then runs
the offline benchmark on a scaled-down copy of it: 4 short requests on the CPU, 64 on a
GPU. ``--full`` runs the real thing (on a GPU, with the Qwen3-0.6B-shaped model), and
``--hf`` adds Hugging Face's continuous batching beside it:

    python examples/ch22_benchmark.py [--model PATH] [--full] [--hf]
    python -m minisgl.benchmark.offline --hf          # the same, with every option
    python -m minisgl.benchmark.decode_step           # decode step time vs the bandwidth floor
"""
# output: nondeterministic

import argparse
import os

import torch

from minisgl.benchmark import offline
from minisgl.benchmark.workload import nano_vllm_workload

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model",
    default=None,
    help="default: SmolLM2 for the scaled-down run, models/qwen3-0.6b-shaped with --full",
)
parser.add_argument("--full", action="store_true", help="the whole 256-request workload")
parser.add_argument("--hf", action="store_true", help="also run transformers' continuous batching")
args = parser.parse_args()

w = nano_vllm_workload()
lengths = sorted(len(p) for p in w.prompts)
print(
    f"nano-vllm workload: {w.num_requests} requests, prompts of {lengths[0]}..{lengths[-1]} tokens "
    f"({w.input_tokens:,} in all), {min(w.max_tokens)}..{max(w.max_tokens)} output tokens each "
    f"({w.output_tokens:,} in all), temperature {w.temperature}, EOS ignored"
)
print(f"first prompt starts {w.prompts[0][:6]}, asks for {w.max_tokens[0]} tokens")

on_gpu = torch.cuda.is_available()
if args.full:
    model = args.model or os.environ.get("MINISGL_MODEL", "models/qwen3-0.6b-shaped")
    argv = ["--model", model]
else:
    model = args.model or os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
    argv = [
        "--model",
        model,
        "--num-seqs",
        "64" if on_gpu else "4",
        "--input-len",
        "16",
        "64",
        "--output-len",
        "8",
        "32" if on_gpu else "8",
        "--max-seq-len",
        "256",
        "--page-size",
        "16",
    ]
    if not on_gpu:
        argv += ["--device", "cpu", "--input-len", "4", "16"]
offline.main(argv + (["--hf"] if args.hf else []))
