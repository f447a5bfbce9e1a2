"""Exercise 341: the scheduler's online I/O, on fake queues that record what they get."""

from __future__ import annotations

import random
from typing import List

import torch

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortBackendMsg,
    BatchBackendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    StatsQueryMsg,
    UserMsg,
)
from minisgl.message.frontend import StatsReply
from minisgl.scheduler.io import SchedulerIOMixin


class Inbox:
    """The tokenizer's socket as rank 0 sees it: raw messages, decoded by tagging."""

    def __init__(self, msgs: List[object]) -> None:
        self.raws = [("raw", m) for m in msgs]
        self.gets = 0

    def get_raw(self):
        self.gets += 1
        return self.raws.pop(0)

    def empty(self) -> bool:
        return not self.raws

    def decode(self, raw):
        assert raw[0] == "raw", f"decode() got {raw!r}, not a raw message"
        return raw[1]


class Outbox:
    def __init__(self) -> None:
        self.put_calls: List[object] = []
        self.publications: List[list] = []

    def put(self, msg) -> None:
        self.put_calls.append(msg)

    def put_raw_many(self, raws) -> None:
        self.publications.append(list(raws))


class Publications:
    """Rank 0's publications as another rank sees them."""

    def __init__(self, batches: List[List[object]]) -> None:
        self.batches = [[("pub", m) for m in b] for b in batches]
        self.calls = 0

    def get_raw_many(self):
        self.calls += 1
        return self.batches.pop(0)

    @staticmethod
    def decoder(raw):
        assert raw[0] == "pub", f"decoder() got {raw!r}"
        return raw[1]


STATS = {"kv_pages_total": 8}


def rank(primary: bool, broadcast: bool, inbox=None, publications=None) -> SchedulerIOMixin:
    io = object.__new__(SchedulerIOMixin)  # no sockets: the fakes stand in for them
    io.is_primary, io._broadcast = primary, broadcast
    io._recv_from_tokenizer = inbox
    io._send_into_tokenizer = Outbox()
    io._send_into_ranks = Outbox()
    io._recv_from_rank0 = publications
    io.idle_calls = 0

    def idle() -> None:
        assert inbox is None or inbox.gets == 0, "run_when_idle() must come before get_raw()"
        io.idle_calls += 1

    io.run_when_idle = idle
    io.collect_stats = lambda: dict(STATS)
    return io


def user(uid: int) -> UserMsg:
    return UserMsg(uid, torch.tensor([1, 2], dtype=torch.int32), SamplingParams(max_tokens=2))


def test_rank0_publishes_once_per_call_even_when_empty():
    io = rank(primary=True, broadcast=True, inbox=Inbox([]))
    assert io._receive_online(blocking=False) == []
    assert io._send_into_ranks.publications == [[]], (
        f"one publication ([]) per call, got {io._send_into_ranks.publications}"
    )
    a, b = user(1), user(2)
    io._recv_from_tokenizer = Inbox([a, b])
    got = io._receive_online(blocking=False)
    assert [m.uid for m in got] == [1, 2], f"rank 0 should return both messages, got {got}"
    assert io._send_into_ranks.publications[1] == [("raw", a), ("raw", b)], (
        "the second call publishes the two raw messages it read, in one put_raw_many"
    )


def test_a_blocking_call_waits_and_checks_idle_first():
    inbox = Inbox([user(1), user(2), user(3)])
    io = rank(primary=True, broadcast=False, inbox=inbox)
    got = io._receive_online(blocking=True)
    assert io.idle_calls == 1, "a blocking call runs run_when_idle() once, before waiting"
    assert [m.uid for m in got] == [1, 2, 3], f"every queued message, in order: {got}"
    empty = Inbox([])
    io._recv_from_tokenizer = empty
    assert io._receive_online(blocking=False) == [] and empty.gets == 0, (
        "a non-blocking call on an empty socket must not wait in get_raw()"
    )
    assert io._send_into_ranks.publications == [], "no other ranks: nothing to publish"


def test_another_rank_reads_one_publication_per_call():
    pubs = Publications([[user(4)], []])
    io = rank(primary=False, broadcast=True, publications=pubs)
    assert [m.uid for m in io._receive_online(blocking=False)] == [4]
    assert io._receive_online(blocking=True) == []
    assert pubs.calls == 2, "each call takes exactly one publication"
    assert io.idle_calls == 1


def test_batches_are_flattened_in_order():
    io = rank(primary=True, broadcast=False)
    msgs = [user(1), BatchBackendMsg(data=[user(2), BatchBackendMsg(data=[AbortBackendMsg(3)])])]
    got = io._answer_queries(msgs)
    assert [type(m).__name__ for m in got] == ["UserMsg", "UserMsg", "AbortBackendMsg"], got
    assert [m.uid for m in got] == [1, 2, 3]


def test_stats_are_answered_by_rank0_only():
    msgs = [user(1), StatsQueryMsg(uid=77), BatchBackendMsg(data=[StatsQueryMsg(uid=78)])]
    io = rank(primary=True, broadcast=True)
    assert [m.uid for m in io._answer_queries(msgs)] == [1], "queries never reach the loop"
    replies = io._send_into_tokenizer.put_calls
    assert [type(r) for r in replies] == [StatsReply, StatsReply], replies
    assert [r.uid for r in replies] == [77, 78] and replies[0].stats == STATS
    other = rank(primary=False, broadcast=True)
    assert [m.uid for m in other._answer_queries(msgs)] == [1]
    assert other._send_into_tokenizer.put_calls == [], "only rank 0 answers a query"


def test_only_rank0_sends_and_batches_several():
    one, two = DetokenizeMsg(1, 5, False), DetokenizeMsg(2, 6, True)
    io = rank(primary=True, broadcast=True)
    io._send_online([])
    assert io._send_into_tokenizer.put_calls == [], "an empty reply sends nothing"
    io._send_online([one])
    io._send_online([one, two])
    sent = io._send_into_tokenizer.put_calls
    assert sent[0] == one, f"one message goes as itself, got {sent[0]!r}"
    assert isinstance(sent[1], BatchTokenizerMsg) and sent[1].data == [one, two]
    other = rank(primary=False, broadcast=True)
    other._send_online([one, two])
    assert other._send_into_tokenizer.put_calls == [], "the other ranks send nothing"


def drawn_messages(rng: random.Random, depth: int = 0) -> List[object]:
    """A drawn mix of requests, aborts, stats queries and nested batches of them."""
    out: List[object] = []
    for _ in range(rng.randint(0, 5)):
        kind = rng.randrange(4 if depth < 2 else 3)
        uid = rng.randrange(1000)
        if kind == 0:
            out.append(user(uid))
        elif kind == 1:
            out.append(AbortBackendMsg(uid))
        elif kind == 2:
            out.append(StatsQueryMsg(uid=uid))
        else:
            out.append(BatchBackendMsg(data=drawn_messages(rng, depth + 1)))
    return out


def flatten(msgs: List[object]) -> List[object]:
    return [m for x in msgs for m in (flatten(x.data) if isinstance(x, BatchBackendMsg) else [x])]


def test_drawn_messages_reach_the_loop_in_order_and_queries_are_answered(drawn_seed):
    """Mixes of messages drawn at random (each judged run draws new ones): the loop gets
    every request and abort in order, rank 0 answers every stats query in order, and the
    replies go out one message or one batch per call."""
    rng = random.Random(drawn_seed)
    for _ in range(20):
        msgs = drawn_messages(rng)
        flat = flatten(msgs)
        io = rank(primary=True, broadcast=False)
        got = io._answer_queries(msgs)
        want = [m for m in flat if not isinstance(m, StatsQueryMsg)]
        assert [(type(m), m.uid) for m in got] == [(type(m), m.uid) for m in want], msgs
        queries = [m.uid for m in flat if isinstance(m, StatsQueryMsg)]
        assert [r.uid for r in io._send_into_tokenizer.put_calls] == queries
        replies = [DetokenizeMsg(u, rng.randrange(100), rng.random() < 0.5) for u in range(3)]
        n = rng.randint(0, 3)
        io._send_online(replies[:n])
        sent = io._send_into_tokenizer.put_calls[len(queries) :]
        assert sent == (
            [] if n == 0 else [replies[0]] if n == 1 else [BatchTokenizerMsg(replies[:n])]
        )
