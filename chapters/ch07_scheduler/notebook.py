# The cells of chapter 7's notebook that run each part on the real engine (tools/notebook_parts.py
# puts each after the section its `part` names). Runs as a script too, from the repository root.

# %%
# One scheduler for the whole notebook, set up as the chapter's main sets it up: the plain
# loop (no overlap), the naive cache (no prefix reuse), the real SmolLM2 on the CPU.
import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM
from minisgl.llm.llm import RequestStatus
from minisgl.message import UserMsg

ENV.DISABLE_OVERLAP_SCHEDULING.value = True
llm = LLM(
    "models/SmolLM2-135M-Instruct",
    dtype=torch.float32,
    device="cpu",
    attention_backend="torch",
    max_running_req=8,
    num_page_override=1024,
    max_seq_len_override=512,
    cache_type="naive",
)


# %% part="Four managers and an engine"
# The four managers and the two aliases the loop uses on every step.
for name in ("table_manager", "cache_manager", "decode_manager", "prefill_manager"):
    print(f"{name:<16} {type(getattr(llm, name)).__name__}")
print("token_pool  ", tuple(llm.token_pool.shape), llm.token_pool.dtype)
print("page_table  ", tuple(llm.engine.page_table.shape))
print("prefill_budget", llm.prefill_budget, "tokens per prefill step")
print(
    "free:",
    llm.table_manager.available_size,
    "table rows,",
    llm.cache_manager.num_free_pages,
    "KV pages",
)

# %% part="Prefill first"
# Queue two requests and ask for a batch: the prefill queue yields one, so this step is a
# prefill (the decode set is empty anyway).
for uid, (prompt, n) in enumerate([("The capital of France is", 3), ("1 + 1 =", 1)]):
    ids = llm._tokenize_one(prompt)
    llm.status_map[uid] = RequestStatus(uid, ids.tolist(), ignore_eos=True)
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    llm._process_one_msg(UserMsg(uid=uid, input_ids=ids, sampling_params=params))
forward_input = llm._schedule_next_batch()
batch = forward_input.batch
print(batch.phase, "of", [(r.uid, r.extend_len) for r in batch.reqs], "(uid, tokens fed)")

# %% part="The prefill queue and admission"
# Both fitted: the queue is empty, and each admitted request holds a table row.
print("still waiting:", len(llm.prefill_manager.pending_list))
print("free table rows:", llm.table_manager.available_size, "of 8")
print("rows taken:", [r.table_idx for r in batch.reqs])

# %% part="Preparing a batch"
# What `_prepare_batch` built for that prefill: one position and one KV slot per input token.
print("positions", batch.positions.tolist())
print("out_loc  ", batch.out_loc.tolist())

# %% part="Running it: `_forward`"
# Run the batch. `filter_reqs` then keeps only who can still decode: uid 1 asked for one
# token, which this prefill produced, so it never joins the decode set.
output = llm._forward(forward_input)
output.copy_done_event.synchronize()  # the tokens' copy to the CPU is done
print("sampled:", output.next_tokens_cpu.tolist())
print("decoding:", sorted(r.uid for r in llm.decode_manager.running_reqs))

# %% part="Handling the results"
# Hand the tokens back (uid 1 finishes and frees its row), then decode until uid 0 has its
# three tokens. What the decode set still reserves shrinks by one slot per step.
llm._process_last_data((forward_input, output))
print("free table rows:", llm.table_manager.available_size, "of 8")
while (forward_input := llm._schedule_next_batch()) is not None:
    reserved = llm.decode_manager.inflight_tokens
    print(forward_input.batch.phase, [r.uid for r in forward_input.batch.reqs], end=" ")
    llm._process_last_data((forward_input, llm._forward(forward_input)))
    print(f"reserved {reserved} -> {llm.decode_manager.inflight_tokens} KV slots")
print({uid: llm.tokenizer.decode(s.output_ids) for uid, s in llm.status_map.items()})

# %% part="The offline interface: `LLM`"
# The same loop, driven by `generate` until every request is done.
llm.status_map.clear()
prompts = ["The capital of France is", "List three prime numbers:", "def fibonacci(n):"]
for prompt, out in zip(prompts, llm.generate(prompts, SamplingParams(max_tokens=6))):
    print(f"{prompt!r:<28} -> {out['text']!r}")
print("free afterwards:", llm.table_manager.available_size, "of 8 table rows")
llm.shutdown()
