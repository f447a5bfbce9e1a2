"""Scheduler settings on top of the engine's. Mirrors upstream ``minisgl.scheduler.config``."""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.engine import EngineConfig


@dataclass(frozen=True)
class SchedulerConfig(EngineConfig):
    """``max_extend_tokens`` is the prefill token budget of one step (longer prompts are
    chunked, chapter 10); ``cache_type`` is ``"radix"`` or ``"naive"``; ``offline_mode``
    means no processes and no sockets (the ``LLM`` class). ``enable_retraction`` admits on
    an estimate of each request's future tokens and retracts running requests when a decode
    step runs out of KV pages (chapter 23); off, admission reserves every ``max_tokens``.

    Online, ``ipc_dir`` is the launch's private directory of socket files (chapter 14);
    the ``zmq_*_addr`` properties name the sockets in it. Upstream keys them on the pid.
    """

    max_extend_tokens: int = 8192
    cache_type: str = "radix"
    offline_mode: bool = False
    ipc_dir: str | None = None
    enable_retraction: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_extend_tokens < 1:
            raise ValueError(f"max_extend_tokens must be >= 1, got {self.max_extend_tokens}")

    def _addr(self, name: str) -> str:
        if self.ipc_dir is None:
            raise ValueError("an online scheduler needs ipc_dir (the launch's socket directory)")
        return f"ipc://{self.ipc_dir}/{name}"

    @property
    def zmq_backend_addr(self) -> str:
        """Where rank 0 of the scheduler receives from the tokenizer worker."""
        return self._addr("backend")

    @property
    def zmq_detokenizer_addr(self) -> str:
        """Where the tokenizer worker receives (new requests and tokens to detokenize)."""
        return self._addr("detokenizer")

    @property
    def zmq_scheduler_broadcast_addr(self) -> str:
        """Where rank 0 re-broadcasts every received message to the other ranks."""
        return self._addr("broadcast")
