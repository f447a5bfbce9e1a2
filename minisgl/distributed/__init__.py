"""Tensor parallelism: which rank this process is, and the collectives between ranks
(chapter 16; a single rank, and no process group, until then)."""

from .impl import DistributedCommunicator, destroy_distributed, init_distributed
from .info import DistributedInfo, get_tp_info, set_tp_info

__all__ = [
    "DistributedCommunicator",
    "DistributedInfo",
    "destroy_distributed",
    "get_tp_info",
    "init_distributed",
    "set_tp_info",
]
