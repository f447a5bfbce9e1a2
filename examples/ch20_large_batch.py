"""Chapter 20: kernels for large batches: decode attention longest first, and sampling in one pass.

1. The batch decode kernel on a small paged cache (four requests of 7 to 130 tokens, pages
   of 4 tokens) against softmax attention computed directly in float32.
2. ``longest_first``: the order in which the kernel starts a batch's programs, past one
   wave of the GPU, and the same outputs in that order.
3. The Gumbel-max draw: 400 rows drawn from one distribution at temperatures 1 and 2, the
   frequencies beside ``softmax(logits / T)``.

On a CPU the kernels run in Triton's interpreter (set here, before Triton is imported), so
the sizes stay small; on a GPU ``python -m minisgl.benchmark.decode_attention`` times the
batch kernel against FlashInfer's at real sizes.

    python examples/ch20_large_batch.py [--device cpu|cuda]
"""

# output: mask \d\.\de[-+]\d+

import argparse
import math
import os

import torch

if not torch.cuda.is_available():  # read when triton is imported: run its kernels in Python
    os.environ.setdefault("TRITON_INTERPRET", "1")

from minisgl.attention.split_kv import longest_first  # noqa: E402
from minisgl.kernel.triton.decode_batch import decode_attention_batch  # noqa: E402
from minisgl.kernel.triton.sample import gumbel_sample  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
device = torch.device(args.device)
gen = torch.Generator().manual_seed(0)

# 1. the batch kernel -------------------------------------------------------------------------
PAGE, H_Q, H_KV, D = 4, 4, 2, 16
lens = [64, 7, 130, 33]
num_pages = sum(-(-n // PAGE) for n in lens)
k_slots, v_slots = (torch.randn(num_pages * PAGE, H_KV, D, generator=gen) for _ in range(2))
order = torch.randperm(num_pages, generator=gen).tolist()  # each request's pages, shuffled
indptr, page_ids, last_len, want = [0], [], [], []
q = torch.randn(len(lens), H_Q, D, generator=gen)
for b, n in enumerate(lens):
    pages = order[indptr[-1] : indptr[-1] + -(-n // PAGE)]
    page_ids += pages
    indptr.append(len(page_ids))
    last_len.append(n - (len(pages) - 1) * PAGE)
    slots = torch.tensor([pages[t // PAGE] * PAGE + t % PAGE for t in range(n)])
    k = k_slots[slots].repeat_interleave(H_Q // H_KV, 1)  # [n, H_q, D]: each KV head's group
    v = v_slots[slots].repeat_interleave(H_Q // H_KV, 1)
    scores = torch.einsum("hd,thd->ht", q[b], k) / math.sqrt(D)
    want.append(torch.einsum("ht,thd->hd", scores.softmax(-1), v))
index = [torch.tensor(x, dtype=torch.int32, device=device) for x in (indptr, page_ids, last_len)]
q, k_slots, v_slots = q.to(device), k_slots.to(device), v_slots.to(device)
got = decode_attention_batch(q, k_slots, v_slots, *index, PAGE, D**-0.5)
err = float((got.cpu() - torch.stack(want)).abs().max())
print(f"batch kernel, {len(lens)} requests of {lens} tokens in pages of {PAGE}:")
print(
    f"  one program per (request, KV head): {len(lens) * H_KV}; max |kernel - softmax| = {err:.1e}"
)

# 2. longest first ----------------------------------------------------------------------------
resident = 4  # pretend the GPU holds four programs at once: the batch's eight need two waves
first = longest_first(lens, H_KV, resident)
print(
    f"longest first, {len(lens) * H_KV} programs, {resident} at once: rows start in the order {first}"
)
print(f"  (all at once, with 8 resident: {longest_first(lens, H_KV, 8)}, the batch's own order)")
again = decode_attention_batch(
    q,
    k_slots,
    v_slots,
    *index,
    PAGE,
    D**-0.5,
    torch.tensor(first, dtype=torch.int32, device=device),
)
print(f"  same outputs in that order: {torch.equal(again, got)}")

# 3. sampling in one pass ---------------------------------------------------------------------
probs = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625])
rows = 400
logits = torch.full((rows, 32), -1e4)
logits[:, : len(probs)] = probs.log()
logits = logits.to(device=device, dtype=torch.bfloat16)
draws = torch.Generator(device=device).manual_seed(1)
print(f"Gumbel-max draw, {rows} rows of the same logits (a vocabulary of 32, five likely):")
for temperature in (1.0, 2.0):
    temps = torch.full((rows,), temperature, device=device)
    tokens = gumbel_sample(logits, temps, None, None, draws).cpu()
    freq = torch.bincount(tokens, minlength=32)[: len(probs)].float() / rows
    target = torch.softmax(probs.log() / temperature, dim=-1)
    print(
        f"  T = {temperature}: frequencies "
        + " ".join(f"{f:.3f}" for f in freq.tolist())
        + "  softmax(logits / T) "
        + " ".join(f"{t:.3f}" for t in target.tolist())
    )
