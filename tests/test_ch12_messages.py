"""Chapter 12: messages as msgpack bytes, and ZeroMQ queues over ipc:// between processes."""

import asyncio
import dataclasses
import multiprocessing as mp
import shutil

import msgpack
import pytest
import torch
import zmq

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortBackendMsg,
    AbortMsg,
    BaseBackendMsg,
    BaseTokenizerMsg,
    BatchBackendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    SampledLogprobs,
    StatsQueryMsg,
    TokenizeMsg,
    UserMsg,
)
from minisgl.message.frontend import (
    BaseFrontendMsg,
    BatchFrontendMsg,
    StatsReply,
    TokenLogprob,
    TopLogprob,
    UserReply,
)
from minisgl.message.utils import deserialize, dumps, loads, message_types, serialize
from minisgl.utils.mp import (
    ZmqAsyncPullQueue,
    ZmqAsyncPushQueue,
    ZmqPubQueue,
    ZmqPullQueue,
    ZmqPushQueue,
    ZmqSubQueue,
    new_ipc_dir,
)


def ids(*values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype)


EXAMPLES = [
    UserMsg(
        uid=7,
        input_ids=ids(1, 2, 3),
        sampling_params=SamplingParams(temperature=0.5, top_k=20, max_tokens=9),
    ),
    AbortBackendMsg(uid=3),
    ExitMsg(),
    StatsQueryMsg(uid=11),
    BatchBackendMsg(data=[AbortBackendMsg(uid=1), UserMsg(2, ids(5), SamplingParams())]),
    DetokenizeMsg(uid=1, next_token=42, finished=False),
    DetokenizeMsg(uid=2, next_token=-1, finished=True, error="prompt too long"),
    TokenizeMsg(
        uid=4, text="The capital of France is", sampling_params=SamplingParams(ignore_eos=True)
    ),
    TokenizeMsg(
        uid=5, text=[{"role": "user", "content": "héllo 👋"}], sampling_params=SamplingParams()
    ),
    AbortMsg(uid=6),
    BatchTokenizerMsg(data=[DetokenizeMsg(1, 2, False), DetokenizeMsg(3, 4, True)]),
    UserReply(
        uid=1,
        incremental_output="中文",
        finished=True,
        finish_reason="stop",
        num_prompt_tokens=5,
        num_output_tokens=3,
    ),
    UserReply(uid=2, incremental_output="", finished=True, error="boom"),
    StatsReply(uid=3, stats={"kv_pages_free": 10}),
    BatchFrontendMsg(data=[UserReply(1, "a", False), StatsReply(2, {})]),
    # logprobs: a token's, its alternatives', and a reply carrying them
    DetokenizeMsg(3, 42, False, logprobs=SampledLogprobs(-0.25, [42, 7], [-0.25, -2.5])),
    SampledLogprobs(logprob=-1.0),
    TopLogprob(token="é", bytes=[0xC3, 0xA9], logprob=-1.5),
    TokenLogprob(token="\ufffd", bytes=[0xF0, 0x9F], logprob=-0.5, text_offset=3),
    UserReply(
        uid=4,
        incremental_output="é",
        finished=False,
        logprobs=[TokenLogprob("é", [0xC3, 0xA9], -0.1, 0, [TopLogprob("e", [0x65], -2.0)])],
    ),
]


def same(a, b):
    """Equality that compares tensors by dtype and values (dataclass == cannot)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(
            same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def test_every_message_type_has_an_example():
    bases = {"BaseBackendMsg", "BaseTokenizerMsg", "BaseFrontendMsg", "SamplingParams"}
    assert set(message_types()) - bases == {type(m).__name__ for m in EXAMPLES}


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_bytes(msg):
    raw = dumps(msg)
    assert isinstance(raw, bytes)
    back = loads(raw)
    assert same(back, msg), (back, msg)


@pytest.mark.parametrize(
    "dtype", [torch.int32, torch.int64, torch.float32, torch.bfloat16, torch.uint8]
)
def test_a_tensor_travels_as_raw_bytes_and_keeps_its_dtype(dtype):
    t = torch.arange(1000).to(dtype)
    data = serialize(t)
    assert data["dtype"] == str(dtype).removeprefix("torch.")
    assert len(data["buffer"]) == 1000 * t.element_size()  # raw bytes, not a list of numbers
    back = deserialize(data)
    assert back.dtype == dtype and torch.equal(back, t)
    back[0] = 1  # a private, writable copy
    assert empty_round_trip(dtype).shape == (0,)


def empty_round_trip(dtype):
    return loads(dumps(torch.empty(0, dtype=dtype)))


def test_a_prompt_costs_about_four_bytes_per_token():
    msg = UserMsg(
        uid=0, input_ids=torch.arange(4096, dtype=torch.int32), sampling_params=SamplingParams()
    )
    assert 4 * 4096 <= len(dumps(msg)) < 4 * 4096 + 300


def test_bad_values_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="1-D"):
        serialize(torch.zeros(2, 2))
    with pytest.raises(TypeError, match="set"):
        serialize({1, 2})
    with pytest.raises(ValueError, match="unknown message type 'os.system'"):
        loads(msgpack.packb({"__type__": "os.system", "command": "true"}))
    with pytest.raises(ValueError, match="max_tokens"):  # constructors validate what arrives
        loads(msgpack.packb({"__type__": "SamplingParams", "max_tokens": 0}))


def test_base_classes_tell_the_three_directions_apart():
    assert isinstance(loads(dumps(EXAMPLES[0])), BaseBackendMsg)
    assert isinstance(loads(dumps(EXAMPLES[5])), BaseTokenizerMsg)
    assert isinstance(loads(dumps(EXAMPLES[11])), BaseFrontendMsg)


# ---- queues ---------------------------------------------------------------------------


@pytest.fixture
def ipc_dir():
    d = new_ipc_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_push_pull_keeps_order_and_either_side_may_start_first(ipc_dir):
    addr = f"ipc://{ipc_dir}/q"
    push = ZmqPushQueue(addr, create=False, encoder=dumps)  # connects before anyone binds
    for i in range(5):
        push.put(AbortBackendMsg(uid=i))
    pull = ZmqPullQueue(addr, create=True, decoder=loads)
    assert [pull.get().uid for _ in range(5)] == list(range(5))
    assert pull.empty() and not pull.poll(0.05)
    push.stop()
    pull.stop()


def _child_sends(addr: str, n: int) -> None:
    push = ZmqPushQueue(addr, create=False, encoder=dumps)
    for i in range(n):
        push.put(DetokenizeMsg(uid=i, next_token=i * 10, finished=i == n - 1))
    push.stop()
    # a forked child ends with os._exit: terminate the context first, which waits until the
    # I/O thread has sent everything queued (else the last messages are lost and the parent hangs)
    zmq.Context.instance().term()


def test_messages_cross_a_process_boundary(ipc_dir):
    addr = f"ipc://{ipc_dir}/from-child"
    pull = ZmqPullQueue(addr, create=True, decoder=loads)
    # fork: a spawned child would spend seconds re-importing torch for a few sends
    child = mp.get_context("fork").Process(target=_child_sends, args=(addr, 50))
    child.start()
    got = [pull.get() for _ in range(50)]
    child.join(30)
    assert [m.next_token for m in got] == [i * 10 for i in range(50)] and got[-1].finished
    pull.stop()


def test_pub_sub_reaches_every_subscriber_once_they_joined(ipc_dir):
    addr = f"ipc://{ipc_dir}/bcast"
    pub = ZmqPubQueue(addr, create=True, encoder=dumps)
    subs = [ZmqSubQueue(addr, create=False, decoder=loads) for _ in range(3)]
    pub.wait_for_subscribers(3, timeout_s=10)  # a plain PUB would drop what comes earlier
    pub.put(ExitMsg())
    pub.put_raw_many([dumps(AbortMsg(1)), dumps(AbortMsg(2))])
    pub.put_raw_many([])
    for sub in subs:
        assert isinstance(sub.get(), ExitMsg)
        assert [loads(r).uid for r in sub.get_raw_many()] == [1, 2]
        assert sub.get_raw_many() == []
        sub.stop()
    with pytest.raises(TimeoutError, match="0 of 1 subscribers"):
        pub.wait_for_subscribers(1, timeout_s=0.2)
    pub.stop()


def test_async_queues_for_the_api_server(ipc_dir):
    async def main():
        to_worker = ZmqAsyncPushQueue(f"ipc://{ipc_dir}/a", create=False, encoder=dumps)
        worker_in = ZmqPullQueue(f"ipc://{ipc_dir}/a", create=True, decoder=loads)
        worker_out = ZmqPushQueue(f"ipc://{ipc_dir}/b", create=False, encoder=dumps)
        from_worker = ZmqAsyncPullQueue(f"ipc://{ipc_dir}/b", create=True, decoder=loads)
        await to_worker.put(TokenizeMsg(uid=1, text="hi", sampling_params=SamplingParams()))
        msg = await asyncio.get_running_loop().run_in_executor(None, worker_in.get)
        worker_out.put(UserReply(uid=msg.uid, incremental_output="hello", finished=True))
        reply = await asyncio.wait_for(from_worker.get(), 10)
        for q in (to_worker, worker_in, worker_out, from_worker):
            q.stop()
        return reply

    assert asyncio.run(main()) == UserReply(uid=1, incremental_output="hello", finished=True)
