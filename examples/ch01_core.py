"""Chapter 1: the life of one request, told by its lengths.

A request is a handful of integers that move as the engine works: ``cached_len`` (KV
already stored), ``device_len`` (tokens the device knows), ``max_device_len`` (where it
must stop). This script walks one request through a prefill and three decode steps, the
way the engine will, and prints the lengths after each step.
"""

import torch

from minisgl.core import Batch, Req, SamplingParams

prompt = torch.tensor([101, 2009, 2003, 1037, 3231], dtype=torch.int32)  # 5 token ids
req = Req(
    input_ids=prompt,
    table_idx=0,
    cached_len=0,
    output_len=4,
    uid=0,
    sampling_params=SamplingParams(max_tokens=4),
)


def show(when: str) -> None:
    print(
        f"{when:<22} cached_len={req.cached_len:<2} device_len={req.device_len:<2} "
        f"extend_len={req.extend_len:<2} remain_len={req.remain_len:<2} can_decode={req.can_decode}"
    )


show("admitted")
phase = "prefill"
next_token = 7000
while req.can_decode:
    batch = Batch(reqs=[req], phase=phase)
    print(
        f"  {batch.phase} step feeds {req.extend_len} token(s) at positions "
        f"{list(range(req.cached_len, req.device_len))}"
    )
    req.complete_one()  # the engine did the forward pass: fed tokens are cached now
    req.append_host(torch.tensor([next_token], dtype=torch.int32))  # the sampled token comes back
    show(f"after {phase}")
    phase, next_token = "decode", next_token + 1

print(f"finished with {len(req.input_ids)} tokens: {req.input_ids.tolist()}")
print(
    f"the last token was never fed to the model: its KV is not cached "
    f"(cached_len={req.cached_len} < {len(req.input_ids)})"
)

for bad in ({"temperature": -0.5}, {"top_p": 0.0}, {"max_tokens": 0}):
    try:
        SamplingParams(**bad)
    except ValueError as err:
        print(f"SamplingParams({bad}) -> ValueError: {err}")
