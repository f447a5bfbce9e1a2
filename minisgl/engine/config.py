"""Everything the engine needs to know to start. Mirrors upstream ``minisgl.engine.config``."""

from __future__ import annotations

from dataclasses import (
    dataclass,
    field,  # +ch14
)
from functools import cached_property
from typing import Tuple  # +ch18

import torch

from minisgl.distributed import DistributedInfo  # +ch14
from minisgl.models import ModelConfig
from minisgl.utils import cached_load_hf_config

# On the CPU the KV pool gets a fixed budget unless told otherwise: a fraction of the
# host's RAM is no sensible default on a machine that runs other things too.
DEFAULT_CPU_KV_MEMORY = 512 * 1024**2  # bytes


@dataclass(frozen=True)
class EngineConfig:
    """``model_path`` is a local Hugging Face folder. KV sizing, in order of precedence:
    ``num_page_override`` pages; ``kv_memory_cap`` bytes; on CUDA ``memory_ratio`` of the
    free memory measured before loading, minus the weights; on the CPU
    ``DEFAULT_CPU_KV_MEMORY``."""

    model_path: str
    # >>> ch14: this process's rank out of how many; with more than one, every rank gets the
    # same config but its own tp_info
    tp_info: DistributedInfo = field(default_factory=lambda: DistributedInfo(0, 1))
    # <<< ch14
    dtype: torch.dtype = torch.bfloat16
    device: str | None = None  # None: MINISGL_DEVICE, else CUDA when available, else CPU
    max_running_req: int = 256
    attention_backend: str = "auto"
    moe_backend: str = "auto"  # MoE models: "torch", "fused" (Triton), "auto"  # +ch21
    page_size: int = 1
    memory_ratio: float = 0.9
    num_page_override: int | None = None
    kv_memory_cap: int | None = None
    max_seq_len_override: int | None = None
    seed: int = 42
    # >>> ch18: CUDA graphs (CUDA with a graph-capable attention backend only) of the batch
    # sizes cuda_graph_bs if given, else 1, 2, 4, 8, 16, ... up to cuda_graph_max_bs
    # (default 256, capped at max_running_req); 0 disables them
    cuda_graph_bs: Tuple[int, ...] | None = None
    cuda_graph_max_bs: int | None = None
    # <<< ch18
    # >>> ch16: where the ranks meet (file:// or tcp://), and how long a collective waits for
    # a rank that is still busy (first use compiles kernels)
    distributed_addr: str = ""
    distributed_timeout: float = 600.0
    # <<< ch16

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.max_running_req < 1:
            raise ValueError(f"max_running_req must be >= 1, got {self.max_running_req}")

    @cached_property
    def model_config(self) -> ModelConfig:
        return ModelConfig.from_hf(cached_load_hf_config(str(self.model_path)))

    @property
    def max_seq_len(self) -> int:
        if self.max_seq_len_override is not None:
            return self.max_seq_len_override
        return self.model_config.rotary_config.max_position
