"""Chapter 5: attention over a paged KV cache, checked against dense attention.

Two requests share one prefill batch. Request 0 already has 3 tokens of KV in the pool
(a cached prefix) and feeds 4 more; request 1 is new and feeds 4. Their KV sits on
scattered pages. The torch backend plans the batch once (``prepare_metadata``) and then
attends through the page table; the result must equal plain causal attention over each
whole sequence.
"""

import torch
import torch.nn.functional as F

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, Req, SamplingParams, set_global_ctx
from minisgl.kvcache import MHAKVCache

torch.manual_seed(0)
HQ, HKV, D, P = 4, 2, 16, 2


class Shape:  # the three numbers a backend needs from the model config
    num_qo_heads, num_kv_heads, head_dim = HQ, HKV, D


ctx = Context(page_size=P)
ctx.kv_cache = MHAKVCache(
    HKV, 1, D, num_pages=8, page_size=P, dtype=torch.float32, device=torch.device("cpu")
)
ctx.page_table = torch.zeros((3, 8), dtype=torch.int32)
ctx.attn_backend = backend = create_attention_backend("torch", Shape)  # type: ignore[arg-type]
set_global_ctx(ctx)

total, cached, pages = [7, 4], [3, 0], [[6, 1, 4, 2], [7, 0]]
seqs = [(torch.randn(n, HQ, D), torch.randn(n, HKV, D), torch.randn(n, HKV, D)) for n in total]
reqs = []
for row in range(2):
    slots = torch.cat([torch.arange(p * P, (p + 1) * P) for p in pages[row]])[: total[row]]
    ctx.page_table[row, : total[row]] = slots.to(torch.int32)
    _, k, v = seqs[row]
    ctx.kv_cache.store_kv(
        k[: cached[row]], v[: cached[row]], slots[: cached[row]], 0
    )  # the cached prefix
    reqs.append(
        Req(
            torch.zeros(total[row], dtype=torch.int32),
            row,
            cached[row],
            1,
            row,
            SamplingParams(),
            None,
        )
    )  # type: ignore[arg-type]
    print(
        f"request {row}: pages {pages[row]} -> slots {slots.tolist()}, cached_len={cached[row]}, "
        f"extend_len={reqs[-1].extend_len}"
    )

batch = Batch(reqs, "prefill")
batch.out_loc = torch.cat([ctx.page_table[r, cached[r] : total[r]] for r in range(2)])
backend.prepare_metadata(batch)
meta = batch.attn_metadata
print(
    f"metadata: cu_seqlens_q={meta.cu_seqlens_q} seq_lens={meta.seq_lens} "
    f"last token rows={meta.get_last_indices(2).tolist()}"
)
mask = torch.ones(4, 7, dtype=torch.bool).tril(diagonal=3).int()
print("request 0's mask (4 queries at positions 3..6 over 7 keys):")
for row in mask.tolist():
    print("   ", " ".join("x" if m else "." for m in row))

q = torch.cat([seqs[r][0][cached[r] :] for r in range(2)])
k = torch.cat([seqs[r][1][cached[r] :] for r in range(2)])
v = torch.cat([seqs[r][2][cached[r] :] for r in range(2)])
out = backend.forward(q, k, v, 0, batch)


def dense(qs, ks, vs):
    o = F.scaled_dot_product_attention(
        qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1), is_causal=True, enable_gqa=True
    )
    return o.transpose(0, 1)


ref = torch.cat([dense(*seqs[r])[cached[r] :] for r in range(2)])
print(
    f"paged output {tuple(out.shape)} vs dense attention: max |diff| = {float((out - ref).abs().max()):.1e}"
)
