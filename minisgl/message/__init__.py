"""Messages between the server's processes (explained in chapter 12).

The scheduler already speaks them in chapter 7: the offline ``LLM`` feeds it ``UserMsg``
and collects ``DetokenizeMsg`` without any process boundary.
"""

from .backend import AbortBackendMsg, BaseBackendMsg, BatchBackendMsg, ExitMsg, UserMsg
from .tokenizer import DetokenizeMsg

__all__ = ["AbortBackendMsg", "BaseBackendMsg", "BatchBackendMsg", "DetokenizeMsg", "ExitMsg", "UserMsg"]
