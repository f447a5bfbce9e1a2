"""Tensor-parallel bookkeeping (explained in chapter 16; a single rank until then)."""

from .impl import DistributedCommunicator
from .info import DistributedInfo, get_tp_info, set_tp_info

__all__ = ["DistributedCommunicator", "DistributedInfo", "get_tp_info", "set_tp_info"]
