"""Drive the real scheduler loop from a script, with or without a model.

Two schedulers run the unchanged ``Scheduler`` loop, message handling, admission and result
processing; only where messages come from differs:

* ``FakeEngineScheduler`` has no model. Its "forward" writes a code of (token, position)
  into a fake KV pool at each token's slot, checks that every earlier slot of the request
  still holds the right code (so a page-table row pointing at a page another request owns
  is caught the step it happens), and "samples" ``fake_next_token(context)``, a hash of
  the whole context as read back through the page table. Outputs then depend only on the
  prompt, so every scheduling choice must give ``fake_reference`` exactly.
* ``ScriptedLLM`` is the offline ``LLM`` with a real model and the same script.

A script maps a step number to the messages that arrive at that step (``UserMsg``,
``AbortBackendMsg``). ``check_resources`` runs before every step and accounts for every KV
page and every table row (see its docstring). Replies are kept per uid, with the step they
were sent in; ``run_script`` runs a script to the end and checks the idle state.
"""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext  # +ch11
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Dict, List, Sequence, Set, Tuple

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import ForwardOutput
from minisgl.env import ENV  # +ch11
from minisgl.kvcache.radix_cache import RadixCacheHandle, RadixPrefixCache  # +ch09
from minisgl.llm import LLM
from minisgl.message import AbortBackendMsg, BaseBackendMsg, DetokenizeMsg, UserMsg
from minisgl.scheduler import Scheduler
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import (
    ChunkedReq,  # +ch10
    PrefillManager,
)
from minisgl.scheduler.scheduler import ForwardInput
from minisgl.scheduler.table import TableManager
from minisgl.utils.device import NullEvent, NullStream

Script = Dict[int, List[BaseBackendMsg]]
# the loops a script may run under (run_script's overlap): the plain one, and the overlapped
LOOPS = [False]
LOOPS.append(True)  # +ch11
FAKE_VOCAB = 13  # small, so requests that do not ignore EOS (token 0) do hit it
FAKE_EOS = 0


class ScriptDone(Exception):
    """The script is over and the scheduler has nothing left to do."""


def fake_next_token(context: Sequence[int]) -> int:
    """The fake model: a hash of every (position, token) of the context, in ``[0, 13)``."""
    return sum((i + 1) * 31 * int(t) + 7 * i for i, t in enumerate(context)) % FAKE_VOCAB


def fake_reference(prompt: Sequence[int], max_tokens: int, ignore_eos: bool) -> List[int]:
    """What any correct scheduler must reply for a request under the fake model (EOS
    included when it ends the request)."""
    context, out = list(prompt), []
    while len(out) < max_tokens:
        token = fake_next_token(context)
        out.append(token)
        context.append(token)
        if token == FAKE_EOS and not ignore_eos:
            break
    return out


def user(uid: int, prompt: Sequence[int], max_tokens: int, ignore_eos: bool = True) -> UserMsg:
    return UserMsg(
        uid,
        torch.tensor(list(prompt), dtype=torch.int32),
        SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
    )


@dataclass
class Launch:
    """One batch handed to the engine: when (launch index, loop step) and what."""

    index: int
    step: int
    phase: str
    reqs: List[Tuple[int, int, int, bool]]  # (uid, cached_len, extend_len, is a chunk)


@dataclass
class ScriptState:
    script: Script
    max_steps: int
    step: int = 0
    launches: List[Launch] = field(default_factory=list)
    events: List[Tuple[str, int, int]] = field(default_factory=list)  # (what, batch index, step)
    replies: Dict[int, List[Tuple[int, DetokenizeMsg]]] = field(default_factory=dict)
    aborted: Set[int] = field(default_factory=set)
    dead_from: Dict[int, int] = field(default_factory=dict)  # uid -> first launch it may not be in
    in_flight: Batch | None = None
    freed: Counter = field(default_factory=Counter)  # uid -> times its resources were released
    batch_index: Dict[int, int] = field(default_factory=dict)  # id(batch) -> launch index


class ScriptMixin:
    """``receive_msg``/``send_result`` from a script, plus the bookkeeping the checks use."""

    state: ScriptState

    def load_script(self, script: Script, max_steps: int = 2000) -> None:
        self.state = ScriptState(
            script={k: list(v) for k, v in script.items()}, max_steps=max_steps
        )

    # ---- I/O ------------------------------------------------------------------------------
    def receive_msg(self, blocking: bool = False) -> List[BaseBackendMsg]:
        st = self.state
        check_resources(self)  # the state left by the step before: must always add up
        if blocking and not any(k >= st.step for k in st.script):
            raise ScriptDone()
        if blocking:  # idle: jump to the next step that brings messages
            st.step = min(k for k in st.script if k >= st.step)
        if st.step > st.max_steps:
            raise AssertionError(f"still busy after {st.max_steps} steps: a request starves")
        msgs = st.script.get(st.step, [])
        for msg in msgs:
            if isinstance(msg, AbortBackendMsg):
                st.aborted.add(msg.uid)
                st.dead_from.setdefault(msg.uid, len(st.launches))  # handled before the next launch
        st.step += 1
        return msgs

    def send_result(self, reply: List[DetokenizeMsg]) -> None:
        st = self.state
        for msg in reply:
            assert msg.uid not in st.aborted, f"uid {msg.uid} got a token after it was aborted"
            sent = st.replies.setdefault(msg.uid, [])
            assert not (sent and sent[-1][1].finished), (
                f"uid {msg.uid} got a token after it finished"
            )
            sent.append((st.step - 1, msg))
            if msg.finished:  # it may still sit in the batch launched this step, not later
                st.dead_from.setdefault(msg.uid, len(st.launches))

    # ---- tracing ----------------------------------------------------------------------------
    def _forward(self, forward_input: ForwardInput) -> ForwardOutput:
        st, batch = self.state, forward_input.batch
        index = len(st.launches)
        busy = {r.table_idx: r.uid for r in st.in_flight.reqs} if st.in_flight is not None else {}
        for req in batch.reqs:
            assert index < st.dead_from.get(req.uid, index + 1), (
                f"uid {req.uid} is in batch {index} after it finished or was aborted"
            )
            # the batch in flight may still write its requests' rows (the sampled token)
            assert busy.get(req.table_idx, req.uid) == req.uid, (
                f"uid {req.uid} got row {req.table_idx} while uid {busy[req.table_idx]}'s batch "
                "using it is still in flight"
            )
        st.launches.append(
            Launch(
                index,
                st.step - 1,
                batch.phase,
                [(r.uid, r.cached_len, r.extend_len, is_chunk(r)) for r in batch.reqs],
            )
        )
        st.events.append(("launch", index, st.step - 1))
        st.batch_index[id(batch)] = index
        st.in_flight = batch
        return super()._forward(forward_input)  # type: ignore[misc]

    def _process_last_data(self, last_data: Any) -> None:
        super()._process_last_data(last_data)  # type: ignore[misc]
        if last_data is None:
            return
        batch = last_data[0].batch
        self.state.events.append(
            ("results", self.state.batch_index[id(batch)], self.state.step - 1)
        )
        if batch is self.state.in_flight:
            self.state.in_flight = None

    def _free_req_resources(self, req: Req) -> None:
        self.state.freed[req.uid] += 1
        super()._free_req_resources(req)  # type: ignore[misc]

    # ---- results ----------------------------------------------------------------------------
    def outputs(self) -> Dict[int, List[int]]:
        """uid -> every token replied (a final EOS included)."""
        return {uid: [m.next_token for _, m in sent] for uid, sent in self.state.replies.items()}


# ---------------------------------------------------------------------------------------------
# the invariants


def is_chunk(req: Req) -> bool:
    """Whether ``req`` is a chunk of a longer prompt."""
    # >>> ch08-ch09
    # return False
    # <<< ch08-ch09
    return isinstance(req, ChunkedReq)  # +ch10


def _pages(slots: torch.Tensor, page_size: int) -> List[int]:
    return (slots[::page_size] // page_size).tolist()


def live_requests(s: Scheduler) -> List[Req]:
    """Requests holding a table row and KV right now: the decode set and the requests the
    loop still holds (see below), minus what was freed."""
    live: Dict[int, Req] = {}
    candidates: List[Req] = list(s.decode_manager.running_reqs)
    # >>> ch10
    candidates += [
        p.chunked_req for p in s.prefill_manager.pending_list if p.chunked_req is not None
    ]
    # <<< ch10
    in_flight = getattr(getattr(s, "state", None), "in_flight", None)
    if in_flight is not None:
        candidates += in_flight.reqs
    for req in candidates:
        if req not in s.finished_reqs:
            live[id(req)] = req
    return list(live.values())


def check_resources(s: Scheduler) -> None:
    """Account for every KV page and table row, between two steps of the loop.

    * The prefix cache's own bookkeeping holds (``check_integrity``), and where it keeps
      nodes every node's ``ref_count`` equals the number of live requests locking it.
    * Each live request's row covers its computed positions ``[0, cached_len)``, page by
      page (slot ``% P`` == position ``% P``); its first ``cache_handle.cached_len`` slots
      are exactly the cached path it locked; the rest are pages it owns.
    * Free pages, pages in the prefix cache and pages owned by live requests are
      disjoint and add up to every page of the pool.
    * Free rows, rows held back by the loop, and rows of live requests are disjoint and add
      up to ``max_running_req``.
    """
    cm: CacheManager = s.cache_manager
    tm: TableManager = s.table_manager
    P = cm.page_size
    cm.prefix_cache.check_integrity()
    assert bool((cm.free_slots % P == 0).all()), "a free slot is not the start of a page"
    free = (cm.free_slots // P).tolist()
    cached: List[int] = []
    # >>> ch09
    refs: Counter = Counter()
    radix = isinstance(cm.prefix_cache, RadixPrefixCache)
    if radix:
        for node in cm.prefix_cache._nodes():
            cached += _pages(node.value, P)
    # <<< ch09
    owned: List[int] = []
    live = live_requests(s)
    for req in live:
        row = cm.page_table[req.table_idx, : req.cached_len].cpu()
        positions = torch.arange(req.cached_len)
        assert bool((row % P == positions % P).all()), (
            f"uid {req.uid}: a row entry is not in its page"
        )
        handle = req.cache_handle
        matched = handle.get_matched_indices().cpu()
        assert torch.equal(row[: handle.cached_len], matched.to(row.dtype)), (
            f"uid {req.uid}: its row does not point at the cached prefix it locked"
        )
        owned += sorted(set((row[handle.cached_len :] // P).tolist()))
        # >>> ch09
        if radix:
            assert isinstance(handle, RadixCacheHandle)
            node = handle.node
            while node.parent is not None:
                refs[id(node)] += 1
                node = node.parent
    if radix:
        for node in cm.prefix_cache._nodes():
            assert node.ref_count == refs[id(node)], (
                f"a radix node has ref_count {node.ref_count} but {refs[id(node)]} live users"
            )
        # <<< ch09
    every = free + cached + owned
    counts = Counter(every)
    twice = [page for page, n in counts.items() if n > 1]
    assert not twice, (
        f"pages {twice[:5]} are in two places (free {len(free)}, cached "
        f"{len(cached)}, owned {len(owned)})"
    )
    assert len(every) == cm.num_pages, (
        f"pages leaked: free {len(free)} + cached {len(cached)} + owned {len(owned)} != {cm.num_pages}"
    )
    rows = list(tm._free_slots) + [r.table_idx for r in live]
    rows += list(s._deferred_slots)  # held back for a batch in flight  # +ch11
    assert sorted(rows) == list(range(tm._max_running_reqs)), (
        f"table rows do not add up: {sorted(rows)}"
    )


def check_idle(s: Scheduler) -> None:
    """Nothing runs: every page is free or cached (and unlocked), every row is free."""
    s.run_when_idle()  # checks the pages' integrity (and releases rows held back)
    check_resources(s)
    assert s.table_manager.available_size == s.table_manager._max_running_reqs, "a table row leaked"
    assert s.cache_manager.prefix_cache.size_info.protected_size == 0, (
        "a cached prefix is still locked"
    )
    assert not s.prefill_manager.pending_list and not s.decode_manager.running_reqs


def run_script(s: Scheduler, script: Script, overlap: bool, max_steps: int = 2000) -> None:
    """Run ``script`` through ``s``'s own loop until all is done; ``overlap`` (one of
    ``LOOPS``) picks the loop."""
    s.load_script(script, max_steps)  # type: ignore[attr-defined]
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap  # +ch11
    try:
        s.run_forever()
    except ScriptDone:
        pass
    check_idle(s)


# ---------------------------------------------------------------------------------------------
# the two schedulers


class _FakeEngine(Scheduler):
    """The scheduler's managers and loops around a fake model (see the module docstring)."""

    def __init__(
        self,
        *,
        num_pages: int,
        page_size: int = 1,
        max_running_req: int = 4,
        max_seq_len: int = 256,
        cache_type: str = "naive",
        max_extend_tokens: int = 8192,
        enable_retraction: bool = False,  # +ch23
    ) -> None:
        # what Scheduler.__init__ builds, minus the Engine
        page_table = torch.zeros((max_running_req + 1, max_seq_len), dtype=torch.int32)
        self.device = torch.device("cpu")
        # >>> ch11
        self.stream = NullStream()
        self.engine_stream_ctx = nullcontext()
        # <<< ch11
        self.engine = SimpleNamespace(
            stream=NullStream(), max_seq_len=max_seq_len, page_table=page_table, num_pages=num_pages
        )
        self.table_manager = TableManager(max_running_req, page_table)
        self.cache_manager = CacheManager(num_pages, page_size, page_table, cache_type)
        self.decode_manager = DecodeManager(page_size)
        self.prefill_manager = PrefillManager(
            self.cache_manager, self.table_manager, self.decode_manager
        )
        self.finished_reqs = set()
        # >>> ch11
        self._defer_slot_free = False
        self._deferred_slots = []
        self._in_flight = None
        # <<< ch11
        self.eos_token_ids = {FAKE_EOS}
        self.token_pool = self.table_manager.token_pool
        self.prefill_budget = max_extend_tokens
        # >>> ch23
        self.retract_manager = None
        if enable_retraction:
            from minisgl.scheduler.retract import RetractManager

            self.retract_manager = RetractManager()
        # <<< ch23
        # >>> ch24: no request of the fake model asks for a grammar, so no library is ever built
        from minisgl.structured import GrammarManager

        self.grammar_manager = GrammarManager(lambda: None, self.device)  # type: ignore[arg-type]
        self._in_flight_data = None
        # <<< ch24
        self.kv = torch.full(
            (num_pages * page_size,), -1, dtype=torch.int64
        )  # code of (token, pos)

    def _prepare_batch(self, batch: Batch) -> ForwardInput:
        self.cache_manager.allocate_paged(batch.reqs)
        return ForwardInput(batch, None, None, None)  # type: ignore[arg-type]

    def _forward(self, forward_input: ForwardInput) -> ForwardOutput:
        batch = forward_input.batch
        page_table, tokens = self.engine.page_table, self.token_pool
        sampled = []
        for req in batch.reqs:
            row = req.table_idx
            positions = torch.arange(req.device_len)
            codes = tokens[row, : req.device_len].to(torch.int64) * 100_000 + positions
            slots = page_table[row, : req.device_len].to(torch.int64)
            seen = self.kv[slots[: req.cached_len]]
            bad = (seen != codes[: req.cached_len]).nonzero()
            assert len(bad) == 0, (
                f"uid {req.uid} reads a slot that holds someone else's KV at position {int(bad[0])}"
            )
            self.kv[slots[req.cached_len :]] = codes[req.cached_len :]  # "compute" this step's KV
            context = (self.kv[slots] // 100_000).tolist()  # read back through the page table
            sampled.append(fake_next_token(context))
        next_tokens = torch.tensor(sampled, dtype=torch.int32)
        for req, token in zip(batch.reqs, sampled):
            if req.can_decode:  # the next step's input, as the real _forward writes it
                tokens[req.table_idx, req.device_len] = token
            req.complete_one()
        self.decode_manager.filter_reqs(batch.reqs)
        return ForwardOutput(next_tokens, next_tokens, NullEvent())

    def receive_msg(self, blocking: bool = False) -> List[BaseBackendMsg]:
        raise NotImplementedError  # provided by ScriptMixin

    def send_result(self, reply: List[DetokenizeMsg]) -> None:
        raise NotImplementedError


class FakeEngineScheduler(ScriptMixin, _FakeEngine):
    """``FakeEngineScheduler(num_pages=8, page_size=4, cache_type="naive",
    max_extend_tokens=16, max_running_req=4, max_seq_len=256)``; then ``run_script``."""


class ScriptedLLM(ScriptMixin, LLM):
    """The offline ``LLM`` (a real model) fed by a script instead of ``generate``."""


# ---------------------------------------------------------------------------------------------
# random workloads (hypothesis), for the property tests


@dataclass
class Workload:
    page_size: int
    num_pages: int
    cache_type: str
    overlap: bool
    budget: int  # max_extend_tokens
    rows: int  # max_running_req
    # (uid, prompt, max_tokens, ignore_eos, arrival step, abort delay or None)
    requests: List[Tuple[int, List[int], int, bool, int, int | None]]

    def script(self) -> Script:
        script: Script = {}
        for uid, prompt, max_tokens, ignore_eos, arrive, abort in self.requests:
            script.setdefault(arrive, []).append(user(uid, prompt, max_tokens, ignore_eos))
            if abort is not None:
                script.setdefault(arrive + abort, []).append(AbortBackendMsg(uid))
        return script


def workloads(
    page_sizes: Sequence[int] = (1, 4, 16), cache_types: Sequence[str] = ("naive", "radix")
):
    """A hypothesis strategy: requests arriving at random steps, built from two shared
    prefixes (a "system prompt" of up to three pages and a bit), random lengths, some
    aborted, under a KV pool only a few pages larger than the largest request needs."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw: Any) -> Workload:
        P = draw(st.sampled_from(list(page_sizes)))
        tokens = st.integers(1, 40)
        prefixes = [draw(st.lists(tokens, max_size=3 * P + 3)) for _ in range(2)]
        requests = []
        for uid in range(draw(st.integers(1, 10))):
            base = draw(st.sampled_from([[], *prefixes]))
            prompt = base + draw(st.lists(tokens, min_size=0 if base else 1, max_size=2 * P + 2))
            requests.append(
                (
                    uid,
                    prompt,
                    draw(st.integers(1, 2 * P + 2)),
                    draw(st.booleans()),
                    draw(st.integers(0, 12)),
                    draw(st.one_of(st.none(), st.integers(0, 10))),
                )
            )
        need = max(len(prompt) + max_tokens for _, prompt, max_tokens, *_ in requests)
        num_pages = max(2, -(-need // P) + draw(st.integers(0, 3)))  # every request fits alone
        return Workload(
            P,
            num_pages,
            draw(st.sampled_from(list(cache_types))),
            draw(st.sampled_from(LOOPS)),
            draw(st.integers(1, 24)),
            draw(st.integers(1, 4)),
            requests,
        )

    return build()


def check_workload(w: Workload) -> FakeEngineScheduler:
    """Run ``w`` on the fake engine: every step's resources add up (``check_resources``),
    the end is idle and leak-free, every request that was not aborted finishes with exactly
    the tokens the fake model gives it alone (first come, first served: none starves), an
    aborted one got a prefix of them and nothing after its abort, and every admitted
    request released its row and pages exactly once."""
    s = FakeEngineScheduler(
        num_pages=w.num_pages,
        page_size=w.page_size,
        cache_type=w.cache_type,
        max_extend_tokens=w.budget,
        max_running_req=w.rows,
        max_seq_len=128,
    )
    run_script(s, w.script(), w.overlap, max_steps=1000)
    out = s.outputs()
    admitted = {uid for launch in s.state.launches for uid, *_ in launch.reqs}
    for uid, prompt, max_tokens, ignore_eos, _, abort in w.requests:
        ref, got = fake_reference(prompt, max_tokens, ignore_eos), out.get(uid, [])
        if abort is None:
            assert got == ref, f"uid {uid}: got {got}, alone it gives {ref}"
        else:
            assert got == ref[: len(got)], f"uid {uid} (aborted): got {got}, alone it gives {ref}"
        assert s.state.freed[uid] == (1 if uid in admitted else 0), (
            f"uid {uid}: resources released {s.state.freed[uid]} times"
        )
    return s
