"""Chapter 12: the messages between the server's processes, as bytes on a socket.

Every kind of message is packed with msgpack (a prompt's token ids travel as raw bytes
with their dtype), unpacked, and compared with the original. Then the same bytes cross a
real process boundary: a child process pushes messages over ``ipc://`` and this one pulls
them, in order; and a publisher reaches every subscriber (how one scheduler rank can
re-broadcast what it receives to the others).

    python examples/ch12_messages.py
"""
# capture-output

import multiprocessing as mp
import shutil

import torch

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    TokenizeMsg,
    UserMsg,
)
from minisgl.message.frontend import UserReply
from minisgl.message.utils import dumps, loads, serialize
from minisgl.utils.mp import ZmqPubQueue, ZmqPullQueue, ZmqPushQueue, ZmqSubQueue, new_ipc_dir


def child(addr: str) -> None:
    queue = ZmqPushQueue(addr, create=False, encoder=dumps)
    for i in range(5):
        queue.put(DetokenizeMsg(uid=i, next_token=100 + i, finished=i == 4))
    queue.stop()


def main() -> None:
    messages = [
        TokenizeMsg(
            uid=0,
            text=[{"role": "user", "content": "Bonjour 👋"}],
            sampling_params=SamplingParams(),
        ),
        UserMsg(
            uid=0,
            input_ids=torch.arange(100, 1124, dtype=torch.int32),
            sampling_params=SamplingParams(),
        ),
        DetokenizeMsg(uid=0, next_token=9906, finished=False),
        BatchTokenizerMsg(
            data=[DetokenizeMsg(uid=u, next_token=13, finished=u == 2) for u in range(3)]
        ),
        UserReply(
            uid=0,
            incremental_output=" Paris",
            finished=True,
            finish_reason="stop",
            num_prompt_tokens=1024,
            num_output_tokens=8,
        ),
        AbortMsg(uid=1),
        ExitMsg(),
    ]
    print(f"{'message':<20} {'bytes':>6}  round trip")
    for msg in messages:
        raw = dumps(msg)
        back = loads(raw)
        same = repr(back) == repr(msg) and (
            not isinstance(msg, UserMsg) or torch.equal(back.input_ids, msg.input_ids)
        )
        print(f"{type(msg).__name__:<20} {len(raw):>6}  {'equal' if same else 'DIFFERENT'}")
    print(
        "a 1024-token prompt is",
        len(dumps(messages[1])),
        "bytes: 4 per int32 id, plus the envelope",
    )
    print("what msgpack sees for a DetokenizeMsg:", serialize(messages[2]))

    ipc_dir = new_ipc_dir()
    pull = ZmqPullQueue(f"ipc://{ipc_dir}/demo", create=True, decoder=loads)
    proc = mp.get_context("spawn").Process(target=child, args=(f"ipc://{ipc_dir}/demo",))
    proc.start()
    got = [pull.get() for _ in range(5)]
    proc.join()
    print("from a child process over ipc://:", [(m.uid, m.next_token, m.finished) for m in got])

    pub = ZmqPubQueue(f"ipc://{ipc_dir}/bcast", create=True, encoder=dumps)
    subs = [ZmqSubQueue(f"ipc://{ipc_dir}/bcast", create=False, decoder=loads) for _ in range(2)]
    pub.wait_for_subscribers(2)
    pub.put_raw_many([dumps(AbortMsg(uid=7)), dumps(ExitMsg())])
    for i, sub in enumerate(subs):
        print(f"subscriber {i} got:", [loads(raw) for raw in sub.get_raw_many()])
    for q in (pull, pub, *subs):
        q.stop()
    shutil.rmtree(ipc_dir)


if __name__ == "__main__":  # a spawned child imports this file: it must not rerun it
    main()
