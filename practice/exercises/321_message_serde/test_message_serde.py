"""Exercise 321: serialize / deserialize / dumps / loads of minisgl/message/utils.py.

Pure CPU: messages are plain data plus 1-D CPU tensors.
"""

from __future__ import annotations

import dataclasses
import random

import msgpack
import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortBackendMsg,
    AbortMsg,
    BatchBackendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    StatsQueryMsg,
    TokenizeMsg,
    UserMsg,
)
from minisgl.message.frontend import (
    BatchFrontendMsg,
    StatsReply,
    TokenLogprob,
    TopLogprob,
    UserReply,
)
from minisgl.message.tokenizer import SampledLogprobs
from minisgl.message.utils import deserialize, dumps, loads, message_types, serialize

DTYPES = [
    torch.int32,
    torch.int64,
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.uint8,
    torch.bool,
]


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def same(a, b) -> bool:
    """Field-by-field equality; tensors by dtype and values (dataclass ``==`` cannot)."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(
            same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


ONE_OF_EACH = [
    UserMsg(
        uid=3,
        input_ids=ids(151644, 872, 198),
        sampling_params=SamplingParams(temperature=0.7, top_p=0.9),
    ),
    AbortBackendMsg(uid=4),
    ExitMsg(),
    StatsQueryMsg(uid=5),
    BatchBackendMsg(data=[ExitMsg(), AbortBackendMsg(uid=1)]),
    DetokenizeMsg(uid=6, next_token=1000, finished=True),
    TokenizeMsg(
        uid=7,
        text=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
        sampling_params=SamplingParams(max_tokens=3),
    ),
    AbortMsg(uid=8),
    BatchTokenizerMsg(data=[AbortMsg(uid=9)]),
    UserReply(uid=10, incremental_output="🙂 ok", finished=False),
    StatsReply(uid=11, stats={"table_rows_free": 7, "kv_pages_in_use": 0}),
    BatchFrontendMsg(data=[StatsReply(uid=12)]),
    # logprobs: a sampled token's and its alternatives, and a reply that carries them
    DetokenizeMsg(
        uid=13,
        next_token=42,
        finished=False,
        logprobs=SampledLogprobs(-0.25, [42, 7], [-0.25, -2.5]),
    ),
    SampledLogprobs(logprob=-1.0),
    TopLogprob(token="é", bytes=[0xC3, 0xA9], logprob=-1.5),
    TokenLogprob(token="\ufffd", bytes=[0xF0, 0x9F], logprob=-0.5, text_offset=3),
    UserReply(
        uid=14,
        incremental_output="é",
        finished=False,
        logprobs=[TokenLogprob("é", [0xC3, 0xA9], -0.1, 0, [TopLogprob("e", [0x65], -2.0)])],
    ),
]


def test_the_examples_cover_every_message_type():
    missing = (
        set(message_types())
        - {type(m).__name__ for m in ONE_OF_EACH}
        - {"SamplingParams", "BaseBackendMsg", "BaseTokenizerMsg", "BaseFrontendMsg"}
    )
    assert not missing, f"add an example of {sorted(missing)} to ONE_OF_EACH"


@pytest.mark.parametrize("msg", ONE_OF_EACH, ids=lambda m: type(m).__name__)
def test_every_message_type_round_trips(msg):
    raw = dumps(msg)
    assert isinstance(raw, bytes), f"dumps must return bytes, got {type(raw).__name__}"
    back = loads(raw)
    assert same(back, msg), f"sent {msg!r}\n got {back!r}"


def test_a_dataclass_becomes_a_tagged_dict():
    data = serialize(AbortMsg(uid=8))
    assert data == {"__type__": "AbortMsg", "uid": 8}, f"serialize(AbortMsg(uid=8)) = {data!r}"
    sp = serialize(SamplingParams(top_k=5))
    assert sp["__type__"] == "SamplingParams" and sp["top_k"] == 5 and sp["max_tokens"] == 1024, sp


def test_plain_values_pass_through():
    value = {"a": [1, 2.5, "x", None, True, b"\x00\xff"], "b": (3, 4)}
    data = serialize(value)
    assert data == {"a": [1, 2.5, "x", None, True, b"\x00\xff"], "b": [3, 4]}, data
    assert deserialize(msgpack.unpackb(msgpack.packb(data, use_bin_type=True), raw=False)) == data


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_a_tensor_is_its_raw_bytes_with_its_dtype(dtype):
    t = (torch.arange(37) * 3 - 20).to(dtype)
    data = serialize(t)
    assert isinstance(data, dict) and data.get("__type__") == "Tensor", (
        f"a tensor must become a Tensor dict, got {data!r:.120}"
    )
    assert isinstance(data["buffer"], bytes), (
        f"the buffer must be bytes (the tensor's memory), got {type(data['buffer']).__name__}"
    )
    assert len(data["buffer"]) == 37 * t.element_size(), (
        f"37 {dtype} values are {37 * t.element_size()} bytes, the buffer has {len(data['buffer'])}"
    )
    back = loads(dumps(t))
    assert back.dtype == dtype, f"sent {dtype}, got {back.dtype}"
    assert torch.equal(back, t), (
        f"values differ: sent {t[:6].tolist()}..., got {back[:6].tolist()}..."
    )


def test_the_dtype_name_is_the_torch_name():
    assert serialize(ids(1))["dtype"] == "int32", serialize(ids(1))
    assert serialize(torch.zeros(1, dtype=torch.bfloat16))["dtype"] == "bfloat16"
    assert deserialize({"__type__": "Tensor", "dtype": "int64", "buffer": bytes(16)}).tolist() == [
        0,
        0,
    ]


def test_a_prompt_costs_four_bytes_per_token():
    msg = UserMsg(
        uid=0, input_ids=torch.arange(10_000, dtype=torch.int32), sampling_params=SamplingParams()
    )
    n = len(dumps(msg))
    assert 40_000 <= n < 40_200, (
        f"a 10000-token int32 prompt should cost about 40000 bytes, costs {n}"
    )


def test_an_empty_tensor_round_trips():
    for dtype in (torch.int32, torch.float32):
        back = loads(dumps(torch.empty(0, dtype=dtype)))
        assert back.shape == (0,) and back.dtype == dtype, f"empty {dtype}: got {back!r}"


def test_a_strided_view_sends_its_values():
    base = torch.arange(10, dtype=torch.int32)
    view = base[::2]
    back = loads(dumps(view))
    assert back.tolist() == [0, 2, 4, 6, 8], (
        f"base[::2] is [0, 2, 4, 6, 8], received {back.tolist()}"
    )


def test_a_received_tensor_is_a_private_writable_copy():
    data = serialize(ids(1, 2, 3))
    before = list(data["buffer"])  # a copy: bytes(b) would be b itself
    t = deserialize(data)
    t[0] = 99  # the scheduler writes into received tensors
    assert list(data["buffer"]) == before, (
        "writing into the received tensor changed the bytes it came from"
    )
    assert t.tolist() == [99, 2, 3]


def test_nested_messages_round_trip():
    msg = BatchBackendMsg(
        data=[
            UserMsg(
                uid=1,
                input_ids=ids(5, 6),
                sampling_params=SamplingParams(ignore_eos=True, max_tokens=4),
            ),
            BatchBackendMsg(
                data=[
                    AbortBackendMsg(uid=2),
                    UserMsg(uid=3, input_ids=ids(), sampling_params=SamplingParams()),
                ]
            ),
        ]
    )
    back = loads(dumps(msg))
    assert same(back, msg), f"sent {msg!r}\n got {back!r}"
    assert isinstance(back.data[0].sampling_params, SamplingParams), (
        "a nested SamplingParams must be rebuilt"
    )


def test_constructors_validate_what_arrives():
    with pytest.raises(ValueError, match="top_p"):
        loads(msgpack.packb({"__type__": "SamplingParams", "top_p": 0.0}, use_bin_type=True))


def test_unknown_types_are_refused():
    for name in ("Popen", "os.system", "Tensorr"):
        with pytest.raises(ValueError, match="unknown message type"):
            deserialize({"__type__": name, "args": ["true"]})
    custom = {"Ping": dataclasses.make_dataclass("Ping", [("n", int)])}
    assert deserialize({"__type__": "Ping", "n": 2}, registry=custom).n == 2, (
        "use the registry you are given"
    )


def test_bad_values_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="1-D"):
        serialize(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="meta|cpu|CPU"):
        serialize(torch.zeros(3, device="meta"))
    with pytest.raises(TypeError, match="set"):
        serialize(UserReply(uid=0, incremental_output={"a"}, finished=False))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dtype"):
        deserialize({"__type__": "Tensor", "dtype": "Tensor", "buffer": b"1234"})


def test_drawn_messages_round_trip(drawn_seed):
    """Messages of drawn sizes, dtypes and values (each judged run draws new ones) come back
    equal, and a prompt of N int32 ids still costs about 4N bytes."""
    rng = random.Random(drawn_seed)
    for uid in range(20):
        n = rng.randint(0, 300)
        prompt = torch.tensor([rng.randrange(200_000) for _ in range(n)], dtype=torch.int32)
        params = SamplingParams(
            temperature=rng.choice([0.0, 0.5, 1.3]),
            top_k=rng.choice([-1, 1, 40]),
            max_tokens=rng.randint(1, 4096),
        )
        dtype = rng.choice(DTYPES)
        values = torch.randn(rng.randint(0, 40), generator=torch.Generator().manual_seed(uid))
        msg = BatchBackendMsg(
            data=[
                UserMsg(uid=uid, input_ids=prompt, sampling_params=params),
                AbortBackendMsg(uid=rng.randrange(1000)),
            ]
        )
        raw = dumps(msg)
        assert same(loads(raw), msg), f"sent {msg!r}"
        assert 4 * n <= len(raw) <= 4 * n + 400, f"{n} ids took {len(raw)} bytes"
        tensor = (values.abs() * 100).to(dtype)  # no negative float cast to an unsigned type
        back = deserialize(serialize(tensor))
        assert same(back, tensor), f"a {dtype} tensor of {tensor.numel()} came back as {back!r}"
