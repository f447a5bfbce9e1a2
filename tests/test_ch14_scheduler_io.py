"""Chapter 14: the scheduler's I/O over ZMQ: rank 0 listens and re-broadcasts, every rank
sees the same messages in the same order; the real scheduler served over sockets."""

import random
import shutil
import threading
import time
from typing import Dict, List

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.distributed import DistributedInfo
from minisgl.env import ENV
from minisgl.message import (
    AbortBackendMsg,
    BatchBackendMsg,
    BatchTokenizerMsg,
    DetokenizeMsg,
    ExitMsg,
    StatsQueryMsg,
    UserMsg,
)
from minisgl.message.frontend import StatsReply
from minisgl.message.utils import dumps, loads
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.io import SchedulerIOMixin
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue, new_ipc_dir
from tests.helpers import DEVICE, hf_greedy


@pytest.fixture
def ipc_dir():
    d = new_ipc_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


class FakeRank(SchedulerIOMixin):
    """The scheduler's loop without a model: a request "runs" for max_tokens steps. Every
    rank decides to block or not from its own state, exactly as the real loop does."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.remaining: Dict[int, int] = {}
        self.seen: List[List[str]] = []  # per loop iteration, what receive_msg returned
        self.idle_calls = 0
        super().__init__(config)

    def run_when_idle(self) -> None:
        self.idle_calls += 1

    def collect_stats(self) -> Dict[str, int]:
        return {"running_reqs": len(self.remaining)}

    def loop(self) -> None:
        while True:
            msgs = self.receive_msg(blocking=not self.remaining)
            self.seen.append([f"{type(m).__name__}:{getattr(m, 'uid', '')}" for m in msgs])
            for m in msgs:
                if isinstance(m, ExitMsg):
                    return
                if isinstance(m, UserMsg):
                    self.remaining[m.uid] = m.sampling_params.max_tokens
                elif isinstance(m, AbortBackendMsg):
                    self.remaining.pop(m.uid, None)
            reply = [
                DetokenizeMsg(uid, 0, left == 1) for uid, left in sorted(self.remaining.items())
            ]
            self.remaining = {u: n - 1 for u, n in self.remaining.items() if n > 1}
            self.send_result(reply)
            time.sleep(random.random() * 0.002)  # ranks run at different speeds


def config(ipc_dir, rank=0, size=1, model_path="unused", **kw):
    return SchedulerConfig(
        model_path=model_path, tp_info=DistributedInfo(rank, size), ipc_dir=ipc_dir, **kw
    )


def test_every_rank_sees_the_same_messages_in_the_same_order(ipc_dir):
    size = 3
    ranks: List[FakeRank] = [None] * size  # type: ignore[list-item]

    def run(rank: int) -> None:
        ranks[rank] = FakeRank(config(ipc_dir, rank, size))  # rank 0 waits for 2 subscribers
        ranks[rank].loop()

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    to_backend = ZmqPushQueue(config(ipc_dir).zmq_backend_addr, create=False, encoder=dumps)
    replies = ZmqPullQueue(config(ipc_dir).zmq_detokenizer_addr, create=True, decoder=loads)
    rng = random.Random(1)
    for uid in range(40):  # bursts and pauses, so messages land in different iterations
        params = SamplingParams(max_tokens=rng.randint(1, 6))
        to_backend.put(UserMsg(uid, torch.tensor([1, 2], dtype=torch.int32), params))
        if uid % 7 == 3:
            to_backend.put(
                BatchBackendMsg(data=[AbortBackendMsg(uid), StatsQueryMsg(uid=1000 + uid)])
            )
        time.sleep(rng.random() * 0.01)
    time.sleep(0.3)
    to_backend.put(ExitMsg())
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)

    assert ranks[0].seen == ranks[1].seen == ranks[2].seen  # same messages, same iterations
    flat = [m for step in ranks[0].seen for m in step]
    assert flat.count("ExitMsg:") == 1 and sum(m.startswith("UserMsg") for m in flat) == 40
    assert not any("StatsQueryMsg" in m for m in flat)  # answered by rank 0, not scheduled
    assert ranks[0].idle_calls == ranks[1].idle_calls > 0

    got = []
    while not replies.empty():  # only rank 0 replies: one copy of each token
        msg = replies.get()
        got += msg.data if isinstance(msg, BatchTokenizerMsg) else [msg]
    stats = [m for m in got if isinstance(m, StatsReply)]
    assert sorted(m.uid for m in stats) == [1000 + u for u in range(40) if u % 7 == 3]
    finished = [m.uid for m in got if isinstance(m, DetokenizeMsg) and m.finished]
    assert len(finished) == len(set(finished))  # no duplicates from the other ranks
    for q in (to_backend, replies):
        q.stop()


def test_offline_mode_opens_nothing_and_leaves_io_to_the_subclass(ipc_dir):
    rank = SchedulerIOMixin(config(None, offline_mode=True))  # no ipc_dir needed
    with pytest.raises(NotImplementedError, match="offline"):
        rank.receive_msg()
    with pytest.raises(ValueError, match="ipc_dir"):
        SchedulerIOMixin(config(None))


# ---- the real scheduler, served over sockets (in a thread of this process) --------------


@pytest.fixture
def served(qwen3_path, ipc_dir):
    """A real Scheduler in online mode; the test plays the tokenizer worker."""
    ENV.DISABLE_OVERLAP_SCHEDULING.value = False  # served as the server does: overlapped
    cfg = config(
        ipc_dir,
        model_path=str(qwen3_path),
        dtype=torch.float32,
        device=DEVICE,
        attention_backend="torch",
        max_running_req=4,
        num_page_override=512,
        max_seq_len_override=64,
    )
    scheduler = Scheduler(cfg)
    errors: List[BaseException] = []

    def run() -> None:
        try:
            scheduler.run_forever()
        except KeyboardInterrupt:  # ExitMsg
            pass
        except BaseException as e:  # pragma: no cover - reported by the test
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    to_backend = ZmqPushQueue(cfg.zmq_backend_addr, create=False, encoder=dumps)
    replies = ZmqPullQueue(cfg.zmq_detokenizer_addr, create=True, decoder=loads)
    yield scheduler, to_backend, replies
    to_backend.put(ExitMsg())
    thread.join(30)
    assert not thread.is_alive() and not errors, errors
    scheduler.stop_io()
    scheduler.shutdown()
    for q in (to_backend, replies):
        q.stop()


def collect(replies, until):
    """Tokens per uid (and other messages) until ``until(tokens, others)`` holds."""
    tokens: Dict[int, List[DetokenizeMsg]] = {}
    others = []
    deadline = time.monotonic() + 60
    while not until(tokens, others):
        assert replies.poll(max(0.0, deadline - time.monotonic())), "the scheduler went silent"
        msg = replies.get()
        for m in msg.data if isinstance(msg, BatchTokenizerMsg) else [msg]:
            if isinstance(m, DetokenizeMsg):
                tokens.setdefault(m.uid, []).append(m)
            else:
                others.append(m)
    return tokens, others


def test_the_scheduler_serves_over_sockets(served, qwen3_path):
    scheduler, to_backend, replies = served
    prompts = [[1, 2, 3], [10, 20, 30, 40, 50], list(range(5, 13))]
    for uid, p in enumerate(prompts):
        to_backend.put(
            UserMsg(
                uid,
                torch.tensor(p, dtype=torch.int32),
                SamplingParams(max_tokens=6, ignore_eos=True),
            )
        )
    to_backend.put(
        UserMsg(7, torch.arange(100, dtype=torch.int32), SamplingParams(max_tokens=2))
    )  # > 64
    done = lambda t, o: all(u in t and t[u][-1].finished for u in (0, 1, 2, 7))  # noqa: E731
    tokens, _ = collect(replies, done)
    assert [[m.next_token for m in tokens[u]] for u in range(3)] == hf_greedy(
        qwen3_path, prompts, 6
    )
    [refused] = tokens[7]
    assert refused.error and "100 tokens" in refused.error and "limit is 64" in refused.error

    to_backend.put(StatsQueryMsg(uid=99))
    _, others = collect(replies, lambda t, o: any(isinstance(m, StatsReply) for m in o))
    stats = others[-1].stats
    assert (
        stats["kv_pages_in_use"] == 0 and stats["table_rows_free"] == stats["table_rows_total"] == 4
    )
    assert stats["running_reqs"] == stats["pending_reqs"] == 0 and stats["max_seq_len"] == 64


def test_an_abort_frees_the_request_at_once(served):
    scheduler, to_backend, replies = served
    prompt = torch.tensor([1, 2, 3], dtype=torch.int32)
    to_backend.put(UserMsg(1, prompt, SamplingParams(max_tokens=50, ignore_eos=True)))
    collect(replies, lambda t, o: len(t.get(1, [])) >= 3)  # it is decoding
    to_backend.put(AbortBackendMsg(uid=1))
    to_backend.put(StatsQueryMsg(uid=5))
    tokens, others = collect(replies, lambda t, o: bool(o))
    assert not any(m.finished for m in tokens.get(1, []))  # aborted: never "finished"
    time.sleep(0.2)
    to_backend.put(StatsQueryMsg(uid=6))
    _, others = collect(replies, lambda t, o: bool(o))
    assert others[0].stats["kv_pages_in_use"] == 0 and others[0].stats["table_rows_free"] == 4
