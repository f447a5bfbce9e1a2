"""Turning logits into next tokens: greedy, temperature, top-k and top-p.

``prepare`` builds the per-request parameter tensors while the batch is being assembled
(so the copies to the device overlap other work); ``sample`` runs after the forward pass.
A greedy-only batch skips everything but ``argmax``; otherwise the random draw is the
kernel op ``sample`` (``kernel/sampling.py``): the torch reference everywhere, or whatever
faster kernel the kernel table has for the call.

A request with its own ``seed`` does not draw from the sampler's shared generator, whose
stream every row of every batch consumes (so a row's draw would depend on its neighbours):
its token comes from ``sample_seeded``, whose noise is keyed by the seed and the position
being sampled alone. Rows that asked for ``logprobs`` also get the log-softmax of the raw
logits (before temperature and filters, vLLM's default ``raw_logprobs``): the sampled
token's and the top ``k``; other rows cost nothing. Mirrors upstream
``minisgl.engine.sample`` (which has neither seeds per request nor logprobs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Callable,  # +ch24
    List,
    Tuple,
)

import torch

from minisgl.kernel.bitmask import apply_token_bitmask  # +ch24
from minisgl.kernel.sampling import sample as sample_tokens
from minisgl.kernel.sampling import sample_seeded
from minisgl.kernel.torch_sampling import seed_key
from minisgl.utils.device import pin

if TYPE_CHECKING:
    from minisgl.core import Batch


@dataclass
class BatchSamplingArgs:
    """``None`` temperatures means the whole batch is greedy. Otherwise ``[B]`` tensors;
    ``greedy`` marks the rows that take the argmax in a mixed batch (``any_greedy``: whether
    there may be one). ``seeded_rows`` ``[R]``
    are the random rows with their own seed, ``seed_keys`` their R generator seeds, and
    ``shared_draw`` whether any random row is left for the shared generator.
    ``logprob_rows`` (a list of row indices, and ``logprob_index`` the same ``[R]`` on the
    device) asked for logprobs, with at most ``top_logprobs`` alternatives."""

    temperatures: torch.Tensor | None
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    greedy: torch.Tensor | None = None
    any_greedy: bool = True  # False (from prepare) spares the argmax: no row is greedy
    seeded_rows: torch.Tensor | None = None
    seed_keys: List[int] = field(default_factory=list)
    shared_draw: bool = True
    logprob_rows: List[int] = field(default_factory=list)
    logprob_index: torch.Tensor | None = None
    top_logprobs: int = 0
    # >>> ch24: called once, after the model is launched: ``[B, ceil(V / 32)]`` int32 on the
    # device, the tokens each row's grammar allows (None: no row has a grammar)
    token_bitmask: Callable[[], torch.Tensor | None] | None = None
    # <<< ch24


@dataclass
class LogprobOutput:
    """Log-probabilities of the rows ``rows`` of a batch: ``token_logprobs`` ``[R]`` float32
    (of the sampled tokens), ``top_ids`` ``[R, K]`` int64 and ``top_logprobs`` ``[R, K]``
    float32 (the K most likely tokens, most likely first; K may be 0). On the device until
    ``to_cpu``."""

    rows: List[int]
    token_logprobs: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor

    def __post_init__(self) -> None:
        self._position = {row: j for j, row in enumerate(self.rows)}

    def to_cpu(self) -> LogprobOutput:
        """A copy on the CPU, started without waiting (valid once the batch's copy event is)."""
        return LogprobOutput(
            self.rows,
            *(
                t.to("cpu", non_blocking=True)
                for t in (self.token_logprobs, self.top_ids, self.top_logprobs)
            ),
        )

    def of_row(self, row: int, k: int) -> Tuple[float, List[int], List[float]] | None:
        """Row ``row``'s sampled-token logprob and its ``k`` best alternatives, or None when the
        row did not ask."""
        j = self._position.get(row)
        if j is None:
            return None
        return (
            float(self.token_logprobs[j]),
            self.top_ids[j, :k].tolist(),
            self.top_logprobs[j, :k].tolist(),
        )


def _to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, pin_memory=pin(device)).to(device, non_blocking=True)


class Sampler:
    def __init__(self, device: torch.device, vocab_size: int, seed: int = 42) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    # >>> ch17
    def warm_up(self, dtype: torch.dtype) -> None:
        """Two draws from a ``[2, V]`` batch of ``dtype`` logits with a generator of its own,
        one plain and one cut to the top 2 (on CUDA, a kernel each). Kernels are built on
        first use (FlashInfer's in a minute or more on a fresh machine), and a server whose
        first sampled request waits for that holds every other request too; the sampler's
        own stream is left untouched."""
        logits = torch.zeros(2, self.vocab_size, dtype=dtype, device=self.device)
        generator = torch.Generator(device=self.device)
        generator.manual_seed(0)
        temperatures = torch.full((2,), 0.5, device=self.device)
        top_2 = torch.full((2,), 2, dtype=torch.int64, device=self.device)
        for top_k in (None, top_2):
            sample_tokens(logits, temperatures, top_k, None, generator)

    # <<< ch17

    def prepare(self, batch: Batch) -> BatchSamplingArgs:
        params = [r.sampling_params for r in batch.reqs]
        logprob_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        # copied ahead, like the other tensors: no blocking copy after the forward pass
        index = _to_device(logprob_rows, torch.int64, self.device) if logprob_rows else None
        top = max((params[i].logprobs or 0 for i in logprob_rows), default=0)
        greedy = [p.is_greedy for p in params]
        if all(greedy):
            return BatchSamplingArgs(
                None, logprob_rows=logprob_rows, logprob_index=index, top_logprobs=top
            )
        temps = [1.0 if g else p.temperature for p, g in zip(params, greedy)]
        # a greedy row's filters are moot (it takes the argmax); left in, they would make the
        # whole batch pay for filtering
        top_ks = [
            p.top_k if p.top_k >= 1 and not g else self.vocab_size for p, g in zip(params, greedy)
        ]
        top_ps = [1.0 if g else p.top_p for p, g in zip(params, greedy)]
        random_rows = [i for i, g in enumerate(greedy) if not g]
        seeded = [i for i in random_rows if params[i].seed is not None]
        return BatchSamplingArgs(
            temperatures=_to_device(temps, torch.float32, self.device),
            top_k=_to_device(top_ks, torch.int64, self.device)
            if min(top_ks) < self.vocab_size
            else None,
            top_p=_to_device(top_ps, torch.float32, self.device) if min(top_ps) < 1.0 else None,
            greedy=_to_device(greedy, torch.bool, self.device),
            any_greedy=any(greedy),
            seeded_rows=_to_device(seeded, torch.int64, self.device) if seeded else None,
            # keyed by the position of the token being drawn: device_len before the forward
            seed_keys=[
                seed_key(seed, batch.reqs[i].device_len)
                for i in seeded
                if (seed := params[i].seed) is not None
            ],
            shared_draw=len(seeded) < len(random_rows),
            logprob_rows=logprob_rows,
            logprob_index=index,
            top_logprobs=top,
        )

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """``logits: [B, V]`` -> token ids ``[B]`` int64."""
        # >>> ch24: a grammar's mask, in place; on a copy when logprobs need the raw logits
        bitmask = args.token_bitmask() if args.token_bitmask is not None else None
        if bitmask is not None:
            logits = logits.clone() if args.logprob_rows else logits
            apply_token_bitmask(logits, bitmask)
        # <<< ch24
        if args.temperatures is None:
            return logits.argmax(dim=-1)
        # the argmax reads every logit once more: only when some row is greedy
        greedy_tokens = logits.argmax(dim=-1) if args.any_greedy else None
        if args.shared_draw:
            sampled = sample_tokens(
                logits, args.temperatures, args.top_k, args.top_p, self.generator
            )
        else:  # every random row has its own seed (drawn below), the others take the argmax
            sampled = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
        rows = args.seeded_rows
        if rows is not None:
            sampled[rows] = sample_seeded(
                logits[rows],
                args.temperatures[rows],
                None if args.top_k is None else args.top_k[rows],
                None if args.top_p is None else args.top_p[rows],
                args.seed_keys,
            )
        return (
            sampled if greedy_tokens is None else torch.where(args.greedy, greedy_tokens, sampled)
        )

    def logprobs(
        self, logits: torch.Tensor, tokens: torch.Tensor, args: BatchSamplingArgs
    ) -> LogprobOutput | None:
        """``logits: [B, V]``, the sampled ``tokens: [B]`` -> the log-softmax of the raw
        logits for the rows that asked (None when none did), on the device."""
        rows = args.logprob_index
        if rows is None:
            return None
        logprobs = logits[rows].float().log_softmax(dim=-1)
        token_logprobs = logprobs.gather(1, tokens[rows].unsqueeze(1)).squeeze(1)
        top_logprobs, top_ids = logprobs.topk(args.top_logprobs, dim=-1)
        return LogprobOutput(args.logprob_rows, token_logprobs, top_ids, top_logprobs)
