"""Stop sequences while streaming: never send text that may turn out to be a stop string.

A stop string (``stop=["\\n\\n", "###"]``) ends the answer where it first appears, and is not
part of the answer. Streaming makes this subtle: the string can arrive split over tokens
(``"#"`` then ``"##"``), so text that could be the beginning of a stop string is *held back*
until the next text decides it: either the stop string completes (the held text is dropped,
the request finishes with ``finish_reason`` "stop") or it cannot any more (the held text is
sent). Only the longest suffix that is a prefix of some stop string is held, so at most
``len(longest stop) - 1`` characters wait. vLLM's ``StopChecker`` and SGLang's
``check_finished`` hold back the same way; upstream mini-sglang has no stop strings.
"""

from __future__ import annotations

from typing import List, Tuple


class StopChecker:
    """One request's stop strings and the text held back from the client.

    ``feed(text)`` returns what may be sent now and whether a stop string was found;
    ``flush()`` returns the held text once no more text will come.
    """

    def __init__(self, stops: List[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""

    def feed(self, text: str) -> Tuple[str, bool]:
        """Append ``text`` to the held text. Returns ``(sendable, stopped)``: with
        ``stopped`` the text before the earliest stop string (the rest is dropped)."""
        buf = self.held + text
        # the sent text never ends in a stop string's prefix, so a match starts in ``buf``
        hits = [i for i in (buf.find(s) for s in self.stops) if i != -1]
        if hits:
            self.held = ""
            return buf[: min(hits)], True
        keep = max((self._overlap(buf, s) for s in self.stops), default=0)
        self.held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """The held text, when the answer ends for another reason (EOS, length)."""
        out, self.held = self.held, ""
        return out

    @staticmethod
    def _overlap(buf: str, stop: str) -> int:
        """The length of the longest suffix of ``buf`` that is a proper prefix of ``stop``."""
        for k in range(min(len(stop) - 1, len(buf)), 0, -1):
            if buf.endswith(stop[:k]):
                return k
        return 0
