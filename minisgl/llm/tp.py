"""Offline tensor parallelism: the ``LLM`` process is rank 0; spawned processes are the rest.

Every rank runs the same scheduler loop on its slice of the model, so every rank must see
the same requests in the same order. Rank 0 (the ``LLM`` the user holds) decides what to
feed each step and publishes exactly that list to the other ranks, once per loop
iteration, the way a serving rank 0 re-broadcasts what the tokenizer sent (chapter 14).
The other ranks are ordinary online schedulers of rank > 0: they subscribe, run, and send
nothing back (rank 0 has computed the same tokens). An ``ExitMsg`` stops them.

The ranks meet (``torch.distributed``) and talk (ZeroMQ) through files in a private
temporary directory. Upstream's ``LLM`` runs a single rank; its server does this with
one process per rank (``minisgl.server.launch``).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import shutil
import signal
import sys
from dataclasses import replace
from multiprocessing.process import BaseProcess
from typing import List

from minisgl.distributed import DistributedInfo
from minisgl.message import BaseBackendMsg, ExitMsg
from minisgl.message.utils import dumps
from minisgl.scheduler import SchedulerConfig
from minisgl.utils import init_logger
from minisgl.utils.mp import ZmqPubQueue, new_ipc_dir

logger = init_logger(__name__)
STOP_TIMEOUT_S = 15.0


def _rank_main(config: SchedulerConfig) -> None:
    """A rank > 0: an online scheduler that only ever hears from rank 0."""
    if sys.platform.startswith("linux"):  # die with rank 0, never linger as an orphan
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    import torch

    from minisgl.scheduler import Scheduler

    scheduler = Scheduler(config)
    try:
        with torch.inference_mode():
            scheduler.run_forever()
    except KeyboardInterrupt:  # ExitMsg
        pass
    finally:
        scheduler.stop_io()
    scheduler.shutdown()


class RankGroup:
    """Ranks ``1 .. size-1`` of an offline ``LLM``, and rank 0's channel to them.

    ``RankGroup(config, size)`` spawns the ranks and returns at once; ``config`` is then
    rank 0's own config (``tp_info``, ``ipc_dir`` and ``distributed_addr`` filled in).
    Call ``connect()`` once rank 0's scheduler exists, ``publish()`` once per loop
    iteration, ``stop()`` at the end.
    """

    def __init__(self, config: SchedulerConfig, size: int) -> None:
        ipc_dir = new_ipc_dir()
        self.config = replace(
            config,
            tp_info=DistributedInfo(0, size),
            ipc_dir=ipc_dir,
            distributed_addr=f"file://{ipc_dir}/distributed",
        )
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch or CUDA state
        self.processes: List[BaseProcess] = []
        for rank in range(1, size):
            rank_config = replace(
                self.config, tp_info=DistributedInfo(rank, size), offline_mode=False
            )
            p = ctx.Process(
                target=_rank_main, args=(rank_config,), name=f"minisgl-llm-rank-{rank}", daemon=True
            )
            p.start()
            self.processes.append(p)
        self._pub: ZmqPubQueue[BaseBackendMsg] | None = None

    def connect(self) -> None:
        """Wait until every other rank listens (``TimeoutError`` after 60 s)."""
        self._pub = ZmqPubQueue(
            self.config.zmq_scheduler_broadcast_addr, create=True, encoder=dumps
        )
        self._pub.wait_for_subscribers(len(self.processes))

    def publish(self, msgs: List[BaseBackendMsg]) -> None:
        """What rank 0 feeds this iteration (possibly nothing): the others read exactly it."""
        assert self._pub is not None, "connect() first"
        self._pub.put_raw_many([dumps(m) for m in msgs])

    def dead_ranks(self, wait_s: float = 0.0) -> List[str]:
        """``"rank R (pid P) exited with code C"`` for every rank that has ended."""
        dead = []
        for rank, p in enumerate(self.processes, start=1):
            p.join(wait_s)
            if p.exitcode is not None:
                dead.append(f"rank {rank} (pid {p.pid}) exited with code {p.exitcode}")
        return dead

    def stop(self) -> None:
        """Tell the ranks to exit, wait up to ``STOP_TIMEOUT_S``, kill stragglers, clean up."""
        if self._pub is not None:
            self.publish([ExitMsg()])
        for p in self.processes:
            p.join(STOP_TIMEOUT_S if self._pub is not None else 0)
            if p.exitcode is None:
                p.kill()
                p.join()
        if self._pub is not None:
            self._pub.stop()
            self._pub = None
        shutil.rmtree(self.config.ipc_dir or "", ignore_errors=True)
