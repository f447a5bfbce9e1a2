"""Structured output: answers held to a JSON schema, a regex, a choice or a grammar.

``grammar`` turns a request's ``(kind, text)`` into a matcher (on llguidance) and checks it
for the server; ``manager`` is the scheduler's side: grammars compiled off its thread,
a matcher per request, the batch's token bitmask each step. The mask itself is the kernel op
``apply_token_bitmask`` (``minisgl/kernel/bitmask.py``).
"""

from .grammar import GRAMMAR_KINDS, GrammarBackend, GrammarError, Matcher, check_grammar
from .manager import COMPILE_TIMEOUT_S, GrammarManager

__all__ = [
    "GRAMMAR_KINDS",
    "COMPILE_TIMEOUT_S",
    "GrammarBackend",
    "GrammarError",
    "GrammarManager",
    "Matcher",
    "check_grammar",
]
