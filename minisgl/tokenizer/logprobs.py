"""Logprobs on the way out: each token's text and bytes, released in step with the text.

The scheduler sends numbers per token (``DetokenizeMsg.logprobs``: the token's, and ids and
logprobs of its alternatives);
a client wants each token's text and UTF-8 bytes, and wants the entries of the tokens whose
text a reply carries, no more and no fewer. Text and tokens do not line up one to one: a
character split over two tokens is sent when its second token arrives, and the stop checker
(``stop.py``) holds back text that may start a stop string. So each entry is *placed* when
its text is decoded (``text_offset``: where it starts in the answer, ``end``: where it ends)
and *released* once the client has been sent all of it. When a stop string ends the answer,
the tokens that contributed text before the cut are released and the rest are dropped; at
any other end, every entry goes. A token the text leaves out (a final EOS, a stop token id)
gets no entry.

A token's ``bytes`` are its own bytes even when they are part of a character: byte-level
BPE vocabularies (GPT-2's, Llama 3's, Qwen's) spell each byte as one printable character,
and ``byte_decoder`` undoes that spelling. vLLM and SGLang return the same entries
(``Logprob``, ``decoded_token``); OpenAI's API defines the fields.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from transformers import PreTrainedTokenizerBase

from minisgl.message import DetokenizeMsg
from minisgl.message.frontend import TokenLogprob, TopLogprob


@functools.cache
def byte_decoder() -> Dict[str, int]:
    """GPT-2's printable spelling of the 256 byte values, inverted: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class TokenTexts:
    """Each token id's display text (``decode([id])``) and its raw bytes, cached."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._cache: Dict[int, Tuple[str, List[int]]] = {}

    def __call__(self, token_id: int) -> Tuple[str, List[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            text = str(self.tokenizer.decode([token_id]))
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            decoder = byte_decoder()
            if isinstance(piece, str) and piece and all(c in decoder for c in piece):
                raw = [decoder[c] for c in piece]  # byte-level BPE: the token's own bytes
            else:
                raw = list(text.encode("utf-8", "surrogatepass"))
            hit = self._cache[token_id] = (text, raw)
        return hit

    def entry(self, msg: DetokenizeMsg) -> TokenLogprob:
        """The entry of ``msg``'s token (``text_offset`` is set when it is placed)."""
        lp = msg.logprobs
        assert lp is not None
        token, raw = self(msg.next_token)
        tops = [TopLogprob(*self(i), logprob=v) for i, v in zip(lp.top_ids, lp.top_logprobs)]
        return TokenLogprob(token, raw, lp.logprob, -1, tops)


@dataclass
class LogprobQueue:
    """One request's entries between the scheduler and the client (see the module docstring).
    ``unplaced``: tokens whose text is not decoded yet; ``placed``: (entry, end) in order."""

    unplaced: List[TokenLogprob] = field(default_factory=list)
    placed: List[Tuple[TokenLogprob, int]] = field(default_factory=list)

    def add(self, entry: TokenLogprob) -> None:
        self.unplaced.append(entry)

    def place(self, start: int, end: int) -> None:
        """The text ``[start, end)`` of the answer was decoded: it covers every unplaced token."""
        for entry in self.unplaced:
            entry.text_offset = start
            self.placed.append((entry, end))
        self.unplaced.clear()

    def release(self, sent: int, stopped: bool, finished: bool) -> List[TokenLogprob]:
        """The entries to send now that ``sent`` characters of the answer have gone out:
        those wholly sent; when a stop string cut the answer there, also those that began
        before the cut (the rest are dropped); at any other end, all."""
        if finished and not stopped:
            out = [e for e, _ in self.placed] + self.unplaced
            self.placed, self.unplaced = [], []
            return out
        n = 0
        while n < len(self.placed):
            entry, end = self.placed[n]
            if not (end <= sent or (stopped and entry.text_offset < sent)):
                break
            n += 1
        out = [e for e, _ in self.placed[:n]]
        self.placed = [] if stopped else self.placed[n:]
        return out
