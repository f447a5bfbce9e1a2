"""Chapter 14: the real scheduler, fed over ZMQ sockets instead of an in-memory list.

The scheduler runs in a thread of this process in online mode (``offline_mode=False``):
``SchedulerIOMixin`` binds its pull socket and connects its push socket to the tokenizer
worker's address, and this script plays that worker. It sends tokenized prompts as
``UserMsg``, reads each step's ``DetokenizeMsg`` tokens back, aborts a request halfway,
sends a prompt longer than the context (an error reply comes back), asks for the
scheduler's counters, and finally stops it with ``ExitMsg``.

    python examples/ch14_scheduler_io.py [--model PATH] [--device cpu|cuda]
"""
# capture-output

import argparse
import os
import shutil
import threading
from typing import Dict, List

import torch

from minisgl.core import SamplingParams
from minisgl.message import AbortBackendMsg, BatchTokenizerMsg, ExitMsg, StatsQueryMsg, UserMsg
from minisgl.message.utils import dumps, loads
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.utils import load_tokenizer
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue, new_ipc_dir

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--model", default=os.environ.get("MINISGL_MODEL", "models/SmolLM2-135M-Instruct")
)
parser.add_argument("--device", default="cpu")
args = parser.parse_args()

ipc_dir = new_ipc_dir()
config = SchedulerConfig(
    model_path=args.model,
    dtype=torch.float32,
    device=args.device,
    attention_backend="torch",
    max_running_req=8,
    num_page_override=2048,
    max_seq_len_override=256,
    ipc_dir=ipc_dir,
)
scheduler = Scheduler(
    config
)  # online: binds config.zmq_backend_addr, connects to the detokenizer's
print(
    f"scheduler listening on ipc://.../{os.path.basename(config.zmq_backend_addr)}, "
    f"replying to ipc://.../{os.path.basename(config.zmq_detokenizer_addr)}"
)


def serve() -> None:
    try:
        scheduler.run_forever()
    except KeyboardInterrupt:  # how ExitMsg ends the loop
        print("scheduler: ExitMsg received, loop left")


thread = threading.Thread(target=serve)
thread.start()
to_scheduler = ZmqPushQueue(config.zmq_backend_addr, create=False, encoder=dumps)
from_scheduler = ZmqPullQueue(config.zmq_detokenizer_addr, create=True, decoder=loads)


def read_until(done) -> List:
    """Messages from the scheduler (batches unpacked) until ``done(messages)``."""
    got: List = []
    while not done(got):
        msg = from_scheduler.get()
        got += msg.data if isinstance(msg, BatchTokenizerMsg) else [msg]
    return got


tok = load_tokenizer(args.model)
prompts = {
    0: ("The capital of France is", 8),
    1: ("def fibonacci(n):", 12),
    2: ("Once upon a time,", 5),
}
for uid, (prompt, n) in prompts.items():
    ids = torch.tensor(tok.encode(prompt), dtype=torch.int32)
    to_scheduler.put(UserMsg(uid, ids, SamplingParams(max_tokens=n, ignore_eos=True)))
to_scheduler.put(
    UserMsg(3, torch.zeros(300, dtype=torch.int32), SamplingParams(max_tokens=4))
)  # > 256
finished = lambda got: {m.uid for m in got if getattr(m, "finished", False)} >= {0, 1, 2, 3}  # noqa: E731
tokens: Dict[int, List[int]] = {}
for m in read_until(finished):
    if m.error:
        print(f"uid {m.uid}: refused: {m.error}")
    else:
        tokens.setdefault(m.uid, []).append(m.next_token)
for uid, (prompt, _) in prompts.items():
    print(f"uid {uid}: {prompt!r} + {len(tokens[uid])} tokens -> {tok.decode(tokens[uid])!r}")

to_scheduler.put(
    UserMsg(
        4,
        torch.tensor(tok.encode("Count: 1, 2,"), dtype=torch.int32),
        SamplingParams(max_tokens=200, ignore_eos=True),
    )
)
got = read_until(lambda got: len(got) >= 3)
to_scheduler.put(AbortBackendMsg(uid=4))  # the client went away
print(f"uid 4: aborted after {len(got)}+ of 200 tokens")


def ask_stats(uid: int) -> Dict[str, int]:
    to_scheduler.put(StatsQueryMsg(uid=uid))
    got = read_until(lambda got: any(hasattr(m, "stats") for m in got))
    return next(m.stats for m in got if hasattr(m, "stats"))


# the abort is handled on the scheduler's next iteration: ask until it has gone idle
stats = ask_stats(99)
for uid in range(100, 200):
    if stats["running_reqs"] == 0 and stats["table_rows_free"] == stats["table_rows_total"]:
        break
    stats = ask_stats(uid)
print(
    "counters once idle:",
    {
        k: stats[k]
        for k in (
            "kv_pages_in_use",
            "table_rows_free",
            "table_rows_total",
            "running_reqs",
            "pending_reqs",
            "max_seq_len",
        )
    },
)

to_scheduler.put(ExitMsg())
thread.join()
scheduler.stop_io()
scheduler.shutdown()
to_scheduler.stop()
from_scheduler.stop()
shutil.rmtree(ipc_dir)
