"""Logprob entries in OpenAI's two shapes (the appendix on logprobs explains them).

The tokenizer worker sends one ``TokenLogprob`` per output token, in step with the text
(``minisgl.tokenizer.logprobs``); these functions only lay them out, for a whole answer or,
through ``with_*_logprobs``, on the chunks the stream's chunkers already built:

* chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
  "logprob", "bytes"}, ...]}, ...]}``;
* completions (the legacy API): ``{"tokens": [...], "token_logprobs": [...],
  "top_logprobs": [{token: logprob, ...}, ...], "text_offset": [...]}``, where each
  ``top_logprobs`` dict holds the k best alternatives and the sampled token (so up to k + 1
  keys, as OpenAI documents).

Values are natural logs of the model's raw distribution; a log-probability too small for
float32 (``-inf``) is sent as OpenAI's floor ``-9999.0``, since JSON has no infinity.
Upstream mini-sglang has no logprobs; the shapes are OpenAI's, as vLLM and SGLang serve them.
"""

from __future__ import annotations

from typing import Any, Dict, List

from minisgl.message.frontend import TokenLogprob, UserReply

FLOOR = -9999.0


def _lp(value: float) -> float:
    return value if value > FLOOR else FLOOR  # also NaN-safe: comparisons with NaN are False


def chat_logprobs(entries: List[TokenLogprob]) -> Dict[str, Any]:
    """``choices[i].logprobs`` of a chat answer (or of one streamed delta)."""
    return {
        "content": [
            {
                "token": e.token,
                "logprob": _lp(e.logprob),
                "bytes": e.bytes,
                "top_logprobs": [
                    {"token": t.token, "logprob": _lp(t.logprob), "bytes": t.bytes}
                    for t in e.top_logprobs
                ],
            }
            for e in entries
        ]
    }


def completion_logprobs(entries: List[TokenLogprob]) -> Dict[str, Any]:
    """``choices[i].logprobs`` of a completion (or of one streamed chunk); ``text_offset``
    counts characters from the start of the answer."""
    tops = []
    for e in entries:
        top = {t.token: _lp(t.logprob) for t in e.top_logprobs}
        top.setdefault(e.token, _lp(e.logprob))
        tops.append(top)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [_lp(e.logprob) for e in entries],
        "top_logprobs": tops,
        "text_offset": [e.text_offset for e in entries],
    }


def with_completion_logprobs(
    payloads: List[Dict[str, Any]], reply: UserReply
) -> List[Dict[str, Any]]:
    """A completions stream's ``payloads`` for ``reply`` with its entries filled in (the
    chunkers of ``api_server`` leave ``logprobs`` None). The tokenizer worker releases entries
    only with text, or on the finished reply, so a reply with entries always has a payload."""
    for payload in payloads:
        payload["choices"][0]["logprobs"] = completion_logprobs(reply.logprobs)
    return payloads


def with_chat_logprobs(payloads: List[Dict[str, Any]], reply: UserReply) -> List[Dict[str, Any]]:
    """A chat stream's ``payloads`` for ``reply`` with its entries on the chunk that carries
    its text (on the closing chunk when the finished reply brings entries but no text)."""
    if not reply.logprobs or not payloads:
        return payloads
    texts = [p for p in payloads if p["choices"][0]["delta"].get("content")]
    target = texts[-1] if texts else payloads[-1]
    target["choices"][0]["logprobs"] = chat_logprobs(reply.logprobs)
    return payloads
