"""Scheduler settings on top of the engine's. Mirrors upstream ``minisgl.scheduler.config``."""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.engine import EngineConfig
from minisgl.structured.manager import COMPILE_TIMEOUT_S  # +ch24


@dataclass(frozen=True)
class SchedulerConfig(EngineConfig):
    """``max_extend_tokens`` is the prefill token budget of one step; ``offline_mode``
    means no processes and no sockets (the ``LLM`` class)."""

    max_extend_tokens: int = 8192
    cache_type: str = "radix"  # the prefix cache: "radix" or "naive"  # +ch09
    offline_mode: bool = False
    # >>> ch14: online, the launch's private directory of socket files; the zmq_*_addr
    # properties name the sockets in it (upstream keys them on the pid)
    ipc_dir: str | None = None
    # <<< ch14
    # >>> ch23: admit on an estimate of each request's future tokens, and retract running
    # requests when a decode step runs out of KV pages; off, admission reserves every max_tokens
    enable_retraction: bool = False
    # <<< ch23
    # >>> ch24: a grammar not compiled in this many seconds fails its request
    grammar_timeout_s: float = COMPILE_TIMEOUT_S
    # <<< ch24

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_extend_tokens < 1:
            raise ValueError(f"max_extend_tokens must be >= 1, got {self.max_extend_tokens}")

    # >>> ch14
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

    # <<< ch14
