"""Queues between processes: ZeroMQ sockets over ``ipc://`` (Unix domain sockets).

Each queue wraps one socket and one codec: ``encoder`` turns an object into bytes,
``decoder`` turns bytes back (``minisgl.message.utils.dumps`` / ``loads`` for messages).

* ``ZmqPushQueue`` / ``ZmqPullQueue``: a pipeline. Many pushers may feed one puller; ZeroMQ
  keeps each pusher's messages in order and queues them while the puller is busy.
* ``ZmqAsyncPushQueue`` / ``ZmqAsyncPullQueue``: the same, awaitable, for the API server's
  asyncio event loop.
* ``ZmqPubQueue`` / ``ZmqSubQueue``: one publisher, every subscriber gets every message
  (one scheduler rank re-broadcasting what it received to the others).

``create=True`` binds the address (the owner, one per address); ``create=False``
connects to it. Either side may start first. Addresses are ``ipc://<dir>/<name>`` inside a
fresh directory per launch (``new_ipc_dir``), so two servers on one machine never share a
socket file (a Unix socket path must stay under ~100 bytes). Mirrors upstream ``minisgl.utils.mp``.
"""

from __future__ import annotations

import tempfile
import time
from typing import Callable, Generic, List, TypeVar

import zmq
import zmq.asyncio

T = TypeVar("T")
Encoder = Callable[[T], bytes]
Decoder = Callable[[bytes], T]

# ms a closing socket keeps trying to deliver what is queued: long enough for a last
# message, short enough that a process whose peer is dead still exits
LINGER_MS = 1000
# A blocking wait wakes up this often (ms) to let Python run signal handlers: a SIGTERM
# may be delivered to another thread (OpenMP's, the tokenizer's), and then nothing would
# interrupt a receive that blocks in C forever.
WAKE_MS = 200


def new_ipc_dir() -> str:
    """A fresh private directory (``/tmp/minisgl-XXXX``) for one launch's socket files."""
    return tempfile.mkdtemp(prefix="minisgl-")


def _open(context: zmq.Context, kind: int, addr: str, create: bool) -> zmq.Socket:
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, LINGER_MS)
    if create:
        socket.bind(addr)
    else:
        socket.connect(addr)
    return socket


class _SyncQueue:
    def __init__(self, kind: int, addr: str, create: bool) -> None:
        self.addr = addr
        self.socket = _open(zmq.Context.instance(), kind, addr, create)

    def poll(self, timeout_s: float) -> bool:
        """Whether a message is ready, waiting at most ``timeout_s`` seconds."""
        return self.socket.poll(timeout=int(timeout_s * 1000)) != 0

    def empty(self) -> bool:
        return not self.poll(0)

    def _wait(self) -> None:
        while not self.socket.poll(timeout=WAKE_MS):
            pass

    def stop(self) -> None:
        self.socket.close()


class ZmqPushQueue(_SyncQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, encoder: Encoder[T]) -> None:
        super().__init__(zmq.PUSH, addr, create)
        self.encoder = encoder

    def put(self, obj: T) -> None:
        self.socket.send(self.encoder(obj), copy=False)

    def put_raw(self, raw: bytes) -> None:
        self.socket.send(raw, copy=False)


class ZmqPullQueue(_SyncQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, decoder: Decoder[T]) -> None:
        super().__init__(zmq.PULL, addr, create)
        self.decoder = decoder

    def get(self) -> T:
        """The next message; blocks until there is one."""
        return self.decoder(self.get_raw())

    def get_raw(self) -> bytes:
        """The next message's bytes, undecoded (to forward them as they are)."""
        self._wait()
        return self.socket.recv()

    def decode(self, raw: bytes) -> T:
        return self.decoder(raw)


class ZmqPubQueue(_SyncQueue, Generic[T]):
    """The publishing end. An XPUB socket: it sees each subscriber's subscription, so
    ``wait_for_subscribers`` can make sure no message is published before everyone
    listens (a plain PUB socket silently drops messages sent before a subscriber joined)."""

    def __init__(self, addr: str, create: bool, encoder: Encoder[T]) -> None:
        super().__init__(zmq.XPUB, addr, create)
        self.socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # report every subscriber, not each topic once
        self.encoder = encoder

    def wait_for_subscribers(self, n: int, timeout_s: float = 60.0) -> None:
        """Block until ``n`` subscribers have subscribed.

        Raises:
            TimeoutError: after ``timeout_s`` seconds with fewer.
        """
        deadline, seen = time.monotonic() + timeout_s, 0
        while seen < n:
            left = deadline - time.monotonic()
            if left <= 0 or not self.poll(left):
                raise TimeoutError(f"{seen} of {n} subscribers joined {self.addr} in {timeout_s} s")
            if self.socket.recv()[:1] == b"\x01":  # \x01 + topic: subscribe; \x00: unsubscribe
                seen += 1

    def put(self, obj: T) -> None:
        self.socket.send(self.encoder(obj), copy=False)

    def put_raw_many(self, raws: List[bytes]) -> None:
        """Publish several encoded messages as one ZeroMQ message (possibly none of them):
        a subscriber's ``get_raw_many`` receives exactly this list."""
        self.socket.send_multipart([b"", *raws], copy=False)  # a header frame: never empty


class ZmqSubQueue(_SyncQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, decoder: Decoder[T]) -> None:
        super().__init__(zmq.SUB, addr, create)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")  # every message
        self.decoder = decoder

    def get(self) -> T:
        self._wait()
        return self.decoder(self.socket.recv())

    def get_raw_many(self) -> List[bytes]:
        """The next ``put_raw_many`` list; blocks until it comes."""
        self._wait()
        return self.socket.recv_multipart()[1:]


class _AsyncQueue:
    def __init__(self, kind: int, addr: str, create: bool) -> None:
        self.addr = addr
        self.socket = _open(zmq.asyncio.Context.instance(), kind, addr, create)

    def stop(self) -> None:
        self.socket.close()


class ZmqAsyncPushQueue(_AsyncQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, encoder: Encoder[T]) -> None:
        super().__init__(zmq.PUSH, addr, create)
        self.encoder = encoder

    async def put(self, obj: T) -> None:
        await self.socket.send(self.encoder(obj), copy=False)  # type: ignore[misc]  # a Future here


class ZmqAsyncPullQueue(_AsyncQueue, Generic[T]):
    def __init__(self, addr: str, create: bool, decoder: Decoder[T]) -> None:
        super().__init__(zmq.PULL, addr, create)
        self.decoder = decoder

    async def get(self) -> T:
        return self.decoder(await self.socket.recv())  # type: ignore[misc]  # a Future here
