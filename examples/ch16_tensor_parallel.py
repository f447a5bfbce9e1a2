"""Chapter 16: tensor parallelism on the CPU: each rank's slice of the weights, and the
same greedy tokens from one rank and from two.

Part 1 builds the model once per rank (on the meta device: shapes, no memory) and prints
the shapes of one layer's weights, the embedding and the LM head on every rank. Part 2
asks which rank counts a model can be split over (SmolLM2 has 9 query heads: 2 and 4
are refused). Part 3 generates with ``LLM(tp=1)`` and ``LLM(tp=2)`` (this process is rank
0; rank 1 is a spawned process, and the ranks all-reduce through gloo) and compares.

    python examples/ch16_tensor_parallel.py [--model PATH] [--tp N]
"""

import argparse
import os

import torch

from minisgl.core import SamplingParams
from minisgl.distributed import set_tp_info
from minisgl.layers.shard import check_tp_size, shard_vocab
from minisgl.llm import LLM
from minisgl.models import ModelConfig, create_model
from minisgl.utils import cached_load_hf_config, torch_dtype

SHOWN = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.qkv_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "lm_head.weight",
]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "List three prime numbers:",
    "Once upon a time,",
]


def shard_shapes(config: ModelConfig, size: int) -> None:
    print(
        f"tp={size}: {config.num_qo_heads} query heads, {config.num_kv_heads} KV heads, head dim "
        f"{config.head_dim}, hidden {config.hidden_size}, MLP {config.intermediate_size}, vocab {config.vocab_size}"
    )
    for rank in range(size):
        set_tp_info(rank, size)
        with torch.device("meta"), torch_dtype(torch.float32):
            weights = create_model(config).state_dict()
        print(
            f"  rank {rank}: "
            + ", ".join(f"{name.split('.')[-2]} {list(weights[name].shape)}" for name in SHOWN)
        )
    set_tp_info(0, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("MINISGL_MODEL", "models/tiny-qwen3"))
    parser.add_argument("--tp", type=int, default=2)
    args = parser.parse_args()
    config = ModelConfig.from_hf(cached_load_hf_config(args.model))

    print(
        "== 1. each rank's slice (column-parallel: qkv, gate_up; row-parallel: o, down; vocab: embedding, head)"
    )
    shard_shapes(config, 1)
    shard_shapes(config, args.tp)
    if config.num_kv_heads < 4 and config.num_qo_heads % 4 == 0:
        shard_shapes(config, 4)  # fewer KV heads than ranks: each rank holds one whole KV head
    table = torch.arange(10.0).unsqueeze(1)  # a vocabulary of 10 one-number rows
    print(
        "a vocabulary of 10 rows over 4 ranks, zero-padded to 3 rows each:",
        [shard_vocab(table, r, 4).flatten().tolist() for r in range(4)],
    )

    print("\n== 2. which rank counts a model can be split over")
    for name, (q, kv, mlp) in {"tiny Qwen3": (4, 2, 128), "SmolLM2-135M": (9, 3, 1536)}.items():
        for size in (2, 3, 4):
            try:
                check_tp_size(q, kv, mlp, size)
                print(f"  {name} at tp={size}: ok")
            except ValueError as e:
                print(f"  {name} at tp={size}: refused: {e}")

    print(f"\n== 3. greedy tokens, tp=1 and tp={args.tp}, on the CPU (gloo)")
    options = dict(
        dtype=torch.float32,
        device="cpu",
        attention_backend="torch",
        max_seq_len_override=256,
        num_page_override=2048,
    )
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    outputs = {}
    for size in (1, args.tp):
        llm = LLM(args.model, tp=size, **options)
        outputs[size] = [o["token_ids"] for o in llm.generate(PROMPTS, sp)]
        print(
            f"  tp={size}: {llm.engine.kv_cache.k_cache(0).shape[-2]} KV head(s) per rank in the KV pool; "
            f"first request's tokens {outputs[size][0]}"
        )
        llm.shutdown()
    for prompt, one, many in zip(PROMPTS, outputs[1], outputs[args.tp]):
        print(f"  {prompt!r:<28} tp=1 == tp={args.tp}: {one == many}")


if __name__ == "__main__":  # spawned ranks import this file again: only rank 0 runs main
    main()
