"""Messages between the server's processes (explained in chapter 12).

The scheduler already speaks them in chapter 7: the offline ``LLM`` feeds it ``UserMsg``
and collects ``DetokenizeMsg`` without any process boundary. Across processes they travel
as msgpack (``minisgl.message.utils``); the API server's own messages are in
``minisgl.message.frontend``.
"""

from .backend import (
    AbortBackendMsg,
    BaseBackendMsg,
    BatchBackendMsg,
    ExitMsg,
    StatsQueryMsg,
    UserMsg,
)
from .tokenizer import (
    AbortMsg,
    BaseTokenizerMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    SampledLogprobs,
    TokenizeMsg,
)

__all__ = [
    "AbortBackendMsg",
    "AbortMsg",
    "BaseBackendMsg",
    "BaseTokenizerMsg",
    "BatchBackendMsg",
    "BatchTokenizerMsg",
    "DetokenizeMsg",
    "ExitMsg",
    "SampledLogprobs",
    "StatsQueryMsg",
    "TokenizeMsg",
    "UserMsg",
]
