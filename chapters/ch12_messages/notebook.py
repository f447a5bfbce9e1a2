# The cells of chapter 12's notebook that run each part on the real message classes and
# queues (tools/notebook_parts.py puts each after the section its `part` names).

# %% part="Messages are dataclasses"
# A message is a plain dataclass: what the scheduler receives, and what it sends back.
import torch

from minisgl.core import SamplingParams
from minisgl.message import DetokenizeMsg, UserMsg

user = UserMsg(
    uid=7,
    input_ids=torch.tensor([1, 2, 3], dtype=torch.int32),
    sampling_params=SamplingParams(max_tokens=4),
)
reply = DetokenizeMsg(uid=7, next_token=42, finished=False)
print(user)
print(reply)

# %% part="The wire format: `serialize` and `deserialize`"
# `serialize` turns a message into msgpack-friendly values (the tensor becomes raw bytes and
# its dtype); `dumps`/`loads` are the bytes that cross a socket, and back.
from minisgl.message.utils import dumps, loads, serialize

print(serialize(user))
raw = dumps(user)
back = loads(raw)
print(
    len(raw), "bytes;", type(back).__name__, back.uid, back.input_ids.tolist(), back.sampling_params
)
assert torch.equal(back.input_ids, user.input_ids) and back.input_ids.dtype == torch.int32

# %% part="Queues: ZeroMQ over `ipc://`"
# A push queue and a pull queue in this process, on a fresh ipc:// address: messages come
# out in the order they went in, and either side may be opened first.
import shutil

from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue, new_ipc_dir

folder = new_ipc_dir()
addr = f"ipc://{folder}/demo"
push = ZmqPushQueue(addr, create=False, encoder=dumps)  # connects before anyone has bound
for i in range(3):
    push.put(DetokenizeMsg(uid=i, next_token=100 + i, finished=i == 2))
pull = ZmqPullQueue(addr, create=True, decoder=loads)
print([(m.uid, m.next_token, m.finished) for m in (pull.get() for _ in range(3))])
push.stop()
pull.stop()
shutil.rmtree(folder, ignore_errors=True)
