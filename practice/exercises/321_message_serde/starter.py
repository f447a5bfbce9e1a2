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

TYPE_KEY = "__type__"
_PLAIN = (int, float, str, bool, bytes, type(None))


def serialize(obj: Any) -> Any:
    """Plain msgpack-able data for ``obj`` (see the module docstring for the format).

    Raises:
        ValueError: for a tensor that is not 1-D or not on the CPU.
        TypeError: for a value of any other type (a set, a custom class, ...).
    """
    raise NotImplementedError("Exercise 321: implement serialize")


def deserialize(data: Any, registry: Dict[str, Type[Any]] | None = None) -> Any:
    """Inverse of ``serialize``. ``registry`` maps type names to classes (default: every
    message class and ``SamplingParams``).

    Raises:
        ValueError: for an unknown ``__type__`` or an unknown tensor dtype.
    """
    raise NotImplementedError("Exercise 321: implement deserialize")


def dumps(obj: Any) -> bytes:
    """``obj`` as msgpack bytes: ``serialize`` then pack."""
    raise NotImplementedError("Exercise 321: implement dumps")


def loads(raw: bytes) -> Any:
    """The object ``dumps`` packed into ``raw``."""
    raise NotImplementedError("Exercise 321: implement loads")


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
