"""Tensor parallelism: which rank this process is, out of how many (in one process, rank 0
of 1)."""

# >>> ch16
from .impl import DistributedCommunicator, destroy_distributed, init_distributed

# <<< ch16
from .info import DistributedInfo, get_tp_info, set_tp_info

__all__ = [
    "DistributedCommunicator",  # +ch16
    "DistributedInfo",
    "destroy_distributed",  # +ch16
    "get_tp_info",
    "init_distributed",  # +ch16
    "set_tp_info",
]
