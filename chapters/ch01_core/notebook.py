# The cells of chapter 1's notebook that run each part on the real `minisgl.core`
# (tools/notebook_parts.py puts each after the section its `part` names).

# %% part="Sampling parameters"
# A request's sampling settings; bad values are refused where they are made.
from minisgl.core import SamplingParams

print(SamplingParams())
print("greedy:", SamplingParams().is_greedy, SamplingParams(temperature=0.7).is_greedy)
for bad in ({"temperature": -0.5}, {"top_k": 0}, {"max_tokens": 0}):
    try:
        SamplingParams(**bad)
    except ValueError as err:
        print(f"SamplingParams(**{bad}) -> ValueError: {err}")

# %% part="A request is its lengths"
# One request of a 5-token prompt that may add 3 tokens, through one prefill and its decodes.
import torch

from minisgl.core import Req

req = Req(
    input_ids=torch.tensor([101, 2009, 2003, 1037, 3231], dtype=torch.int32),
    table_idx=0,
    cached_len=0,
    output_len=3,
    uid=0,
    sampling_params=SamplingParams(max_tokens=3),
)
print(req, "extend_len", req.extend_len, "remain_len", req.remain_len)
while req.can_decode:
    req.complete_one()  # the forward pass ran: what was fed is cached, one token is coming
    req.append_host(torch.tensor([7000], dtype=torch.int32))
    print(req, "extend_len", req.extend_len, "remain_len", req.remain_len)

# %% part="A batch: one forward pass, one phase"
# A batch is its requests and one phase; `padded_reqs` is `reqs` until CUDA graphs pad it.
from minisgl.core import Batch

batch = Batch(reqs=[req], phase="decode")
print(batch.phase, "size", batch.size, "is_decode", batch.is_decode, "padded", batch.padded_size)

# %% part="The context, and the one global"
# The engine publishes one Context; a layer reads the batch being forwarded from it.
from minisgl.core import Context, get_global_ctx, set_global_ctx

ctx = Context(page_size=1)
set_global_ctx(ctx)
with get_global_ctx().forward_batch(batch):
    print("inside forward_batch:", get_global_ctx().batch.phase, "batch")
try:
    get_global_ctx().batch
except AssertionError as err:
    print("outside it:", err)
set_global_ctx(None)
