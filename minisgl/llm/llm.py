"""The offline interface: ``LLM(path).generate(prompts, params)`` with no server at all.

``LLM`` *is* a scheduler. It overrides only where messages come from (a list in memory)
and where results go (a dict in memory), and reuses the main loop unchanged, so testing
the offline interface tests the server's scheduling too. Mirrors upstream
``minisgl.llm.llm.LLM``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import (
    TYPE_CHECKING,  # +ch16
    Any,
    Dict,
    List,
    Sequence,
    Tuple,
)

import torch

from minisgl.core import SamplingParams
from minisgl.layers.shard import check_tp_size  # +ch16
from minisgl.message import BaseBackendMsg, DetokenizeMsg, UserMsg
from minisgl.scheduler import Scheduler, SchedulerConfig

# >>> ch16
if TYPE_CHECKING:
    from .tp import RankGroup
# <<< ch16

Prompt = str | List[int]


class RequestAllFinished(Exception):
    """Raised by ``receive_msg`` to leave ``run_forever`` once every request is done."""


@dataclass
class RequestStatus:
    uid: int
    input_ids: List[int]
    ignore_eos: bool
    output_ids: List[int] = field(default_factory=list)
    error: str | None = None
    # per output token: (logprob, [(alternative id, its logprob), ...]), when asked for
    logprobs: List[Tuple[float, List[Tuple[int, float]]]] = field(default_factory=list)


class LLM(Scheduler):
    """``LLM(model_path, dtype=torch.bfloat16, **scheduler_options)``; the options are
    ``SchedulerConfig`` fields (``device``, ``max_running_req``, ...).

    Raises:
        FileNotFoundError: when ``model_path`` holds no model (the message says how to get
            the book's default one).
    """

    def __init__(
        self,
        model_path: str,
        dtype: torch.dtype = torch.bfloat16,
        tp: int = 1,  # +ch16
        **kwargs: Any,
    ) -> None:
        config = SchedulerConfig(
            model_path=str(model_path), dtype=dtype, offline_mode=True, **kwargs
        )
        # >>> ch16: with tp > 1 this process is rank 0 of a tensor-parallel group and spawns
        # the other ranks (minisgl.llm.tp); on CUDA rank r uses GPU r. shutdown() stops them
        # (they also die with this process); a model whose heads cannot be split over tp
        # ranks is refused with a ValueError here, before any process starts
        self._ranks: RankGroup | None = None
        if tp != 1:
            from .tp import RankGroup

            mc = config.model_config
            check_tp_size(mc.num_qo_heads, mc.num_kv_heads, mc.intermediate_size, tp)
            self._ranks = RankGroup(config, tp)
            config = self._ranks.config
        try:
            super().__init__(config)
            if self._ranks is not None:
                self._ranks.connect()
        except BaseException:
            if self._ranks is not None:
                self._ranks.stop()
            raise
        # <<< ch16
        # >>> ch07-ch15
        # super().__init__(config)
        # <<< ch07-ch15
        self.pending_requests: List[Tuple[torch.Tensor, SamplingParams]] = []
        self.status_map: Dict[int, RequestStatus] = {}
        self.counter = 0

    def _tokenize_one(self, prompt: Prompt) -> torch.Tensor:
        if isinstance(prompt, str):
            return torch.tensor(self.tokenizer.encode(prompt), dtype=torch.int32)
        return torch.tensor(list(prompt), dtype=torch.int32)

    def receive_msg(self, blocking: bool = False) -> List[BaseBackendMsg]:
        """Feed waiting prompts to the scheduler, about one prefill budget's worth per step."""
        if blocking and not self.pending_requests:
            raise RequestAllFinished()
        msgs: List[BaseBackendMsg] = []
        total_len = 0
        while self.pending_requests and total_len < self.prefill_budget:
            input_ids, params = self.pending_requests.pop(0)
            uid = self.counter
            self.counter += 1
            total_len += len(input_ids)
            self.status_map[uid] = RequestStatus(uid, input_ids.tolist(), params.ignore_eos)
            msgs.append(UserMsg(uid=uid, input_ids=input_ids, sampling_params=params))
        # >>> ch16: the other ranks must feed exactly the same, this very step
        if self._ranks is not None:
            self._ranks.publish(msgs)
        # <<< ch16
        return msgs

    def send_result(self, reply: List[DetokenizeMsg]) -> None:
        for msg in reply:
            status = self.status_map[msg.uid]
            if msg.error is not None:
                status.error = msg.error
            elif status.ignore_eos or not (msg.finished and msg.next_token in self.eos_token_ids):
                status.output_ids.append(msg.next_token)
                lp = msg.logprobs
                if lp is not None:
                    status.logprobs.append((lp.logprob, list(zip(lp.top_ids, lp.top_logprobs))))

    def generate(
        self, prompts: Sequence[Prompt], sampling_params: SamplingParams | Sequence[SamplingParams]
    ) -> List[Dict[str, Any]]:
        """Generate for every prompt (text or token ids); returns, in order,
        ``{"text": str, "token_ids": List[int]}`` (a final EOS is not included). A request
        whose params set ``logprobs`` also gets ``"logprobs"``: per token of ``token_ids``,
        ``(logprob, [(id, logprob) of the top alternatives])``, natural logs of the model's
        raw distribution (before temperature, top-k and top-p).

        Raises:
            ValueError: naming the request and the limit, when a prompt is empty or does not
                leave room for one output token in the context (``max_seq_len``); or when the
                number of sampling params does not match the prompts.
        """
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling_params)} sampling params")
        tokenized = [self._tokenize_one(p) for p in prompts]
        limit = self.engine.max_seq_len
        for i, ids in enumerate(tokenized):
            if not 0 < len(ids) < limit:
                raise ValueError(
                    f"prompt {i} has {len(ids)} tokens; a prompt needs between 1 and {limit - 1} "
                    f"tokens (the context limit is {limit}, with room for one output token)"
                )
        # copies: the scheduler may shorten max_tokens to fit the context
        params = [replace(sp) for sp in sampling_params]
        start = self.counter
        self.pending_requests = list(zip(tokenized, params))
        try:
            self.run_forever()
        except RequestAllFinished:
            pass
        # >>> ch16: a collective failed: say which rank took it down
        except RuntimeError as e:
            dead = self._ranks.dead_ranks(wait_s=1.0) if self._ranks is not None else []
            if dead:
                raise RuntimeError(
                    f"tensor-parallel {'; '.join(dead)}: this LLM cannot continue"
                ) from e
            raise
        # <<< ch16
        self.run_when_idle()
        results = []
        for i in range(len(prompts)):
            status = self.status_map.pop(start + i)
            if status.error is not None:
                raise ValueError(status.error)
            result: Dict[str, Any] = {
                "text": self.tokenizer.decode(status.output_ids),
                "token_ids": status.output_ids,
            }
            if params[i].logprobs is not None:
                result["logprobs"] = status.logprobs
            results.append(result)
        return results

    def shutdown(self) -> None:
        """Stop this engine (and first the other tensor-parallel ranks, if any)."""
        # >>> ch16
        if self._ranks is not None:
            self._ranks.stop()
            self._ranks = None
        # <<< ch16
        super().shutdown()
