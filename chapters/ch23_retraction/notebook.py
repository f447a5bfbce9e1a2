# The cells of chapter 23's notebook that run each part on the real managers, with no model
# (tools/notebook_parts.py puts each after the section its `part` names).

# %% part="A guess that learns: `NewTokenRatio`"
# SGLang's defaults: 0.7 decaying to 0.098 in 600 decode steps.
from minisgl.scheduler.retract import NewTokenRatio

ratio = NewTokenRatio()
for step in range(601):
    if step % 150 == 0:
        print(f"after {step:>3} decode steps: {ratio.value:.3f}")
    ratio.decay_one_step()

# %% part="Where the guess enters admission"
# 18 pages of 4 tokens, two requests of 8 + 32: one fits reserving everything, two at 0.7.
import torch

from minisgl.core import SamplingParams
from minisgl.message import UserMsg
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import PrefillManager
from minisgl.scheduler.table import TableManager

for r in (1.0, 0.7):
    page_table = torch.zeros((5, 64), dtype=torch.int32)
    cache = CacheManager(18, 4, page_table, "naive")
    prefill = PrefillManager(cache, TableManager(4, page_table), DecodeManager(4))
    for uid in range(2):
        ids = torch.arange(1, 9, dtype=torch.int32)
        prefill.add_one_req(UserMsg(uid, ids, SamplingParams(max_tokens=32)))
    prefill.new_token_ratio = r  # what the scheduler sets from its NewTokenRatio each step
    batch = prefill.schedule_next_batch(1000)
    print(f"ratio {r}: admitted {[q.uid for q in batch.reqs]}, {len(prefill.pending_list)} waiting")

# %% part="Whom to retract first"
# Remaining outputs 10, 90, 20 and 90: the two at 90 go first, the later arrival before.
from minisgl.core import Req
from minisgl.scheduler.retract import retract_order


def running(uid, prompt_len, max_tokens, generated):
    req = Req(
        input_ids=torch.arange(1, prompt_len + 1, dtype=torch.int32),
        table_idx=uid,
        cached_len=0,
        output_len=max_tokens,
        uid=uid,
        sampling_params=SamplingParams(max_tokens=max_tokens),
    )
    for _ in range(generated):
        req.complete_one()
    return req


reqs = [
    running(0, 4, 100, 90),
    running(1, 4, 100, 10),
    running(2, 50, 20, 0),
    running(3, 4, 100, 10),
]
print([(r.uid, r.remain_len) for r in retract_order(reqs)])
