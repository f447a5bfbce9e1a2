"""The messages the scheduler speaks: what it receives (``backend``) and what it sends
(``tokenizer``). The offline ``LLM`` feeds it ``UserMsg`` and collects ``DetokenizeMsg``
in memory.
"""

from .backend import (
    AbortBackendMsg,
    BaseBackendMsg,
    BatchBackendMsg,
    ExitMsg,
    StatsQueryMsg,  # +ch12
    UserMsg,
)
from .tokenizer import (
    AbortMsg,  # +ch12
    BaseTokenizerMsg,
    BatchTokenizerMsg,  # +ch12
    DetokenizeMsg,
    SampledLogprobs,
    TokenizeMsg,  # +ch12
)

__all__ = [
    "AbortBackendMsg",
    "AbortMsg",  # +ch12
    "BaseBackendMsg",
    "BaseTokenizerMsg",
    "BatchBackendMsg",
    "BatchTokenizerMsg",  # +ch12
    "DetokenizeMsg",
    "ExitMsg",
    "SampledLogprobs",
    "StatsQueryMsg",  # +ch12
    "TokenizeMsg",  # +ch12
    "UserMsg",
]
