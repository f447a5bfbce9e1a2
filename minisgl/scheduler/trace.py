"""A recorder of what the scheduler does, step by step, for the book's trace viewer.

``TraceRecorder.attach(scheduler)`` wraps four of the scheduler's methods *on that one
object* (``_prepare_batch``, ``_forward``, ``_process_last_data`` and the prefill queue's
``add_one_req``) and its prefix cache's ``evict``. Nothing in ``Scheduler`` knows about it:
a scheduler without a recorder runs exactly its own code, with no flag to test on its hot
path. With one, every step reads the page table, the free list and the radix
tree back to the CPU, so recording costs a device synchronisation per step (it is for
looking, not for benchmarks); it never runs inside a CUDA graph, only around ``forward_batch``.

``recorder.document()`` is one JSON document (``trace.schema.json`` beside this file, version
``SCHEMA_VERSION``): the run's settings, the requests, and per step (one batch launched):

* ``kind`` (prefill/decode) and, per request in the batch, its ``uid``, table ``row``,
  ``cached_len``, ``device_len`` and ``extend_len`` (tokens fed), whether it is a chunk of a
  longer prompt, the KV ``pages`` it holds, those ``new_pages`` this step allocated, and the
  token ``sampled`` and its ``text`` (``None`` for a chunk);
* ``rows``: every occupied page-table row (its request and the pages of ``[0, device_len)``);
* ``free_pages``, the pages ``freed`` back to the free list and ``evicted`` from the prefix
  cache while the step was scheduled or its results handled;
* ``radix``: the radix tree after the step's results were handled (nodes, lock counts), or
  ``None`` with the naive cache;
* ``handled_while_running``: when the scheduler overlaps steps, the step whose results the
  CPU handled while this one was on the device;
* ``timings_ms``: CPU time to schedule, to launch and to handle results, and when it
  launched and when its results were handled.

The viewer is ``python -m tools.trace_view trace.json``. There is no upstream counterpart:
mini-sglang logs; this file exists for the book.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Set, Tuple

import torch

from minisgl.env import ENV  # +ch11
from minisgl.utils import div_ceil

from .prefill import ChunkedReq  # +ch10

if TYPE_CHECKING:
    from minisgl.core import Batch, Req

    from .scheduler import ForwardData, ForwardInput, Scheduler

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("trace.schema.json")
_TOKENS_SHOWN = 16  # token ids kept per radix node: enough to recognise a prefix


class TraceRecorder:
    """Records one scheduler's steps; see the module docstring. Attach before the run."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.page_size = scheduler.cache_manager.page_size
        self.steps: List[Dict[str, Any]] = []
        self.requests: Dict[int, Dict[str, Any]] = {}
        self._originals: List[Tuple[Any, str, Any]] = []
        self._step_of: Dict[int, int] = {}  # id(batch) -> step index
        self._launched: int | None = None  # the last step launched
        self._held: Dict[int, Set[int]] = {}  # uid -> pages held at its last step
        self._free: Set[int] = set(self._free_pages())
        self._evicted: List[int] = []
        self._arrived: List[int] = []
        self._node_ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._next_node_id = itertools.count()
        self._t0 = time.perf_counter()
        self.overhead_s = 0.0  # CPU seconds spent recording, outside the methods it wraps

    # ---- attaching ----------------------------------------------------------------------
    @classmethod
    def attach(cls, scheduler: Scheduler) -> TraceRecorder:
        """Start recording ``scheduler`` (before its first step)."""
        rec = cls(scheduler)
        rec._wrap(scheduler, "_prepare_batch", rec._on_prepare)
        rec._wrap(scheduler, "_forward", rec._on_forward)
        rec._wrap(scheduler, "_process_last_data", rec._on_process)
        rec._wrap(scheduler.prefill_manager, "add_one_req", rec._on_arrival)
        rec._wrap(scheduler.cache_manager.prefix_cache, "evict", rec._on_evict)
        return rec

    def _wrap(self, obj: Any, name: str, hook: Callable[..., Any]) -> None:
        original = getattr(obj, name)
        own = vars(obj).get(name)  # an example's own wrapper, put back on detach

        def wrapped(*args: Any) -> Any:
            inside = 0.0  # time in the wrapped method itself (a nested hook's own time included)

            def timed(*a: Any) -> Any:
                nonlocal inside
                t = time.perf_counter()
                try:
                    return original(*a)
                finally:
                    inside += time.perf_counter() - t

            t = time.perf_counter()
            try:
                return hook(timed, *args)
            finally:
                self.overhead_s += time.perf_counter() - t - inside

        self._originals.append((obj, name, own))
        setattr(obj, name, wrapped)  # an instance attribute: the class is untouched

    def detach(self) -> None:
        """Stop recording: the methods the scheduler had before ``attach`` are used again."""
        for obj, name, own in reversed(self._originals):
            if own is None:
                delattr(obj, name)
            else:
                setattr(obj, name, own)
        self._originals.clear()

    # ---- hooks --------------------------------------------------------------------------
    def _on_arrival(self, original: Callable[..., Any], msg: Any) -> Any:
        self.requests[msg.uid] = {
            "uid": msg.uid,
            "prompt_len": len(msg.input_ids),
            "max_tokens": msg.sampling_params.max_tokens,
            "arrived_step": len(self.steps),
        }
        self._arrived.append(msg.uid)
        return original(msg)

    def _on_evict(self, original: Callable[..., Any], size: int) -> torch.Tensor:
        slots = original(size)
        self._evicted.extend(int(s) // self.page_size for s in slots[:: self.page_size].tolist())
        return slots

    def _on_prepare(self, original: Callable[..., Any], batch: Batch) -> ForwardInput:
        t = time.perf_counter()
        forward_input = original(batch)
        schedule_ms = (time.perf_counter() - t) * 1e3
        index = len(self.steps)
        self._step_of[id(batch)] = index
        reqs = [self._req_record(r) for r in batch.reqs]
        freed, evicted = self._free_diff()
        sched = self.scheduler
        step: Dict[str, Any] = {
            "index": index,
            "kind": batch.phase,
            "num_tokens": sum(r.extend_len for r in batch.reqs),
            "reqs": reqs,
            "arrived": self._arrived,
            "waiting": [p.uid for p in sched.prefill_manager.pending_list],
            "rows": self._rows(batch),
            "free_pages": len(self._free),
            "freed": freed,
            "evicted": evicted,
            "radix": None,
            "handled_while_running": None,
            "timings_ms": {
                "launch_at": round((t - self._t0) * 1e3, 3),
                "schedule": round(schedule_ms, 3),
                "forward": None,
                "handle_at": None,
                "handle": None,
            },
        }
        self._arrived = []
        self.steps.append(step)
        # >>> ch24: each grammar's allowed tokens, counted when the sampler asks for the mask
        mask = forward_input.sample_args.token_bitmask
        if mask is not None:
            forward_input.sample_args.token_bitmask = self._counting(mask, batch, reqs)
        # <<< ch24
        return forward_input

    # >>> ch24
    def _counting(
        self, mask: Callable[[], torch.Tensor | None], batch: Batch, reqs: List[Dict[str, Any]]
    ) -> Callable[[], torch.Tensor | None]:
        def counted() -> torch.Tensor | None:
            bitmask = mask()
            if bitmask is not None:
                bits = (bitmask.unsqueeze(-1) >> torch.arange(32, device=bitmask.device)) & 1
                allowed = bits.flatten(1)[:, : self.scheduler.engine.sampler.vocab_size].sum(1)
                grammars = self.scheduler.grammar_manager.matchers
                for rec, req, n in zip(reqs, batch.reqs, allowed.tolist()):
                    matcher = grammars.get(req.uid)
                    live = matcher is not None and not matcher.is_terminated()
                    rec["allowed"] = n if live else None
            return bitmask

        return counted

    # <<< ch24

    def _on_forward(self, original: Callable[..., Any], forward_input: ForwardInput) -> Any:
        t = time.perf_counter()
        output = original(forward_input)
        index = self._step_of.get(id(forward_input.batch))
        if index is not None:
            self.steps[index]["timings_ms"]["forward"] = round((time.perf_counter() - t) * 1e3, 3)
            self._launched = index
        return output

    def _on_process(self, original: Callable[..., Any], last_data: ForwardData | None) -> None:
        if last_data is None:
            return original(last_data)
        batch = last_data[0].batch
        before = [len(r.input_ids) for r in batch.reqs]
        t = time.perf_counter()
        original(last_data)
        handle_ms = (time.perf_counter() - t) * 1e3
        index = self._step_of.pop(id(batch), None)
        if index is None:  # launched before the recorder was attached
            return
        step = self.steps[index]
        step["timings_ms"]["handle_at"] = round((t - self._t0) * 1e3, 3)
        step["timings_ms"]["handle"] = round(handle_ms, 3)
        finished = self.scheduler.finished_reqs
        for rec, req, n in zip(step["reqs"], batch.reqs, before):
            if len(req.input_ids) > n:  # a chunk appends nothing
                rec["sampled"] = int(req.input_ids[-1])
                rec["text"] = self.scheduler.tokenizer.decode([rec["sampled"]])
            rec["finished"] = req in finished
            if rec["finished"]:
                self._held.pop(req.uid, None)
        if self._launched is not None and self._launched != index:
            self.steps[self._launched]["handled_while_running"] = index
        freed, evicted = self._free_diff()
        step["freed"] = sorted(set(step["freed"]) | set(freed))
        step["free_pages"] = len(self._free)
        step["evicted"] += evicted
        step["radix"] = self._radix()

    # ---- snapshots ----------------------------------------------------------------------
    def _pages_of(self, row: int, length: int) -> List[int]:
        if length <= 0:
            return []
        slots = self.scheduler.engine.page_table[row, : length : self.page_size]
        return [int(s) // self.page_size for s in slots.tolist()]

    def _req_record(self, req: Req) -> Dict[str, Any]:
        pages = self._pages_of(req.table_idx, req.device_len)
        held = self._held.get(req.uid, set())
        self._held[req.uid] = set(pages)
        return {
            "uid": req.uid,
            "row": req.table_idx,
            "cached_len": req.cached_len,
            "device_len": req.device_len,
            "extend_len": req.extend_len,
            # >>> ch07-ch09
            # "chunked": False,
            # <<< ch07-ch09
            "chunked": isinstance(req, ChunkedReq),  # +ch10
            "pages": pages,
            # pages before ceil(cached_len / P) were there already (its own, or the cache's)
            "new_pages": [
                p for p in pages[div_ceil(req.cached_len, self.page_size) :] if p not in held
            ],
            "sampled": None,
            "text": None,
            "finished": False,
            "allowed": None,  # tokens its grammar allowed this step  # +ch24
        }

    def _rows(self, batch: Batch) -> List[Dict[str, Any]]:
        """Every occupied page-table row: the batch's and the decoding requests' rows."""
        # a request outside the batch has KV for [0, cached_len); the batch's, [0, device_len)
        lens = {
            r.table_idx: (r.uid, r.cached_len) for r in self.scheduler.decode_manager.running_reqs
        }
        lens.update({r.table_idx: (r.uid, r.device_len) for r in batch.reqs})
        return [
            {"row": row, "uid": uid, "len": n, "pages": self._pages_of(row, n)}
            for row, (uid, n) in sorted(lens.items())
        ]

    def _free_pages(self) -> List[int]:
        free = self.scheduler.cache_manager.free_slots
        return [int(s) // self.page_size for s in free.tolist()]

    def _free_diff(self) -> tuple[List[int], List[int]]:
        """(pages newly on the free list since the last look, pages evicted meanwhile)."""
        now = set(self._free_pages())
        freed = sorted(now - self._free)
        self._free = now
        evicted, self._evicted = self._evicted, []
        return freed, evicted

    def _radix(self) -> Dict[str, Any] | None:
        cache = self.scheduler.cache_manager.prefix_cache
        root = getattr(cache, "root", None)
        if root is None:  # the naive cache keeps nothing
            return None
        nodes: List[Dict[str, Any]] = []
        stack = [(root, None)]
        while stack:
            node, parent = stack.pop()
            nid = self._node_ids.get(node)
            if nid is None:  # a node keeps its id for life; a new node (a split's) gets a new one
                nid = self._node_ids[node] = next(self._next_node_id)
            if parent is not None:
                pages = node.value[:: self.page_size].tolist()
                nodes.append(
                    {
                        "id": nid,
                        "parent": parent,
                        "length": node.length,
                        "tokens": node.key[:_TOKENS_SHOWN].tolist(),
                        "pages": [int(s) // self.page_size for s in pages],
                        "ref_count": node.ref_count,
                    }
                )
            for child in sorted(node.children.values(), key=lambda n: n.key[0].item()):
                stack.append((child, nid))
        info = cache.size_info
        return {
            "root": self._node_ids[root],
            "nodes": sorted(nodes, key=lambda n: n["id"]),
            "evictable_tokens": info.evictable_size,
            "protected_tokens": info.protected_size,
        }

    # ---- output -------------------------------------------------------------------------
    def document(self, **meta: Any) -> Dict[str, Any]:
        """The trace as one JSON-serialisable dict; ``meta`` (e.g. ``example=``) is kept as is."""
        s = self.scheduler
        cfg = s.config
        return {
            "format": "minisgl-trace",
            "version": SCHEMA_VERSION,
            "meta": meta,
            "config": {
                "page_size": self.page_size,
                "num_pages": s.cache_manager.num_pages,
                "max_running_req": cfg.max_running_req,
                "max_extend_tokens": s.prefill_budget,
                # >>> ch07-ch08
                # "cache_type": "naive",
                # <<< ch07-ch08
                "cache_type": cfg.cache_type,  # +ch09
                # >>> ch07-ch10
                # "overlap": False,
                # <<< ch07-ch10
                "overlap": not ENV.DISABLE_OVERLAP_SCHEDULING,  # +ch11
                "device": str(s.device),
            },
            "requests": [self.requests[u] for u in sorted(self.requests)],
            "steps": self.steps,
        }

    def save(self, path: str | Path, run: str | None = None, **meta: Any) -> Path:
        """Write ``document(**meta)`` to ``path`` (compact JSON, one line per step). With
        ``run``, the run of an example the trace holds ("the chunked run"), also kept in
        ``meta``: say on stderr where the trace went and how to view it (stderr, so that the
        example's stdout stays the output the book shows)."""
        if run is not None:
            meta = {"run": run, **meta}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = self.document(**meta)
        steps = doc.pop("steps")
        head = json.dumps(doc, separators=(",", ":"))[:-1]
        body = ",\n".join(json.dumps(st, separators=(",", ":")) for st in steps)
        path.write_text(f'{head},"steps":[\n{body}\n]}}\n', encoding="utf-8")
        if run is not None:
            print(
                f"wrote the trace of {run} to {path}; view it: python -m tools.trace_view {path}",
                file=sys.stderr,
            )
        return path
