"""Scheduler settings on top of the engine's. Mirrors upstream ``minisgl.scheduler.config``."""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.engine import EngineConfig


@dataclass(frozen=True)
class SchedulerConfig(EngineConfig):
    """``max_extend_tokens`` is the prefill token budget of one step (longer prompts are
    chunked, chapter 10); ``cache_type`` is ``"radix"`` or ``"naive"``; ``offline_mode``
    means no processes and no sockets (the ``LLM`` class)."""

    max_extend_tokens: int = 8192
    cache_type: str = "radix"
    offline_mode: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_extend_tokens < 1:
            raise ValueError(f"max_extend_tokens must be >= 1, got {self.max_extend_tokens}")
