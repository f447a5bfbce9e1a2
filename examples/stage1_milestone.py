"""Stage 1 milestone: the engine of chapters 0-6, driven by hand, on all three models.

No scheduler yet: this script plays its part. For each model it starts an ``Engine``,
takes three rows of the page table from a ``TableManager``, and hands out KV pages of
P = 4 token slots in a shuffled order, so every request's KV is scattered over the pool
and attention has to follow the page table. Three prompts of different lengths are
prefilled together in one packed batch, then decoded together step by step; each step's
sampled tokens are the next step's input. The texts are compared token for token with
``transformers`` greedy generation (float32, each prompt on its own).

Only files of chapters 0-6 are used (``minisgl.scheduler.table`` came in chapter 4).

    python examples/stage1_milestone.py [--model PATH] [--device cpu|cuda] [--new-tokens N]
"""
# capture-output

import argparse
from pathlib import Path
from typing import List

import torch
from transformers import AutoModelForCausalLM

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.scheduler.table import TableManager
from minisgl.utils import check_model_path, load_tokenizer

MODELS = ["models/SmolLM2-135M-Instruct", "models/tiny-qwen3", "models/tiny-qwen2"]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
PAGE_SIZE = 4

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", help="one model folder (default: the three models of the book)")
parser.add_argument(
    "--device", default="cpu", help="cpu or cuda (the torch attention backend on both)"
)
parser.add_argument("--new-tokens", type=int, default=10, help="tokens to generate per prompt")
args = parser.parse_args()


def hand_out_slots(engine: Engine, req: Req, free_pages: List[int]) -> None:
    """Give every position this step feeds a KV slot: a fresh page at each page boundary,
    the next slot of the current page otherwise (the job the scheduler's cache manager takes over)."""
    row = engine.page_table[req.table_idx]
    for pos in range(req.cached_len, req.device_len):
        if pos % PAGE_SIZE == 0:
            row[pos] = free_pages.pop() * PAGE_SIZE
        else:
            row[pos] = row[pos - 1] + 1


def run_by_hand(path: Path) -> None:
    engine = Engine(
        EngineConfig(
            str(path),
            dtype=torch.float32,
            device=args.device,
            attention_backend="torch",
            page_size=PAGE_SIZE,
            max_running_req=4,
            num_page_override=64,
            max_seq_len_override=128,
        )
    )
    mc = engine.config.model_config
    print(
        f"== {path.name}: {mc.architectures[0]}, {mc.num_layers} layers, H_q={mc.num_qo_heads}, "
        f"H_kv={mc.num_kv_heads}, D={mc.head_dim}, vocab {mc.vocab_size}"
    )
    print(
        f"   engine on {engine.device}: {engine.num_pages} KV pages x {PAGE_SIZE} slots, "
        f"page table {tuple(engine.page_table.shape)}"
    )
    tok = load_tokenizer(str(path))
    tables = TableManager(engine.config.max_running_req, engine.page_table)
    free_pages = torch.randperm(
        engine.num_pages, generator=torch.Generator().manual_seed(0)
    ).tolist()
    reqs = []
    for uid, text in enumerate(PROMPTS):
        ids = torch.tensor(tok.encode(text), dtype=torch.int32)
        reqs.append(
            Req(
                ids,
                table_idx=tables.allocate(),
                cached_len=0,
                output_len=args.new_tokens,
                uid=uid,
                sampling_params=SamplingParams(max_tokens=args.new_tokens),
            )
        )  # type: ignore[arg-type]

    generated: List[List[int]] = [[] for _ in reqs]
    feed = torch.cat([r.input_ids for r in reqs]).to(engine.device)
    phase = "prefill"
    with torch.inference_mode():
        for _ in range(args.new_tokens):
            batch = Batch(reqs, phase)  # type: ignore[arg-type]
            for r in reqs:
                hand_out_slots(engine, r, free_pages)
            batch.positions = torch.cat(
                [torch.arange(r.cached_len, r.device_len) for r in reqs]
            ).to(engine.device)
            batch.out_loc = torch.cat(
                [engine.page_table[r.table_idx, r.cached_len : r.device_len] for r in reqs]
            )
            batch.input_ids = feed
            if phase == "prefill":
                lens = " + ".join(str(r.extend_len) for r in reqs)
                print(
                    f"   prefill: B={batch.size} requests, T={len(batch.positions)} tokens packed ({lens})"
                )
            engine.attn_backend.prepare_metadata(batch)
            out = engine.forward_batch(batch, engine.sampler.prepare(batch))
            out.copy_done_event.synchronize()  # the CPU copy of the tokens has landed
            for g, r, t in zip(generated, reqs, out.next_tokens_cpu):
                g.append(int(t))
                r.append_host(t.view(1))
            feed, phase = out.next_tokens_gpu, "decode"
    print(f"   decode: {args.new_tokens - 1} steps of B={len(reqs)}, T={len(reqs)}")
    for r in reqs:
        pages = (engine.page_table[r.table_idx, : r.cached_len : PAGE_SIZE] // PAGE_SIZE).tolist()
        print(f"   uid{r.uid}: row {r.table_idx}, {r.cached_len} tokens of KV on pages {pages}")
        tables.free(r.table_idx)
    engine.shutdown()

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    matches = []
    for text, gen in zip(PROMPTS, generated):
        ids = torch.tensor([tok.encode(text)])
        with torch.inference_mode():
            ref = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=False,
                pad_token_id=hf.generation_config.pad_token_id,
            )[0, ids.shape[1] :].tolist()
        matches.append(gen == ref)
        print(f"   {text!r:<40} -> {tok.decode(gen)!r:<44} matches HF: {gen == ref}")
    print(
        f"   all rows returned: {tables.available_size} of {engine.config.max_running_req} free; "
        f"{sum(matches)}/{len(matches)} match HF"
    )


for model in [args.model] if args.model else MODELS:
    run_by_hand(check_model_path(model))
