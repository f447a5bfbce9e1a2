# The cells of chapter 11's notebook that run each part on the real scheduler
# (tools/notebook_parts.py puts each after the section its `part` names).

# %%
# One scheduler with overlap scheduling on (the default), SmolLM2 on the CPU.
import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM
from minisgl.llm.llm import RequestStatus
from minisgl.message import UserMsg

ENV.DISABLE_OVERLAP_SCHEDULING.value = False
llm = LLM(
    "models/SmolLM2-135M-Instruct",
    dtype=torch.float32,
    device="cpu",
    attention_backend="torch",
    max_running_req=4,
    max_seq_len_override=256,
    cache_type="naive",
)


def submit(uid: int, prompt: str, max_tokens: int) -> None:
    """Queue one request the way `receive_msg` does."""
    ids = llm._tokenize_one(prompt)
    llm.status_map[uid] = RequestStatus(uid, ids.tolist(), ignore_eos=True)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    llm._process_one_msg(UserMsg(uid=uid, input_ids=ids, sampling_params=params))


# %% part="The loop"
# Drive `overlap_loop` by hand and watch the order: each iteration launches a batch, then
# handles the results of the one before it. The first handles nothing; the last launches nothing.
launched, handled = llm._forward, llm._process_last_data


def trace_forward(forward_input):
    print(f"  launch  {forward_input.batch.phase:<7} {[r.uid for r in forward_input.batch.reqs]}")
    return launched(forward_input)


def trace_results(last_data):
    if last_data is not None:
        print(f"  results {last_data[0].batch.phase:<7} {[r.uid for r in last_data[0].batch.reqs]}")
    handled(last_data)


llm._forward, llm._process_last_data = trace_forward, trace_results
submit(0, "The capital of France is", 3)
submit(1, "Once upon a time,", 2)
data, n = None, 0
while data is not None or llm.prefill_manager.runnable or llm.decode_manager.runnable:
    print(f"iteration {n}:")
    data, n = llm.overlap_loop(data), n + 1
print({uid: llm.tokenizer.decode(s.output_ids) for uid, s in llm.status_map.items()})

# %% part="Guard 1: a finished request may be in the batch in flight"
# `finished_reqs` holds who finished in the last results pass. A batch launched before that
# pass may still contain them (a request that meets EOS is noticed only on the CPU), so the
# next pass skips their results.
print("finished in the last pass:", sorted(r.uid for r in llm.finished_reqs))

# %% part="Guard 2: a freed row is held back while a batch is in flight"
# Rows of requests that finished under overlap wait in `_deferred_slots` until nothing that
# might still read them is in flight.
print("held back:", llm._deferred_slots, "free rows:", llm.table_manager.available_size, "of 4")
llm._release_deferred_slots()
print("released:", llm._deferred_slots, "free rows:", llm.table_manager.available_size, "of 4")
llm._forward, llm._process_last_data = launched, handled
llm.shutdown()
