# The cells of chapter 10's notebook that run each part on the real managers, with no model
# (tools/notebook_parts.py puts each after the section its `part` names).

# %% part="A piece of a prompt: `ChunkedReq`"
# A step budget of 6 tokens and a 10-token prompt: the first step can only take a chunk.
import torch

from minisgl.core import SamplingParams
from minisgl.message import UserMsg
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import PrefillManager
from minisgl.scheduler.table import TableManager

P, BUDGET = 4, 6
page_table = torch.zeros((3, 32), dtype=torch.int32)
table = TableManager(2, page_table)
cache = CacheManager(num_pages=8, page_size=P, page_table=page_table, type="naive")
prefill = PrefillManager(cache, table, DecodeManager(P))
prefill.add_one_req(
    UserMsg(0, torch.arange(1, 11, dtype=torch.int32), SamplingParams(max_tokens=2))
)
prefill.add_one_req(UserMsg(1, torch.arange(1, 4, dtype=torch.int32), SamplingParams(max_tokens=2)))

step1 = prefill.schedule_next_batch(BUDGET)
chunk = step1.reqs[0]
print(step1.reqs, "can_decode:", chunk.can_decode)
try:
    chunk.append_host(torch.tensor([7], dtype=torch.int32))
except RuntimeError as err:
    print("append_host:", err)

# %% part="Cutting at the budget: `PrefillAdder`"
# The chunk took the whole budget, so uid 1 waits although it is small. uid 0 stays queued
# too, at the head: its PendingReq holds the chunk until the last piece is admitted.
print(
    "admitted:", [r.uid for r in step1.reqs], "still queued:", [p.uid for p in prefill.pending_list]
)

# %% part="Back to the head of the queue"
# The engine runs the chunk (its positions are cached now); the next step continues it
# first, and the 2 tokens of budget left over start uid 1, as a chunk of its own.
cache.allocate_paged(step1.reqs)
chunk.complete_one()
step2 = prefill.schedule_next_batch(BUDGET)
for r in step2.reqs:
    print(f"{type(r).__name__:<10} uid {r.uid}: positions [{r.cached_len}, {r.device_len})")

# %% part="Pages across chunk boundaries"
# The first chunk, positions [0, 6), took pages for 0-3 and 4-7; the rest, [6, 10), needs only
# one more page (for 8-9): the half-used page is filled first.
before = cache.num_free_pages
cache.allocate_paged([step2.reqs[0]])
print("new pages for the second chunk:", before - cache.num_free_pages)
print("row of uid 0:", page_table[step2.reqs[0].table_idx, :10].tolist())
