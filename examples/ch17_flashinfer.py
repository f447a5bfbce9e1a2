"""Chapter 17: what FlashInfer is told about a batch, and (on a GPU) how close it lands.

Three requests share a page-table of 4-token pages, one of them with a cached prefix.
The script prints each request's row of token slots and the paged-KV index derived from
it (query offsets, page offsets, page ids, last-page lengths): exactly what the
FlashInfer backend plans with. Then it shows which kernel serves each op on this device.
On a GPU with ``flashinfer`` installed it also runs the same bf16 batch through the
FlashInfer and the torch attention backends and prints how far their logits are apart.

    python examples/ch17_flashinfer.py [--model PATH] [--device cpu|cuda]
"""

import argparse
import importlib.util
import os

import torch

from minisgl.attention import create_attention_backend
from minisgl.attention.fi import paged_kv_index, use_tensor_cores
from minisgl.benchmark import manual
from minisgl.engine import Engine, EngineConfig
from minisgl.kernel import library_for
from minisgl.utils import load_tokenizer

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
on_gpu = args.device.startswith("cuda")
with_flashinfer = on_gpu and importlib.util.find_spec("flashinfer") is not None

engine = Engine(
    EngineConfig(
        args.model,
        dtype=torch.bfloat16 if on_gpu else torch.float32,
        device=args.device,
        page_size=4,
        max_running_req=4,
        num_page_override=256,
        max_seq_len_override=128,
        cuda_graph_max_bs=0,  # +ch18
        attention_backend="fi" if with_flashinfer else "torch",
    )
)
tok = load_tokenizer(args.model)
prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
ids = [tok.encode(p) for p in prompts]
reqs = manual.place(engine, ids, 4)
reqs[2].cached_len = 8  # as if the prefix cache had matched its first two pages

print("token slots of each request (page size 4; slot = page * 4 + offset):")
for r in reqs:
    print(
        f"  row {r.table_idx}: {engine.page_table[r.table_idx, : r.device_len].tolist()}  "
        f"(cached {r.cached_len}, new {r.extend_len})"
    )
index = paged_kv_index(engine.page_table, reqs, page_size=4)
print("what FlashInfer's prefill wrapper is planned with:")
print(f"  qo_indptr        {index.qo_indptr.tolist()}   (query rows of each request)")
print(f"  kv_indptr        {index.kv_indptr.tolist()}   (its pages in kv_page_ids)")
print(f"  kv_page_ids      {index.kv_page_ids.tolist()}")
print(f"  kv_last_page_len {index.kv_last_page_len.tolist()}   (slots used in each last page)")
mc = engine.config.model_config
print(
    f"decode on tensor cores for this model ({mc.num_qo_heads} query / {mc.num_kv_heads} KV heads): "
    f"{use_tensor_cores(mc.num_qo_heads, mc.num_kv_heads)}"
)

x = torch.zeros(2, 8, device=engine.device, dtype=engine.dtype)
slots, loc = torch.zeros(4, 1, 8, device=x.device, dtype=x.dtype), torch.arange(2, device=x.device)
norms = library_for("rms_norm", x, x[0], 1e-6)
store = library_for("store_cache", slots, slots, loc, slots[:2], slots[:2])
print(
    f"on {engine.device} in {engine.dtype}: the norms, SwiGLU, RoPE and sampling run on {norms}; "
    f"the KV store and the embedding on {store}; attention backend {type(engine.attn_backend).__name__}"
)

if with_flashinfer:
    reqs = manual.place(engine, ids, 6)
    tokens, fi_logits = manual.greedy(engine, reqs, 6)
    engine.attn_backend = engine.ctx.attn_backend = create_attention_backend("torch", mc)
    _, torch_logits = manual.greedy(engine, manual.place(engine, ids, 6), 6, forced=tokens)
    for step, (a, b) in enumerate(zip(fi_logits, torch_logits)):
        rel = float((a - b).abs().max() / (b.max() - b.min()))
        same = (a.argmax(-1) == b.argmax(-1)).tolist()
        print(
            f"  step {step}: max |fi - torch| = {rel:.3%} of the logit range; same argmax per request {same}"
        )
    print("greedy (FlashInfer): " + " | ".join(repr(tok.decode(t)) for t in tokens))
else:
    print(
        "(no FlashInfer here: on a GPU with flashinfer installed this compares its logits with torch's)"
    )
engine.shutdown()
