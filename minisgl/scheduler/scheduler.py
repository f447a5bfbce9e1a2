"""The scheduler: four managers and a loop that turns a queue of requests into batches.

Each iteration receives messages, picks a batch (prefill first, decode otherwise),
prepares it, runs the engine and handles the results of the batch before. The batch's
input ids are gathered from the token pool on the device and each sampled token is
written back there, so the CPU never has to know a token before the next step runs.
Mirrors upstream ``minisgl.scheduler.scheduler.Scheduler``.
"""

from __future__ import annotations

from typing import (
    TYPE_CHECKING,
    Callable,  # +ch24
    List,
    NamedTuple,
    NoReturn,
    Set,
    Tuple,
    TypeAlias,
)

import torch

from minisgl.core import Batch, Req
from minisgl.env import ENV  # +ch11
from minisgl.message import (
    AbortBackendMsg,
    BaseBackendMsg,
    BatchBackendMsg,
    DetokenizeMsg,
    ExitMsg,
    SampledLogprobs,
    UserMsg,
)
from minisgl.structured import GrammarBackend, GrammarManager  # +ch24
from minisgl.utils import init_logger, load_eos_token_ids, load_tokenizer
from minisgl.utils.device import (
    create_stream,  # +ch11
    pin,
    set_stream,  # +ch11
    stream_ctx,  # +ch11
    synchronize,
)

from .cache import CacheManager
from .config import SchedulerConfig
from .decode import DecodeManager
from .io import SchedulerIOMixin
from .prefill import (
    ChunkedReq,  # +ch10
    PrefillManager,
)
from .table import TableManager

if TYPE_CHECKING:
    from minisgl.engine import BatchSamplingArgs, ForwardOutput

logger = init_logger(__name__)

Indice2D: TypeAlias = Tuple[torch.Tensor, torch.Tensor]  # (rows [N] int64, columns [N] int64)


class ForwardInput(NamedTuple):
    batch: Batch
    sample_args: BatchSamplingArgs
    input_tuple: Indice2D  # (row, position) of every input token in the token pool
    write_tuple: Indice2D  # (row, device_len) where each sampled token goes; -1: the last column


ForwardData: TypeAlias = "Tuple[ForwardInput, ForwardOutput]"


class Scheduler(SchedulerIOMixin):
    """Runs requests to completion. Where messages come from and where results go
    (``receive_msg``, ``send_result``, from ``SchedulerIOMixin``) is not its business: the
    offline ``LLM`` overrides them in memory."""

    def __init__(self, config: SchedulerConfig) -> None:
        from minisgl.engine import Engine

        self.engine = Engine(config)
        self.config = config
        self.device = self.engine.device
        # >>> ch11: metadata is prepared on this stream while the engine computes on its own
        self.stream = create_stream(self.device)
        self.engine_stream_ctx = stream_ctx(self.engine.stream)
        set_stream(self.stream)
        # <<< ch11

        self.table_manager = TableManager(config.max_running_req, self.engine.page_table)
        self.cache_manager = CacheManager(
            self.engine.num_pages,
            config.page_size,
            self.engine.page_table,
            config.cache_type,  # +ch09
        )
        self.decode_manager = DecodeManager(config.page_size)
        self.prefill_manager = PrefillManager(
            self.cache_manager, self.table_manager, self.decode_manager
        )

        self.finished_reqs: Set[Req] = set()  # the requests the last handled step finished
        # >>> ch11: under overlap, a freed row is reused only once no in-flight batch can touch it
        self._defer_slot_free = False
        self._deferred_slots: List[int] = []
        self._in_flight: Batch | None = None  # the batch launched, not yet handled
        # <<< ch11
        self.tokenizer = load_tokenizer(config.model_path)
        self.eos_token_ids = load_eos_token_ids(config.model_path, self.tokenizer)
        self.token_pool = self.table_manager.token_pool
        self.prefill_budget = config.max_extend_tokens
        # >>> ch23: loaded only when on: admit on an estimate, retract when pages run out
        self.retract_manager = None  # a retract.RetractManager when on (typed there: no circle)
        if config.enable_retraction:
            from .retract import RetractManager

            self.retract_manager = RetractManager()
        # <<< ch23
        # >>> ch24: grammars compile off this thread; the library loads with the first one
        self.grammar_manager = GrammarManager(
            lambda: GrammarBackend(
                self.tokenizer, self.engine.sampler.vocab_size, self.eos_token_ids
            ),
            self.device,
            config.grammar_timeout_s,
            lockstep=config.tp_info.size > 1,  # tensor-parallel ranks admit in step
        )
        self._in_flight_data: ForwardData | None = None  # set by the overlap loop
        # <<< ch24
        super().__init__(config)  # the I/O

    # ---- the loops ----------------------------------------------------------------------
    def normal_loop(self) -> None:
        """Receive, schedule, forward, then handle this batch's results: CPU and device
        take turns."""
        # >>> ch11: nothing is in flight when results are handled
        self._defer_slot_free = False
        self._in_flight = None
        # <<< ch11
        self._in_flight_data = None  # +ch24
        blocking = not (self.prefill_manager.runnable or self.decode_manager.runnable)
        blocking &= not self.grammar_manager.waiting  # +ch24
        for msg in self.receive_msg(blocking=blocking):
            self._process_one_msg(msg)
        forward_input = self._schedule_next_batch()
        ongoing = None
        if forward_input is not None:
            ongoing = (forward_input, self._forward(forward_input))
        self._process_last_data(ongoing)

    # >>> ch11
    def overlap_loop(self, last_data: ForwardData | None) -> ForwardData | None:
        """Launch batch N+1 on the engine stream, then handle batch N's results on the CPU
        while the device computes."""
        self._defer_slot_free = True
        blocking = not (
            last_data is not None or self.prefill_manager.runnable or self.decode_manager.runnable
        )
        if last_data is None:  # nothing in flight: rows held back for safety can be reused now
            # (not only when blocking: a request waiting for a row would otherwise wait forever)
            self._release_deferred_slots()
        blocking &= not self.grammar_manager.waiting  # +ch24
        self._in_flight = last_data[0].batch if last_data is not None else None  # for aborts
        self._in_flight_data = last_data  # a grammar's mask needs its tokens  # +ch24
        for msg in self.receive_msg(blocking=blocking):
            self._process_one_msg(msg)
        forward_input = self._schedule_next_batch()
        ongoing = None
        if forward_input is not None:
            with self.engine_stream_ctx:
                self.engine.stream.wait_stream(self.stream)  # the batch's metadata is ready
                ongoing = (forward_input, self._forward(forward_input))
        self._process_last_data(last_data)
        return ongoing

    # <<< ch11

    @torch.inference_mode()
    def run_forever(self) -> NoReturn:
        # >>> ch11: overlap scheduling, unless switched off; the plain loop then prepares its
        # batches on the engine's stream
        if ENV.DISABLE_OVERLAP_SCHEDULING:
            with self.engine_stream_ctx:
                self.engine.stream.wait_stream(self.stream)
                while True:
                    self.normal_loop()
        data = None
        while True:
            data = self.overlap_loop(data)
        # <<< ch11
        # >>> ch07-ch10
        # while True:
        #     self.normal_loop()
        # <<< ch07-ch10

    def run_when_idle(self) -> None:
        """Nothing is running: a good moment to verify that no KV page leaked."""
        self._release_deferred_slots()  # +ch11
        self.cache_manager.check_integrity()

    def shutdown(self) -> None:
        synchronize(self.device)
        self.grammar_manager.shutdown()  # +ch24
        self.engine.shutdown()

    # ---- messages and results -------------------------------------------------------------
    def _process_one_msg(self, msg: BaseBackendMsg) -> None:
        if isinstance(msg, BatchBackendMsg):
            for m in msg.data:
                self._process_one_msg(m)
        elif isinstance(msg, ExitMsg):
            raise KeyboardInterrupt
        elif isinstance(msg, UserMsg):
            input_len, max_seq_len = len(msg.input_ids), self.engine.max_seq_len
            if input_len == 0 or input_len >= max_seq_len:
                error = (  # the client's own words: no request id of ours in them
                    f"the prompt has {input_len} tokens; it must have between "
                    f"1 and {max_seq_len - 1} (the context limit is {max_seq_len} tokens)"
                )
                logger.warning(f"request {msg.uid}: {error}")
                self.send_result(
                    [DetokenizeMsg(uid=msg.uid, next_token=-1, finished=True, error=error)]
                )
                return
            max_output_len = max_seq_len - input_len
            if msg.sampling_params.max_tokens > max_output_len:
                msg.sampling_params.max_tokens = max_output_len
            # >>> ch24: a request with a grammar waits for it to compile
            if msg.sampling_params.grammar is not None:
                self.grammar_manager.add(msg)
                return
            # <<< ch24
            self.prefill_manager.add_one_req(msg)
        elif isinstance(msg, AbortBackendMsg):
            # >>> ch24
            self.grammar_manager.drop_waiting(msg.uid)
            self.grammar_manager.release(msg.uid)
            # <<< ch24
            req = self.prefill_manager.abort_req(msg.uid) or self.decode_manager.abort_req(msg.uid)
            req = req or self._find_in_flight(msg.uid)  # +ch11
            if req is not None:
                self._free_req_resources(req)
                # >>> ch11: it may sit in the batch in flight: drop that result
                self.finished_reqs.add(req)
                # <<< ch11
        else:
            raise TypeError(f"unknown message type {type(msg).__name__}")

    def _process_last_data(self, last_data: ForwardData | None) -> None:
        if last_data is None:
            return
        batch, output = last_data[0].batch, last_data[1]
        next_tokens_cpu, logprobs = output.next_tokens_cpu, output.logprobs
        output.copy_done_event.synchronize()  # this batch, and every one before it, is done
        self._release_deferred_slots()  # +ch11
        reply: List[DetokenizeMsg] = []
        new_finished: Set[Req] = set()
        with self.cache_manager.lazy_free_region():
            for i, req in enumerate(batch.reqs):
                # >>> ch10: a chunk samples nothing
                if isinstance(req, ChunkedReq):
                    continue
                # <<< ch10
                # >>> ch11: finished or aborted while this batch flew
                if req in self.finished_reqs:
                    continue
                # <<< ch11
                next_token = next_tokens_cpu[i]
                req.append_host(next_token.unsqueeze(0))
                token = int(next_token.item())
                # count the tokens the CPU has received
                finished = len(req.input_ids) >= req.max_device_len
                if not req.sampling_params.ignore_eos:
                    finished |= token in self.eos_token_ids
                finished |= self.grammar_manager.advance(req.uid, token)  # +ch24
                msg = DetokenizeMsg(uid=req.uid, next_token=token, finished=finished)
                if logprobs is not None:  # only rows that asked have them
                    k = req.sampling_params.logprobs or 0
                    lp = logprobs.of_row(i, k)
                    if lp is not None:
                        msg.logprobs = SampledLogprobs(*lp)
                reply.append(msg)
                if finished:
                    self.grammar_manager.release(req.uid)  # +ch24
                    self.decode_manager.remove_req(req)
                    self._free_req_resources(req)
                    new_finished.add(req)
                # >>> ch09: the prompt's KV goes to the prefix cache right away
                elif batch.is_prefill:
                    self.cache_manager.cache_req(req, finished=False)
                # <<< ch09
        self.finished_reqs = new_finished
        self.send_result(reply)

    # >>> ch11
    def _find_in_flight(self, uid: int) -> Req | None:
        """Under overlap, a request whose last token is being computed has already left the
        decode set (it cannot decode further) but its result is not handled yet: it is
        found, not yet freed, only in the batch in flight."""
        if self._in_flight is None:
            return None
        for req in self._in_flight.reqs:
            if req.uid == uid and req not in self.finished_reqs and not isinstance(req, ChunkedReq):
                return req
        return None

    # <<< ch11

    def _free_req_resources(self, req: Req) -> None:
        # >>> ch11: under overlap the row waits until no batch in flight can touch it
        if self._defer_slot_free:
            self._deferred_slots.append(req.table_idx)
        else:
            self.table_manager.free(req.table_idx)
        # <<< ch11
        # >>> ch07-ch10
        # self.table_manager.free(req.table_idx)
        # <<< ch07-ch10
        self.cache_manager.cache_req(req, finished=True)

    # >>> ch11
    def _release_deferred_slots(self) -> None:
        for slot in self._deferred_slots:
            self.table_manager.free(slot)
        self._deferred_slots.clear()

    # <<< ch11

    # >>> ch24
    def _admit_compiled_grammars(self) -> None:
        """Requests whose grammar is compiled join the prefill queue; a failed compile ends
        its request with the error. Waits a few milliseconds when nothing else can run."""
        idle = not (self.prefill_manager.runnable or self.decode_manager.runnable)
        ready, failed = self.grammar_manager.poll(wait_s=0.005 if idle else 0.0)
        for msg in ready:
            self.prefill_manager.add_one_req(msg)
        if failed:
            self.send_result(
                [DetokenizeMsg(uid=m.uid, next_token=-1, finished=True, error=e) for m, e in failed]
            )

    def _grammar_mask(self, reqs: List[Req]) -> Callable[[], torch.Tensor | None] | None:
        """What the sampler calls for the batch's mask, once the model is launched (None when
        no request has a grammar). Under overlap the batch in flight holds each matcher's last
        token: the CPU waits for that batch's tokens and advances the matchers then, while the
        device runs this batch's model, and fills the mask from them."""
        if not self.grammar_manager.has_grammar(reqs):
            return None
        in_flight = self._in_flight_data

        def mask() -> torch.Tensor | None:
            if in_flight is not None and self.grammar_manager.has_grammar(in_flight[0].batch.reqs):
                batch, output = in_flight[0].batch, in_flight[1]
                output.copy_done_event.synchronize()
                for i, req in enumerate(batch.reqs):  # those _process_last_data will keep
                    if not isinstance(req, ChunkedReq) and req not in self.finished_reqs:
                        token = int(output.next_tokens_cpu[i])
                        self.grammar_manager.advance(req.uid, token, ahead=True)
            return self.grammar_manager.fill_mask(reqs)

        return mask

    # <<< ch24
    # ---- one batch ---------------------------------------------------------------------
    def _schedule_next_batch(self) -> ForwardInput | None:
        self._admit_compiled_grammars()  # +ch24
        # >>> ch23: admission reserves the current share of each output budget
        if self.retract_manager is not None:
            self.prefill_manager.new_token_ratio = self.retract_manager.new_token_ratio.value
        # <<< ch23
        # prefill first: new requests get their first token soon; decode otherwise
        batch = self.prefill_manager.schedule_next_batch(self.prefill_budget)
        # >>> ch23: a page for every decoding request, retracting some if need be
        if batch is None and self.retract_manager is not None:
            self.retract_manager.retract_decode(self)
        # <<< ch23
        batch = batch or self.decode_manager.schedule_next_batch()
        return self._prepare_batch(batch) if batch else None

    def _prepare_batch(self, batch: Batch) -> ForwardInput:
        self.engine.graph_runner.pad_batch(batch)  # to a captured graph's size  # +ch18
        self.cache_manager.allocate_paged(batch.reqs)
        batch.positions = _make_positions(batch, self.device)
        input_tuple = _make_input_tuple(batch, self.device)
        write_tuple = _make_write_tuple(batch, self.device)
        batch.out_loc = self.engine.page_table[input_tuple]
        self.engine.attn_backend.prepare_metadata(batch)
        sample_args = self.engine.sampler.prepare(batch)
        sample_args.token_bitmask = self._grammar_mask(batch.reqs)  # +ch24
        return ForwardInput(batch, sample_args, input_tuple, write_tuple)

    def _forward(self, forward_input: ForwardInput) -> ForwardOutput:
        batch, sample_args, input_tuple, write_tuple = forward_input
        batch.input_ids = self.token_pool[input_tuple]  # gathered on the device
        output = self.engine.forward_batch(batch, sample_args)
        self.token_pool[write_tuple] = output.next_tokens_gpu  # next step's input, on the device
        self.decode_manager.filter_reqs(batch.reqs)
        return output


def _make_positions(batch: Batch, device: torch.device) -> torch.Tensor:
    """Positions ``[cached_len, device_len)`` of every request, packed: ``[T]`` int32."""
    positions = torch.cat(
        [torch.arange(r.cached_len, r.device_len, dtype=torch.int32) for r in batch.padded_reqs]
    )
    return (
        positions.pin_memory().to(device, non_blocking=True)
        if pin(device)
        else positions.to(device)
    )


def _make_input_tuple(batch: Batch, device: torch.device) -> Indice2D:
    """(row, position) of each input token: indexes both the token pool and the page table."""
    rows = torch.cat(
        [torch.full((r.extend_len,), r.table_idx, dtype=torch.int64) for r in batch.padded_reqs]
    )
    rows = rows.pin_memory().to(device, non_blocking=True) if pin(device) else rows.to(device)
    return rows, batch.positions.to(torch.int64)


def _make_write_tuple(batch: Batch, device: torch.device) -> Indice2D:
    """Where each sampled token goes: ``token_pool[table_idx, device_len]``.

    ``device_len`` is read before ``forward_batch`` increments it, so it is exactly the new
    token's position. Column -1 (the row's last) for a request that cannot decode: nothing
    reads that sample, as a position is written before it is an input.
    """
    rows = torch.tensor([r.table_idx for r in batch.reqs], dtype=torch.int64)
    cols = torch.tensor(
        [r.device_len if r.can_decode else -1 for r in batch.reqs], dtype=torch.int64
    )
    if pin(device):
        return rows.pin_memory().to(device, non_blocking=True), cols.pin_memory().to(
            device, non_blocking=True
        )
    return rows.to(device), cols.to(device)
