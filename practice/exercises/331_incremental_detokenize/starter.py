"""Token ids back to text, one token at a time, for streaming.

Decoding each new token on its own is wrong: byte-level BPE splits an emoji or a CJK
character into several tokens, each of which decodes to U+FFFD ("\ufffd") alone, and
some tokenizers drop or add a space depending on the tokens before. So each request keeps
a small window: ``prefix_offset..read_offset`` are the ids of the text already sent last
time (context), ``read_offset..`` the ids not sent yet. Each step decodes the window with
and without the new ids; the difference is the new text, sent only when it does not end in
U+FFFD (a character still incomplete). When the request finishes, the whole output is
decoded once and whatever the stream has not sent yet is sent, so the concatenation of
everything sent equals ``tokenizer.decode(all ids)``.

This is the scheme of vLLM's ``detokenize_incrementally``; upstream
``minisgl.tokenizer.detokenize.DetokenizeManager`` uses the same offsets and additionally
holds back partial words.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Dict, List

from transformers import PreTrainedTokenizerBase

from minisgl.message import DetokenizeMsg
from minisgl.utils import init_logger

logger = init_logger(__name__)
INCOMPLETE = "\ufffd"


@dataclass
class DecodeStatus:
    """One request's progress. ``sent`` is the text streamed so far."""

    num_prompt_tokens: int
    ignore_eos: bool
    ids: List[int] = field(default_factory=list)
    num_output_tokens: int = 0  # tokens generated, a final EOS included
    sent: str = ""
    prefix_offset: int = 0
    read_offset: int = 0


@dataclass
class Delta:
    """What ``detokenize`` returns for one message: new text, and on the last message why
    it finished and the output length (tokens)."""

    uid: int
    text: str
    finished: bool
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    error: str | None = None


class DetokenizeManager:
    """``add(uid, ...)`` when a request is tokenized, ``detokenize(msgs)`` for each step's
    tokens, ``forget(uid)`` when its client goes away. Messages of unknown (forgotten)
    requests are skipped."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_token_ids: AbstractSet[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.status: Dict[int, DecodeStatus] = {}

    def add(self, uid: int, num_prompt_tokens: int, ignore_eos: bool) -> None:
        self.status[uid] = DecodeStatus(num_prompt_tokens, ignore_eos)

    def forget(self, uid: int) -> None:
        self.status.pop(uid, None)

    def detokenize(self, msgs: List[DetokenizeMsg]) -> List[Delta]:
        """The new text of each message of a known request, in order. A finished request
        is forgotten afterwards.

        Several steps' tokens may come at once (the worker drains its queue): the k-th
        token of every request goes in round k, and each round decodes all of its
        windows in two ``batch_decode`` calls.
        """
        raise NotImplementedError("Exercise 331: implement DetokenizeManager.detokenize")

    def _detokenize_round(self, msgs: List[DetokenizeMsg]) -> List[Delta | None]:
        """One token per request at most; ``None`` for an unknown request."""
        raise NotImplementedError("Exercise 331: implement DetokenizeManager._detokenize_round")

    def _flush(self, s: DecodeStatus, pending: str) -> str:
        """The rest of the full decode once ``s.sent + pending`` has gone out."""
        raise NotImplementedError("Exercise 331: implement DetokenizeManager._flush")
