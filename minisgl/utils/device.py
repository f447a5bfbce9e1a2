"""One engine, two kinds of device: CUDA streams and events on a GPU, null ones on the CPU.

The scheduler overlaps CPU work with GPU work through two CUDA streams and waits on CUDA
events. The CPU runs every operation synchronously, so there a stream is a no-op and an
event is always complete; these classes let the same scheduler code run on both. Pinned
(page-locked) host memory only helps host-to-GPU copies, so ``pin`` is off on the CPU.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from typing import ContextManager, Iterator

import torch


class NullStream:
    """Stands in for ``torch.cuda.Stream`` on the CPU, where work is already ordered."""

    def wait_stream(self, other: object) -> None:
        pass

    def synchronize(self) -> None:
        pass


class NullEvent:
    """Stands in for ``torch.cuda.Event`` on the CPU: recorded work is already done."""

    def record(self, stream: object = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


Stream = torch.cuda.Stream | NullStream
Event = torch.cuda.Event | NullEvent


def check_device(name: str, what: str = "the device") -> torch.device:
    """``name`` (``cpu``, ``cuda``, ``cuda:1``) as a device this machine can run the engine on;
    ``what`` names the setting in the error (``--device`` on a command line).

    Raises:
        ValueError: for another kind of device, or CUDA when torch sees no GPU.
    """
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"{what} must be cpu or cuda (cuda:N), got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"{what} is {name!r}, but torch sees no CUDA GPU here "
            "(a CPU build of torch, or no driver): use cpu"
        )
    return torch.device(name)


def default_device() -> torch.device:
    """``MINISGL_DEVICE`` if set (``cpu``, ``cuda``, ``cuda:1``; see ``check_device``), else
    CUDA when available."""
    name = os.environ.get("MINISGL_DEVICE")
    if name:
        return check_device(name, "MINISGL_DEVICE")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def pin(device: torch.device) -> bool:
    """Whether host staging tensors should be pinned (only worth it for CUDA copies)."""
    return is_cuda(device)


def create_stream(device: torch.device) -> Stream:
    return torch.cuda.Stream(device=device) if is_cuda(device) else NullStream()


def create_event(device: torch.device) -> Event:
    return torch.cuda.Event() if is_cuda(device) else NullEvent()


def stream_ctx(stream: Stream) -> ContextManager:
    """``with stream_ctx(s):`` makes ``s`` current for the block (nothing on the CPU)."""
    return torch.cuda.stream(stream) if isinstance(stream, torch.cuda.Stream) else nullcontext()


def set_stream(stream: Stream) -> None:
    if isinstance(stream, torch.cuda.Stream):
        torch.cuda.set_stream(stream)


def current_stream(device: torch.device) -> Stream:
    return torch.cuda.current_stream(device) if is_cuda(device) else NullStream()


def synchronize(device: torch.device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)


def get_free_memory(device: torch.device) -> int:
    """Free bytes on a CUDA device.

    Raises:
        ValueError: on the CPU, where the KV pool is sized otherwise (``num_page_override``,
            ``kv_memory_cap`` or ``DEFAULT_CPU_KV_MEMORY``): a fraction of host RAM is no
            sensible default on a shared machine.
    """
    if not is_cuda(device):
        raise ValueError("free memory is only measured on CUDA devices")
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


@contextmanager
def device_ctx(device: torch.device) -> Iterator[None]:
    """Make ``device`` current for CUDA calls that look at the current device."""
    if is_cuda(device):
        with torch.cuda.device(device):
            yield
    else:
        yield
