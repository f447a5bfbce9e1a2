"""Turning messages into bytes and back: msgpack of plain data, one tagged dict per object.

A message is a dataclass whose fields are ints, floats, strings, ``None``, bools, bytes,
lists, dicts, other dataclasses (``SamplingParams``, nested messages) or 1-D tensors.
``serialize`` turns it into plain data that msgpack can pack: a dataclass becomes
``{"__type__": "UserMsg", "uid": 3, ...}`` and a tensor becomes
``{"__type__": "Tensor", "dtype": "int32", "buffer": <raw bytes>}``, so a prompt of N
int32 ids costs 4N bytes on the wire rather than a list of N msgpack integers.
``deserialize`` rebuilds the objects, calling each class's constructor (so
``SamplingParams.__post_init__`` validates what arrives).

Which names may be rebuilt is explicit: ``deserialize`` looks types up in a registry of
the message classes (``message_types``), never in arbitrary globals, so bytes from a
socket cannot instantiate any other class. Mirrors upstream
``minisgl.message.utils.serialize_type`` / ``deserialize_type``, which key on a module's
``globals()``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Type

import msgpack
import torch

TYPE_KEY = "__type__"
_PLAIN = (int, float, str, bool, bytes, type(None))


def serialize(obj: Any) -> Any:
    """Plain msgpack-able data for ``obj`` (see the module docstring for the format).

    Raises:
        ValueError: for a tensor that is not 1-D or not on the CPU.
        TypeError: for a value of any other type (a set, a custom class, ...).
    """
    if isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, torch.Tensor):
        if obj.dim() != 1 or obj.device.type != "cpu":
            raise ValueError(
                f"only 1-D CPU tensors travel in messages, got {tuple(obj.shape)} on {obj.device}"
            )
        # viewed as bytes, any dtype (bfloat16 included) survives without a numpy type
        raw = obj.contiguous().view(torch.uint8).numpy().tobytes()
        return {TYPE_KEY: "Tensor", "dtype": str(obj.dtype).removeprefix("torch."), "buffer": raw}
    if isinstance(obj, (list, tuple)):
        return [serialize(v) for v in obj]
    if isinstance(obj, dict):
        return {k: serialize(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        data = {f.name: serialize(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
        return {TYPE_KEY: type(obj).__name__, **data}
    raise TypeError(f"cannot serialize a {type(obj).__name__} in a message")


def deserialize(data: Any, registry: Dict[str, Type[Any]] | None = None) -> Any:
    """Inverse of ``serialize``. ``registry`` maps type names to classes (default: every
    message class and ``SamplingParams``).

    Raises:
        ValueError: for an unknown ``__type__`` or an unknown tensor dtype.
    """
    registry = message_types() if registry is None else registry
    if isinstance(data, list):
        return [deserialize(v, registry) for v in data]
    if not isinstance(data, dict):
        return data
    name = data.get(TYPE_KEY)
    if name is None:
        return {k: deserialize(v, registry) for k, v in data.items()}
    if name == "Tensor":
        dtype = getattr(torch, data["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown tensor dtype {data['dtype']!r}")
        if not data["buffer"]:  # frombuffer refuses an empty buffer
            return torch.empty(0, dtype=dtype)
        # bytearray: a writable copy, so the tensor does not alias msgpack's buffer
        return torch.frombuffer(bytearray(data["buffer"]), dtype=torch.uint8).view(dtype)
    cls = registry.get(name)
    if cls is None:
        raise ValueError(f"unknown message type {name!r}")
    return cls(**{k: deserialize(v, registry) for k, v in data.items() if k != TYPE_KEY})


def dumps(obj: Any) -> bytes:
    """``obj`` as msgpack bytes: ``serialize`` then pack."""
    return msgpack.packb(serialize(obj), use_bin_type=True)


def loads(raw: bytes) -> Any:
    """The object ``dumps`` packed into ``raw``."""
    return deserialize(msgpack.unpackb(raw, raw=False))


@functools.cache
def message_types() -> Dict[str, Type[Any]]:
    """Name -> class for every message dataclass and ``SamplingParams``.

    Built on first use: importing the message modules here, not at the top, keeps this
    file free of import cycles (they do not import it).
    """
    from minisgl.core import SamplingParams

    from . import backend, frontend, tokenizer

    found: Dict[str, Type[Any]] = {"SamplingParams": SamplingParams}
    for module in (backend, tokenizer, frontend):
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                and dataclasses.is_dataclass(value)
                and value.__module__ == module.__name__
            ):
                found[name] = value
    return found
