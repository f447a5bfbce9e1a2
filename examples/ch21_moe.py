"""Chapter 21: a mixture-of-experts model (Qwen3-MoE): routing, alignment, HF equality.

The tiny Qwen3-MoE (4 layers, 8 experts of which each token uses 2) runs one prompt; the
script records what the router of layer 0 decided, prints each token's experts and
weights, how many tokens each expert got, and the expert-sorted, block-padded layout the
Triton kernel reads. Then it runs that layer's experts through the fused Triton path
(compiled on CUDA; in Triton's interpreter on the CPU) and the torch loop, and finally
generates from a few prompts and compares the tokens with ``transformers``.

    python examples/ch21_moe.py [--model PATH] [--device cpu|cuda]
"""

# output: mask \d\.\de[-+]\d+

import argparse
import os
from typing import List

import torch

if not torch.cuda.is_available():  # read when triton is imported: run its kernels in Python
    os.environ.setdefault("TRITON_INTERPRET", "1")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.env import ENV  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.moe.base import BaseMoeBackend  # noqa: E402
from minisgl.moe.fused import fused_experts, get_default_config  # noqa: E402
from minisgl.moe.routing import fused_topk, moe_align_block_size  # noqa: E402
from minisgl.moe.torch_backend import torch_experts  # noqa: E402
from minisgl.utils import check_model_path  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", default=os.environ.get("MINISGL_MODEL", "models/tiny-qwen3-moe"))
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
path = str(check_model_path(args.model))


class Recorder(BaseMoeBackend):
    """Wraps the engine's MoE backend and keeps the inputs of every call (one per layer)."""

    def __init__(self, inner: BaseMoeBackend) -> None:
        self.inner, self.calls = inner, []
        self.supports_cuda_graph = inner.supports_cuda_graph

    def forward(self, hidden_states, w1, w2, gating_output, topk, renormalize, activation="silu"):
        self.calls.append((hidden_states.clone(), w1, w2, gating_output.clone(), topk, renormalize))
        return self.inner.forward(
            hidden_states, w1, w2, gating_output, topk, renormalize, activation
        )

    def experts(
        self, hidden_states, w1, w2, topk_weights, topk_ids
    ):  # forward above never calls it
        return self.inner.experts(hidden_states, w1, w2, topk_weights, topk_ids)


ENV.DISABLE_OVERLAP_SCHEDULING.value = True
llm = LLM(
    path,
    dtype=torch.float32,
    device=args.device,
    attention_backend="torch",
    max_running_req=8,
    num_page_override=512,
    max_seq_len_override=256,
    cache_type="naive",
    cuda_graph_max_bs=0,
)
cfg, ctx = llm.engine.config.model_config, llm.engine.ctx
expert_params = 3 * cfg.hidden_size * cfg.moe_intermediate_size
print(
    f"{cfg.num_layers} layers, {cfg.num_experts} experts per layer, top-{cfg.num_experts_per_tok}, "
    f"norm_topk_prob={cfg.norm_topk_prob}; the engine runs them with {type(ctx.moe_backend).__name__}"
)
layer0 = "model.layers.0.mlp.experts"
weights = llm.engine.model.state_dict()
print(
    f"stacked weights: {layer0}.gate_up_proj {list(weights[layer0 + '.gate_up_proj'].shape)}, "
    f"down_proj {list(weights[layer0 + '.down_proj'].shape)}"
)
print(
    f"expert parameters per layer: {cfg.num_experts * expert_params:,} stored, "
    f"{cfg.num_experts_per_tok * expert_params:,} used by each token"
)

# ----------------------------------------------------------------- one prompt, layer 0's router
recorder = Recorder(ctx.moe_backend)
ctx.moe_backend = recorder
prompt = "The capital of France is"
llm.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))
ctx.moe_backend = recorder.inner
x, w1, w2, logits, top_k, renorm = recorder.calls[0]  # the prefill's first layer
topk_weights, topk_ids = fused_topk(logits, top_k, renorm)
pieces = [llm.tokenizer.decode([t]) for t in llm.tokenizer.encode(prompt)]
print(f"\nlayer 0 routing of {prompt!r} ({len(pieces)} tokens): token -> experts (weights)")
for t, piece in enumerate(pieces):
    choice = ", ".join(f"{int(e)} ({float(w):.2f})" for e, w in zip(topk_ids[t], topk_weights[t]))
    print(f"  {t} {piece!r:>10} -> {choice}")
counts = torch.bincount(topk_ids.flatten().long(), minlength=cfg.num_experts)
print("tokens per expert: " + "  ".join(f"{e}:{int(c)}" for e, c in enumerate(counts)))
all_counts = sum(
    torch.bincount(fused_topk(c[3], top_k, renorm)[1].flatten().long(), minlength=cfg.num_experts)
    for c in recorder.calls
)
print(
    f"over all {len(recorder.calls)} layers: "
    + "  ".join(f"{e}:{int(c)}" for e, c in enumerate(all_counts))
)

# ----------------------------------------------------------------- the aligned layout
block = 4
sorted_ids, expert_ids, total = moe_align_block_size(topk_ids, block, cfg.num_experts)
num_slots = topk_ids.numel()
print(
    f"\nmoe_align_block_size(block_size={block}): slot s = token s//{top_k}, choice s%{top_k}; "
    f"'.' = padding"
)


def label(s: int) -> str:
    return "." if s >= num_slots else f"{s}=t{s // top_k}"


for b in range(int(total) // block):
    rows = [label(int(s)) for s in sorted_ids[b * block : (b + 1) * block]]
    print(f"  block {b:>2}  expert {int(expert_ids[b])}: " + " ".join(f"{r:>6}" for r in rows))
used = int(total)
print(
    f"num_tokens_post_padded = {used} for {num_slots} slots ({used - num_slots} padding rows); "
    f"{sorted_ids.numel()} entries allocated, {expert_ids.numel()} blocks, "
    f"{int((expert_ids < 0).sum())} of them past the end"
)
bm = get_default_config(len(pieces), cfg.num_experts)["BLOCK_SIZE_M"]
padded_real = int(moe_align_block_size(topk_ids, bm, cfg.num_experts)[2])
print(
    f"the kernel's own BLOCK_SIZE_M for {len(pieces)} tokens is {bm}: {padded_real} rows for {num_slots} slots"
)

# ----------------------------------------------------------------- fused kernel vs torch loop
where = "compiled for CUDA" if x.is_cuda else "in Triton's interpreter"
fused = fused_experts(x, w1, w2, topk_weights, topk_ids)
loop = torch_experts(x, w1, w2, topk_weights, topk_ids)
diff = float((fused - loop).abs().max() / loop.abs().max())
print(
    f"\nlayer 0 experts, fused Triton ({where}) vs torch loop: max relative difference {diff:.1e}"
)

# ----------------------------------------------------------------- the whole model against HF
prompts = ["The capital of France is", "def fibonacci(n):", "1 + 1 ="]
ours = [
    o["token_ids"] for o in llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
]
hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
tok = AutoTokenizer.from_pretrained(path)
theirs: List[List[int]] = []
for p in prompts:
    ids = tok(p, return_tensors="pt").input_ids
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=12,
            min_new_tokens=12,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
    theirs.append(out[0, ids.shape[1] :].tolist())
print(f"\ngreedy, 12 tokens, float32, {type(ctx.moe_backend).__name__} vs transformers:")
for p, a, b in zip(prompts, ours, theirs):
    print(f"  {p!r:28} identical: {a == b}   {tok.decode(a)!r}")
