"""The dataclasses every other module speaks: sampling parameters, requests, batches, context.

Mirrors upstream ``python/minisgl/core.py``.

Shape legend used across the package: ``T`` tokens in the batch, ``B`` requests, ``H_q``/
``H_kv`` query/KV heads, ``D`` head dim, ``P`` page size, ``L`` layers.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,  # +ch02
    Iterator,
    List,
    Literal,
    Tuple,  # +ch24
)

import torch

# >>> ch02
if TYPE_CHECKING:
    from minisgl.attention.base import BaseAttnBackend

    # >>> ch04
    from minisgl.kvcache import (
        BaseCacheHandle,
        BaseKVCachePool,  # +ch05
    )

    # <<< ch04
    from minisgl.moe import BaseMoeBackend  # +ch21
# <<< ch02


MAX_TOP_LOGPROBS = 20  # alternatives per token at most (OpenAI's limit for top_logprobs)


@dataclass
class SamplingParams:
    """How to pick the next token of one request.

    ``temperature`` 0 means greedy; ``top_k`` -1 means the whole vocabulary; ``top_p`` is
    the nucleus mass in (0, 1]; ``max_tokens`` counts output tokens (>= 1). ``seed`` (any
    int64) makes this request's draws its own: the same seed, prompt and parameters give the
    same tokens whatever else is batched with it. ``logprobs`` None computes no
    log-probabilities; ``k`` >= 0 returns each output token's and the ``k`` most likely
    alternatives' (at most ``MAX_TOP_LOGPROBS``).

    Raises:
        ValueError: naming the field, when a value is out of range.
    """

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    ignore_eos: bool = False
    max_tokens: int = 1024
    seed: int | None = None
    logprobs: int | None = None
    grammar: Tuple[str, str] | None = None  # (kind, text) the answer must match  # +ch24

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ValueError(f"seed must fit in 64 bits (signed), got {self.seed}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")
        # >>> ch24: a pair of strings, a tuple even after a message's round trip (a dict key)
        if self.grammar is not None:
            if len(self.grammar) != 2 or not all(isinstance(x, str) for x in self.grammar):
                raise ValueError(
                    f"grammar must be a (kind, text) pair of strings, got {self.grammar!r}"
                )
            self.grammar = (self.grammar[0], self.grammar[1])
        # <<< ch24

    @property
    def is_greedy(self) -> bool:
        """Temperature 0 or top-k 1 leaves one candidate: the argmax (top-p cannot change that)."""
        return self.temperature <= 0.0 or self.top_k == 1


@dataclass(eq=False)
class Req:
    """One request inside the engine: its tokens and where it stands.

    Lengths are in tokens. ``input_ids`` lives on the CPU and grows as tokens come back.
    The KV of positions ``[0, cached_len)`` is already in the cache; positions
    ``[cached_len, device_len)`` are this step's input (``extend_len`` of them);
    ``max_device_len`` = prompt + ``max_tokens`` is where the request must stop.
    Compared by identity (``eq=False``) so requests can live in sets.

    Mirrors upstream ``minisgl.core.Req``.
    """

    input_ids: torch.Tensor  # [prompt + generated so far], int32, CPU
    table_idx: int  # row of the page table / token pool owned by this request
    cached_len: int
    output_len: int  # max_tokens
    uid: int
    sampling_params: SamplingParams
    # >>> ch04: its hold on the prefix cache (None for a request built by hand)
    cache_handle: BaseCacheHandle | None = None
    # <<< ch04

    def __post_init__(self) -> None:
        assert self.input_ids.is_cpu, "Req.input_ids must live on the CPU"
        self.device_len = len(self.input_ids)
        self.max_device_len = len(self.input_ids) + self.output_len
        assert 0 <= self.cached_len < self.device_len <= self.max_device_len, (
            f"bad lengths: cached_len={self.cached_len}, device_len={self.device_len}, "
            f"max_device_len={self.max_device_len}"
        )

    @property
    def remain_len(self) -> int:
        """Tokens this request may still add to the KV cache."""
        return self.max_device_len - self.device_len

    @property
    def extend_len(self) -> int:
        """Tokens fed to the model in this step (the whole uncached prompt, or 1 in decode)."""
        return self.device_len - self.cached_len

    def complete_one(self) -> None:
        """After a forward pass: everything fed is now cached, and one new token is coming."""
        self.cached_len = self.device_len
        self.device_len += 1

    def append_host(self, next_token: torch.Tensor) -> None:
        """Record a sampled token (``[1]`` int32 CPU tensor) on the CPU side."""
        self.input_ids = torch.cat([self.input_ids, next_token])

    @property
    def can_decode(self) -> bool:
        return self.remain_len > 0

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(uid={self.uid}, table_idx={self.table_idx}, "
            f"cached_len={self.cached_len}, device_len={self.device_len}, "
            f"max_device_len={self.max_device_len})"
        )


@dataclass
class Batch:
    """The requests of one forward pass, all in the same phase.

    The scheduler fills ``input_ids`` ``[T]``, ``positions`` ``[T]`` and ``out_loc`` ``[T]``
    (the KV slot each token is written to); the attention backend fills ``attn_metadata``.
    ``padded_reqs`` equals ``reqs`` unless the batch is padded with dummy requests.
    """

    reqs: List[Req]
    phase: Literal["prefill", "decode"]
    input_ids: torch.Tensor = field(init=False)
    positions: torch.Tensor = field(init=False)
    out_loc: torch.Tensor = field(init=False)
    padded_reqs: List[Req] = field(init=False)
    attn_metadata: object = field(init=False)

    def __post_init__(self) -> None:
        self.padded_reqs = self.reqs

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def padded_size(self) -> int:
        return len(self.padded_reqs)


@dataclass
class Context:
    """What a layer deep inside the model needs but cannot be handed as an argument.

    The layers need the batch being forwarded; threading it through every ``forward`` would
    clutter each model file, so the engine keeps one ``Context`` and publishes it with
    ``set_global_ctx`` (the one global the book keeps, as upstream does).
    """

    # >>> ch02: the attention layer hands its q, k and v to the backend
    attn_backend: BaseAttnBackend = field(init=False)
    # <<< ch02
    # >>> ch05: what a paged backend reads: ``page_table`` is ``[rows, C]`` int32, a row per
    # request the table can hold, ``C`` a multiple of 32; entry ``[row, pos]`` is the KV-pool
    # slot of token ``pos`` of the request in ``row`` (token indices even when ``P`` > 1)
    page_size: int = 1
    page_table: torch.Tensor = field(init=False)
    kv_cache: BaseKVCachePool = field(init=False)
    # <<< ch05
    moe_backend: BaseMoeBackend = field(init=False)  # MoE models only  # +ch21
    _batch: Batch | None = field(default=None, init=False)

    @property
    def batch(self) -> Batch:
        assert self._batch is not None, "no batch is being forwarded"
        return self._batch

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[None]:
        assert self._batch is None, "nested forward_batch is not allowed"
        try:
            self._batch = batch
            yield
        finally:
            self._batch = None


_GLOBAL_CTX: Context | None = None


def set_global_ctx(ctx: Context | None) -> None:
    """Publish the engine's context (``None`` clears it, for shutdown and tests)."""
    global _GLOBAL_CTX
    _GLOBAL_CTX = ctx


def get_global_ctx() -> Context:
    assert _GLOBAL_CTX is not None, "the global context is not set: create an Engine first"
    return _GLOBAL_CTX
