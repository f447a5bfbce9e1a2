"""Chapter 6: the engine, driven by hand.

No scheduler yet: we play its part. Two requests are admitted by hand (a page-table row
each, KV slots handed out from a counter), prefilled together in one packed batch, then
decoded together step by step. Then the same engine samples with temperature, top-k and
top-p. Every greedy token is compared with Hugging Face.
"""

import argparse
import os

import torch
from transformers import AutoModelForCausalLM

from minisgl.core import Batch, Req, SamplingParams, get_global_ctx
from minisgl.engine import Engine, EngineConfig
from minisgl.utils import check_model_path, load_tokenizer

parser = argparse.ArgumentParser()
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu")
args = parser.parse_args()
path = str(check_model_path(args.model))

engine = Engine(
    EngineConfig(
        path,
        dtype=torch.float32,
        device=args.device,
        max_running_req=4,
        num_page_override=256,
        max_seq_len_override=256,
    )
)
print(
    f"engine on {engine.device}: {engine.num_pages} KV pages, page table {tuple(engine.page_table.shape)}, "
    f"attention backend {type(engine.attn_backend).__name__}"
)
tok = load_tokenizer(path)
prompts = ["The capital of France is", "def fibonacci(n):"]
next_slot = 0
reqs = []
for row, text in enumerate(prompts):
    ids = torch.tensor(tok.encode(text), dtype=torch.int32)
    reqs.append(
        Req(
            ids,
            table_idx=row,
            cached_len=0,
            output_len=8,
            uid=row,
            sampling_params=SamplingParams(max_tokens=8),
        )
    )  # type: ignore[arg-type]


def step(phase: str, input_ids: torch.Tensor) -> torch.Tensor:
    """What a scheduler will do for us: slots, positions, metadata."""
    global next_slot
    batch = Batch(reqs, phase)
    for r in reqs:  # hand out one KV slot per new token, in order
        n = r.extend_len
        engine.page_table[r.table_idx, r.cached_len : r.device_len] = torch.arange(
            next_slot, next_slot + n
        )
        next_slot += n
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]).to(
        engine.device
    )
    batch.out_loc = torch.cat(
        [engine.page_table[r.table_idx, r.cached_len : r.device_len] for r in reqs]
    )
    batch.input_ids = input_ids.to(engine.device)
    engine.attn_backend.prepare_metadata(batch)
    args_ = engine.sampler.prepare(batch)
    out = engine.forward_batch(batch, args_)
    out.copy_done_event.synchronize()
    print(
        f"  {phase:<7} fed {len(batch.input_ids):>2} tokens at positions {batch.positions.tolist()} "
        f"-> {out.next_tokens_cpu.tolist()}"
    )
    return out.next_tokens_cpu


with torch.inference_mode():
    tokens = step("prefill", torch.cat([r.input_ids for r in reqs]))
    generated = [[t] for t in tokens.tolist()]
    for _ in range(7):
        for r, t in zip(reqs, tokens):
            r.append_host(t.view(1))
        tokens = step("decode", tokens)
        for g, t in zip(generated, tokens.tolist()):
            g.append(t)

hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
for text, gen in zip(prompts, generated):
    ids = torch.tensor([tok.encode(text)])
    ref = hf.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)[
        0, ids.shape[1] :
    ].tolist()
    print(f"{text!r:<28} -> {tok.decode(gen)!r:<40} matches HF: {gen == ref}")

# sampling: the same logits, four policies
open_prompt = "My favourite food is"
reqs = [
    Req(
        torch.tensor(tok.encode(open_prompt), dtype=torch.int32), 0, 0, 1, 0, SamplingParams(), None
    )
]  # type: ignore[arg-type]
batch = Batch(reqs, "prefill")
batch.positions = torch.arange(reqs[0].device_len, device=engine.device)
engine.page_table[0, : reqs[0].device_len] = torch.arange(
    200, 200 + reqs[0].device_len
)  # fresh slots
batch.out_loc = engine.page_table[0, : reqs[0].device_len]
batch.input_ids = reqs[0].input_ids.to(engine.device)
engine.attn_backend.prepare_metadata(batch)
with torch.inference_mode(), get_global_ctx().forward_batch(batch):
    logits = engine.model.forward()
print(
    f"top-5 after {open_prompt!r}: "
    + ", ".join(f"{tok.decode([i])!r} {p:.2f}" for p, i in zip(*logits[0].softmax(-1).topk(5)))
)
for sp in [
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=1.0, top_k=3),
    SamplingParams(temperature=1.0, top_p=0.5),
]:
    batch.reqs = [Req(reqs[0].input_ids, 0, 0, 1, 0, sp, None)] * 12  # type: ignore[arg-type]
    draws = engine.sampler.sample(logits.expand(12, -1), engine.sampler.prepare(batch)).tolist()
    print(
        f"  T={sp.temperature} top_k={sp.top_k} top_p={sp.top_p}: "
        + " ".join(repr(tok.decode([d])) for d in draws)
    )
engine.shutdown()
