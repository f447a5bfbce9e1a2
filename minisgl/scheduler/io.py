"""Where the scheduler's messages come from and where its results go.

The scheduler's loop touches the outside world through two methods only, ``receive_msg``
and ``send_result``, which it inherits from ``SchedulerIOMixin``. Offline
(``config.offline_mode``) nothing is opened: the ``LLM`` subclass overrides both itself.
Mirrors upstream ``minisgl.scheduler.io.SchedulerIOMixin``.
"""

from __future__ import annotations

from typing import (
    TYPE_CHECKING,
    Dict,  # +ch14
    List,
)

from minisgl.message import (
    BaseBackendMsg,
    BatchBackendMsg,  # +ch14
    BatchTokenizerMsg,  # +ch14
    DetokenizeMsg,
    StatsQueryMsg,  # +ch14
)
from minisgl.utils import init_logger

if TYPE_CHECKING:
    from minisgl.engine import Engine  # +ch14
    from minisgl.utils.mp import (
        ZmqPubQueue,  # +ch14
        ZmqPullQueue,  # +ch14
        ZmqPushQueue,  # +ch14
        ZmqSubQueue,  # +ch14
    )

    from .cache import CacheManager  # +ch14
    from .config import SchedulerConfig
    from .decode import DecodeManager  # +ch14
    from .prefill import PrefillManager  # +ch14
    from .table import TableManager  # +ch14

logger = init_logger(__name__)


class SchedulerIOMixin:
    """Gives the ``Scheduler`` its ``receive_msg`` and ``send_result``."""

    # >>> ch14: online, rank 0 pulls messages from the tokenizer worker and pushes each step's
    # tokens back to it. Under tensor parallelism every rank runs the same scheduler on its
    # own slice of the model, and every rank must see the same messages in the same order,
    # or their batches (and their collective operations) diverge. So only rank 0 listens to
    # the tokenizer; it re-publishes what it received to the other ranks, as the raw bytes,
    # once per loop iteration (an empty list when nothing came), and each other rank reads
    # exactly one such publication per iteration. The ranks stay in step without any extra
    # collective: all of them run the same loop on the same state. Upstream broadcasts the
    # message count through a CPU process group instead.
    engine: Engine
    cache_manager: CacheManager
    table_manager: TableManager
    prefill_manager: PrefillManager
    decode_manager: DecodeManager
    # <<< ch14

    def __init__(self, config: SchedulerConfig) -> None:
        """Call it after the scheduler's managers exist. Offline it opens nothing."""
        if config.offline_mode:
            return  # the subclass (LLM) brings its own receive_msg and send_result
        # >>> ch14: rank 0 binds config.zmq_backend_addr (pull) and connects to
        # config.zmq_detokenizer_addr (push); with more ranks it binds
        # config.zmq_scheduler_broadcast_addr (publish) and waits until every other rank has
        # subscribed (TimeoutError after 60 s). Imported here: offline there are no sockets
        # and no msgpack at all
        from minisgl.message.utils import dumps, loads
        from minisgl.utils.mp import ZmqPubQueue, ZmqPullQueue, ZmqPushQueue, ZmqSubQueue

        tp = config.tp_info
        self.is_primary = tp.is_primary()
        self._broadcast = tp.size > 1
        if self.is_primary:
            self._recv_from_tokenizer: ZmqPullQueue[BaseBackendMsg] = ZmqPullQueue(
                config.zmq_backend_addr, create=True, decoder=loads
            )
            self._send_into_tokenizer: ZmqPushQueue[object] = ZmqPushQueue(
                config.zmq_detokenizer_addr, create=False, encoder=dumps
            )
            if self._broadcast:
                self._send_into_ranks: ZmqPubQueue[object] = ZmqPubQueue(
                    config.zmq_scheduler_broadcast_addr, create=True, encoder=dumps
                )
                self._send_into_ranks.wait_for_subscribers(tp.size - 1)
        else:
            self._recv_from_rank0: ZmqSubQueue[BaseBackendMsg] = ZmqSubQueue(
                config.zmq_scheduler_broadcast_addr, create=False, decoder=loads
            )
        self.receive_msg = self._receive_online  # type: ignore[method-assign]
        self.send_result = self._send_online  # type: ignore[method-assign]
        # <<< ch14

    # ---- the interface the scheduler's loop calls ---------------------------------------
    def receive_msg(self, blocking: bool = False) -> List[BaseBackendMsg]:
        """New messages; with ``blocking``, wait until there is at least one."""
        raise NotImplementedError("offline mode: a subclass (the LLM) provides receive_msg")

    def send_result(self, reply: List[DetokenizeMsg]) -> None:
        """Deliver this step's tokens."""
        raise NotImplementedError("offline mode: a subclass (the LLM) provides send_result")

    def run_when_idle(self) -> None:
        """Called before blocking for a message (the scheduler checks its KV pages)."""

    # >>> ch14
    # ---- online -------------------------------------------------------------------------
    def _receive_online(self, blocking: bool = False) -> List[BaseBackendMsg]:
        if blocking:
            self.run_when_idle()
        if self.is_primary:
            raws = [self._recv_from_tokenizer.get_raw()] if blocking else []
            while not self._recv_from_tokenizer.empty():
                raws.append(self._recv_from_tokenizer.get_raw())
            if self._broadcast:
                self._send_into_ranks.put_raw_many(raws)  # exactly one publication per call
            msgs = [self._recv_from_tokenizer.decode(raw) for raw in raws]
        else:
            # rank 0 publishes once per iteration, blocking or not: wait for this one
            msgs = [
                self._recv_from_rank0.decoder(raw) for raw in self._recv_from_rank0.get_raw_many()
            ]
        return self._answer_queries(msgs)

    def _answer_queries(self, msgs: List[BaseBackendMsg]) -> List[BaseBackendMsg]:
        """Answer stats queries here (rank 0 only); the loop gets everything else. A query
        sees the state before the messages that arrived with it are handled."""
        kept: List[BaseBackendMsg] = []
        for msg in msgs:
            if isinstance(msg, BatchBackendMsg):
                kept.extend(self._answer_queries(msg.data))
            elif isinstance(msg, StatsQueryMsg):
                if self.is_primary:
                    from minisgl.message.frontend import StatsReply

                    self._send_into_tokenizer.put(
                        StatsReply(uid=msg.uid, stats=self.collect_stats())
                    )
            else:
                kept.append(msg)
        return kept

    def _send_online(self, reply: List[DetokenizeMsg]) -> None:
        if not self.is_primary or not reply:  # the other ranks computed the same tokens
            return
        self._send_into_tokenizer.put(
            reply[0] if len(reply) == 1 else BatchTokenizerMsg(data=list(reply))
        )

    def collect_stats(self) -> Dict[str, int]:
        """The scheduler's counters, in pages, rows and requests.

        ``kv_pages_in_use`` counts pages neither free nor evictable from the prefix cache:
        those of running requests (and cached prefixes they hold). When nothing runs it is
        0 and ``table_rows_free == table_rows_total``; anything else is a leak.
        """
        page_size = self.cache_manager.page_size
        size = self.cache_manager.prefix_cache.size_info
        total, free = self.cache_manager.num_pages, self.cache_manager.num_free_pages
        evictable = size.evictable_size // page_size
        return {
            "kv_pages_total": total,
            "kv_pages_free": free,
            "kv_pages_cached": size.total_size // page_size,
            "kv_pages_in_use": total - free - evictable,
            "page_size": page_size,
            "table_rows_total": self.engine.config.max_running_req,
            "table_rows_free": self.table_manager.available_size,
            "running_reqs": len(self.decode_manager.running_reqs),
            "pending_reqs": len(self.prefill_manager.pending_list),
            "max_seq_len": self.engine.max_seq_len,
        }

    def stop_io(self) -> None:
        """Close the sockets (online only)."""
        for name in (
            "_recv_from_tokenizer",
            "_send_into_tokenizer",
            "_send_into_ranks",
            "_recv_from_rank0",
        ):
            queue = getattr(self, name, None)
            if queue is not None:
                queue.stop()

    # <<< ch14
