"""What clients may send, checked before anything reaches the engine.

Three request bodies (``/generate``, ``/v1/completions``, ``/v1/chat/completions``) as
pydantic models. Types are strict (``"5"`` is not an integer, ``"yes"`` not a boolean),
ranges are checked, and unknown fields are refused: a parameter the engine would silently
ignore (``n=2``, penalties) is answered with a 400 that says so, instead of an answer that
looks right and is not; ``seed`` and ``logprobs`` are honoured (chapter 6, and the
appendix on logprobs). Before any model sees it, ``check_json`` refuses
what JSON allows but nothing downstream can carry: a lone surrogate (``"\ud800"``, which no
UTF-8 encoder accepts) and nesting deeper than ``MAX_JSON_DEPTH``. Errors use OpenAI's body,
``{"error": {"message", "type", "param", "code"}}``, so the ``openai`` client raises them
with the message. Upstream ``minisgl.server.api_server`` has looser models of the same names.
"""

from __future__ import annotations

from typing import (
    Any,
    Dict,
    List,
    Literal,
    Mapping,
    Sequence,
    Tuple,  # +ch24
)

from fastapi.responses import JSONResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)

from minisgl.core import MAX_TOP_LOGPROBS, SamplingParams

from .response_format import ConstraintError, ResponseFormat, grammar_of  # +ch24


class APIError(Exception):
    """An error answered as OpenAI's error body with ``status`` (400, 404, 503, ...)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: Dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers

    def response(self) -> JSONResponse:
        body = {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        }
        return JSONResponse(body, status_code=self.status, headers=self.headers)


MAX_JSON_DEPTH = 32  # a chat body needs 4 levels; deeper is an attack on the parser


def check_json(body: Any) -> None:
    """Refuse, naming the field, what parsed as JSON but cannot go further: a string with a
    lone surrogate (msgpack and the tokenizer need UTF-8) or nesting deeper than
    ``MAX_JSON_DEPTH``. Iterative, so a deep body cannot exhaust the stack.

    Raises:
        APIError: 400 with ``param`` the dotted path of the field (``messages.0.content``).
    """
    stack: List[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            where = path.split(".")[0]  # the top-level field: the full path is 33 items long
            raise APIError(400, f"'{where}': nested deeper than {MAX_JSON_DEPTH} levels", where)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                where = path or "body"
                raise APIError(
                    400,
                    f"'{where}': not valid Unicode (a lone surrogate at character {e.start})",
                    path or None,
                ) from None
        elif isinstance(value, dict):
            for k, v in value.items():
                shown = str(k).encode("utf-8", "backslashreplace").decode()  # a key's surrogate too
                key = f"{path}.{shown}" if path else shown
                stack.append((k, key, depth + 1))
                stack.append((v, key, depth + 1))
        elif isinstance(value, list):
            stack.extend(
                (v, f"{path}.{i}" if path else str(i), depth + 1) for i, v in enumerate(value)
            )


def describe_validation_errors(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """One readable sentence (and the first offending field) from pydantic's error list."""
    parts, first = [], None
    for e in errors:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        field = ".".join(loc) or None
        first = first or field
        if e.get("type") == "extra_forbidden":
            parts.append(f"unsupported field '{field}': this server does not implement it")
        elif e.get("type") == "missing":
            parts.append(f"'{field}' is required")
        else:
            msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
            parts.append(f"'{field}': {msg}" if field else msg)
    return "; ".join(parts) or "invalid request", first


MAX_STOP = 16  # stop strings per request (OpenAI allows 4)
MAX_INT32 = 2**31 - 1  # token ids and top_k cross to the scheduler as int32-sized numbers
MAX_STOP_CHARS = 256
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions API's limit; chat allows MAX_TOP_LOGPROBS


class _Sampling(BaseModel):
    """Fields shared by the three endpoints."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: StrictInt = Field(default=-1, le=MAX_INT32)  # an SGLang extension: -1 (off) or >= 1
    ignore_eos: StrictBool = False  # an SGLang extension
    stream: StrictBool = False
    stop: StrictStr | List[StrictStr] | None = None
    stop_token_ids: List[StrictInt] = Field(default_factory=list)  # vLLM's and SGLang's
    seed: StrictInt | None = None  # this request's own random stream (chapter 6)
    # >>> ch24: output constraints (SGLang's and vLLM's names); OpenAI's response_format below
    json_schema: StrictStr | Dict[str, Any] | None = None
    regex: StrictStr | None = None
    ebnf: StrictStr | None = None
    choice: List[StrictStr] | None = Field(default=None, min_length=1)
    # <<< ch24

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int | None) -> int | None:
        if v is not None and not -(2**63) <= v < 2**63:
            raise ValueError("must be an integer that fits in 64 bits (signed)")
        return v

    @property
    def logprobs_wanted(self) -> int | None:
        """None: no logprobs; k >= 0: each token's and its k best alternatives'."""
        return None

    # >>> ch24
    def constraints(self) -> Dict[str, Any]:
        """The output-constraint fields, by name."""
        return {f: getattr(self, f) for f in ("json_schema", "regex", "ebnf", "choice")}

    def grammar(self) -> Tuple[str, str] | None:
        """The engine's ``(kind, text)`` for the one constraint set, checked.

        Raises:
            APIError: 400 naming the field, for two constraints or an invalid one.
        """
        try:
            return grammar_of(self.constraints())
        except ConstraintError as e:
            raise APIError(400, str(e), e.field) from None

    # <<< ch24

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v == 0 or v < -1:
            raise ValueError("must be -1 (disabled) or >= 1")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | List[str] | None) -> List[str]:
        stops = [] if v is None else [v] if isinstance(v, str) else v
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences, got {len(stops)}")
        if any(not 0 < len(x) <= MAX_STOP_CHARS for x in stops):
            raise ValueError(f"each stop sequence must have 1 to {MAX_STOP_CHARS} characters")
        return stops

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_token_ids(cls, v: List[int]) -> List[int]:
        if v and (len(v) > MAX_STOP or min(v) < 0 or max(v) > MAX_INT32):
            raise ValueError(f"at most {MAX_STOP} token ids, each from 0 to {MAX_INT32}")
        return v

    @property
    def stop_strings(self) -> List[str]:
        return list(self.stop or [])  # the validator made it a list

    def sampling_params(self, default_max_tokens: int, max_seq_len: int) -> SamplingParams:
        """``SamplingParams`` for the engine. ``max_tokens`` may be at most
        ``max_seq_len - 1`` (a one-token prompt). Once the prompt is tokenized, an explicit
        ``max_tokens`` the prompt leaves no room for is refused (``TokenizeMsg.context_len``);
        the default is shortened by the scheduler to what the prompt leaves of the context.

        Raises:
            APIError: 400 when ``max_tokens`` exceeds the context.
        """
        max_tokens = default_max_tokens if self.max_tokens is None else self.max_tokens
        if max_tokens > max_seq_len - 1:
            raise APIError(
                400,
                f"max_tokens is {max_tokens}, but the context is {max_seq_len} tokens "
                f"(prompt included): at most {max_seq_len - 1}",
                "max_tokens",
            )
        return SamplingParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            ignore_eos=self.ignore_eos,
            max_tokens=min(max_tokens, max_seq_len - 1),
            seed=self.seed,
            logprobs=self.logprobs_wanted,
            grammar=self.grammar(),  # +ch24
        )


class GenerateRequest(_Sampling):
    """``POST /generate``: upstream's native endpoint. Streams ``{"text": delta}`` events."""

    prompt: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)


class StreamOptions(BaseModel):
    """OpenAI's ``stream_options``: only ``include_usage`` (a last chunk with the usage)."""

    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False


class _OpenAI(_Sampling):
    """OpenAI fields the engine cannot honour are accepted only at their neutral value."""

    model: StrictStr
    n: StrictInt = 1
    presence_penalty: StrictFloat = Field(default=0.0, allow_inf_nan=False)
    frequency_penalty: StrictFloat = Field(default=0.0, allow_inf_nan=False)
    user: StrictStr | None = None  # metadata only
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None  # +ch24

    @field_validator("n")
    @classmethod
    def _n(cls, v: int) -> int:
        if v != 1:
            raise ValueError(
                "only n=1 is supported (one choice per request); send n requests instead"
            )
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, v: float) -> float:
        if v != 0.0:
            raise ValueError("penalties are not supported by this server (only 0)")
        return v

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    # >>> ch24
    def constraints(self) -> Dict[str, Any]:
        return {**super().constraints(), "response_format": self.response_format}

    # <<< ch24


class CompletionRequest(_OpenAI):
    """``POST /v1/completions``. ``max_tokens`` defaults to 16, as in OpenAI's API;
    ``echo`` puts the prompt in front of the answer's text; ``logprobs`` (0 to 5) returns
    each output token's logprob and its best alternatives (not the prompt's: ``echo`` with
    ``logprobs`` is refused)."""

    prompt: StrictStr
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= MAX_COMPLETION_LOGPROBS:
            raise ValueError(f"must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {v}")
        return v

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("logprobs") is not None:
            raise ValueError("echo with logprobs (the prompt's logprobs) is not supported")
        return v

    @property
    def logprobs_wanted(self) -> int | None:
        return self.logprobs

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError("only best_of=1 is supported (one candidate per request)")
        return v

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix (insertion) is not supported by this server")
        return v


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: StrictStr
    name: StrictStr | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None:  # the chat templates have no place for it: refused, not dropped
            raise ValueError("participant names are not supported by this server")
        return v


class ChatCompletionRequest(_OpenAI):
    """``POST /v1/chat/completions``. Without ``max_tokens`` (or ``max_completion_tokens``)
    the answer may run to the end of the context, as in OpenAI's API. ``logprobs: true``
    returns each token's logprob, with ``top_logprobs`` (0 to 20) alternatives."""

    messages: List[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is None:
            return v
        if not 0 <= v <= MAX_TOP_LOGPROBS:
            raise ValueError(f"must be between 0 and {MAX_TOP_LOGPROBS}, got {v}")
        if not info.data.get("logprobs"):
            raise ValueError("needs logprobs set to true")
        return v

    @property
    def logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def chat(self) -> List[Dict[str, str]]:
        return [{"role": m.role, "content": m.content} for m in self.messages]
