# The cells of chapter 8's notebook that run each part on the real managers, with no model
# (tools/notebook_parts.py puts each after the section its `part` names).

# %% part="Where a KV slot can be"
# A pool of 8 pages of P = 4 tokens, two table rows, the naive cache: every page is free.
import torch

from minisgl.core import SamplingParams
from minisgl.message import UserMsg
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import PrefillManager
from minisgl.scheduler.table import TableManager

P = 4
page_table = torch.zeros((3, 32), dtype=torch.int32)
table = TableManager(2, page_table)
cache = CacheManager(num_pages=8, page_size=P, page_table=page_table, type="naive")
decode = DecodeManager(P)
prefill = PrefillManager(cache, table, decode)
print("free pages:", cache.num_free_pages, "first slots:", cache.free_slots.tolist())
print("available:", cache.available_size, "tokens")

# %% part="Giving a batch its pages: `allocate_paged`"
# A 6-token prompt that may add 5 tokens: its prefill needs 2 pages, its first decode
# fits in the second page, and the decode at position 8 opens a third.
prompt = torch.arange(1, 7, dtype=torch.int32)
prefill.add_one_req(UserMsg(0, prompt, SamplingParams(max_tokens=5)))
req = prefill.schedule_next_batch(prefill_budget=100).reqs[0]
for step in range(4):
    before = cache.num_free_pages
    span = (req.cached_len, req.device_len)
    cache.allocate_paged([req])
    req.complete_one()  # the forward pass ran: the positions fed are cached now
    print(
        f"positions [{span[0]}, {span[1]}): {before - cache.num_free_pages} new page(s);", end=" "
    )
    print("row:", page_table[req.table_idx, : req.cached_len].tolist())

# %% part="Taking pages back: `cache_req`"
# The request finishes. The naive cache keeps nothing, so every page it held is freed.
with cache.lazy_free_region():
    cache.cache_req(req, finished=True)
    print("inside lazy_free_region:", cache.num_free_pages, "free pages")
table.free(req.table_idx)
print("after it:", cache.num_free_pages, "free pages")

# %% part="One free per pass: `lazy_free_region`"
# Two requests finish in the same pass: their pages are queued, and returned by a single
# concatenation when the region ends.
for uid in (3, 4):
    ids = torch.arange(1, 5, dtype=torch.int32)
    prefill.add_one_req(UserMsg(uid, ids, SamplingParams(max_tokens=2)))
pair = prefill.schedule_next_batch(prefill_budget=100).reqs
cache.allocate_paged(pair)
for r in pair:
    r.complete_one()
free_list = cache.free_slots
with cache.lazy_free_region():
    for r in pair:
        cache.cache_req(r, finished=True)
    print("inside: the free list is untouched:", cache.free_slots is free_list)
for r in pair:
    table.free(r.table_idx)
print("after:", cache.num_free_pages, "free pages")

# %% part="Proving nothing leaked: `check_integrity`"
cache.check_integrity()
print("free + cached == all pages")
lost, cache.free_slots = cache.free_slots[-1:], cache.free_slots[:-1]  # lose one page on purpose
try:
    cache.check_integrity()
except RuntimeError as err:
    print("RuntimeError:", err)
cache.free_slots = torch.cat([cache.free_slots, lost])

# %% part="Admission counted in pages"
# 32 tokens of KV in all: a prompt of 20 that may add 20 can never fit, so it is not admitted
# and the queue keeps it; one that may add 8 does fit.
prefill.add_one_req(
    UserMsg(1, torch.arange(1, 21, dtype=torch.int32), SamplingParams(max_tokens=20))
)
print("uid1 (20 + 20 tokens):", prefill.schedule_next_batch(prefill_budget=100))
prefill.pending_list.clear()
prefill.add_one_req(
    UserMsg(2, torch.arange(1, 21, dtype=torch.int32), SamplingParams(max_tokens=8))
)
print("uid2 (20 + 8 tokens): ", prefill.schedule_next_batch(prefill_budget=100).reqs)
