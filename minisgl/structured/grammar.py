"""A request's grammar, compiled by llguidance into a matcher that yields token masks.

A grammar is a pair ``(kind, text)``, the one form it travels in from the client to the
scheduler (``SamplingParams.grammar``):

* ``json_object``: any JSON object (``text`` is ignored; OpenAI's ``{"type": "json_object"}``);
* ``json_schema``: ``text`` is a JSON Schema, serialized;
* ``regex``: the whole answer matches ``text`` (Rust ``regex`` syntax);
* ``choice``: ``text`` is a JSON list of strings, the answer is one of them;
* ``ebnf``: ``text`` is a GBNF (llama.cpp) or Lark grammar.

The library is llguidance: one wheel with no dependencies for every CPython, masks computed
in about a millisecond without a compile step per schema, a rollback (for speculative
decoding) and a batched mask fill on its own threads. xgrammar (SGLang's and vLLM's default)
fits behind the same three calls: ``GrammarBackend.compile``, ``Matcher.accept`` and
``GrammarBackend.fill_bitmask``. Mirrors SGLang's ``constrained/llguidance_backend.py``.
"""

from __future__ import annotations

import json
from typing import List, Sequence, Tuple

import llguidance
import llguidance.hf
import llguidance.torch
import torch

GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "choice", "ebnf")
# JSON as ``json.dumps`` writes it: one space after ``,`` and ``:``, no other whitespace. With
# whitespace free, a small model can spend its whole budget on newlines inside a valid object.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A grammar that cannot be used: its message names the problem, in the library's words."""


def to_llguidance(kind: str, text: str) -> str:
    """The llguidance grammar of ``(kind, text)``, not yet checked.

    Raises:
        GrammarError: for an unknown kind, or text that is not the JSON its kind needs.
    """
    try:
        if kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema(
                {"type": "object"}, defaults=JSON_LAYOUT
            )
        if kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(text)
        if kind == "choice":
            choices = json.loads(text)
            if not (
                isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices)
            ):
                raise GrammarError("a choice must be a non-empty list of strings")
            return llguidance.grammar_from("choice", text)
        if kind == "ebnf":
            return llguidance.grammar_from("ebnf", text)
    except (ValueError, TypeError) as e:  # not JSON, or a grammar the converter refused
        raise GrammarError(f"invalid {kind}: {e}") from None
    raise GrammarError(f"unknown grammar kind {kind!r}; one of {', '.join(GRAMMAR_KINDS)}")


def check_grammar(kind: str, text: str) -> None:
    """Check a grammar without a tokenizer (what the server can do before queueing it).

    Raises:
        GrammarError: naming the problem, e.g. ``invalid regex: ... unclosed group``.
    """
    message = llguidance.LLMatcher.validate_grammar(to_llguidance(kind, text))
    if message:
        raise GrammarError(f"invalid {kind}: {message.strip()}")


class Matcher:
    """One request's place in its grammar. ``accept`` advances it by a sampled token;
    ``rollback`` undoes the last tokens; ``is_terminated`` is true once the grammar has
    ended (it allows nothing but end-of-sequence, or has consumed it)."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False (and the matcher stops) when the grammar forbids it."""
        return self.matcher.consume_token(token)

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self.matcher.is_stopped()

    def copy(self) -> Matcher:
        return Matcher(self.matcher.deep_copy())

    @property
    def error(self) -> str:
        return self.matcher.get_error()


class GrammarBackend:
    """llguidance with one model's tokenizer: ``vocab_size`` is the model's (the logits'
    width, which may pass the tokenizer's: the extra ids are never allowed), and a grammar
    may end only with one of ``eos_token_ids``. Building it reads the whole vocabulary
    (about 0.4 s for SmolLM2's 49,152 tokens): build it once."""

    def __init__(self, hf_tokenizer, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.hf.from_tokenizer(
            hf_tokenizer, n_vocab=vocab_size, eos_token=list(eos_token_ids)
        )
        self.executor = llguidance.LLExecutor()

    def compile(self, kind: str, text: str) -> Matcher:
        """A matcher at the start of the grammar (copy it for each request). Drops the GIL
        while the library builds the parser.

        Raises:
            GrammarError: naming the problem.
        """
        matcher = llguidance.LLMatcher(self.tokenizer, to_llguidance(kind, text))
        if matcher.is_error():
            raise GrammarError(f"invalid {kind}: {matcher.get_error().strip()}")
        return Matcher(matcher)

    def fill_bitmask(self, matchers: List[Tuple[Matcher, int]], bitmask: torch.Tensor) -> None:
        """Write each ``(matcher, row)``'s allowed tokens into row ``row`` of ``bitmask:
        [B, ceil(vocab_size / 32)]`` int32 (CPU, contiguous), on the library's threads in
        one call."""
        llguidance.torch.fill_next_token_bitmask_par(
            self.executor, [(m.matcher, row) for m, row in matchers], bitmask
        )
